//! [`Peer`]: a connected node, and how messages reach it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Channel, Endpoint, Header, Locality, Route};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Mutex;

use crate::envelope::{Envelope, Payload};
use crate::node::NodeInner;
use crate::{Error, Message, Result};

/// How messages reach a peer.
pub(crate) enum Link {
    /// A node in this process: envelopes go straight into its inbox.
    Inproc {
        target: Weak<NodeInner>,
        /// The target's `Peer` for us, set once both sides exist (the sender of replies).
        reverse: OnceLock<Weak<PeerInner>>,
    },
    /// A TCP connection; the reader task owns the read half.
    Tcp { writer: Mutex<OwnedWriteHalf> },
}

pub(crate) struct PeerInner {
    pub(crate) remote: Endpoint,
    pub(crate) listen: Option<String>,
    pub(crate) outbound: Arc<Route>,
    pub(crate) inbound: Arc<Route>,
    pub(crate) link: Link,
    pub(crate) closed: AtomicBool,
    /// Encode even in-process (the test switch that keeps both paths equal).
    pub(crate) force_encode: bool,
}

/// A connected node: send it messages, ask how it is reached.
///
/// Cheap to clone. Obtained from [`Node::connect`](crate::Node::connect),
/// [`Node::peer`](crate::Node::peer) or [`Envelope::from`].
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<PeerInner>);

impl Peer {
    pub(crate) fn new(
        local: &Endpoint,
        remote: Endpoint,
        listen: Option<String>,
        channel: Channel,
        link: Link,
        force_encode: bool,
    ) -> Peer {
        let locality = Locality::between(local, &remote);
        let outbound = Arc::new(Route {
            from: local.clone(),
            to: remote.clone(),
            locality,
            channel,
        });
        let inbound = Arc::new(Route {
            from: remote.clone(),
            to: local.clone(),
            locality,
            channel,
        });
        Peer(Arc::new(PeerInner {
            remote,
            listen,
            outbound,
            inbound,
            link,
            closed: AtomicBool::new(false),
            force_encode,
        }))
    }

    /// The peer's node name.
    pub fn name(&self) -> &str {
        &self.0.remote.name
    }

    /// What the peer said about itself in the handshake.
    pub fn endpoint(&self) -> &Endpoint {
        &self.0.remote
    }

    /// The address the peer listens on, if it announced one.
    pub fn listen_addr(&self) -> Option<&str> {
        self.0.listen.as_deref()
    }

    /// The route messages to this peer take.
    pub fn route(&self) -> &Arc<Route> {
        &self.0.outbound
    }

    pub(crate) fn inbound_route(&self) -> &Arc<Route> {
        &self.0.inbound
    }

    /// How near the peer is.
    pub fn locality(&self) -> Locality {
        self.0.outbound.locality
    }

    /// The channel messages to this peer use.
    pub fn channel(&self) -> Channel {
        self.0.outbound.channel
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    pub(crate) fn mark_closed(&self) {
        self.0.closed.store(true, Ordering::Release);
    }

    /// Sends `value` to the peer.
    ///
    /// In-process the value is moved and nothing is serialized; over TCP it is encoded
    /// for this route and its buffers are written straight from their memory.
    pub async fn send<T: Message>(&self, value: T) -> Result<()> {
        if self.is_closed() {
            return Err(Error::PeerClosed(self.name().to_string()));
        }
        match &self.0.link {
            Link::Inproc { target, reverse } => {
                let target = target
                    .upgrade()
                    .ok_or_else(|| Error::PeerClosed(self.name().to_string()))?;
                let reverse = reverse
                    .get()
                    .and_then(Weak::upgrade)
                    .ok_or_else(|| Error::PeerClosed(self.name().to_string()))?;
                target.registry.check(T::TYPE_NAME)?;
                let payload = if self.0.force_encode || target.force_encode_inproc {
                    let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                    Payload::Encoded {
                        body: Bytes::from(encoded.body),
                        frames: encoded.frames,
                    }
                } else {
                    Payload::Value(Box::new(value))
                };
                target
                    .deliver(Envelope {
                        from: Peer(reverse),
                        type_name: T::TYPE_NAME.to_string(),
                        payload,
                    })
                    .await
            }
            Link::Tcp { writer } => {
                let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                let header = Header::Msg {
                    type_name: T::TYPE_NAME,
                    body: &encoded.body,
                    frames: encoded
                        .frames
                        .iter()
                        .map(|f| handoff_wire::Descriptor::Inline { len: f.len() as u64 })
                        .collect(),
                };
                let mut head = Vec::with_capacity(encoded.body.len() + 64);
                encode_header_into(&header, &mut head);
                let mut w = writer.lock().await;
                crate::io::write_all_vectored(&mut *w, &head, &encoded.frames)
                    .await
                    .map_err(|e| {
                        self.mark_closed();
                        Error::io(format!("sending {} to {}", T::TYPE_NAME, self.name()), e)
                    })
            }
        }
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name())
            .field("locality", &self.locality())
            .field("channel", &self.channel())
            .finish()
    }
}

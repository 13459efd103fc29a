//! [`Peer`]: a connected node, and how messages reach it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};

use bytes::Bytes;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Channel, Descriptor, Endpoint, Header, Locality, Route, TicketClaim};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Mutex;

use crate::envelope::{Envelope, Payload};
use crate::node::NodeInner;
use crate::shm::{self, Held};
use crate::tickets::client::Pending;
use crate::tickets::{OnDemand, Ticket};
use crate::unix::UnixWriter;
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
    /// A Unix socket to a same-host node; large buffers go as shared memory.
    Shm(Arc<ShmLink>),
}

/// The sending state of a same-host connection.
pub(crate) struct ShmLink {
    pub(crate) writer: Mutex<UnixWriter>,
    /// What we keep alive for the peer until it releases each lease.
    leases: StdMutex<HashMap<u64, Held>>,
    next_lease: AtomicU64,
    /// Buffers at least this large go through shared memory.
    threshold: usize,
    /// Send only sealed segments (fresh memfd, sealed against change).
    sealed: bool,
}

/// Leases a node holds for a peer: buffers kept alive until the peer releases them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseStats {
    /// Leases outstanding.
    pub count: usize,
    /// Bytes they keep alive.
    pub bytes: usize,
}

impl ShmLink {
    pub(crate) fn new(writer: UnixWriter, threshold: usize, sealed: bool) -> ShmLink {
        ShmLink {
            writer: Mutex::new(writer),
            leases: StdMutex::default(),
            next_lease: AtomicU64::new(1),
            threshold,
            sealed,
        }
    }

    /// Ends the leases the peer released.
    pub(crate) fn release(&self, leases: &[u64]) -> usize {
        let mut held = self.leases.lock().expect("leases lock");
        leases.iter().filter(|l| held.remove(l).is_some()).count()
    }

    /// Ends every lease (the peer is gone).
    pub(crate) fn release_all(&self) -> usize {
        let mut held = self.leases.lock().expect("leases lock");
        let n = held.len();
        held.clear();
        n
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let held = self.leases.lock().expect("leases lock");
        LeaseStats {
            count: held.len(),
            bytes: held.values().map(Held::bytes).sum(),
        }
    }

    /// Plans each frame (shared segment or inline), registers the leases, and writes the message.
    async fn send(&self, type_name: &str, body: &[u8], frames: Vec<Planned>, label: &str) -> Result<()> {
        let mut descriptors = Vec::with_capacity(frames.len());
        let mut inline = Vec::new();
        // Local handles on what the fds belong to, so they stay open while we send.
        let mut passing: Vec<Held> = Vec::new();
        for planned in frames {
            let frame = match planned {
                Planned::Ticket(claim) => {
                    descriptors.push(Descriptor::Ticket(claim));
                    continue;
                }
                Planned::Bytes(frame) => frame,
            };
            // One read takes at most MAX_FDS_PER_READ descriptors: frames past that go inline.
            let room = passing.len() < crate::unix::MAX_FDS_PER_READ;
            let origin_ok = room && shm::origin_of(&frame).is_some_and(|o| !self.sealed || o.sealed());
            let shared = if !room {
                None
            } else if origin_ok {
                Some(Held::Buffer(frame.clone()))
            } else if frame.len() >= self.threshold && !frame.is_empty() {
                Some(if self.sealed {
                    Held::Sealed(Arc::new(
                        shm::sealed_copy(&frame).map_err(|e| Error::io("copying into a sealed segment", e))?,
                    ))
                } else {
                    Held::Buffer(shm::copy_in(&frame).map_err(|e| Error::io("copying into shared memory", e))?)
                })
            } else {
                None
            };
            match shared {
                Some(held) => {
                    let lease = self.next_lease.fetch_add(1, Ordering::Relaxed);
                    let (offset, size, sealed) = match &held {
                        Held::Buffer(b) => {
                            let o = shm::origin_of(b).expect("a shared buffer has its origin");
                            (
                                o.offset_of(b).expect("a view lies in its segment"),
                                o.size(),
                                o.sealed(),
                            )
                        }
                        Held::Sealed(s) => (0, s.size, true),
                    };
                    descriptors.push(Descriptor::Shm {
                        len: held.bytes() as u64,
                        offset: offset as u64,
                        size: size as u64,
                        lease,
                        sealed,
                    });
                    // Registered before sending: the release may come back at once.
                    self.leases
                        .lock()
                        .expect("leases lock")
                        .insert(lease, held.clone_handle());
                    passing.push(held);
                }
                None => {
                    descriptors.push(Descriptor::Inline {
                        len: frame.len() as u64,
                    });
                    inline.push(frame);
                }
            }
        }
        let header = Header::Msg {
            type_name,
            body,
            frames: descriptors,
        };
        let mut head = Vec::with_capacity(body.len() + 64);
        encode_header_into(&header, &mut head);
        let fds: Vec<_> = passing.iter().map(Held::fd).collect();
        let mut w = self.writer.lock().await;
        w.send_with_fds(&head, &fds)
            .await
            .map_err(|e| Error::io(format!("sending {type_name} to {label}"), e))?;
        crate::io::write_all_vectored(&mut *w, &[], &inline)
            .await
            .map_err(|e| Error::io(format!("sending {type_name} to {label}"), e))
    }
}

pub(crate) struct PeerInner {
    pub(crate) remote: Endpoint,
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    pub(crate) outbound: Arc<Route>,
    pub(crate) inbound: Arc<Route>,
    pub(crate) link: Link,
    pub(crate) closed: AtomicBool,
    /// Encode even in-process (the test switch that keeps both paths equal).
    pub(crate) force_encode: bool,
    /// The node this peer belongs to (for tickets: its leases and settings).
    pub(crate) local: Weak<NodeInner>,
    /// Ticket requests sent on this connection, waiting for the owner's answer.
    pub(crate) pending: StdMutex<HashMap<u64, Pending>>,
}

/// A frame after the ticket policy: its bytes, or a ticket for them.
pub(crate) enum Planned {
    Bytes(Buffer),
    Ticket(TicketClaim),
}

/// A connected node: send it messages, ask how it is reached.
///
/// Cheap to clone. Obtained from [`Node::connect`](crate::Node::connect),
/// [`Node::peer`](crate::Node::peer) or [`Envelope::from`].
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<PeerInner>);

/// What the handshake told us about a peer, besides its endpoint.
#[derive(Default)]
pub(crate) struct PeerAddrs {
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
}

impl Peer {
    pub(crate) fn new(
        node: &Arc<NodeInner>,
        remote: Endpoint,
        addrs: PeerAddrs,
        channel: Channel,
        link: Link,
        force_encode: bool,
    ) -> Peer {
        let local = &node.me;
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
            listen: addrs.listen,
            unix: addrs.unix,
            outbound,
            inbound,
            link,
            closed: AtomicBool::new(false),
            force_encode,
            local: Arc::downgrade(node),
            pending: StdMutex::default(),
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

    /// The peer's Unix socket for same-host connections, if it announced one.
    pub fn unix_addr(&self) -> Option<&str> {
        self.0.unix.as_deref()
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

    /// Shared-memory leases this node holds for the peer (zero on other channels).
    pub fn leases(&self) -> LeaseStats {
        match &self.0.link {
            Link::Shm(link) => link.stats(),
            _ => LeaseStats::default(),
        }
    }

    /// Sends `value` to the peer.
    ///
    /// In-process the value is moved and nothing is serialized; to a same-host peer large
    /// buffers travel as shared memory; over TCP the value is encoded for this route and
    /// its buffers are written straight from their memory.
    pub async fn send<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, false).await
    }

    async fn send_inner<T: Message>(&self, value: T, by_ticket: bool) -> Result<()> {
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
                let planned = self.plan(encoded.frames, by_ticket).await?;
                let mut descriptors = Vec::with_capacity(planned.len());
                let mut inline = Vec::new();
                for p in planned {
                    match p {
                        Planned::Bytes(b) => {
                            descriptors.push(Descriptor::Inline { len: b.len() as u64 });
                            inline.push(b);
                        }
                        Planned::Ticket(claim) => descriptors.push(Descriptor::Ticket(claim)),
                    }
                }
                let header = Header::Msg {
                    type_name: T::TYPE_NAME,
                    body: &encoded.body,
                    frames: descriptors,
                };
                let mut head = Vec::with_capacity(encoded.body.len() + 64);
                encode_header_into(&header, &mut head);
                let mut w = writer.lock().await;
                crate::io::write_all_vectored(&mut *w, &head, &inline)
                    .await
                    .map_err(|e| {
                        self.mark_closed();
                        Error::io(format!("sending {} to {}", T::TYPE_NAME, self.name()), e)
                    })
            }
            Link::Shm(link) => {
                let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                let planned = self.plan(encoded.frames, by_ticket).await?;
                link.send(T::TYPE_NAME, &encoded.body, planned, self.name())
                    .await
                    .inspect_err(|e| {
                        if matches!(e, Error::Io { .. }) {
                            self.mark_closed();
                        }
                    })
            }
        }
    }

    /// Sends `value` with every non-empty buffer as a ticket: the peer pulls the bytes
    /// from us (or from their owner, for tickets we hold), and we keep them under a lease
    /// until it releases them. In-process peers get the value itself.
    pub async fn send_by_ticket<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, true).await
    }

    /// Applies the ticket policy to each frame: tickets we hold are forwarded (the owner
    /// registers the peer first), large or requested buffers are leased and sent as tickets.
    async fn plan(&self, frames: Vec<Buffer>, by_ticket: bool) -> Result<Vec<Planned>> {
        let node = self.0.local.upgrade().ok_or(Error::NodeClosed)?;
        let to = &self.0.remote.node_id;
        // A peer that did not announce `ticket` gets bytes, never tickets.
        let takes_tickets = self.0.remote.has_capability("ticket");
        let mut out = Vec::with_capacity(frames.len());
        for frame in frames {
            if let Some(ticket) = Ticket::of(&frame) {
                let claim = &ticket.0.claim;
                if &claim.owner == to || !takes_tickets {
                    // Back to its owner, or to a peer without tickets: send the bytes.
                    out.push(Planned::Bytes(ticket.redeem().await?));
                } else {
                    out.push(Planned::Ticket(node.forward_claim(&ticket.0, to).await?));
                }
                continue;
            }
            let on_demand = OnDemand::of(&frame);
            let lazy = on_demand.is_some();
            let wanted = by_ticket
                || lazy
                || (self.channel() == Channel::Tcp && node.ticket_threshold.is_some_and(|t| frame.len() >= t));
            if wanted && takes_tickets && !frame.is_empty() {
                let known_digest = on_demand.and_then(|o| o.digest);
                let issued = node.leases.issue(&frame, known_digest, to, self.name()).await?;
                out.push(Planned::Ticket(TicketClaim {
                    len: frame.len() as u64,
                    owner: node.me.node_id.clone(),
                    addr: node.listen_addr.clone(),
                    lease: issued.lease,
                    token: issued.token.to_vec(),
                    digest: issued.digest.to_vec(),
                    ttl_ms: node.leases.config.ttl.as_millis() as u64,
                    lazy,
                }));
            } else {
                out.push(Planned::Bytes(frame));
            }
        }
        Ok(out)
    }

    /// Writes a control header (and its inline bytes) on this connection.
    pub(crate) async fn write_control(&self, header: &Header<'_>, frames: &[Buffer]) -> Result<()> {
        let mut head = Vec::with_capacity(96);
        encode_header_into(header, &mut head);
        let result = match &self.0.link {
            Link::Tcp { writer } => crate::io::write_all_vectored(&mut *writer.lock().await, &head, frames).await,
            Link::Shm(link) => crate::io::write_all_vectored(&mut *link.writer.lock().await, &head, frames).await,
            Link::Inproc { .. } => return Err(Error::Config("no wire protocol between in-process nodes".into())),
        };
        result.map_err(|e| Error::io(format!("writing to {}", self.name()), e))
    }
}

impl Held {
    fn clone_handle(&self) -> Held {
        match self {
            Held::Buffer(b) => Held::Buffer(b.clone()),
            Held::Sealed(s) => Held::Sealed(s.clone()),
        }
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Held::Buffer(b) => shm::origin_of(b).expect("a shared buffer has its origin").fd(),
            Held::Sealed(s) => s.fd.as_fd(),
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

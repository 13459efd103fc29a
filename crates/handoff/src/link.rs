//! [`Link`]: how bytes reach a peer — in-process, a TCP stream, or a Unix socket that also
//! passes shared-memory segments. Writing, and its write timeout, is the connection's
//! [`Socket`]'s.

use std::future::Future;
use std::pin::Pin;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::context::Context;
use crate::payload::Payload;
use crate::shm::Held;
use crate::socket::Socket;
use crate::tickets::owner::WhenFull;
use crate::{Error, Result};
pub(crate) use handoff_proto::outbound::Planned;
use handoff_proto::outbound::{inline_routes, message_head, stream_parts, Routed, Router, ShmRouting};
pub use handoff_proto::shm::leases::LeaseStats;
use handoff_proto::shm::leases::ShmLeases;

/// How messages reach a peer.
pub(crate) enum Link {
    /// A node in this process: envelopes go straight into its inbox.
    Inproc(Arc<dyn InprocTarget>),
    /// A TCP connection, plain or inside TLS.
    Tcp(Arc<Socket>),
    /// A Unix socket to a same-host node; large buffers go as shared memory.
    Shm(Arc<ShmLink>),
}

/// Where an in-process link delivers: the receiving node's inbox, with the receiving node's
/// peer for us as the sender. A trait so that a link need not know nodes and peers; the
/// in-process connection implements it (`inproc::InprocRoute`).
pub(crate) trait InprocTarget: Send + Sync {
    /// Fails unless the receiving node takes messages named `type_name` (and it and its
    /// peer for us live). A sender calls it before anything else: the two calls below
    /// take the name as checked.
    fn check(&self, type_name: &'static str) -> Result<()>;

    /// Puts a message into the receiving node's inbox if its receive budget has room now;
    /// gives the payload back if not. Fails if the receiving node or its peer for us is
    /// gone.
    fn try_deliver(&self, type_name: &'static str, payload: Payload) -> Result<std::result::Result<(), Payload>>;

    /// Puts a message into the receiving node's inbox once its receive budget has room
    /// (after [`check`](Self::check) and a [`try_deliver`](Self::try_deliver) that found none).
    fn deliver(
        &self,
        type_name: &'static str,
        payload: Payload,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>;
}

/// What a send is, for its errors and its limits.
pub(crate) struct Sending<'a> {
    pub(crate) type_name: &'a str,
    /// The peer's name.
    pub(crate) peer: &'a str,
    /// What the receiver accepts (spec §9): nothing it must refuse is sent.
    pub(crate) limits: &'a handoff_wire::Limits,
    /// Set when the socket itself failed (the connection is lost), not the send alone (a
    /// frame that could not be copied into shared memory, a lease that did not come).
    pub(crate) socket_failed: AtomicBool,
    /// Set once the message is in the socket's stream: it is then written in full, even if
    /// the send is dropped.
    pub(crate) queued: AtomicBool,
}

impl Sending<'_> {
    /// The error of a write that failed: the connection is lost.
    fn failed(&self, e: std::io::Error) -> Error {
        self.socket_failed.store(true, Ordering::Relaxed);
        Error::io(format!("sending {} to {}", self.type_name, self.peer), e)
    }

    /// Whether the socket failed during the send.
    pub(crate) fn lost_the_connection(&self) -> bool {
        self.socket_failed.load(Ordering::Relaxed)
    }

    fn mark_queued(&self) {
        self.queued.store(true, Ordering::Relaxed);
    }

    /// Whether the message went, or goes, to the peer: it is in the stream of a connection
    /// that did not fail. What was leased for a message that did not go ends.
    pub(crate) fn went(&self) -> bool {
        self.queued.load(Ordering::Relaxed) && !self.lost_the_connection()
    }
}

/// The error of a message a receiver would have to refuse.
pub(crate) fn unsendable(type_name: &str, peer: &str, reason: handoff_wire::WireError) -> Error {
    Error::Unsendable {
        type_name: type_name.to_string(),
        peer: peer.to_string(),
        reason: Box::new(reason),
    }
}

impl Link {
    /// The connection's socket; none in process.
    pub(crate) fn socket(&self) -> Option<&Arc<Socket>> {
        match self {
            Link::Tcp(socket) => Some(socket),
            Link::Shm(link) => Some(&link.socket),
            Link::Inproc(_) => None,
        }
    }

    /// Sends a message whose frames went through the ticket policy: over TCP with every
    /// frame inline; on a same-host connection routed through shared memory.
    pub(crate) async fn send(&self, sending: &Sending<'_>, body: &[u8], frames: Vec<Planned>) -> Result<()> {
        match self {
            Link::Shm(link) => link.send(sending, body, frames).await,
            _ => {
                let routed = inline_routes(frames);
                let head = message_head(sending.type_name, body, &routed, &[], sending.limits)
                    .map_err(|reason| unsendable(sending.type_name, sending.peer, reason))?;
                let (_, inline) = stream_parts(routed);
                let Some(socket) = self.socket() else {
                    unreachable!("in-process peers send values")
                };
                socket
                    .send(Bytes::from(head), Vec::new(), inline, || sending.mark_queued())
                    .await
                    .map_err(|e| sending.failed(e))
            }
        }
    }

    /// Sends an `error` (best effort, within `limit`), then shuts our sending direction
    /// down, so the peer reads the error before the end of the stream.
    pub(crate) async fn send_error_and_shutdown(&self, err: &handoff_wire::WireError, limit: Duration) {
        if let Some(socket) = self.socket() {
            socket
                .say_and_shutdown(handoff_proto::handshake::error_header(err), limit)
                .await;
        }
    }
}

/// The sending state of a same-host connection.
pub(crate) struct ShmLink {
    pub(crate) socket: Arc<Socket>,
    /// What we keep alive for the peer until it releases each lease (spec §7.4), bounded
    /// in bytes and count (§9.1).
    leases: StdMutex<ShmLeases<Held>>,
    /// Signalled when the peer releases leases (a send waiting for room wakes up).
    released: Notify,
    /// Buffers at least this large go through shared memory.
    threshold: usize,
    /// Send only sealed segments (fresh memfd, sealed against change).
    sealed: bool,
    /// What a send does when the peer holds that much already.
    when_full: WhenFull,
    /// The peer's process id (`SO_PEERCRED`).
    peer_pid: Option<u32>,
}

impl ShmLink {
    pub(crate) fn new(socket: Arc<Socket>, ctx: &Context, peer_pid: Option<u32>) -> ShmLink {
        ShmLink {
            socket,
            leases: StdMutex::new(ShmLeases::new(
                ctx.bounds.max_shm_lease_bytes_per_peer,
                ctx.bounds.max_shm_leases_per_peer,
            )),
            released: Notify::new(),
            threshold: ctx.settings.shm_threshold(),
            sealed: ctx.settings.shm_sealed,
            when_full: ctx.leases.config.when_full,
            peer_pid,
        }
    }

    /// Ends the leases the peer released.
    pub(crate) fn release(&self, leases: &[u64]) -> usize {
        let ended = self.leases.lock().expect("leases lock").release(leases);
        if ended > 0 {
            self.released.notify_waiters();
        }
        ended
    }

    /// Ends every lease (the connection is gone). Our segments it held go back to the pool
    /// once the peer's process cannot map them any more: one that lives must not see the
    /// next sender's bytes there (`handoff_sys::end_leases_of`).
    pub(crate) fn release_all(&self) -> usize {
        let kept = self.leases.lock().expect("leases lock").take_all();
        let n = kept.len();
        handoff_sys::end_leases_of(self.peer_pid, kept);
        self.released.notify_waiters();
        n
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        self.leases.lock().expect("leases lock").stats()
    }

    /// Registers a lease on `held` for the peer, waiting (as configured) while the peer
    /// holds as much as it may; a send never ends a live lease to make room.
    async fn lease(&self, held: &Held, peer: &str) -> Result<u64> {
        let bytes = held.bytes() as u64;
        let attempt = || {
            let leases = &mut self.leases.lock().expect("leases lock");
            leases.try_lease(held.clone(), bytes).map_err(|(_, reason)| reason)
        };
        crate::wait::for_lease(&self.released, self.when_full, peer, bytes, attempt).await
    }

    /// Routes each frame (shared segment or inline), registers the leases, and writes the
    /// message.
    async fn send(&self, sending: &Sending<'_>, body: &[u8], frames: Vec<Planned>) -> Result<()> {
        let routing = ShmRouting {
            threshold: self.threshold,
            sealed_only: self.sealed,
            max_fds: handoff_proto::inbound::MAX_FDS_PER_READ,
            copy: handoff_proto::shm::CopyInto::Mapping,
        };
        // Frame by frame: each shared frame's lease is taken (waiting for the peer to
        // release some, as configured) before the next frame is copied, so that a waiting
        // send holds no copy but the one its lease waits for. Registered before sending:
        // the release may come back at once.
        let mut router = Router::new(routing);
        let mut routed = Vec::with_capacity(frames.len());
        // The leases taken for this message end unless it is queued: on an error, and when
        // the send is dropped while it waits (for a lease, or for the socket's state).
        let mut leased = Taken {
            link: self,
            leases: Vec::new(),
            sending,
        };
        for frame in frames {
            let r = router.route(frame).map_err(|e| Error::io(e.what, e.source))?;
            if let Routed::Shared { held, .. } = &r {
                let lease = self.lease(held, sending.peer).await?;
                leased.leases.push(lease);
            }
            routed.push(r);
        }
        let head = message_head(sending.type_name, body, &routed, &leased.leases, sending.limits)
            .map_err(|reason| unsendable(sending.type_name, sending.peer, reason))?;
        let (fds, inline) = stream_parts(routed);
        self.socket
            .send(Bytes::from(head), fds, inline, || sending.mark_queued())
            .await
            .map_err(|e| sending.failed(e))
    }
}

/// The leases taken for a message on a same-host connection: they end when it is dropped
/// before the message was queued. (Once queued, the peer releases them, or they end with
/// the connection.)
struct Taken<'a, 'b> {
    link: &'a ShmLink,
    leases: Vec<u64>,
    sending: &'a Sending<'b>,
}

impl Drop for Taken<'_, '_> {
    fn drop(&mut self) {
        if !self.sending.queued.load(Ordering::Relaxed) && !self.leases.is_empty() {
            self.link.release(&self.leases);
        }
    }
}

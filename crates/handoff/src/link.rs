//! [`Link`]: how bytes reach a peer — in-process, a TCP stream, or a Unix socket that also
//! passes shared-memory segments — and writing to it within the write timeout.
//!
//! A write that makes no progress for the write timeout (the peer reads nothing) fails,
//! and the connection is shut down in both directions, so that its reader ends too and
//! only that peer's sends fail (spec §9.1).

use std::future::Future;
use std::os::fd::BorrowedFd;
use std::pin::Pin;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use handoff_wire::Buffer;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, Notify};

use crate::context::Context;
use crate::payload::Payload;
use crate::shm::Held;
use crate::tcp::TcpWriter;
use crate::tickets::owner::WhenFull;
use crate::unix::UnixWriter;
use crate::{Error, Result};
pub(crate) use handoff_proto::outbound::Planned;
use handoff_proto::outbound::{message_head, route_frames, Routed, ShmRouting};
use handoff_proto::shm::leases::ShmLeases;

/// How messages reach a peer.
pub(crate) enum Link {
    /// A node in this process: envelopes go straight into its inbox.
    Inproc(Arc<dyn InprocTarget>),
    /// A TCP connection, plain or inside TLS; the reader task owns the read half.
    Tcp { writer: Mutex<TcpWriter> },
    /// A Unix socket to a same-host node; large buffers go as shared memory.
    Shm(Arc<ShmLink>),
}

/// Where an in-process link delivers: the receiving node's inbox, with the receiving node's
/// peer for us as the sender. A trait so that a link need not know nodes and peers; the
/// in-process connection implements it (`inproc::InprocRoute`).
pub(crate) trait InprocTarget: Send + Sync {
    /// Whether the receiving node takes messages named `type_name`, and if so whether it
    /// wants them encoded (its test switch); fails if it or its peer for us is gone.
    fn accepts(&self, type_name: &str) -> Result<bool>;

    /// Puts a message into the receiving node's inbox once its receive budget has room.
    fn deliver(
        &self,
        type_name: &'static str,
        payload: Payload,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>>;
}

/// Shuts a socket down in both directions: pending and later reads and writes on it end
/// at once (a stalled write, the connection's reader), whoever holds it.
fn abort_socket(fd: BorrowedFd<'_>) {
    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
}

impl Link {
    /// Writes `head` then `frames` (a whole message without shared segments), within the
    /// write timeout; a stall shuts the connection down.
    pub(crate) async fn write(&self, head: &[u8], frames: &[Buffer], stall: Duration) -> std::io::Result<()> {
        match self {
            Link::Tcp { writer } => {
                let mut w = writer.lock().await;
                let r = crate::io::write_all_vectored(&mut *w, head, frames, stall).await;
                if r.is_err() {
                    abort_socket(w.socket());
                }
                r
            }
            Link::Shm(link) => {
                let mut w = link.writer.lock().await;
                let r = crate::io::write_all_vectored(&mut *w, head, frames, stall).await;
                if r.is_err() {
                    abort_socket(w.fd());
                }
                r
            }
            Link::Inproc(_) => Err(std::io::Error::other("no wire protocol between in-process nodes")),
        }
    }

    /// Sends an `error` (best effort, within `limit` to get the writer at all), then shuts
    /// our sending direction down, so the peer reads the error before the end of the stream.
    pub(crate) async fn send_error_and_shutdown(&self, err: &handoff_wire::WireError, limit: Duration) {
        match self {
            Link::Tcp { writer } => {
                if let Ok(mut w) = tokio::time::timeout(limit, writer.lock()).await {
                    crate::handshake::send_error(&mut *w, err).await;
                    let _ = tokio::time::timeout(limit, w.shutdown()).await;
                }
            }
            Link::Shm(link) => {
                if let Ok(mut w) = tokio::time::timeout(limit, link.writer.lock()).await {
                    crate::handshake::send_error(&mut *w, err).await;
                    let _ = tokio::time::timeout(limit, w.shutdown()).await;
                }
            }
            Link::Inproc(_) => {}
        }
    }

    /// Shuts our sending direction down (the peer sees the end of the stream), within `limit`.
    pub(crate) async fn shutdown_writing(&self, limit: Duration) {
        match self {
            Link::Tcp { writer } => {
                if let Ok(mut w) = tokio::time::timeout(limit, writer.lock()).await {
                    let _ = tokio::time::timeout(limit, w.shutdown()).await;
                }
            }
            Link::Shm(link) => {
                if let Ok(mut w) = tokio::time::timeout(limit, link.writer.lock()).await {
                    let _ = tokio::time::timeout(limit, w.shutdown()).await;
                }
            }
            Link::Inproc(_) => {}
        }
    }
}

/// Leases a node holds for a peer: buffers kept alive until the peer releases them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseStats {
    /// Leases outstanding.
    pub count: usize,
    /// Bytes they keep alive.
    pub bytes: usize,
}

/// The sending state of a same-host connection.
pub(crate) struct ShmLink {
    pub(crate) writer: Mutex<UnixWriter>,
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
    write_timeout: Duration,
}

impl ShmLink {
    pub(crate) fn new(writer: UnixWriter, ctx: &Context) -> ShmLink {
        ShmLink {
            writer: Mutex::new(writer),
            leases: StdMutex::new(ShmLeases::new(
                ctx.bounds.max_shm_lease_bytes_per_peer,
                ctx.bounds.max_shm_leases_per_peer,
            )),
            released: Notify::new(),
            threshold: ctx.shm_threshold,
            sealed: ctx.shm_sealed,
            when_full: ctx.leases.config.when_full,
            write_timeout: ctx.bounds.write_timeout,
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

    /// Ends every lease (the peer is gone).
    pub(crate) fn release_all(&self) -> usize {
        let n = self.leases.lock().expect("leases lock").release_all();
        self.released.notify_waiters();
        n
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let (count, bytes) = self.leases.lock().expect("leases lock").held();
        LeaseStats {
            count,
            bytes: bytes as usize,
        }
    }

    /// Registers a lease on `held` for the peer, waiting (as configured) while the peer
    /// holds as much as it may; a send never ends a live lease to make room.
    async fn lease(&self, held: &Held, peer: &str) -> Result<u64> {
        let bytes = held.bytes() as u64;
        let give_up = match self.when_full {
            WhenFull::Wait(d) => Some(tokio::time::Instant::now() + d),
            WhenFull::Fail => None,
        };
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let refused = self.leases.lock().expect("leases lock").try_lease(held.clone(), bytes);
            match refused {
                Ok(lease) => return Ok(lease),
                Err((_, reason)) if give_up.is_none_or(|g| tokio::time::Instant::now() >= g) => {
                    return Err(Error::LeaseCap {
                        peer: peer.to_string(),
                        bytes,
                        reason,
                    });
                }
                Err(_) => {}
            }
            let _ = tokio::time::timeout_at(give_up.expect("checked above"), released).await;
        }
    }

    /// Routes each frame (shared segment or inline), registers the leases, and writes the
    /// message.
    pub(crate) async fn send(
        &self,
        type_name: &str,
        body: &[u8],
        frames: Vec<Planned>,
        label: &str,
        limits: &handoff_wire::Limits,
    ) -> Result<()> {
        let routing = ShmRouting {
            threshold: self.threshold,
            sealed_only: self.sealed,
            max_fds: crate::unix::MAX_FDS_PER_READ,
        };
        let routed = route_frames(frames, &routing).map_err(|e| Error::io(e.what, e.source))?;
        // Registered before sending: the release may come back at once.
        let mut leased: Vec<u64> = Vec::new();
        for r in &routed {
            if let Routed::Shared { held, .. } = r {
                match self.lease(held, label).await {
                    Ok(lease) => leased.push(lease),
                    Err(e) => {
                        // Nothing was sent: the leases taken for this message end here.
                        self.release(&leased);
                        return Err(e);
                    }
                }
            }
        }
        let head = match message_head(type_name, body, &routed, &leased, limits) {
            Ok(head) => head,
            Err(reason) => {
                self.release(&leased);
                return Err(Error::Unsendable {
                    type_name: type_name.to_string(),
                    peer: label.to_string(),
                    reason: Box::new(reason),
                });
            }
        };
        let fds: Vec<_> = routed
            .iter()
            .filter_map(|r| match r {
                Routed::Shared { fd, .. } => Some(fd.as_fd()),
                _ => None,
            })
            .collect();
        let inline: Vec<Buffer> = routed
            .iter()
            .filter_map(|r| match r {
                Routed::Inline(b) => Some(b.clone()),
                _ => None,
            })
            .collect();
        let mut w = self.writer.lock().await;
        let sent = match w.send_with_fds(&head, &fds, self.write_timeout).await {
            Ok(()) => crate::io::write_all_vectored(&mut *w, &[], &inline, self.write_timeout).await,
            Err(e) => Err(e),
        };
        if sent.is_err() {
            abort_socket(w.fd());
        }
        sent.map_err(|e| Error::io(format!("sending {type_name} to {label}"), e))
    }
}

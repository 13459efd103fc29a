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

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Descriptor, Header, TicketClaim};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, Notify};

use crate::context::Context;
use crate::payload::Payload;
use crate::shm::{self, Held, PassFd, ShmOrigin};
use crate::tcp::TcpWriter;
use crate::tickets::owner::WhenFull;
use crate::unix::UnixWriter;
use crate::{Error, Result};
use handoff_proto::shm::leases::{route_frame, FrameRoute, ShmLeases};

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

/// A frame after the ticket policy: its bytes, or a ticket for them.
pub(crate) enum Planned {
    Bytes(Buffer),
    Ticket(TicketClaim),
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
            let refused = self
                .leases
                .lock()
                .expect("leases lock")
                .try_lease(held.clone_handle(), bytes);
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

    /// Plans each frame (shared segment or inline), registers the leases, and writes the message.
    pub(crate) async fn send(
        &self,
        type_name: &str,
        body: &[u8],
        frames: Vec<Planned>,
        label: &str,
        limits: &handoff_wire::Limits,
    ) -> Result<()> {
        let mut descriptors = Vec::with_capacity(frames.len());
        let mut inline = Vec::new();
        // Local handles on what the fds belong to, so they stay open while we send.
        let mut passing: Vec<(Held, PassFd)> = Vec::new();
        let mut leased: Vec<u64> = Vec::new();
        let result = self
            .plan_frames(frames, &mut descriptors, &mut inline, &mut passing, &mut leased, label)
            .await;
        if let Err(e) = result {
            // Nothing was sent: the leases taken for this message end here.
            self.release(&leased);
            return Err(e);
        }
        let header = Header::Msg {
            type_name,
            body,
            frames: descriptors,
        };
        let mut head = Vec::with_capacity(body.len() + 64);
        encode_header_into(&header, &mut head);
        // The exact header against what the receiver accepts (spec §9): not sent, nothing kept.
        if let Err(reason) = limits.check_outgoing(head.len() - 4, std::iter::empty()) {
            self.release(&leased);
            return Err(Error::Unsendable {
                type_name: type_name.to_string(),
                peer: label.to_string(),
                reason: Box::new(reason),
            });
        }
        let fds: Vec<_> = passing.iter().map(|(_, fd)| fd.as_fd()).collect();
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

    async fn plan_frames(
        &self,
        frames: Vec<Planned>,
        descriptors: &mut Vec<Descriptor>,
        inline: &mut Vec<Buffer>,
        passing: &mut Vec<(Held, PassFd)>,
        leased: &mut Vec<u64>,
        label: &str,
    ) -> Result<()> {
        for planned in frames {
            let frame = match planned {
                Planned::Ticket(claim) => {
                    descriptors.push(Descriptor::Ticket(claim));
                    continue;
                }
                Planned::Bytes(frame) => frame,
            };
            // One read takes at most MAX_FDS_PER_READ descriptors: frames past that go inline.
            // A received segment can be passed on only while its descriptor is kept.
            let origin = shm::origin_of(&frame);
            let pass = origin.and_then(ShmOrigin::pass_fd);
            let route = route_frame(
                frame.len(),
                pass.is_some(),
                origin.is_some_and(|o| o.sealed()),
                passing.len(),
                crate::unix::MAX_FDS_PER_READ,
                self.threshold,
                self.sealed,
            );
            let shared = match route {
                FrameRoute::Segment => Some((Held::Buffer(frame.clone()), pass.expect("route_frame checked it"))),
                FrameRoute::CopySealed => {
                    let copy =
                        Arc::new(shm::sealed_copy(&frame).map_err(|e| Error::io("copying into a sealed segment", e))?);
                    Some((Held::Sealed(copy.clone()), PassFd::Sealed(copy)))
                }
                FrameRoute::CopyIn => {
                    let copy = shm::copy_in(&frame).map_err(|e| Error::io("copying into shared memory", e))?;
                    let fd = shm::origin_of(&copy)
                        .and_then(ShmOrigin::pass_fd)
                        .expect("a segment of our pool");
                    Some((Held::Buffer(copy), fd))
                }
                FrameRoute::Inline => None,
            };
            match shared {
                Some((held, fd)) => {
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
                    // Registered before sending: the release may come back at once.
                    let lease = self.lease(&held, label).await?;
                    leased.push(lease);
                    descriptors.push(Descriptor::Shm {
                        len: held.bytes() as u64,
                        offset: offset as u64,
                        size: size as u64,
                        lease,
                        sealed,
                    });
                    passing.push((held, fd));
                }
                None => {
                    descriptors.push(Descriptor::Inline {
                        len: frame.len() as u64,
                    });
                    inline.push(frame);
                }
            }
        }
        Ok(())
    }
}

impl Held {
    fn clone_handle(&self) -> Held {
        match self {
            Held::Buffer(b) => Held::Buffer(b.clone()),
            Held::Sealed(s) => Held::Sealed(s.clone()),
        }
    }
}

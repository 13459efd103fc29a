//! What an established connection decides about what it receives (spec §9, §11.2 steps
//! 3–6), with no I/O: a driver reads a header, asks here what it means and what to do next
//! (take room, read or map frames, answer a ticket request, read or skip a `pulled`), does
//! it, and comes back with the next header.
//!
//! The order of a message is fixed by the spec and kept here: the length prefix against the
//! header limit; room for a large header before it is read; the header's decoding and its
//! type; the frames' kinds against the channel; room for the whole message before any frame
//! is read or mapped; exactly the announced descriptors; no descriptor left over.

use handoff_wire::framing::{
    header_len, inline_frame_lengths, LEN_PREFIX, TCP_KINDS, UNIX_KINDS, UNIX_KINDS_WITH_CUDA,
};
use handoff_wire::{Descriptor, Header, Limits, TicketClaim, TicketOp, WireError};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::bounds::{MESSAGE_OVERHEAD, SMALL_HEADER};

/// What a connection knows when it plans: its limits and whether it carries shared memory.
#[derive(Debug, Clone, Copy)]
pub struct Receiving {
    /// The limits of an established connection.
    pub limits: Limits,
    /// Whether the connection is a Unix socket that carries `shm` frames and `release`s.
    pub shared_memory: bool,
    /// Whether, on a Unix socket, it carries `cuda` frames too: this node announced `cuda`
    /// (spec §7.10).
    pub device_memory: bool,
}

/// A message that passed every check of its header, and what reading it takes.
#[derive(Debug)]
pub struct MessagePlan<'h> {
    /// The message's type name, known to the node's registry.
    pub type_name: &'h str,
    /// The body's bytes (within the header).
    pub body: &'h [u8],
    /// The frames' descriptors, in order.
    pub frames: Vec<Descriptor>,
    /// Each frame's bytes on the stream after the header, in order (0 for a frame that is
    /// not inline).
    pub inline_lengths: Vec<u64>,
    /// Descriptors the message must have brought (its `shm` frames).
    pub descriptors: usize,
    /// Room the message takes in the receive budget besides its header: its frames' bytes
    /// (tickets not yet redeemed count nothing) and the fixed overhead of every message.
    pub room: u64,
    /// Whether it carries a ticket the node redeems before delivery when it redeems eagerly
    /// (lazy tickets wait for use).
    pub eager_tickets: bool,
    /// The bytes of those tickets: the room their redemption takes before it pulls them
    /// (spec §9.1, `budget::Permit::try_expand_ahead`).
    pub eager_ticket_bytes: u64,
}

/// What a header asks of the connection.
#[derive(Debug)]
pub enum Step<'h> {
    /// A message to read and deliver.
    Message(MessagePlan<'h>),
    /// A ticket request or answer.
    Ticket(TicketOp),
    /// The peer dropped its last view of these shared-memory leases of ours.
    Release(Vec<u64>),
    /// The peer closes the connection with this error; it is not answered.
    PeerRefused {
        /// The peer's error code.
        code: String,
        /// The peer's explanation.
        message: String,
    },
}

impl Receiving {
    /// A connection on TCP (`shared_memory` false) or on a Unix socket.
    pub fn new(limits: Limits, shared_memory: bool) -> Receiving {
        Receiving {
            limits,
            shared_memory,
            device_memory: false,
        }
    }

    /// The same, taking `cuda` frames on a Unix socket if `announced` (this node announced
    /// `cuda`, spec §7.10).
    pub fn with_device_memory(self, announced: bool) -> Receiving {
        Receiving {
            device_memory: announced && self.shared_memory,
            ..self
        }
    }

    /// The frame kinds this connection takes.
    pub fn kinds(&self) -> &'static [&'static str] {
        if self.device_memory {
            UNIX_KINDS_WITH_CUDA
        } else if self.shared_memory {
            UNIX_KINDS
        } else {
            TCP_KINDS
        }
    }

    /// The next header's length from its prefix, checked against the header limit.
    pub fn header_len(&self, prefix: [u8; LEN_PREFIX]) -> Result<usize, WireError> {
        header_len(prefix, &self.limits)
    }

    /// Room a header of `len` bytes takes before it is read: a large one waits for room,
    /// so that the connection waits, not the node (small ones are bounded by the
    /// connection count).
    pub fn header_room(&self, len: usize) -> Option<u64> {
        (len as u64 > SMALL_HEADER).then_some(len as u64)
    }

    /// What `bytes`, a whole header, asks of the connection. `known_type` is the node's
    /// registry check of a message's type name.
    pub fn plan<'h>(
        &self,
        bytes: &'h [u8],
        known_type: impl FnOnce(&str) -> Result<(), WireError>,
    ) -> Result<Step<'h>, WireError> {
        match Header::decode(bytes, &self.limits)? {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                known_type(type_name)?;
                let inline_lengths = inline_frame_lengths(&frames, self.kinds())?;
                let frame_bytes: u64 = frames
                    .iter()
                    // (Tickets and device memory put no byte on the stream or in our memory.)
                    .filter(|d| !matches!(d, Descriptor::Ticket(_) | Descriptor::Cuda(_)))
                    .map(Descriptor::len)
                    .sum();
                let descriptors = frames.iter().filter(|d| matches!(d, Descriptor::Shm { .. })).count();
                let eager = || {
                    frames
                        .iter()
                        .filter(|d| matches!(d, Descriptor::Ticket(TicketClaim { lazy: false, .. })))
                };
                let (eager_tickets, eager_ticket_bytes) =
                    (eager().next().is_some(), eager().map(Descriptor::len).sum());
                Ok(Step::Message(MessagePlan {
                    type_name,
                    body,
                    frames,
                    inline_lengths,
                    descriptors,
                    room: frame_bytes + MESSAGE_OVERHEAD,
                    eager_tickets,
                    eager_ticket_bytes,
                }))
            }
            Header::Ticket(op) => Ok(Step::Ticket(op)),
            Header::Release { leases } if self.shared_memory => Ok(Step::Release(leases)),
            Header::Release { .. } => Err(WireError::Handshake(
                "a release on a connection without shared memory".into(),
            )),
            Header::Error { code, message } => Ok(Step::PeerRefused { code, message }),
            other => Err(WireError::Handshake(format!(
                "unexpected {:?} after the handshake",
                other.kind()
            ))),
        }
    }
}

/// The descriptors a message announced against those that arrived with it (spec §7.2): too
/// few fails the connection. (Too many is [`stray_descriptors`]'s check once its frames
/// were read.)
pub fn check_descriptors(announced: usize, arrived: usize) -> Result<(), WireError> {
    if arrived < announced {
        return Err(WireError::BadShm(format!(
            "the message announces {announced} shared segments, but fewer descriptors arrived"
        )));
    }
    Ok(())
}

/// Descriptors still pending after a message's frames, when no byte of a next message is
/// buffered (which may have brought them): nothing announced them, and the connection fails.
pub fn stray_descriptors(pending: usize, buffered_bytes: usize) -> Result<(), WireError> {
    if pending > 0 && buffered_bytes == 0 {
        return Err(WireError::BadShm(format!(
            "{pending} descriptors arrived that no header announced"
        )));
    }
    Ok(())
}

/// Whether a driver, after an established connection failed with `error` and it sent the
/// peer that error, reads and drops what the peer still sends before closing (§11.3), so
/// that the error is not reset away: not after a timeout, since a silent peer would only
/// hold the connection longer.
pub fn drain_after(error: &WireError) -> bool {
    !matches!(error, WireError::Timeout(_))
}

/// How often a connection that waits for room looks again whether this node's own ticket
/// requests wait on it: they change [`room_slack`] without the budget being told.
pub const ROOM_RECHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// How much a connection's bounds are raised while it waits for room: while this node
/// waits for answers to its own ticket requests on it (those answers may lie behind the
/// waiting message, spec §9.1), by one per-peer bound and by the `tickets` bytes of that
/// peer's tickets already taken ahead of their pull (a ticket admitted alone may be larger
/// than the bound: its answer must still get through); else not at all.
pub fn room_slack(asking: bool, max_per_peer: u64, tickets: u64) -> u64 {
    if asking {
        max_per_peer.saturating_add(tickets)
    } else {
        0
    }
}

/// Messages of one connection that wait for their tickets to be redeemed before delivery,
/// and the messages queued behind them to keep their order: how many, and the room in the
/// receive budget those behind the one being redeemed hold (which its redemption leaves
/// them: `Permit::try_expand_ahead`). A driver redeems them one at a time, in order; the
/// counts are shared between the connection's reader and that redemption, without a lock.
#[derive(Debug, Default)]
pub struct Redemptions {
    queued: AtomicUsize,
    room_behind: AtomicU64,
}

impl Redemptions {
    /// Whether messages wait: a message that arrives now queues behind them, tickets or not.
    pub fn busy(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    /// A message that holds `room` joined the queue.
    pub fn queued(&self, room: u64) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.room_behind.fetch_add(room, Ordering::AcqRel);
    }

    /// A queued message could not be handed on after all: as if it never came.
    pub fn withdrawn(&self, room: u64) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
        self.room_behind.fetch_sub(room, Ordering::AcqRel);
    }

    /// The first queued message, holding `room`, is being redeemed: its room is no longer
    /// behind it.
    pub fn started(&self, room: u64) {
        self.room_behind.fetch_sub(room, Ordering::AcqRel);
    }

    /// The message being redeemed was delivered (or given up).
    pub fn finished(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    /// The room the messages queued behind the one being redeemed hold.
    pub fn room_behind(&self) -> u64 {
        self.room_behind.load(Ordering::Acquire)
    }
}

/// A request of ours waiting on the connection, as a `pulled` answer is checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// For a pull, the bytes asked for; `None` for a forward.
    pub len: Option<u64>,
    /// Whether the pulled bytes are hashed as they arrive.
    pub hash: bool,
}

/// What to do with a `pulled` answer of `len` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pulled {
    /// Read the bytes (hashing them if asked) and hand them to the request.
    Read {
        /// Hash while reading.
        hash: bool,
    },
    /// Read past the bytes without keeping them, and tell the request what came instead.
    Mismatch(String),
    /// Read past the bytes and drop them: nobody waits (late, or never asked, spec §6.7).
    Drop,
}

/// Checks a `pulled` answer against the request waiting for it: only exactly the bytes a
/// pull asked for are read into memory (spec §9.1).
pub fn pulled(waiting: Option<Asked>, len: u64) -> Pulled {
    match waiting {
        Some(Asked { len: Some(asked), hash }) if asked == len => Pulled::Read { hash },
        Some(Asked { len: Some(asked), .. }) => Pulled::Mismatch(format!("answered {len} bytes to a pull of {asked}")),
        Some(Asked { len: None, .. }) => Pulled::Mismatch(format!("answered a forward with {len} bytes")),
        None => Pulled::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_queue_behind_a_redemption_with_their_room() {
        let r = Redemptions::default();
        assert!(!r.busy());
        r.queued(10);
        r.queued(20);
        r.queued(5);
        r.withdrawn(5);
        assert!(r.busy());
        r.started(10);
        assert_eq!(r.room_behind(), 20);
        r.finished();
        r.started(20);
        assert_eq!(r.room_behind(), 0);
        assert!(r.busy());
        r.finished();
        assert!(!r.busy());
    }
    use handoff_wire::framing::encode_header_into;

    fn header(h: &Header<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header_into(h, &mut out);
        out.split_off(4)
    }

    fn msg(frames: Vec<Descriptor>) -> Vec<u8> {
        header(&Header::Msg {
            type_name: "t",
            body: &[0x90],
            frames,
        })
    }

    #[test]
    fn a_message_is_planned_with_its_room_and_descriptors() {
        let unix = Receiving::new(Limits::DEFAULT, true);
        let bytes = msg(vec![
            Descriptor::Inline { len: 10 },
            Descriptor::Shm {
                len: 100,
                offset: 0,
                size: 4096,
                lease: 1,
                sealed: false,
            },
        ]);
        let Step::Message(plan) = unix.plan(&bytes, |_| Ok(())).unwrap() else {
            panic!("a message")
        };
        assert_eq!(plan.inline_lengths, [10, 0]);
        assert_eq!(plan.descriptors, 1);
        assert_eq!(plan.room, 110 + MESSAGE_OVERHEAD);
        assert!(!plan.eager_tickets);
        let tcp = Receiving::new(Limits::DEFAULT, false);
        assert_eq!(
            tcp.plan(&bytes, |_| Ok(())).unwrap_err().code(),
            "unsupported-descriptor",
            "no shm on tcp"
        );
    }

    #[test]
    fn the_type_is_checked_before_the_frames() {
        let r = Receiving::new(Limits::DEFAULT, false);
        let bytes = msg(vec![Descriptor::Inline { len: 1 }]);
        let err = r
            .plan(&bytes, |t| {
                Err(WireError::UnknownType {
                    name: t.into(),
                    known: String::new(),
                })
            })
            .unwrap_err();
        assert_eq!(err.code(), "unknown-type");
    }

    #[test]
    fn releases_only_with_shared_memory_and_no_handshake_after_it() {
        let release = header(&Header::Release { leases: vec![1, 2] });
        assert!(matches!(
            Receiving::new(Limits::DEFAULT, true).plan(&release, |_| Ok(())),
            Ok(Step::Release(l)) if l == [1, 2]
        ));
        let tcp = Receiving::new(Limits::DEFAULT, false);
        assert_eq!(tcp.plan(&release, |_| Ok(())).unwrap_err().code(), "handshake");
        assert_eq!(
            tcp.plan(&header(&Header::Ready), |_| Ok(())).unwrap_err().code(),
            "handshake"
        );
    }

    #[test]
    fn large_headers_take_room_and_descriptors_are_counted() {
        let r = Receiving::new(Limits::DEFAULT, true);
        assert_eq!(r.header_room(100), None);
        assert_eq!(r.header_room(SMALL_HEADER as usize + 1), Some(SMALL_HEADER + 1));
        assert!(check_descriptors(2, 1).is_err());
        assert!(check_descriptors(2, 2).is_ok());
        assert!(stray_descriptors(1, 0).is_err());
        assert!(stray_descriptors(1, 5).is_ok(), "the next message may have brought it");
        assert_eq!(room_slack(true, 7, 0), 7);
        assert_eq!(room_slack(true, 7, 100), 107);
        assert_eq!(room_slack(false, 7, 100), 0);
    }

    #[test]
    fn a_pulled_answer_is_read_only_when_it_is_what_was_asked() {
        let pull = Some(Asked {
            len: Some(10),
            hash: true,
        });
        assert_eq!(pulled(pull, 10), Pulled::Read { hash: true });
        assert!(matches!(pulled(pull, 11), Pulled::Mismatch(w) if w.contains("pull of 10")));
        let forward = Some(Asked { len: None, hash: false });
        assert!(matches!(pulled(forward, 3), Pulled::Mismatch(w) if w.contains("forward")));
        assert_eq!(pulled(None, 3), Pulled::Drop);
    }
}

//! The sending side of a message, with no I/O: how each frame travels on a same-host
//! connection (inline, as a ticket, or as a range of a shared segment, copied into one if
//! the route says so), and the message's header with each shared frame's lease, checked
//! against what the receiver accepts (spec §7, §9).
//!
//! A driver plans the frames ([`Planned`]), routes them one by one ([`Router`]), takes a
//! lease for each [`Routed::Shared`] frame before it routes the next (it may have to wait
//! for the peer to release some),
//! writes [`message_head`] with the segments' descriptors attached to its first byte, then
//! the inline frames.

use std::sync::Arc;

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Descriptor, DeviceClaim, Header, Limits, TicketClaim, WireError};

use crate::shm::buffers::{copy_with, origin_of, CopyInto, Held, PassFd};
use crate::shm::leases::{route_frame, FrameRoute};
use crate::shm::sealed_copy;

/// Most leases one `release` message ends: a driver batches the releases waiting and sends
/// at most this many at once, so that the header (at most 9 bytes a lease) stays well under
/// the size for which a receiver takes room before reading ([`crate::bounds::SMALL_HEADER`]).
pub const MAX_RELEASES_PER_MESSAGE: usize = 4096;

/// A frame after the ticket policy: its bytes, or a ticket for them.
pub enum Planned {
    /// The bytes travel with the message.
    Bytes(Buffer),
    /// A ticket travels instead; the receiver pulls the bytes.
    Ticket(TicketClaim),
    /// Device memory leased to the receiver travels as its IPC handle (spec §7.10).
    Device(DeviceClaim),
}

/// A frame routed for a same-host connection.
pub enum Routed {
    /// Written on the stream after the header.
    Inline(Buffer),
    /// A ticket, in the header.
    Ticket(TicketClaim),
    /// Device memory, in the header (spec §7.10).
    Device(DeviceClaim),
    /// A range of a shared segment: its descriptor rides with the header, and the sender
    /// keeps `held` alive under a lease until the peer releases it.
    Shared {
        /// What the lease keeps alive.
        held: Held,
        /// The segment's descriptor, open while it is passed.
        fd: PassFd,
        /// Where the frame starts in the segment.
        offset: usize,
        /// The segment's size.
        size: usize,
        /// Whether the segment is sealed.
        sealed: bool,
    },
}

/// How a same-host connection routes frames.
#[derive(Debug, Clone, Copy)]
pub struct ShmRouting {
    /// Frames at least this large go through shared memory.
    pub threshold: usize,
    /// Send only sealed segments (a fresh memfd sealed against change).
    pub sealed_only: bool,
    /// Most descriptors one message may carry (one read takes at most this many): frames
    /// past it go inline.
    pub max_fds: usize,
    /// How a frame is copied into a segment of the pool.
    pub copy: CopyInto,
}

/// Why a frame could not be routed: copying it into shared memory failed.
#[derive(Debug)]
pub struct CopyFailed {
    /// What was being done.
    pub what: &'static str,
    /// The system's error.
    pub source: std::io::Error,
}

/// Routes each frame of a message for a same-host connection ([`Router::route`], in order).
pub fn route_frames(frames: Vec<Planned>, routing: &ShmRouting) -> Result<Vec<Routed>, CopyFailed> {
    let mut router = Router::new(*routing);
    frames.into_iter().map(|frame| router.route(frame)).collect()
}

/// Routes the frames of one message, one at a time, so that a sender can take each shared
/// frame's lease (and wait for room) before it copies the next one.
pub struct Router {
    routing: ShmRouting,
    /// Descriptors the message carries so far.
    passing: usize,
}

impl Router {
    /// A router for one message.
    pub fn new(routing: ShmRouting) -> Router {
        Router { routing, passing: 0 }
    }

    /// Routes the message's next frame. A frame already in a segment whose descriptor we
    /// can pass goes as that segment; a large one elsewhere is copied into a segment of the
    /// pool (or a sealed copy, if only sealed segments may be sent); the rest go inline.
    pub fn route(&mut self, planned: Planned) -> Result<Routed, CopyFailed> {
        let frame = match planned {
            Planned::Ticket(claim) => return Ok(Routed::Ticket(claim)),
            Planned::Device(claim) => return Ok(Routed::Device(claim)),
            Planned::Bytes(frame) => frame,
        };
        let routing = &self.routing;
        // A received segment can be passed on only while its descriptor is kept.
        let origin = origin_of(&frame);
        let pass = origin.and_then(|o| o.pass_fd());
        let route = route_frame(
            frame.len(),
            pass.is_some(),
            origin.is_some_and(|o| o.sealed()),
            self.passing,
            routing.max_fds,
            routing.threshold,
            routing.sealed_only,
        );
        let (held, fd) = match route {
            FrameRoute::Inline => return Ok(Routed::Inline(frame)),
            FrameRoute::Segment => (Held::Buffer(frame), pass.expect("route_frame checked it")),
            FrameRoute::CopySealed => {
                let copy = Arc::new(sealed_copy(&frame).map_err(|source| CopyFailed {
                    what: "copying into a sealed segment",
                    source,
                })?);
                (Held::Sealed(copy.clone()), PassFd::Sealed(copy))
            }
            FrameRoute::CopyIn => {
                let copy = copy_with(&frame, routing.copy).map_err(|source| CopyFailed {
                    what: "copying into shared memory",
                    source,
                })?;
                let fd = origin_of(&copy)
                    .and_then(|o| o.pass_fd())
                    .expect("a segment of our pool");
                (Held::Buffer(copy), fd)
            }
        };
        let (offset, size, sealed) = match &held {
            Held::Buffer(b) => {
                let o = origin_of(b).expect("a shared buffer has its origin");
                (
                    o.offset_of(b).expect("a view lies in its segment"),
                    o.size(),
                    o.sealed(),
                )
            }
            Held::Sealed(s) => (0, s.size, true),
        };
        self.passing += 1;
        Ok(Routed::Shared {
            held,
            fd,
            offset,
            size,
            sealed,
        })
    }
}

/// Routes every frame inline (a connection without shared memory).
pub fn inline_routes(frames: Vec<Planned>) -> Vec<Routed> {
    frames
        .into_iter()
        .map(|p| match p {
            Planned::Bytes(b) => Routed::Inline(b),
            Planned::Ticket(claim) => Routed::Ticket(claim),
            Planned::Device(claim) => Routed::Device(claim),
        })
        .collect()
}

/// What goes on the stream after the header of a routed message: the descriptors that
/// ride with its first byte (in the order of its frames), and the inline frames' bytes.
pub fn stream_parts(routed: Vec<Routed>) -> (Vec<PassFd>, Vec<bytes::Bytes>) {
    let mut fds = Vec::new();
    let mut inline = Vec::new();
    for r in routed {
        match r {
            Routed::Inline(b) => inline.push(b.into_bytes()),
            Routed::Shared { fd, .. } => fds.push(fd),
            Routed::Ticket(_) | Routed::Device(_) => {}
        }
    }
    (fds, inline)
}

/// The whole header of a message whose frames were routed, the shared ones with their
/// `leases` in order, checked against `limits` (spec §9: what a conforming receiver would
/// refuse is not sent).
pub fn message_head(
    type_name: &str,
    body: &[u8],
    routed: &[Routed],
    leases: &[u64],
    limits: &Limits,
) -> Result<Vec<u8>, WireError> {
    let mut leases = leases.iter();
    let frames = routed
        .iter()
        .map(|r| match r {
            Routed::Inline(b) => Descriptor::Inline { len: b.len() as u64 },
            Routed::Ticket(claim) => Descriptor::Ticket(claim.clone()),
            Routed::Device(claim) => Descriptor::Cuda(claim.clone()),
            Routed::Shared {
                held,
                offset,
                size,
                sealed,
                ..
            } => Descriptor::Shm {
                len: held.bytes() as u64,
                offset: *offset as u64,
                size: *size as u64,
                lease: *leases.next().expect("a lease for each shared frame"),
                sealed: *sealed,
            },
        })
        .collect();
    let header = Header::Msg {
        type_name,
        body,
        frames,
    };
    let mut head = Vec::with_capacity(body.len() + 64);
    encode_header_into(&header, &mut head);
    limits.check_outgoing(head.len() - 4, std::iter::empty())?;
    Ok(head)
}

/// The leases this node issued for a message's planned frames, as `(lease, token)`: its own
/// tickets (`me` is its node id; a ticket it forwards is leased by its owner) and its leased
/// device memory. A send that fails before the message is written withdraws them
/// ([`LeaseTable::withdraw`](crate::ticket_leases::LeaseTable::withdraw)).
pub fn issued_leases(planned: &[Planned], me: &str) -> Vec<(u64, Vec<u8>)> {
    planned
        .iter()
        .filter_map(|p| match p {
            Planned::Ticket(claim) if claim.owner == me => Some((claim.lease, claim.token.clone())),
            Planned::Device(claim) => Some((claim.lease, claim.token.clone())),
            Planned::Ticket(_) | Planned::Bytes(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::framing::header_len;

    fn routing(threshold: usize, sealed_only: bool, max_fds: usize) -> ShmRouting {
        ShmRouting {
            threshold,
            sealed_only,
            max_fds,
            copy: CopyInto::Mapping,
        }
    }

    fn kinds(routed: &[Routed]) -> Vec<&'static str> {
        routed
            .iter()
            .map(|r| match r {
                Routed::Inline(_) => "inline",
                Routed::Ticket(_) => "ticket",
                Routed::Device(_) => "cuda",
                Routed::Shared { sealed: true, .. } => "sealed",
                Routed::Shared { .. } => "shared",
            })
            .collect()
    }

    #[test]
    fn a_message_s_issued_leases_are_its_own_tickets_and_device_leases() {
        let claim = |owner: &str, lease: u64| TicketClaim {
            len: 1,
            owner: owner.into(),
            addr: None,
            lease,
            token: vec![lease as u8; 32],
            digest: handoff_wire::TicketDigest::Blake3([0; 32]),
            ttl_ms: 1000,
            lazy: false,
        };
        let device = DeviceClaim {
            len: 1,
            offset: 0,
            lease: 9,
            token: vec![9; 32],
            ipc: [0; 64],
            device: [0; 16],
        };
        let planned = [
            Planned::Bytes(Buffer::from(vec![1u8; 4])),
            Planned::Ticket(claim("me", 1)),
            Planned::Ticket(claim("other", 2)),
            Planned::Device(device),
        ];
        assert_eq!(
            issued_leases(&planned, "me"),
            [(1, vec![1; 32]), (9, vec![9; 32])],
            "a forwarded ticket's lease is its owner's"
        );
        assert!(issued_leases(&planned[..1], "me").is_empty());
    }

    #[test]
    fn a_full_release_message_is_a_small_header() {
        let mut head = Vec::new();
        let leases = vec![u64::MAX; MAX_RELEASES_PER_MESSAGE];
        encode_header_into(&Header::Release { leases }, &mut head);
        assert!(
            (head.len() as u64) < crate::bounds::SMALL_HEADER,
            "{} bytes",
            head.len()
        );
    }

    #[test]
    fn frames_go_inline_below_the_threshold_and_past_the_descriptor_bound() {
        let small = Planned::Bytes(Buffer::from(vec![1u8; 100]));
        let large = || Planned::Bytes(Buffer::from(vec![2u8; 200_000]));
        let routed = route_frames(vec![small, large(), large(), large()], &routing(65_536, false, 2)).unwrap();
        assert_eq!(kinds(&routed), ["inline", "shared", "shared", "inline"]);
        let Routed::Shared { held, offset, .. } = &routed[1] else {
            unreachable!()
        };
        assert_eq!((held.bytes(), *offset), (200_000, 0));
        let sealed = route_frames(vec![large()], &routing(65_536, true, 64)).unwrap();
        assert_eq!(kinds(&sealed), ["sealed"]);
    }

    #[test]
    fn a_frame_already_in_a_segment_is_passed_without_a_copy() {
        let mut buf = crate::shm::SharedBufMut::new(100).unwrap();
        buf.copy_from_slice(&[7; 100]);
        let frame = buf.freeze();
        let routed = route_frames(vec![Planned::Bytes(frame.clone())], &routing(65_536, false, 64)).unwrap();
        let [Routed::Shared {
            held: Held::Buffer(b), ..
        }] = &routed[..]
        else {
            panic!("shared")
        };
        assert_eq!(b.as_ptr(), frame.as_ptr(), "the same bytes, not a copy");
    }

    #[test]
    fn the_head_carries_each_lease_and_is_checked_against_the_limits() {
        let routed = route_frames(
            vec![
                Planned::Bytes(Buffer::from(vec![1u8; 10])),
                Planned::Bytes(Buffer::from(vec![2u8; 100_000])),
            ],
            &routing(65_536, false, 64),
        )
        .unwrap();
        let head = message_head("t", &[0x90], &routed, &[42], &Limits::DEFAULT).unwrap();
        let len = header_len(head[..4].try_into().unwrap(), &Limits::DEFAULT).unwrap();
        let Header::Msg { frames, .. } = Header::decode(&head[4..4 + len], &Limits::DEFAULT).unwrap() else {
            panic!("a msg")
        };
        assert!(matches!(frames[0], Descriptor::Inline { len: 10 }));
        assert!(matches!(
            frames[1],
            Descriptor::Shm {
                len: 100_000,
                lease: 42,
                ..
            }
        ));
        let tight = Limits {
            max_header_bytes: 8,
            ..Limits::DEFAULT
        };
        assert!(message_head("t", &[0x90], &routed, &[42], &tight).is_err());
    }
}

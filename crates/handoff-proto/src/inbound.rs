//! The receiving half of an established connection as a push-based state machine (spec §6,
//! §7, §9, §11.2), with no I/O.
//!
//! A driver reads the stream into [`Inbound::recv_space`] (large frames land in their own
//! buffer there, with no copy in between), tells the machine how many bytes came with
//! [`Inbound::received`], hands over the descriptors that arrived with
//! [`Inbound::handle_fds`], and then calls [`Inbound::poll`] until it says
//! [`Step::Read`]. Each other step is something to do:
//! - [`Step::Room`]: room is needed in the node's receive budget: call
//!   [`Inbound::try_take_room`] until it succeeds, waiting between tries for the budget's
//!   waker. Until then the machine offers no space to read into, so a connection that waits
//!   for room stops reading and its peer feels it. The room taken travels with the message
//!   ([`Incoming::permit`]), and room a large header took for anything else goes back;
//! - [`Step::CheckPulled`]: look up our own request a `pulled` answers, then
//!   [`Inbound::pulled_verdict`];
//! - [`Step::Event`]: something received (a message with its frames, a ticket request or
//!   answer, a release, the peer's error);
//! - [`Step::Closed`]: the peer ended the stream between messages.
//!
//! Time is an input too: inside a message every read must bring something within the
//! progress timeout ([`Inbound::poll_timeout`], [`Inbound::handle_timeout`]), counted from
//! the last read that did or from when the driver came back to `poll(now)` after a step;
//! between messages a connection may idle.
//!
//! Received segments are mapped in frame order when the driver gives the node's mapping
//! cache ([`Inbound::with_mappings`]); large `pulled` answers can be hashed by a driver's
//! [`HashBehind`] while they arrive ([`Inbound::with_hash_behind`]).
//!
//! The order of checks is [`crate::receive`]'s; this module only keeps the place in the
//! stream. Every error is final: the connection fails with it, and nothing else does.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use handoff_wire::framing::LEN_PREFIX;
use handoff_wire::{Descriptor, DeviceClaim, TicketClaim, TicketOp, WireError};

use crate::budget::{Account, Budget, Permit};
use crate::receive::{self, Pulled, Receiving};
use crate::recv_buffers::{PooledBuf, RecvPool, MIN_POOLED};
use crate::shm::{Mapping, MappingCache};
use crate::ticket_leases::{LeaseTable, OwnerAnswer};

/// Bytes read ahead at a time between large frames.
const READ_CHUNK: usize = 64 * 1024;

/// The most bytes a driver reads into large frames' buffers in one turn of its loop while
/// each read comes back short (see [`Inbound::turn_ends_after_read`]).
pub const READ_TURN_BYTES: usize = 16 << 20;
/// Most descriptors a peer may pass with one read (spec §7.2): a driver's receive buffer
/// for them holds this many, and more (the kernel truncating them) fails the connection.
/// So a sender puts at most this many `shm` descriptors in one message.
pub const MAX_FDS_PER_READ: usize = 64;
/// Most descriptors waiting, unclaimed, on one connection (spec §7.2: two messages' worth of
/// the 64 one read may bring).
pub const MAX_PENDING_FDS: usize = 2 * MAX_FDS_PER_READ;
/// Pulled bytes are hashed in runs of at least this much, so that blake3 uses its widest
/// SIMD.
const HASH_STEP: usize = 256 << 10;
/// Pulled answers at least this large are hashed by the driver's [`HashBehind`], if it
/// gave one, in runs of [`HASH_BEHIND_STEP`].
pub const HASH_BEHIND_MIN: usize = 8 << 20;
/// Bytes handed to a [`HashBehind`] at a time.
const HASH_BEHIND_STEP: usize = 1 << 20;

/// Hashes a large `pulled` answer away from the reads, while it arrives: a driver with
/// threads to spare runs the hash on a helper thread, so the reading thread goes straight
/// back to the socket and the hash is (almost) done when the last byte lands.
pub trait HashBehind: Send {
    /// The next bytes of the answer, in order. They stay in place and are not written
    /// again until this hasher is dropped, and after [`Event::Pulled`] for as long as the
    /// event's bytes live: a driver that keeps their address must be done with it (or
    /// drop the hasher) before it drops those bytes.
    fn arrived(&mut self, bytes: &[u8]);
    /// Waits until every byte handed over is hashed: the digest, or `None` if the hasher
    /// failed. It blocks (a helper is at most a few runs behind the last byte), so a driver
    /// calls it off its event loop, or with the interpreter let go.
    fn finish(self: Box<Self>) -> Option<[u8; 32]>;
}

/// A driver's maker of [`HashBehind`]s: `None` when it has none to give (the engine then
/// hashes inline).
pub type HashBehindMaker = Box<dyn Fn() -> Option<Box<dyn HashBehind>> + Send>;

/// The digest of a `pulled` answer.
pub enum Digest {
    /// Not asked for.
    None,
    /// Hashed by the engine.
    Hashed([u8; 32]),
    /// Hashed by the driver's [`HashBehind`], which has every byte: the driver waits for it.
    Behind(Box<dyn HashBehind>),
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Digest::None => write!(f, "None"),
            Digest::Hashed(d) => write!(f, "Hashed({})", hex::encode(d)),
            Digest::Behind(_) => write!(f, "Behind"),
        }
    }
}

/// The node's check of a message's type name against its registry.
pub type TypeCheck = Arc<dyn Fn(&str) -> Result<(), WireError> + Send + Sync>;

/// What the driver does next.
#[derive(Debug)]
pub enum Step {
    /// Read from the stream into [`Inbound::recv_space`].
    Read,
    /// Room for `bytes` (and `messages`) of this peer's is needed in the receive budget —
    /// the first time for a message a new permit, after that more room on the same one:
    /// call [`Inbound::try_take_room`] until it succeeds.
    Room {
        /// Bytes of room.
        bytes: u64,
        /// Messages of room (0 for a large header before its message is known).
        messages: usize,
    },
    /// A `pulled` answer arrived: check it against our request `req` with
    /// [`receive::pulled`] and hand the verdict to [`Inbound::pulled_verdict`].
    CheckPulled {
        /// Our request's id.
        req: u64,
        /// The bytes that follow.
        len: u64,
    },
    /// Something was received.
    Event(Event),
    /// The peer ended the stream between two messages.
    Closed,
}

/// Something an established connection received.
#[derive(Debug)]
pub enum Event {
    /// A whole message (its room was taken before any frame was read).
    Message(Incoming),
    /// A ticket request, or an answer other than `pulled` (requests come as
    /// [`Event::Owner`] instead when the engine answers them, [`Inbound::with_owner`]).
    Ticket(TicketOp),
    /// What this node, as the owner, does about a holder's ticket request: the answer to
    /// write back, or what to log.
    Owner {
        /// The holder's request.
        request: TicketOp,
        /// What the lease table made of it.
        answer: OwnerAnswer,
    },
    /// The bytes our pull `req` asked for, with their blake3 digest when it asked for one.
    /// (Keep the bytes until a [`Digest::Behind`] is done with them.)
    Pulled {
        /// Our request's id.
        req: u64,
        /// Their blake3 digest, when the request wanted it. (Before `bytes`, so that a
        /// [`Digest::Behind`] is dropped first when the event is.)
        digest: Digest,
        /// The bytes.
        bytes: Bytes,
    },
    /// A `pulled` that did not match what our request `req` asked for; its bytes were
    /// skipped.
    PulledMismatch {
        /// Our request's id.
        req: u64,
        /// What came instead.
        why: String,
    },
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

/// A received message.
#[derive(Debug)]
pub struct Incoming {
    /// Its type name, known to the node's registry.
    pub type_name: String,
    /// Its body.
    pub body: Bytes,
    /// Its frames, in order.
    pub frames: Vec<Frame>,
    /// Whether it carries a ticket to redeem before delivery when the node redeems eagerly.
    pub eager_tickets: bool,
    /// The bytes of those tickets: the room to take before pulling them
    /// ([`crate::budget::Permit::try_expand_ahead`]).
    pub eager_ticket_bytes: u64,
    /// The room it holds in the receive budget until the application takes it (`None`
    /// without [`Inbound::with_budget`]).
    pub permit: Option<Permit>,
}

/// One frame of a received message.
#[derive(Debug)]
pub enum Frame {
    /// Bytes that came on the stream.
    Bytes(Bytes),
    /// A range of a shared-memory segment, with the segment's descriptor, for the driver
    /// to map.
    Shm {
        /// The segment.
        fd: OwnedFd,
        /// The segment's size as the sender gave it.
        size: u64,
        /// Whether the sender sealed it.
        sealed: bool,
        /// Where the frame starts in the segment.
        offset: u64,
        /// The frame's length.
        len: u64,
        /// The sender's lease on it, released when the last view is dropped.
        lease: u64,
    },
    /// A range of a peer's segment, mapped here by the engine's mapping cache (see
    /// [`Inbound::with_mappings`]): the driver makes it a view that releases `lease` when
    /// its last copy is dropped.
    Mapped {
        /// The mapping.
        mapping: Arc<Mapping>,
        /// Where the frame starts in the mapping.
        at: usize,
        /// The frame's length.
        len: u64,
        /// The sender's lease on it.
        lease: u64,
    },
    /// A ticket to redeem from its owner.
    Ticket(TicketClaim),
    /// The sender's device memory (spec §7.10): the driver maps it through its IPC handle,
    /// or pulls its bytes from the sender under its lease.
    Device(DeviceClaim),
}

/// Bytes being collected for one item: in the read buffer while small, in a buffer of
/// their own (read into directly) when large.
enum Fill {
    Small { len: usize },
    Large { target: PooledBuf, filled: usize },
}

/// A message whose room is being taken or whose frames are being read.
struct Reading {
    type_name: String,
    body: Bytes,
    eager_tickets: bool,
    eager_ticket_bytes: u64,
    /// Descriptors the header announced (its `shm` frames).
    announced: usize,
    descriptors: std::vec::IntoIter<Descriptor>,
    inline_lengths: std::vec::IntoIter<u64>,
    /// The announced descriptors, once taken.
    fds: Option<std::vec::IntoIter<OwnedFd>>,
    frames: Vec<Frame>,
    current: Option<Fill>,
}

/// A `pulled` answer's bytes being read.
struct PulledBytes {
    /// First, so that it is dropped before `fill`: a driver's helper thread stops reading
    /// the buffer before the buffer goes back to the pool (fields drop in order).
    behind: Option<Box<dyn HashBehind>>,
    req: u64,
    fill: Fill,
    hasher: Option<Box<blake3::Hasher>>,
    hashed: usize,
}

enum State {
    /// Between items: the next length prefix.
    Prefix,
    /// A large header waits for its room before it is read.
    HeaderRoom { len: usize },
    /// A header of `len` bytes; `room` when its room was taken.
    Header { len: usize, room: bool },
    /// A decoded message waits for room for all of it.
    MessageRoom(Box<Reading>, u64),
    /// A message's frames are read.
    Frames(Box<Reading>),
    /// A `pulled` answer waits for the driver's verdict.
    PulledVerdict { req: u64, len: u64 },
    /// Pulled bytes are read.
    PulledRead(Box<PulledBytes>),
    /// `left` bytes of a `pulled` of `len` are skipped; a mismatch is reported at the end.
    Skip {
        len: u64,
        left: u64,
        mismatch: Option<(u64, String)>,
    },
    /// The stream ended, or the connection failed.
    Done,
}

/// The receiving half of one established connection.
pub struct Inbound {
    receiving: Receiving,
    known_type: TypeCheck,
    pool: RecvPool,
    progress_timeout: Duration,
    /// The read buffer: `buf[start..end]` was read and is not used yet. Its length is its
    /// capacity (zeroed once), so reads go into initialised memory.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Whether the last [`Inbound::recv_space`] was a large fill's own buffer.
    into_fill: bool,
    fds: VecDeque<OwnedFd>,
    state: State,
    eof: bool,
    /// When the last read brought something, or the driver's last answer came.
    last_progress: Option<Instant>,
    /// Whether the last [`Inbound::poll`] handed the driver something to act on.
    handed_out: bool,
    hash_behind: Option<HashBehindMaker>,
    mappings: Option<Arc<MappingCache>>,
    /// Map received frames private and writable (see [`Inbound::with_private_mappings`]).
    private_mappings: bool,
    /// The node's receive budget and this peer's account in it.
    budget: Option<(Arc<Budget>, Arc<Account>)>,
    /// The room taken for the item being read.
    permit: Option<Permit>,
    /// This node's ticket leases, to answer the peer's requests with.
    owner: Option<Owner>,
}

/// What the engine answers a holder's ticket requests with.
struct Owner {
    leases: Arc<LeaseTable>,
    /// The peer's node id.
    holder: String,
    /// Ours.
    me: String,
}

impl Inbound {
    /// The receiving half of a connection that has just finished its handshake, with the
    /// node's type check and receive buffers; `progress_timeout` is the most a peer may stay
    /// silent in the middle of a message (spec §9.1).
    pub fn new(receiving: Receiving, known_type: TypeCheck, pool: RecvPool, progress_timeout: Duration) -> Inbound {
        Inbound {
            receiving,
            known_type,
            pool,
            progress_timeout,
            buf: Vec::new(),
            start: 0,
            end: 0,
            into_fill: false,
            fds: VecDeque::new(),
            state: State::Prefix,
            eof: false,
            last_progress: None,
            handed_out: false,
            hash_behind: None,
            mappings: None,
            private_mappings: false,
            budget: None,
            permit: None,
            owner: None,
        }
    }

    /// The peer's ticket requests (pull, forward, release, renew) are answered here from
    /// this node's `leases` (spec §7.7): they come out as [`Event::Owner`]. `holder` is the
    /// peer's node id, `me` ours.
    pub fn with_owner(mut self, leases: Arc<LeaseTable>, holder: &str, me: &str) -> Inbound {
        self.owner = Some(Owner {
            leases,
            holder: holder.to_string(),
            me: me.to_string(),
        });
        self
    }

    /// Room is taken in the node's `budget`, on this peer's `account` (spec §9.1); without
    /// it (tests) room is always there and messages carry no permit.
    pub fn with_budget(mut self, budget: Arc<Budget>, account: Arc<Account>) -> Inbound {
        self.budget = Some((budget, account));
        self
    }

    /// Received segments are mapped here, through the node's `cache`, in frame order
    /// ([`Frame::Mapped`]); without it they come out as [`Frame::Shm`] for the driver.
    pub fn with_mappings(mut self, cache: Arc<MappingCache>) -> Inbound {
        self.mappings = Some(cache);
        self
    }

    /// With [`with_mappings`](Self::with_mappings): each received frame gets a private,
    /// writable (copy-on-write) mapping of its own ([`MappingCache::map_private`]), for a
    /// receiver that writes into what it receives without its writes reaching the sender.
    pub fn with_private_mappings(mut self, private: bool) -> Inbound {
        self.private_mappings = private;
        self
    }

    /// Large `pulled` answers (from [`HASH_BEHIND_MIN`]) are hashed by what `make` gives,
    /// while they arrive, instead of inline.
    pub fn with_hash_behind(mut self, make: HashBehindMaker) -> Inbound {
        self.hash_behind = Some(make);
        self
    }

    /// Bytes read and not used yet.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether the machine waits for bytes from the stream (and not for the driver).
    fn wants_bytes(&self) -> bool {
        !self.eof
            && matches!(
                self.state,
                State::Prefix | State::Header { .. } | State::Frames(_) | State::PulledRead(_) | State::Skip { .. }
            )
    }

    /// Whether some byte of an item arrived, so that silence counts against the peer.
    fn inside(&self) -> bool {
        !matches!(self.state, State::Prefix) || self.buffered() > 0
    }

    /// The bytes the item being read needs in the read buffer at once.
    fn item_need(&self) -> usize {
        match &self.state {
            State::Prefix => LEN_PREFIX,
            State::Header { len, .. } => *len,
            State::Frames(r) => match r.current {
                Some(Fill::Small { len }) => len,
                _ => 0,
            },
            State::PulledRead(p) => match p.fill {
                Fill::Small { len } => len,
                Fill::Large { .. } => 0,
            },
            _ => 0,
        }
    }

    /// Where the driver reads next: empty while the machine waits for the driver or is
    /// done. A large frame is read straight into its own buffer.
    pub fn recv_space(&mut self) -> &mut [u8] {
        self.into_fill = false;
        if !self.wants_bytes() {
            return &mut [];
        }
        if self.buffered() == 0 {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > 4 * READ_CHUNK {
                // A large header was read: its memory goes back.
                self.buf = Vec::new();
            }
            let large = match &self.state {
                State::Frames(r) => matches!(r.current, Some(Fill::Large { .. })),
                State::PulledRead(p) => matches!(p.fill, Fill::Large { .. }),
                _ => false,
            };
            if large {
                let fill = match &mut self.state {
                    State::Frames(r) => r.current.as_mut(),
                    State::PulledRead(p) => Some(&mut p.fill),
                    _ => None,
                };
                let Some(Fill::Large { target, filled }) = fill else {
                    unreachable!("checked above")
                };
                self.into_fill = true;
                let at = *filled;
                return target.tail_mut(at);
            }
        }
        let need = self.item_need().max(READ_CHUNK);
        if self.buf.len() - self.start < need || self.buf.len() - self.end < READ_CHUNK / 4 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    /// Whether the last [`recv_space`](Self::recv_space) was a large frame's own buffer. A
    /// read that does not fill it has not learnt that the socket is empty: the rest of the
    /// frame is on its way, and may have arrived while that read copied.
    pub fn filling_frame(&self) -> bool {
        self.into_fill
    }

    /// Whether a driver's turn of reading ends after a read of `got` bytes into the last
    /// [`recv_space`](Self::recv_space) (`space` bytes long), `read_this_turn` bytes read in
    /// this turn so far, this read included. A read that fills its space reads on. A short
    /// read into the shared read buffer found the socket empty: the turn ends (no read is
    /// spent to learn it again). A short read into a large frame's own buffer reads on (the
    /// rest may have come meanwhile, and one read more costs less than a turn of the loop)
    /// until [`READ_TURN_BYTES`] were read, so that one fast peer does not hold up the
    /// driver's other connections.
    pub fn turn_ends_after_read(&self, got: usize, space: usize, read_this_turn: usize) -> bool {
        got < space && (!self.into_fill || read_this_turn >= READ_TURN_BYTES)
    }

    /// `n` bytes were read into the last [`recv_space`](Self::recv_space), at `now`.
    pub fn received(&mut self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        self.last_progress = Some(now);
        if !self.into_fill {
            self.end += n;
            return;
        }
        match &mut self.state {
            State::Frames(r) => {
                if let Some(Fill::Large { filled, .. }) = &mut r.current {
                    *filled += n;
                }
            }
            State::PulledRead(p) => {
                if let Fill::Large { filled, .. } = &mut p.fill {
                    *filled += n;
                }
                p.hash_ready(false);
            }
            _ => {}
        }
    }

    /// The stream ended (a read returned nothing).
    pub fn handle_eof(&mut self) {
        self.eof = true;
    }

    /// One read of the socket into the last [`recv_space`](Self::recv_space), at `now`:
    /// `bytes` read (0 at the end of the stream), the descriptors that came with them, and
    /// whether more came than one read takes (the kernel closed the rest: the connection
    /// fails, spec §7.3).
    pub fn handle_read(
        &mut self,
        bytes: usize,
        fds: Vec<OwnedFd>,
        truncated: bool,
        now: Instant,
    ) -> Result<(), WireError> {
        if truncated {
            self.state = State::Done;
            let problem = format!(
                "descriptors passed with one read were cut off: more than {MAX_FDS_PER_READ} came, or this \
                 process has no descriptor left to take them (its RLIMIT_NOFILE)"
            );
            return Err(WireError::BadShm(problem));
        }
        self.handle_fds(fds)?;
        match bytes {
            0 => self.handle_eof(),
            n => self.received(n, now),
        }
        Ok(())
    }

    /// Descriptors that arrived on the socket, in order. More waiting than
    /// [`MAX_PENDING_FDS`] fails the connection (and closes them).
    pub fn handle_fds(&mut self, fds: impl IntoIterator<Item = OwnedFd>) -> Result<(), WireError> {
        self.fds.extend(fds);
        if self.fds.len() > MAX_PENDING_FDS {
            let n = self.fds.len();
            self.fds.clear();
            self.state = State::Done;
            return Err(WireError::BadShm(format!(
                "{n} descriptors wait unclaimed (at most {MAX_PENDING_FDS})"
            )));
        }
        Ok(())
    }

    /// Descriptors that arrived and no header claimed yet.
    pub fn pending_fds(&self) -> usize {
        self.fds.len()
    }

    /// When a silent peer times out: inside a message, the progress timeout after the last
    /// read that brought something; `None` between messages or while the driver decides.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.inside() || !self.wants_bytes() {
            return None;
        }
        self.last_progress.map(|t| t + self.progress_timeout)
    }

    /// Time passed: fails the connection if the peer was silent inside a message past the
    /// progress timeout.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), WireError> {
        match self.poll_timeout() {
            Some(at) if now >= at => {
                let what = self.what();
                self.state = State::Done;
                Err(WireError::Timeout(format!(
                    "the peer sent nothing for {:?} in the middle of a message (waiting for its {what})",
                    self.progress_timeout
                )))
            }
            _ => Ok(()),
        }
    }

    /// What is being read, for errors.
    fn what(&self) -> &'static str {
        match self.state {
            State::Prefix => "header length",
            State::Header { .. } => "header",
            State::Skip { .. } => "pulled bytes",
            _ => "frame",
        }
    }

    /// Bytes of this peer's tickets taken ahead of their pull (0 without a budget).
    pub fn ticket_bytes(&self) -> u64 {
        self.budget.as_ref().map_or(0, |(_, account)| account.ticket_bytes())
    }

    /// Tries to take the room [`Step::Room`] asked for, at `now`, with the bounds raised by
    /// `slack` ([`receive::room_slack`]); whether it was taken. If not, the driver waits for
    /// the budget's waker (or a moment, if its slack can change) and tries again.
    pub fn try_take_room(&mut self, slack: u64, now: Instant) -> bool {
        let (bytes, messages) = match self.state {
            State::HeaderRoom { len } => (len as u64, 0),
            State::MessageRoom(_, bytes) => (bytes, 1),
            _ => return true,
        };
        if let Some((budget, account)) = &self.budget {
            let taken = match self.permit.as_mut() {
                Some(permit) => permit.try_expand(bytes, messages, slack),
                None => {
                    self.permit = budget.try_acquire(account, bytes, messages, slack);
                    self.permit.is_some()
                }
            };
            if !taken {
                return false;
            }
        }
        self.last_progress = Some(now);
        self.state = match std::mem::replace(&mut self.state, State::Done) {
            State::HeaderRoom { len } => State::Header { len, room: true },
            State::MessageRoom(reading, _) => State::Frames(reading),
            other => other,
        };
        true
    }

    /// The driver's verdict on the `pulled` of [`Step::CheckPulled`], at `now`.
    pub fn pulled_verdict(&mut self, verdict: Pulled, now: Instant) {
        let State::PulledVerdict { req, len } = self.state else {
            return;
        };
        self.last_progress = Some(now);
        let verdict = match (verdict, usize::try_from(len)) {
            (Pulled::Read { .. }, Err(_)) => Pulled::Mismatch(format!("{len} bytes do not fit this machine's memory")),
            (v, _) => v,
        };
        self.state = match verdict {
            Pulled::Read { hash } => State::PulledRead(Box::new(PulledBytes {
                req,
                fill: self.fill_for(len as usize),
                behind: match &self.hash_behind {
                    Some(make) if hash && len as usize >= HASH_BEHIND_MIN => make(),
                    _ => None,
                },
                hasher: hash.then(|| Box::new(blake3::Hasher::new())),
                hashed: 0,
            })),
            Pulled::Mismatch(why) => State::Skip {
                len,
                left: len,
                mismatch: Some((req, why)),
            },
            Pulled::Drop => State::Skip {
                len,
                left: len,
                mismatch: None,
            },
        };
    }

    fn fill_for(&self, len: usize) -> Fill {
        if len < MIN_POOLED {
            Fill::Small { len }
        } else {
            Fill::Large {
                target: self.pool.take(len),
                filled: 0,
            }
        }
    }

    /// An item (a message, a ticket request or answer, a release) was read whole: back
    /// between items, where descriptors no header claimed fail the connection unless a byte
    /// of the next item (which may have brought them) is buffered (spec §7.2).
    fn item_done(&mut self) -> Result<(), WireError> {
        receive::stray_descriptors(self.fds.len(), self.buffered())?;
        self.state = State::Prefix;
        Ok(())
    }

    /// Takes `n` buffered bytes.
    fn take(&mut self, n: usize) -> &[u8] {
        let at = self.start;
        self.start += n;
        &self.buf[at..at + n]
    }

    fn truncated(&mut self, what: &'static str, needed: u64, available: u64) -> WireError {
        self.state = State::Done;
        WireError::Truncated {
            what,
            needed,
            available,
        }
    }

    /// Moves buffered bytes of a large item into its own buffer (a small one stays in the
    /// read buffer until it is whole); the read buffer is left empty, or holds what follows.
    fn absorb(&mut self, fill: &mut Fill) {
        if let Fill::Large { target, filled } = fill {
            let n = self.buffered().min(target.len() - *filled);
            target.tail_mut(*filled)[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            *filled += n;
        }
    }

    /// Whether every byte of the item arrived.
    fn is_whole(&self, fill: &Fill) -> bool {
        match fill {
            Fill::Small { len } => self.buffered() >= *len,
            Fill::Large { target, filled } => *filled == target.len(),
        }
    }

    /// The bytes of an item [`is_whole`](Self::is_whole) said are all here.
    fn take_whole(&mut self, fill: Fill) -> Bytes {
        match fill {
            Fill::Small { len } => Bytes::copy_from_slice(self.take(len)),
            Fill::Large { target, .. } => target.freeze(),
        }
    }

    /// What to do next, at `now`; see the module's documentation. After an error the
    /// connection is over, and later calls say [`Step::Closed`].
    ///
    /// Silence counts from the last read that brought something, or from when the driver
    /// came back after acting on a step (a driver busy elsewhere does not time its peer out).
    pub fn poll(&mut self, now: Instant) -> Result<Step, WireError> {
        if std::mem::take(&mut self.handed_out) {
            self.last_progress = Some(now);
        }
        let step = self.next_step();
        if !matches!(step, Ok(Step::Read)) {
            self.handed_out = true;
        }
        match &step {
            Ok(Step::Event(Event::Message(_)))
            | Ok(Step::Read)
            | Ok(Step::Room { .. })
            | Ok(Step::CheckPulled { .. }) => {}
            // Room a large header took for something other than a message goes back, and
            // so does what a connection that ended or failed held.
            Ok(Step::Event(_)) | Ok(Step::Closed) | Err(_) => self.permit = None,
        }
        step
    }

    fn next_step(&mut self) -> Result<Step, WireError> {
        loop {
            match std::mem::replace(&mut self.state, State::Done) {
                State::Done => return Ok(Step::Closed),
                State::Prefix => {
                    // A new item: room left from the last one (a large header whose item
                    // ended with no event, such as a `pulled` nobody waited for) goes back.
                    self.permit = None;
                    if self.buffered() < LEN_PREFIX {
                        if !self.eof {
                            self.state = State::Prefix;
                            return Ok(Step::Read);
                        }
                        if self.buffered() == 0 {
                            return Ok(Step::Closed);
                        }
                        return Err(self.truncated("header length", LEN_PREFIX as u64, self.buffered() as u64));
                    }
                    let p = self.take(LEN_PREFIX);
                    let prefix = [p[0], p[1], p[2], p[3]];
                    let len = self.receiving.header_len(prefix)?;
                    if let Some(bytes) = self.receiving.header_room(len) {
                        self.state = State::HeaderRoom { len };
                        return Ok(Step::Room { bytes, messages: 0 });
                    }
                    self.state = State::Header { len, room: false };
                }
                State::HeaderRoom { len } => {
                    self.state = State::HeaderRoom { len };
                    return Ok(Step::Room {
                        bytes: len as u64,
                        messages: 0,
                    });
                }
                State::Header { len, room } => {
                    if self.buffered() < len {
                        if self.eof {
                            let available = (LEN_PREFIX + self.buffered()) as u64;
                            return Err(self.truncated("header", (LEN_PREFIX + len) as u64, available));
                        }
                        self.state = State::Header { len, room };
                        return Ok(Step::Read);
                    }
                    let header = if len > 4 * READ_CHUNK {
                        // A large header keeps the read buffer it was read into (its room
                        // was taken), and what follows it moves to a fresh small one.
                        let rest = self.buf[self.start + len..self.end].to_vec();
                        let whole = Bytes::from(std::mem::take(&mut self.buf));
                        let header = whole.slice(self.start..self.start + len);
                        self.buf = rest;
                        self.buf.resize(self.buf.len().max(READ_CHUNK), 0);
                        self.end = self.end - self.start - len;
                        self.start = 0;
                        header
                    } else {
                        Bytes::copy_from_slice(self.take(len))
                    };
                    return self.header(header, len, room);
                }
                State::MessageRoom(reading, bytes) => {
                    self.state = State::MessageRoom(reading, bytes);
                    return Ok(Step::Room { bytes, messages: 1 });
                }
                State::Frames(reading) => return self.frames(reading),
                State::PulledVerdict { req, len } => {
                    self.state = State::PulledVerdict { req, len };
                    return Ok(Step::CheckPulled { req, len });
                }
                State::PulledRead(mut pulled) => {
                    self.absorb(&mut pulled.fill);
                    if !self.is_whole(&pulled.fill) {
                        if self.eof {
                            let (needed, available) = pulled.fill.progress(self.buffered());
                            return Err(self.truncated("frame", needed, available));
                        }
                        pulled.hash_ready(false);
                        self.state = State::PulledRead(pulled);
                        return Ok(Step::Read);
                    }
                    // A large answer's last bytes go to its hasher; a small one is hashed
                    // whole below.
                    pulled.hash_ready(true);
                    let PulledBytes {
                        req,
                        behind,
                        hasher,
                        fill,
                        ..
                    } = *pulled;
                    let small = matches!(fill, Fill::Small { .. });
                    let bytes = self.take_whole(fill);
                    let digest = match (behind, hasher) {
                        (Some(behind), _) => Digest::Behind(behind),
                        (None, Some(mut h)) => {
                            if small {
                                h.update(&bytes);
                            }
                            Digest::Hashed(*h.finalize().as_bytes())
                        }
                        (None, None) => Digest::None,
                    };
                    self.item_done()?;
                    return Ok(Step::Event(Event::Pulled { req, bytes, digest }));
                }
                State::Skip { len, left, mismatch } => {
                    let n = (self.buffered() as u64).min(left);
                    self.start += n as usize;
                    let left = left - n;
                    if left > 0 {
                        if self.eof {
                            return Err(self.truncated("pulled bytes", len, len - left));
                        }
                        self.state = State::Skip { len, left, mismatch };
                        return Ok(Step::Read);
                    }
                    self.item_done()?;
                    if let Some((req, why)) = mismatch {
                        return Ok(Step::Event(Event::PulledMismatch { req, why }));
                    }
                }
            }
        }
    }

    /// A whole header, `room` when its own room was taken: the next state, and the driver's
    /// step.
    fn header(&mut self, header: Bytes, len: usize, room: bool) -> Result<Step, WireError> {
        let known_type = self.known_type.clone();
        let step = match self.receiving.plan(&header, |name| known_type(name))? {
            receive::Step::Message(plan) => {
                let bytes = plan.room + if room { 0 } else { len as u64 };
                let reading = Reading {
                    type_name: plan.type_name.to_string(),
                    body: header.slice_ref(plan.body),
                    eager_tickets: plan.eager_tickets,
                    eager_ticket_bytes: plan.eager_ticket_bytes,
                    announced: plan.descriptors,
                    descriptors: plan.frames.into_iter(),
                    inline_lengths: plan.inline_lengths.into_iter(),
                    fds: None,
                    frames: Vec::new(),
                    current: None,
                };
                self.state = State::MessageRoom(Box::new(reading), bytes);
                Step::Room { bytes, messages: 1 }
            }
            receive::Step::Ticket(TicketOp::Pulled { req, len }) => {
                self.state = State::PulledVerdict { req, len };
                Step::CheckPulled { req, len }
            }
            receive::Step::Ticket(op) => {
                self.item_done()?;
                let answered = self.owner.as_ref().and_then(|o| o.leases.answer(&op, &o.holder, &o.me));
                match answered {
                    Some(answer) => Step::Event(Event::Owner { request: op, answer }),
                    None => Step::Event(Event::Ticket(op)),
                }
            }
            receive::Step::Release(leases) => {
                self.item_done()?;
                Step::Event(Event::Release(leases))
            }
            receive::Step::PeerRefused { code, message } => Step::Event(Event::PeerRefused { code, message }),
        };
        Ok(step)
    }

    /// Reads a message's frames: [`Step::Read`] while bytes are missing, its event once whole.
    fn frames(&mut self, mut r: Box<Reading>) -> Result<Step, WireError> {
        if r.fds.is_none() {
            receive::check_descriptors(r.announced, self.fds.len())?;
            let fds: Vec<OwnedFd> = self.fds.drain(..r.announced).collect();
            r.frames.reserve_exact(r.descriptors.len());
            r.fds = Some(fds.into_iter());
        }
        loop {
            if let Some(mut fill) = r.current.take() {
                self.absorb(&mut fill);
                if !self.is_whole(&fill) {
                    if self.eof {
                        let (needed, available) = fill.progress(self.buffered());
                        return Err(self.truncated("frame", needed, available));
                    }
                    r.current = Some(fill);
                    self.state = State::Frames(r);
                    return Ok(Step::Read);
                }
                let bytes = self.take_whole(fill);
                r.frames.push(Frame::Bytes(bytes));
            }
            let (Some(desc), Some(inline)) = (r.descriptors.next(), r.inline_lengths.next()) else {
                self.item_done()?;
                return Ok(Step::Event(Event::Message(Incoming {
                    type_name: r.type_name,
                    body: r.body,
                    frames: r.frames,
                    eager_tickets: r.eager_tickets,
                    eager_ticket_bytes: r.eager_ticket_bytes,
                    permit: self.permit.take(),
                })));
            };
            match desc {
                Descriptor::Shm {
                    len,
                    offset,
                    size,
                    lease,
                    sealed,
                } => {
                    let fd = r.fds.as_mut().and_then(Iterator::next).expect("counted before");
                    // Mapped in frame order (spec §11.2 step 6): a bad segment fails before
                    // any later frame is read.
                    r.frames.push(match &self.mappings {
                        Some(cache) => {
                            let mapped = if self.private_mappings {
                                cache.map_private(fd, size, sealed, offset, len)
                            } else {
                                cache.map(fd, size, sealed, offset, len)
                            };
                            let (mapping, at) = mapped.map_err(|e| WireError::BadShm(e.0))?;
                            Frame::Mapped {
                                mapping,
                                at,
                                len,
                                lease,
                            }
                        }
                        None => Frame::Shm {
                            fd,
                            size,
                            sealed,
                            offset,
                            len,
                            lease,
                        },
                    });
                }
                Descriptor::Ticket(claim) => r.frames.push(Frame::Ticket(claim)),
                Descriptor::Cuda(claim) => r.frames.push(Frame::Device(claim)),
                _ if inline == 0 => r.frames.push(Frame::Bytes(Bytes::new())),
                _ => {
                    let len = usize::try_from(inline).map_err(|_| WireError::FrameTooLarge {
                        index: r.frames.len(),
                        len: inline,
                        limit: usize::MAX as u64,
                    })?;
                    r.current = Some(self.fill_for(len));
                }
            }
        }
    }
}

impl Fill {
    /// The bytes the item needs and those it has, for a truncation error.
    fn progress(&self, buffered: usize) -> (u64, u64) {
        match self {
            Fill::Small { len } => (*len as u64, buffered as u64),
            Fill::Large { target, filled } => (target.len() as u64, *filled as u64),
        }
    }
}

impl PulledBytes {
    /// Hashes what was read of a large answer in runs of at least [`HASH_STEP`], or all of
    /// it when `all`.
    fn hash_ready(&mut self, all: bool) {
        let Fill::Large { target, filled } = &self.fill else {
            return;
        };
        let step = if self.behind.is_some() {
            HASH_BEHIND_STEP
        } else {
            HASH_STEP
        };
        if *filled - self.hashed < step && !(all && *filled > self.hashed) {
            return;
        }
        let ready = target.range(self.hashed, *filled);
        match (self.behind.as_mut(), self.hasher.as_mut()) {
            (Some(b), _) => b.arrived(ready),
            (None, Some(h)) => {
                h.update(ready);
            }
            (None, None) => return,
        }
        self.hashed = *filled;
    }
}

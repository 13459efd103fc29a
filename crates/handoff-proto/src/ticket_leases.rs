//! The owner's side of tickets: leases on buffers that holders pull from us.
//!
//! A lease keeps a buffer alive for its holders, each with its own token and deadline.
//! A holder's hold ends when it releases (`unlease`), when its deadline passes without a
//! renewal, or when its connection to us is lost; the buffer is freed when the last hold
//! ends — never earlier. Caps on the bytes pinned (in total and per peer) give
//! backpressure: issuing waits for room, or fails, as configured. The table itself never
//! waits: [`LeaseTable::try_issue`] says why there is no room, and a driver that waits
//! (per [`WhenFull`]) asks again once [`LeaseTable::generation`] changed or its waker ran.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use handoff_wire::{Buffer, TicketDigest};

use crate::budget::Waker;

/// A source of the time.
pub type Clock = Box<dyn Fn() -> Instant + Send + Sync>;

/// What a node does when a new lease would exceed its caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait up to this long for leases to end, then fail.
    Wait(Duration),
    /// Fail at once.
    Fail,
}

/// Limits and timing of the leases a node issues.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// How long a hold lasts without a renewal.
    pub ttl: Duration,
    /// Most bytes pinned by all leases together.
    pub max_bytes: u64,
    /// Most bytes pinned by leases issued to one peer.
    pub max_bytes_per_peer: u64,
    /// What to do when a cap is reached.
    pub when_full: WhenFull,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: Duration::from_secs(30),
            max_bytes: 16 << 30,
            max_bytes_per_peer: 8 << 30,
            when_full: WhenFull::Wait(Duration::from_secs(30)),
        }
    }
}

/// Why the owner refuses a pull, forward, renew or release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The `ticket-error` code (spec §7.7).
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

fn refuse(code: &'static str, message: String) -> Refusal {
    Refusal { code, message }
}

struct Hold {
    token: [u8; 32],
    deadline: Instant,
    /// Ended by its deadline: kept (with its token) while the lease lives, so that a late
    /// holder is told `expired` rather than `bad-token` (spec §7.7). Keeps nothing alive.
    expired: bool,
}

/// Device memory a lease keeps alive (a `cuda` frame, spec §7.10). The holder maps it
/// through its IPC handle; a holder that cannot pulls, and the owner copies the range asked
/// for to the host.
pub trait DeviceBytes: Send + Sync {
    /// Its length in bytes.
    fn len(&self) -> u64;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A host copy of `len` bytes from `offset` (a range inside it), or why it failed.
    fn copy_out(&self, offset: u64, len: u64) -> Result<Buffer, String>;
}

/// What a lease keeps alive.
enum Leased {
    /// Bytes in this process's memory.
    Host(Buffer),
    /// Device memory, and how many host copies of it are still held (being written to
    /// its holder): at most [`MAX_DEVICE_COPIES`].
    Device(Arc<dyn DeviceBytes>, Arc<std::sync::atomic::AtomicUsize>),
}

/// Host copies of one device lease that its holder's pulls may have in flight (spec §9.1):
/// each copy is as large as what it pulls, up to the whole lease, so a holder that pulled
/// again and again without reading would make its owner hold as many copies as the answers
/// queued for it (64). Two: a holder pulls one at a time, and a pull made just as the last
/// copy's answer arrived may find it not yet let go.
pub const MAX_DEVICE_COPIES: usize = 2;

/// A host copy of device memory that a pull asked for, still to be made: counted among its
/// lease's copies from the pull on (until the copy made is written, or this is dropped
/// unmade). Copying device memory can take long (a whole lease, over the bus), so a driver
/// makes it off its event loop ([`OwnerAnswer::CopyThenPull`]).
pub struct HostCopy {
    counted: Option<(Arc<dyn DeviceBytes>, Arc<std::sync::atomic::AtomicUsize>)>,
    lease: u64,
    offset: u64,
    len: u64,
}

impl HostCopy {
    /// Makes the copy: its bytes (counted among the lease's copies until their last handle
    /// is gone), or `device-error` if the device memory could not be read.
    pub fn make(mut self) -> Result<Buffer, Refusal> {
        // Counted until the copy is made: a copy that fails, or panics, gives its place
        // back as this is dropped.
        let (memory, _) = self.counted.as_ref().expect("made once");
        match memory.copy_out(self.offset, self.len) {
            Ok(copy) => {
                let (_, copies) = self.counted.take().expect("made once");
                Ok(Buffer::from(bytes::Bytes::from_owner(DeviceCopy {
                    bytes: copy.into_bytes(),
                    copies,
                })))
            }
            Err(why) => Err(refuse(
                "device-error",
                format!(
                    "lease {}: the owner could not copy its device memory: {why}",
                    self.lease
                ),
            )),
        }
    }

    /// How many bytes it copies.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it copies nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy(lease {}, {}+{})", self.lease, self.offset, self.len)
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        if let Some((_, copies)) = self.counted.take() {
            copies.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A host copy of device memory, counted among its lease's copies until its last handle
/// (the answer being written) is gone.
struct DeviceCopy {
    bytes: bytes::Bytes,
    copies: Arc<std::sync::atomic::AtomicUsize>,
}

impl AsRef<[u8]> for DeviceCopy {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for DeviceCopy {
    fn drop(&mut self) {
        self.copies.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Leased {
    /// Whether its holds end by their deadlines: a ticket's do; device memory's end only by
    /// `unlease` or the holder's connection (spec §7.10), since a holder maps it directly.
    fn expires(&self) -> bool {
        matches!(self, Leased::Host(_))
    }

    fn len(&self) -> u64 {
        match self {
            Leased::Host(b) => b.len() as u64,
            Leased::Device(d, _) => d.len(),
        }
    }
}

struct Lease {
    buffer: Leased,
    /// The peer the lease was first issued to (its bytes count against that peer's cap).
    issued_to: String,
    holders: HashMap<String, Hold>,
    created: Instant,
}

#[derive(Default)]
struct State {
    leases: HashMap<u64, Lease>,
    next_id: u64,
    bytes: u64,
    bytes_by_peer: HashMap<String, u64>,
    /// Holds that ended by deadline (for diagnostics).
    expired: u64,
    /// Pulls answered, and the bytes they carried.
    pulls: u64,
    bytes_pulled: u64,
}

/// The leases a node holds as an owner, observable through [`LeaseTableStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LeaseTableStats {
    /// Leases alive.
    pub count: usize,
    /// Bytes they pin.
    pub bytes: u64,
    /// Holds across all leases.
    pub holders: usize,
    /// Age of the oldest lease in seconds (0 when none).
    pub oldest_seconds: f64,
    /// Holds ended by their deadline since the node started.
    pub expired: u64,
    /// Pulls answered since the node started.
    #[serde(default)]
    pub pulls: u64,
    /// Bytes those pulls carried.
    #[serde(default)]
    pub bytes_pulled: u64,
}

/// A lease just issued: what goes into the ticket.
#[derive(Debug)]
pub struct Issued {
    /// The lease's id.
    pub lease: u64,
    /// The holder's token.
    pub token: [u8; 32],
    /// The digest of the leased bytes.
    pub digest: TicketDigest,
}

/// The leases a node issued on its buffers, with their holders (see the module docs).
pub struct LeaseTable {
    state: Mutex<State>,
    /// Times leases ended: an issue that found no room asks again once it changed.
    generation: AtomicU64,
    waker: OnceLock<Waker>,
    /// Where the table reads the time (deadlines and ages): the system's clock, or a
    /// simulated one.
    clock: Clock,
    /// The table's limits and timing.
    pub config: LeaseConfig,
    /// Most live holds on one lease (spec §9.1).
    max_holders: usize,
}

/// Whether `id` has the form of a node id: 32 lower-case hex characters (spec §5.2).
fn is_node_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Lease {
    fn live_holds(&self) -> usize {
        self.holders.values().filter(|h| !h.expired).count()
    }
}

/// Keeps at most `max` expired holds of a lease in memory (the oldest are forgotten; their
/// late holders then see `bad-token`), so remembering them is bounded too.
fn forget_oldest_expired(lease: &mut Lease, max: usize) {
    let expired = lease.holders.values().filter(|h| h.expired).count();
    if expired <= max {
        return;
    }
    let mut by_age: Vec<(Instant, String)> = lease
        .holders
        .iter()
        .filter(|(_, h)| h.expired)
        .map(|(id, h)| (h.deadline, id.clone()))
        .collect();
    by_age.sort();
    for (_, id) in by_age.into_iter().take(expired - max) {
        lease.holders.remove(&id);
    }
}

fn token_eq(a: &[u8; 32], b: &[u8]) -> bool {
    b.len() == 32 && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl LeaseTable {
    /// A table with `config`'s caps and at most `max_holders` live holds per lease.
    pub fn new(config: LeaseConfig, max_holders: usize) -> LeaseTable {
        LeaseTable::with_clock(config, max_holders, Box::new(Instant::now))
    }

    /// The same, reading the time from `clock` (a simulation's clock).
    pub fn with_clock(config: LeaseConfig, max_holders: usize, clock: Clock) -> LeaseTable {
        LeaseTable {
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
            generation: AtomicU64::new(0),
            waker: OnceLock::new(),
            clock,
            config,
            max_holders: max_holders.max(1),
        }
    }

    /// Sets what runs each time leases end (once; later calls are ignored).
    pub fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    /// How many times leases ended so far (see [`try_issue`](Self::try_issue)).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The digest a ticket of `buffer` carries: a known BLAKE3 digest, else xxh3 for a
    /// holder that takes it, else BLAKE3 (spec §7.5).
    pub fn digest_for(buffer: &Buffer, known_digest: Option<[u8; 32]>, holder_takes_xxh3: bool) -> TicketDigest {
        match known_digest {
            Some(d) => TicketDigest::Blake3(d),
            None if holder_takes_xxh3 => TicketDigest::xxh3_of(buffer),
            None => TicketDigest::blake3_of(buffer),
        }
    }

    /// Issues a lease on `buffer` to `holder`, or says which cap leaves no room for it.
    pub fn try_issue(&self, buffer: &Buffer, digest: TicketDigest, holder: &str) -> Result<Issued, String> {
        let (lease, token) = self.issue(Leased::Host(buffer.clone()), holder)?;
        Ok(Issued { lease, token, digest })
    }

    /// Issues a lease on device memory to `holder` (a `cuda` frame, spec §7.10): its id and
    /// the holder's token, or which cap leaves no room. Device bytes count against the caps
    /// as host bytes do: both are memory the holder pins.
    pub fn try_issue_device(&self, memory: Arc<dyn DeviceBytes>, holder: &str) -> Result<(u64, [u8; 32]), String> {
        self.issue(Leased::Device(memory, Arc::default()), holder)
    }

    fn issue(&self, buffer: Leased, holder: &str) -> Result<(u64, [u8; 32]), String> {
        let bytes = buffer.len();
        let mut st = self.state.lock().expect("lease lock");
        let peer_bytes = st.bytes_by_peer.get(holder).copied().unwrap_or(0);
        if st.bytes + bytes > self.config.max_bytes {
            return Err(format!(
                "{} of {} bytes are leased in total",
                st.bytes, self.config.max_bytes
            ));
        }
        if peer_bytes + bytes > self.config.max_bytes_per_peer {
            return Err(format!(
                "{peer_bytes} of {} bytes are leased to it",
                self.config.max_bytes_per_peer
            ));
        }
        let lease = st.next_id;
        st.next_id += 1;
        let token: [u8; 32] = crate::identity::random_bytes();
        st.bytes += bytes;
        *st.bytes_by_peer.entry(holder.to_string()).or_default() += bytes;
        let hold = Hold {
            token,
            deadline: (self.clock)() + self.config.ttl,
            expired: false,
        };
        st.leases.insert(
            lease,
            Lease {
                buffer,
                issued_to: holder.to_string(),
                holders: HashMap::from([(holder.to_string(), hold)]),
                created: (self.clock)(),
            },
        );
        Ok((lease, token))
    }

    fn with_hold<T>(
        &self,
        lease: u64,
        holder: &str,
        token: &[u8],
        f: impl FnOnce(&mut State, u64) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let mut st = self.state.lock().expect("lease lock");
        let Some(l) = st.leases.get(&lease) else {
            return Err(refuse(
                "unknown-lease",
                format!("no lease {lease} (ended or never issued)"),
            ));
        };
        let Some(hold) = l.holders.get(holder) else {
            return Err(refuse(
                "bad-token",
                format!("node {holder} holds no share of lease {lease}"),
            ));
        };
        if !token_eq(&hold.token, token) {
            return Err(refuse(
                "bad-token",
                format!("wrong token for lease {lease} from node {holder}"),
            ));
        }
        if hold.expired || (l.buffer.expires() && hold.deadline <= (self.clock)()) {
            return Err(refuse(
                "expired",
                format!("the hold of node {holder} on lease {lease} expired"),
            ));
        }
        f(&mut st, lease)
    }

    /// Checks a pull and returns the bytes asked for: a view of host bytes (no copy), or a
    /// host copy of device memory (made here, outside the table's lock; a failed copy is
    /// refused with `device-error`, §7.10). [`answer`](Self::answer) leaves the copy to the
    /// driver instead ([`HostCopy`]).
    pub fn pull(&self, lease: u64, holder: &str, token: &[u8], offset: u64, len: u64) -> Result<Buffer, Refusal> {
        match self.checked_pull(lease, holder, token, offset, len)? {
            Ok(bytes) => Ok(bytes),
            Err(copy) => copy.make(),
        }
    }

    /// Checks a pull: the bytes of host memory, or the host copy of device memory still to
    /// be made (counted among its lease's copies from now on).
    fn checked_pull(
        &self,
        lease: u64,
        holder: &str,
        token: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Result<Buffer, HostCopy>, Refusal> {
        let device = self.with_hold(lease, holder, token, |st, lease| {
            let buf = &st.leases[&lease].buffer;
            let Some(end) = offset.checked_add(len).filter(|e| *e <= buf.len()) else {
                return Err(refuse(
                    "out-of-range",
                    format!(
                        "range {offset}+{len} is outside the {} bytes of lease {lease}",
                        buf.len()
                    ),
                ));
            };
            let out = match buf {
                Leased::Host(b) => Ok(b.slice(offset as usize..end as usize)),
                Leased::Device(d, copies) => {
                    if copies.load(Ordering::Acquire) >= MAX_DEVICE_COPIES {
                        return Err(refuse(
                            "device-error",
                            format!(
                                "lease {lease}: a host copy of it is still on its way to {holder}; \
                                 pull again once it arrived"
                            ),
                        ));
                    }
                    copies.fetch_add(1, Ordering::AcqRel);
                    Err((d.clone(), copies.clone()))
                }
            };
            st.pulls += 1;
            st.bytes_pulled += len;
            Ok(out)
        })?;
        Ok(device.map_err(|(memory, copies)| HostCopy {
            counted: Some((memory, copies)),
            lease,
            offset,
            len,
        }))
    }

    /// Registers `to` as a holder too, with its own token; the asking holder keeps its hold.
    /// `owner` is our own node id: a lease cannot be forwarded to its owner.
    pub fn forward(&self, lease: u64, holder: &str, token: &[u8], to: &str, owner: &str) -> Result<[u8; 32], Refusal> {
        let ttl = self.config.ttl;
        let max_holders = self.max_holders;
        self.with_hold(lease, holder, token, |st, lease| {
            if !is_node_id(to) || to == owner {
                let shown: String = to.chars().take(64).collect();
                return Err(refuse(
                    "bad-holder",
                    format!("{shown:?} is not a node id of 32 lower-case hex characters other than the owner's"),
                ));
            }
            let l = st.leases.get_mut(&lease).expect("checked");
            if !l.buffer.expires() {
                return Err(refuse(
                    "not-forwardable",
                    format!("lease {lease} is device memory, which only its owner names to a peer (§7.10)"),
                ));
            }
            let already = l.holders.get(to).is_some_and(|h| !h.expired);
            if !already && l.live_holds() >= max_holders {
                return Err(refuse(
                    "too-many-holders",
                    format!("lease {lease} has {max_holders} holders, as many as this owner allows"),
                ));
            }
            let token: [u8; 32] = crate::identity::random_bytes();
            l.holders.insert(
                to.to_string(),
                Hold {
                    token,
                    deadline: (self.clock)() + ttl,
                    expired: false,
                },
            );
            Ok(token)
        })
    }

    /// Extends a hold by the ttl.
    pub fn renew(&self, lease: u64, holder: &str, token: &[u8]) -> Result<(), Refusal> {
        let ttl = self.config.ttl;
        self.with_hold(lease, holder, token, |st, lease| {
            let hold = st
                .leases
                .get_mut(&lease)
                .expect("checked")
                .holders
                .get_mut(holder)
                .expect("checked");
            hold.deadline = (self.clock)() + ttl;
            Ok(())
        })
    }

    /// Ends a holder's hold (its release).
    pub fn unlease(&self, lease: u64, holder: &str, token: &[u8]) -> Result<(), Refusal> {
        self.with_hold(lease, holder, token, |st, lease| {
            st.leases.get_mut(&lease).expect("checked").holders.remove(holder);
            Ok(())
        })
        .map(|()| self.sweep())
    }

    /// Ends every hold of `holder` (its connection was lost).
    pub fn drop_holder(&self, holder: &str) -> usize {
        let n = {
            let mut st = self.state.lock().expect("lease lock");
            st.leases
                .values_mut()
                .map(|l| l.holders.remove(holder).is_some() as usize)
                .sum()
        };
        self.sweep();
        n
    }

    /// Ends holds whose deadline passed (remembering them while their lease lives);
    /// returns how many.
    pub fn expire(&self) -> usize {
        let now = (self.clock)();
        let n = {
            let mut st = self.state.lock().expect("lease lock");
            let mut n = 0;
            for l in st.leases.values_mut().filter(|l| l.buffer.expires()) {
                for h in l.holders.values_mut().filter(|h| !h.expired && h.deadline <= now) {
                    h.expired = true;
                    n += 1;
                }
                forget_oldest_expired(l, self.max_holders);
            }
            st.expired += n as u64;
            n
        };
        if n > 0 {
            self.sweep();
        }
        n
    }

    /// The soonest deadline of any hold.
    pub fn next_deadline(&self) -> Option<Instant> {
        let st = self.state.lock().expect("lease lock");
        st.leases
            .values()
            .filter(|l| l.buffer.expires())
            .flat_map(|l| l.holders.values().filter(|h| !h.expired).map(|h| h.deadline))
            .min()
    }

    /// Frees leases with no holders left.
    fn sweep(&self) {
        let mut st = self.state.lock().expect("lease lock");
        let done: Vec<u64> = st
            .leases
            .iter()
            .filter(|(_, l)| l.live_holds() == 0)
            .map(|(k, _)| *k)
            .collect();
        if done.is_empty() {
            return;
        }
        for id in done {
            let l = st.leases.remove(&id).expect("listed");
            let bytes = l.buffer.len();
            st.bytes -= bytes;
            if let Some(b) = st.bytes_by_peer.get_mut(&l.issued_to) {
                *b -= bytes;
                if *b == 0 {
                    st.bytes_by_peer.remove(&l.issued_to);
                }
            }
        }
        drop(st);
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(wake) = self.waker.get() {
            wake();
        }
    }

    /// Whether a lease is alive (its buffer still pinned).
    pub fn is_alive(&self, lease: u64) -> bool {
        self.state.lock().expect("lease lock").leases.contains_key(&lease)
    }

    /// What the table holds now.
    pub fn stats(&self) -> LeaseTableStats {
        let st = self.state.lock().expect("lease lock");
        LeaseTableStats {
            count: st.leases.len(),
            bytes: st.bytes,
            holders: st.leases.values().map(Lease::live_holds).sum(),
            oldest_seconds: st
                .leases
                .values()
                .map(|l| (self.clock)().saturating_duration_since(l.created).as_secs_f64())
                .fold(0.0, f64::max),
            expired: st.expired,
            pulls: st.pulls,
            bytes_pulled: st.bytes_pulled,
        }
    }
}

/// What an owner does with a ticket request from one of its holders (spec §7.7).
#[derive(Debug)]
pub enum OwnerAnswer {
    /// Answer `pulled` with these bytes (a view of the leased buffer).
    Pulled {
        /// The request's id.
        req: u64,
        /// The bytes asked for.
        bytes: Buffer,
    },
    /// Answer with `forwarded`.
    Forwarded {
        /// The request's id.
        req: u64,
        /// The new holder's token.
        token: [u8; 32],
    },
    /// Answer with `ticket-error`: the request was refused (worth a limited warning).
    Refused {
        /// The request's id.
        req: u64,
        /// What the request was.
        what: &'static str,
        /// Why.
        refusal: Refusal,
    },
    /// Answer `pulled` with a host copy of device memory, once it is made: a driver makes it
    /// off its event loop ([`finish`](Self::finish) on a thread of its own) and reads no
    /// more of the connection meanwhile, so that a long copy holds up only the peer that
    /// asked for it (spec §9.1).
    CopyThenPull {
        /// The request's id.
        req: u64,
        /// The copy to make.
        copy: HostCopy,
    },
    /// A release or a renewal that was taken; nothing to answer.
    Done,
    /// A release that was not (an ended lease, a wrong token): nothing to answer, worth a
    /// debug line only (releases may cross a lease's end).
    ReleaseIgnored(Refusal),
    /// A renewal refused: nothing to answer (§7.7), worth a limited warning.
    RenewalRefused(Refusal),
}

impl OwnerAnswer {
    /// The answer with its host copy made, for [`CopyThenPull`](Self::CopyThenPull) (blocks
    /// for as long as the copy takes); any other answer as it is.
    pub fn finish(self) -> OwnerAnswer {
        match self {
            OwnerAnswer::CopyThenPull { req, copy } => match copy.make() {
                Ok(bytes) => OwnerAnswer::Pulled { req, bytes },
                Err(refusal) => OwnerAnswer::Refused {
                    req,
                    what: "pull",
                    refusal,
                },
            },
            other => other,
        }
    }

    /// The refusal of pull `req` whose host copy broke on its thread (a driver caught its
    /// panic): `device-error`, so that the holder hears at once instead of waiting out its
    /// pull timeout.
    pub fn copy_broke(req: u64) -> OwnerAnswer {
        OwnerAnswer::Refused {
            req,
            what: "pull",
            refusal: refuse("device-error", "the owner's copy of its device memory failed".into()),
        }
    }

    /// The header that answers the holder (a `pulled` is followed by the answer's bytes);
    /// `None` when nothing is answered (§7.7), or not yet ([`CopyThenPull`](Self::CopyThenPull):
    /// [`finish`](Self::finish) it first).
    pub fn reply(&self) -> Option<handoff_wire::TicketOp> {
        use handoff_wire::TicketOp;
        match self {
            OwnerAnswer::Pulled { req, bytes } => Some(TicketOp::Pulled {
                req: *req,
                len: bytes.len() as u64,
            }),
            OwnerAnswer::Forwarded { req, token } => Some(TicketOp::Forwarded {
                req: *req,
                token: token.to_vec(),
            }),
            OwnerAnswer::Refused { req, refusal, .. } => Some(TicketOp::Refused {
                req: *req,
                code: refusal.code.to_string(),
                message: refusal.message.clone(),
            }),
            OwnerAnswer::CopyThenPull { .. }
            | OwnerAnswer::Done
            | OwnerAnswer::ReleaseIgnored(_)
            | OwnerAnswer::RenewalRefused(_) => None,
        }
    }

    /// Queues the answer to the holder in `out`, if there is one: a `pulled` with its bytes
    /// (counted until written: past spec §9.1's bound the connection reads no more requests
    /// until its answers drain), else a control header.
    /// A [`CopyThenPull`](Self::CopyThenPull) is finished here first, on the caller's thread.
    pub fn queue_reply(self, out: &mut crate::outgoing::Outgoing, now: Instant) {
        let answer = self.finish();
        let Some(reply) = answer.reply() else {
            return;
        };
        let mut head = Vec::with_capacity(64);
        handoff_wire::framing::encode_header_into(&handoff_wire::Header::Ticket(reply), &mut head);
        match answer {
            OwnerAnswer::Pulled { bytes, .. } => out.push_pulled_answer(head.into(), bytes.into_bytes(), now),
            _ => out.push_control(head.into(), now),
        }
    }
}

impl LeaseTable {
    /// The owner's side of a ticket request from `holder` (a node id); `owner` is our own
    /// node id. `None` for the holder's side of the protocol (answers to our requests).
    pub fn answer(&self, op: &handoff_wire::TicketOp, holder: &str, owner: &str) -> Option<OwnerAnswer> {
        use handoff_wire::TicketOp;
        Some(match op {
            TicketOp::Pull {
                req,
                lease,
                token,
                offset,
                len,
            } => match self.checked_pull(*lease, holder, token, *offset, *len) {
                Ok(Ok(bytes)) => OwnerAnswer::Pulled { req: *req, bytes },
                Ok(Err(copy)) => OwnerAnswer::CopyThenPull { req: *req, copy },
                Err(refusal) => OwnerAnswer::Refused {
                    req: *req,
                    what: "pull",
                    refusal,
                },
            },
            TicketOp::Forward { req, lease, token, to } => match self.forward(*lease, holder, token, to, owner) {
                Ok(token) => OwnerAnswer::Forwarded { req: *req, token },
                Err(refusal) => OwnerAnswer::Refused {
                    req: *req,
                    what: "forward",
                    refusal,
                },
            },
            TicketOp::Unlease { lease, token } => match self.unlease(*lease, holder, token) {
                Ok(()) => OwnerAnswer::Done,
                Err(r) => OwnerAnswer::ReleaseIgnored(r),
            },
            TicketOp::Renew { lease, token } => match self.renew(*lease, holder, token) {
                Ok(()) => OwnerAnswer::Done,
                Err(r) => OwnerAnswer::RenewalRefused(r),
            },
            TicketOp::Pulled { .. } | TicketOp::Forwarded { .. } | TicketOp::Refused { .. } => return None,
        })
    }
}

impl LeaseTable {
    /// Ends `holder`'s holds on the leases issued for a message that was not sent after all
    /// ([`issued_leases`](crate::outbound::issued_leases)); those already ended are skipped.
    pub fn withdraw(&self, issued: &[(u64, Vec<u8>)], holder: &str) {
        for (lease, token) in issued {
            let _ = self.unlease(*lease, holder, token);
        }
    }
}

/// The shortest and the longest sleep of a driver's reaper of expired holds
/// ([`LeaseTable::reap_after`]).
pub const REAP_SLEEP: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(250));

impl LeaseTable {
    /// How long a driver's reaper sleeps at `now` before it ends the holds due
    /// ([`expire`](Self::expire)) again: until the soonest deadline of any hold, at least
    /// 5 ms and at most 250 ms (250 ms when none is due).
    pub fn reap_after(&self, now: Instant) -> Duration {
        let (shortest, longest) = REAP_SLEEP;
        self.next_deadline()
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(longest)
            .clamp(shortest, longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "0000000000000000000000000000000a";
    const B: &str = "0000000000000000000000000000000b";
    const C: &str = "0000000000000000000000000000000c";

    fn table(ttl_ms: u64, max: u64, when_full: WhenFull) -> LeaseTable {
        LeaseTable::new(
            LeaseConfig {
                ttl: Duration::from_millis(ttl_ms),
                max_bytes: max,
                max_bytes_per_peer: max,
                when_full,
            },
            3,
        )
    }

    fn issue(t: &LeaseTable, buf: &Buffer, holder: &str) -> Result<Issued, String> {
        t.try_issue(buf, LeaseTable::digest_for(buf, None, false), holder)
    }

    #[test]
    fn a_withdrawn_message_ends_its_leases_holds() {
        let t = table(60_000, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 100]);
        let (a, b) = (issue(&t, &buf, B).unwrap(), issue(&t, &buf, B).unwrap());
        let kept = issue(&t, &buf, B).unwrap();
        let issued = [
            (a.lease, a.token.to_vec()),
            (b.lease, b.token.to_vec()),
            (a.lease, a.token.to_vec()),
        ];
        t.withdraw(&issued, B);
        assert!(
            !t.is_alive(a.lease) && !t.is_alive(b.lease),
            "both ended; the repeat is skipped"
        );
        assert!(t.is_alive(kept.lease));
        t.withdraw(&[(kept.lease, kept.token.to_vec())], C);
        assert!(t.is_alive(kept.lease), "only the holder's own hold ends");
    }

    #[test]
    fn the_reaper_sleeps_until_the_next_deadline_within_its_bounds() {
        let now = Instant::now();
        let idle = table(60_000, 1 << 20, WhenFull::Fail);
        assert_eq!(idle.reap_after(now), REAP_SLEEP.1, "no hold: the longest sleep");
        let soon = table(100, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 10]);
        issue(&soon, &buf, B).unwrap();
        let wait = soon.reap_after(Instant::now());
        assert!(wait > REAP_SLEEP.0 && wait <= Duration::from_millis(100), "{wait:?}");
        assert_eq!(
            soon.reap_after(now + Duration::from_secs(1)),
            REAP_SLEEP.0,
            "overdue: the shortest"
        );
        let late = table(60_000, 1 << 20, WhenFull::Fail);
        issue(&late, &buf, B).unwrap();
        assert_eq!(late.reap_after(now), REAP_SLEEP.1, "far off: the longest");
    }

    #[test]
    fn a_lease_lives_until_its_last_holder_releases() {
        let t = table(60_000, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 1000]);
        let i = issue(&t, &buf, B).unwrap();
        assert_eq!(t.pull(i.lease, B, &i.token, 10, 5).unwrap(), buf.slice(10..15));
        let c_token = t.forward(i.lease, B, &i.token, C, OWNER).unwrap();
        t.unlease(i.lease, B, &i.token).unwrap();
        assert!(t.is_alive(i.lease), "c still holds it");
        assert_eq!(
            t.pull(i.lease, B, &i.token, 0, 1).unwrap_err().code,
            "bad-token",
            "b's hold ended"
        );
        assert_eq!(
            t.pull(i.lease, C, &i.token, 0, 1).unwrap_err().code,
            "bad-token",
            "b's token is not c's"
        );
        t.pull(i.lease, C, &c_token, 0, 1000).unwrap();
        assert_eq!(t.pull(i.lease, C, &c_token, 999, 2).unwrap_err().code, "out-of-range");
        t.unlease(i.lease, C, &c_token).unwrap();
        assert!(!t.is_alive(i.lease));
        assert_eq!(
            t.pull(i.lease, C, &c_token, 0, 1).unwrap_err().code,
            "unknown-lease",
            "no replay"
        );
        assert_eq!(t.stats().bytes, 0);
    }

    #[test]
    fn deadlines_and_lost_holders_end_holds() {
        let t = table(50, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 10]);
        let a = issue(&t, &buf, B).unwrap();
        let b = issue(&t, &buf, C).unwrap();
        assert_eq!(t.drop_holder(C), 1);
        assert!(!t.is_alive(b.lease));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(t.pull(a.lease, B, &a.token, 0, 1).unwrap_err().code, "expired");
        assert_eq!(t.expire(), 1);
        assert!(!t.is_alive(a.lease));
        assert_eq!(t.stats().expired, 1);
    }

    #[test]
    fn caps_leave_no_room_until_a_lease_ends() {
        let t = table(60_000, 100, WhenFull::Wait(Duration::from_secs(5)));
        let buf = Buffer::from(vec![1u8; 80]);
        let first = issue(&t, &buf, B).unwrap();
        let seen = t.generation();
        let err = issue(&t, &buf, B).unwrap_err();
        assert!(err.contains("80 of 100 bytes"), "{err}");
        t.unlease(first.lease, B, &first.token).unwrap();
        assert_ne!(t.generation(), seen, "a waiting issuer sees a lease ended");
        issue(&t, &buf, B).unwrap();
    }

    #[test]
    fn forwards_name_real_nodes_and_holders_are_capped() {
        let t = table(60_000, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 10]);
        let i = issue(&t, &buf, B).unwrap();
        let code = |to: &str| t.forward(i.lease, B, &i.token, to, OWNER).unwrap_err().code;
        assert_eq!(code("not-a-node"), "bad-holder");
        assert_eq!(code(&"A".repeat(32)), "bad-holder", "upper case is not a node id");
        assert_eq!(code(OWNER), "bad-holder", "not to the owner itself");
        t.forward(i.lease, B, &i.token, C, OWNER).unwrap();
        let d = "0000000000000000000000000000000d";
        t.forward(i.lease, B, &i.token, d, OWNER).unwrap();
        assert_eq!(
            code("0000000000000000000000000000000e"),
            "too-many-holders",
            "three live holds"
        );
        t.forward(i.lease, B, &i.token, C, OWNER)
            .expect("re-forwarding to a holder is not refused");
    }

    #[test]
    fn a_late_holder_learns_its_hold_expired_while_the_lease_lives() {
        let t = table(40, 1 << 20, WhenFull::Fail);
        let buf = Buffer::from(vec![1u8; 10]);
        let i = issue(&t, &buf, B).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let c = t.forward(i.lease, B, &i.token, C, OWNER).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(t.expire(), 1, "b's deadline passed, c's not yet");
        assert!(t.is_alive(i.lease), "c keeps it alive");
        assert_eq!(t.pull(i.lease, B, &i.token, 0, 1).unwrap_err().code, "expired");
        assert_eq!(
            t.pull(i.lease, B, &c, 0, 1).unwrap_err().code,
            "bad-token",
            "b with c's token"
        );
        t.unlease(i.lease, C, &c).unwrap();
        assert!(!t.is_alive(i.lease), "an expired hold keeps nothing alive");
        assert_eq!(t.pull(i.lease, B, &i.token, 0, 1).unwrap_err().code, "unknown-lease");
    }

    /// Device memory as a test sees it: host bytes behind the trait, and whether the lease
    /// still keeps them.
    struct FakeDevice(Vec<u8>, Arc<std::sync::atomic::AtomicBool>);

    impl DeviceBytes for FakeDevice {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn copy_out(&self, offset: u64, len: u64) -> Result<Buffer, String> {
            Ok(Buffer::from(self.0[offset as usize..(offset + len) as usize].to_vec()))
        }
    }

    impl Drop for FakeDevice {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn device_leases_copy_on_pull_never_expire_are_not_forwarded_and_end_with_the_holder() {
        let t = table(10, 1 << 20, WhenFull::Fail);
        let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let memory = Arc::new(FakeDevice((0..=255).collect(), freed.clone()));
        let (lease, token) = t.try_issue_device(memory, B).unwrap();
        // A holder that cannot map the memory pulls a copy of the range it asks for.
        assert_eq!(
            t.pull(lease, B, &token, 10, 3).unwrap().as_bytes().as_ref(),
            &[10, 11, 12]
        );
        assert_eq!(t.pull(lease, B, &token, 250, 10).unwrap_err().code, "out-of-range");
        // Two host copies at most for its holder: a third pull while two are held (their
        // answers not yet written) is refused, and allowed again once they are gone.
        let first = t.pull(lease, B, &token, 0, 256).unwrap();
        let second = t.pull(lease, B, &token, 0, 256).unwrap();
        let again = t.pull(lease, B, &token, 0, 256).unwrap_err();
        assert_eq!(again.code, "device-error");
        assert!(again.message.contains("still on its way"), "{}", again.message);
        drop((first, second));
        assert!(t.pull(lease, B, &token, 0, 256).is_ok());
        // Its holder maps it directly, without renewing: no deadline ends the hold.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(t.expire(), 0);
        assert_eq!(t.next_deadline(), None);
        assert!(t.pull(lease, B, &token, 0, 1).is_ok());
        // Only the owner names device memory to a peer.
        assert_eq!(
            t.forward(lease, B, &token, C, OWNER).unwrap_err().code,
            "not-forwardable"
        );
        // The holder's connection is lost: the memory goes at once.
        assert!(!freed.load(Ordering::SeqCst));
        assert_eq!(t.drop_holder(B), 1);
        assert!(freed.load(Ordering::SeqCst), "the lease let the memory go");
        assert_eq!(t.stats().count, 0);
    }

    #[test]
    fn a_failed_copy_of_device_memory_is_refused_as_device_error() {
        struct Broken;
        impl DeviceBytes for Broken {
            fn len(&self) -> u64 {
                8
            }
            fn copy_out(&self, _: u64, _: u64) -> Result<Buffer, String> {
                Err("cuMemcpyDtoH failed".into())
            }
        }
        let t = table(1000, 1 << 20, WhenFull::Fail);
        let (lease, token) = t.try_issue_device(Arc::new(Broken), B).unwrap();
        let refusal = t.pull(lease, B, &token, 0, 8).unwrap_err();
        assert_eq!(refusal.code, "device-error");
        assert!(refusal.message.contains("cuMemcpyDtoH failed"), "{}", refusal.message);
        // Device bytes count against the caps.
        assert_eq!(t.stats().bytes, 8);
    }

    #[test]
    fn a_host_copy_left_to_the_driver_keeps_its_place_until_made_and_gives_it_back_however_it_ends() {
        struct Panics;
        impl DeviceBytes for Panics {
            fn len(&self) -> u64 {
                8
            }
            fn copy_out(&self, _: u64, _: u64) -> Result<Buffer, String> {
                panic!("the driver broke")
            }
        }
        let pull = |t: &LeaseTable, lease: u64, token: &[u8; 32], req: u64| {
            let op = handoff_wire::TicketOp::Pull {
                req,
                lease,
                token: token.to_vec(),
                offset: 0,
                len: 4,
            };
            t.answer(&op, B, "0".repeat(32).as_str()).expect("an owner's answer")
        };
        let t = table(10, 1 << 20, WhenFull::Fail);
        let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (lease, token) = t.try_issue_device(Arc::new(FakeDevice(vec![7; 64], freed)), B).unwrap();
        // Left to the driver: counted from the pull on, so at most MAX_DEVICE_COPIES wait.
        let waiting: Vec<_> = (0..MAX_DEVICE_COPIES as u64)
            .map(|req| pull(&t, lease, &token, req))
            .collect();
        assert!(waiting.iter().all(|a| matches!(a, OwnerAnswer::CopyThenPull { .. })));
        let refused = pull(&t, lease, &token, 99);
        assert!(matches!(&refused, OwnerAnswer::Refused { refusal, .. } if refusal.code == "device-error"));
        // Dropped unmade (the connection ended), a copy gives its place back.
        drop(waiting);
        let made = pull(&t, lease, &token, 5).finish();
        let OwnerAnswer::Pulled { req: 5, bytes } = made else {
            panic!("a pulled answer")
        };
        assert_eq!(bytes.as_bytes().as_ref(), &[7; 4]);
        // Made, it keeps its place until its bytes are written (dropped).
        let held: Vec<_> = (0..MAX_DEVICE_COPIES as u64 - 1)
            .map(|req| pull(&t, lease, &token, req))
            .collect();
        assert!(matches!(pull(&t, lease, &token, 98), OwnerAnswer::Refused { .. }));
        drop((bytes, held));
        assert!(matches!(pull(&t, lease, &token, 6), OwnerAnswer::CopyThenPull { .. }));

        // A copy that panics on the driver's thread gives its place back too.
        let (lease, token) = t.try_issue_device(Arc::new(Panics), B).unwrap();
        for req in 0..3 * MAX_DEVICE_COPIES as u64 {
            let answer = pull(&t, lease, &token, req);
            assert!(
                matches!(answer, OwnerAnswer::CopyThenPull { .. }),
                "pull {req} found no place"
            );
            let broke = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer.finish()));
            assert!(broke.is_err());
        }
    }
}

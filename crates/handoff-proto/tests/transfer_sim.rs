//! Deterministic simulation of established connections: three nodes' engines wired together
//! in memory, on a simulated clock, with a seeded scheduler that delivers each stream in
//! pieces of random sizes, interleaves the streams, stalls them and cuts connections (each
//! stream stays in order within itself).
//!
//! The cast: an owner O and two holders. O sends each holder messages with inline frames
//! (small and large) and tickets for buffers it leases out. The holders pull ranges of
//! their tickets (some hashed), forward tickets to each other and release them. Every
//! receiving side is an `Inbound` that takes room in its node's receive budget before it
//! reads a message; the holders' applications keep messages (and their room) for a while.
//! Connections die mid-transfer, and a stream that stalls inside a message past the
//! progress timeout fails its connection.
//!
//! Checked, per seed:
//! - no corrupt read: every frame and every pulled range is the byte that was sent, and a
//!   hashed pull's digest is the bytes';
//! - no early free, no stale token: the owner serves every request whose token the model
//!   says is live (only a forward over the holder bound may be refused), refuses every
//!   request whose token ended (released, its holder's connection lost, replaced by a later
//!   forward), and its lease table keeps exactly the leases that have a live hold;
//! - no leak: once the holders released what they hold, the dead were dropped and the
//!   stranded holds expired, the owner keeps no lease, and every budget is back at zero;
//! - the bounds: each node's receive budget stays within its bound, a connection cut
//!   mid-message fails with `truncated` (never a short message), and every live stream
//!   ends between two messages;
//! - a seed replays exactly.
//!
//! `cargo test -p handoff-proto --test transfer_sim` (a smoke of 200 seeds);
//! `HANDOFF_SIM_SEEDS=10000 cargo test --release -p handoff-proto --test transfer_sim` (the
//! long run); `HANDOFF_SIM_SEED=N ... -- --nocapture` replays one seed and prints its trace.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use handoff_proto::budget::{Account, Budget, Permit};
use handoff_proto::inbound::{Digest, Event, Frame, Inbound, Step};
use handoff_proto::receive::{self, Asked, Receiving};
use handoff_proto::recv_buffers::RecvPool;
use handoff_proto::seeded::SplitMix64;
use handoff_proto::ticket_leases::{LeaseConfig, LeaseTable, OwnerAnswer, WhenFull};
use handoff_proto::ticket_requests::Requests;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Descriptor, Header, Limits, TicketClaim, TicketDigest, TicketOp};

const OWNER: usize = 0;
const NODES: usize = 3;
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(3600);
const MAX_TOTAL: u64 = 2 << 20;
const MAX_PER_PEER: u64 = 1 << 20;
const MAX_MESSAGE: u64 = 700 << 10;
const MAX_HOLDERS: usize = 2;

fn node_id(i: usize) -> String {
    format!("{:032x}", i + 1)
}

fn pattern(id: u64, frame: usize, i: usize) -> u8 {
    (id.wrapping_mul(31) as usize + frame * 7 + i) as u8
}

/// One direction of a connection.
struct Stream {
    from: usize,
    to: usize,
    wire: VecDeque<u8>,
    inbound: Inbound,
    stalled_until: Option<Instant>,
}

struct Node {
    budget: Arc<Budget>,
    /// Messages the application still holds (with their room).
    app: Vec<Permit>,
    /// A holder's holds it knows of: lease → token.
    holds: BTreeMap<u64, [u8; 32]>,
    /// A holder's requests to the owner: req → (lease, offset, len).
    requests: Requests<(u64, u64, u64)>,
    /// Forwards waiting for the owner's answer: req → (lease, to).
    forwards: BTreeMap<u64, (u64, usize)>,
    next_req: u64,
}

struct Sim {
    rng: SplitMix64,
    t0: Instant,
    now: Arc<Mutex<Instant>>,
    nodes: Vec<Node>,
    /// Keyed by (from, to); a missing pair is a cut connection.
    streams: BTreeMap<(usize, usize), Stream>,
    /// The owner's lease table, which its engines answer holders from.
    leases: Arc<LeaseTable>,
    /// The owner's holds as the model sees them: (lease, holder) → the holder's current
    /// token. A lease lives while it has one (spec §7.7); a forward to a node that holds
    /// the lease already replaces its token.
    tokens: BTreeMap<(u64, usize), [u8; 32]>,
    /// Every leased buffer, kept after its lease ends (an answer may still be on its way).
    truth: BTreeMap<u64, Bytes>,

    next_msg: u64,
    trace: Vec<String>,
    violations: Vec<String>,
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    messages: u64,
    pulls: u64,
    forwards: u64,
    cuts: u64,
    timeouts: u64,
    truncated: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let t0 = Instant::now();
        let now = Arc::new(Mutex::new(t0));
        let clock = now.clone();
        let leases = Arc::new(LeaseTable::with_clock(
            LeaseConfig {
                ttl: TTL,
                max_bytes: 8 << 20,
                max_bytes_per_peer: 4 << 20,
                when_full: WhenFull::Fail,
            },
            MAX_HOLDERS,
            Box::new(move || *clock.lock().unwrap()),
        ));
        let nodes = (0..NODES)
            .map(|_| Node {
                budget: Budget::new(MAX_TOTAL, MAX_PER_PEER, 64 << 10, 8),
                app: Vec::new(),
                holds: BTreeMap::new(),
                requests: Requests::default(),
                forwards: BTreeMap::new(),
                next_req: 1,
            })
            .collect();
        let mut sim = Sim {
            rng: SplitMix64::new(seed),
            t0,
            now,
            nodes,
            streams: BTreeMap::new(),
            leases,
            tokens: BTreeMap::new(),
            truth: BTreeMap::new(),
            next_msg: 1,
            trace: Vec::new(),
            violations: Vec::new(),
            stats: Stats::default(),
        };
        for a in 0..NODES {
            for b in 0..NODES {
                if a != b {
                    sim.connect(a, b);
                }
            }
        }
        sim
    }

    /// A fresh stream from `a` to `b`, its receiver just past the handshake.
    fn connect(&mut self, a: usize, b: usize) {
        let account = Arc::new(Account::default());
        let inbound = Inbound::new(
            Receiving::new(Limits::DEFAULT, false),
            Arc::new(|_: &str| Ok(())),
            RecvPool::new(4 << 20),
            PROGRESS_TIMEOUT,
        )
        .with_budget(self.nodes[b].budget.clone(), account);
        // The owner's engines answer ticket requests from its lease table.
        let inbound = match b {
            OWNER => inbound.with_owner(self.leases.clone(), &node_id(a), &node_id(OWNER)),
            _ => inbound,
        };
        self.streams.insert(
            (a, b),
            Stream {
                from: a,
                to: b,
                wire: VecDeque::new(),
                inbound,
                stalled_until: None,
            },
        );
    }

    fn now(&self) -> Instant {
        *self.now.lock().unwrap()
    }

    fn log(&mut self, line: String) {
        let ms = (self.now() - self.t0).as_millis();
        self.trace.push(format!("{ms:>8} {line}"));
    }

    fn violation(&mut self, what: String) {
        self.log(format!("VIOLATION {what}"));
        self.violations.push(what);
    }

    fn send(&mut self, from: usize, to: usize, bytes: &[u8]) -> bool {
        match self.streams.get_mut(&(from, to)) {
            Some(s) => {
                s.wire.extend(bytes);
                true
            }
            None => false,
        }
    }

    fn header(h: &Header<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header_into(h, &mut out);
        out
    }

    /// The owner sends `to` a message of inline frames and tickets.
    fn owner_sends(&mut self, to: usize) {
        if !self.streams.contains_key(&(OWNER, to)) {
            return;
        }
        let id = self.next_msg;
        self.next_msg += 1;
        let mut frames = Vec::new();
        let mut inline = Vec::new();
        let mut leased = Vec::new();
        for f in 0..self.rng.below(4) as usize {
            if self.rng.chance(30) {
                let len = 1 + self.rng.below(300 << 10) as usize;
                let data: Bytes = (0..len).map(|i| pattern(id ^ 0x55, f, i)).collect::<Vec<_>>().into();
                let buffer = Buffer::from(data.clone());
                let digest = LeaseTable::digest_for(&buffer, None, false);
                match self.leases.try_issue(&buffer, digest, &node_id(to)) {
                    Ok(issued) => {
                        self.truth.insert(issued.lease, data.clone());
                        self.tokens.insert((issued.lease, to), issued.token);
                        leased.push(issued.lease);
                        frames.push(Descriptor::Ticket(TicketClaim {
                            len: len as u64,
                            owner: node_id(OWNER),
                            addr: None,
                            lease: issued.lease,
                            token: issued.token.to_vec(),
                            digest: issued.digest,
                            ttl_ms: TTL.as_millis() as u64,
                            lazy: self.rng.chance(50),
                        }));
                        continue;
                    }
                    Err(why) => self.log(format!("O could not lease {len} bytes: {why}")),
                }
            }
            let len = match self.rng.below(3) {
                0 => self.rng.below(100) as usize,
                1 => self.rng.below(64 << 10) as usize,
                _ => (64 << 10) + self.rng.below(100 << 10) as usize,
            };
            frames.push(Descriptor::Inline { len: len as u64 });
            inline.extend((0..len).map(|i| pattern(id, f, i)));
        }
        let mut body = vec![0x91, 0xcf];
        body.extend(id.to_be_bytes());
        let mut out = Self::header(&Header::Msg {
            type_name: "owner",
            body: &body,
            frames,
        });
        out.extend(inline);
        self.log(format!(
            "O sends #{id} to {to} ({} bytes, leases {leased:?})",
            out.len()
        ));
        self.send(OWNER, to, &out);
    }

    /// A holder asks the owner for something about one of its holds.
    fn holder_acts(&mut self, h: usize) {
        let holds: Vec<(u64, [u8; 32])> = self.nodes[h].holds.iter().map(|(l, t)| (*l, *t)).collect();
        if holds.is_empty() || !self.streams.contains_key(&(h, OWNER)) {
            return;
        }
        let (lease, token) = holds[self.rng.below(holds.len() as u64) as usize];
        let len_total = self.truth[&lease].len() as u64;
        let req = self.nodes[h].next_req;
        self.nodes[h].next_req += 1;
        let forwarding = self.nodes[h].forwards.values().any(|(l, _)| *l == lease);
        let op = match self.rng.below(10) {
            0..=5 => {
                let offset = self.rng.below(len_total.max(1));
                let len = 1 + self.rng.below(len_total - offset);
                let hash = self.rng.chance(50);
                self.nodes[h]
                    .requests
                    .insert(req, Asked { len: Some(len), hash }, (lease, offset, len));
                self.stats.pulls += 1;
                TicketOp::Pull {
                    req,
                    lease,
                    token: token.to_vec(),
                    offset,
                    len,
                }
            }
            6..=7 => {
                let to = if h == 1 { 2 } else { 1 };
                self.nodes[h]
                    .requests
                    .insert(req, Asked { len: None, hash: false }, (lease, 0, 0));
                self.nodes[h].forwards.insert(req, (lease, to));
                self.stats.forwards += 1;
                TicketOp::Forward {
                    req,
                    lease,
                    token: token.to_vec(),
                    to: node_id(to),
                }
            }
            _ if forwarding => return,
            _ => {
                self.nodes[h].holds.remove(&lease);
                TicketOp::Unlease {
                    lease,
                    token: token.to_vec(),
                }
            }
        };
        let what = match &op {
            TicketOp::Pull { req, offset, len, .. } => format!("pull {req}: {len} bytes at {offset} of lease {lease}"),
            TicketOp::Forward { req, to, .. } => format!("forward {req}: lease {lease} to {}", &to[30..]),
            _ => format!("release lease {lease}"),
        };
        self.log(format!("{h} asks O: {what}"));
        let out = Self::header(&Header::Ticket(op));
        self.send(h, OWNER, &out);
    }

    /// Delivers up to `most` bytes on the stream (from, to) in the pieces its receiver
    /// reads, letting the receiver act after each.
    fn deliver(&mut self, key: (usize, usize), most: usize) {
        let mut left = most;
        loop {
            let now = self.now();
            let Some(s) = self.streams.get_mut(&key) else { return };
            if s.stalled_until.is_some_and(|t| now < t) {
                return;
            }
            let space = s.inbound.recv_space();
            let n = left.min(space.len()).min(s.wire.len());
            for (slot, byte) in space[..n].iter_mut().zip(s.wire.drain(..n)) {
                *slot = byte;
            }
            if n > 0 {
                s.inbound.received(n, now);
                left -= n;
            }
            self.drive(key);
            if n == 0 {
                return;
            }
        }
    }

    /// Runs the receiver of `key` until it needs bytes or room it cannot have.
    fn drive(&mut self, key: (usize, usize)) {
        loop {
            let now = self.now();
            let Some(s) = self.streams.get_mut(&key) else { return };
            let step = s.inbound.poll(now);
            let (from, to) = (s.from, s.to);
            match step {
                Err(e) => {
                    if e.code() == "truncated" {
                        self.stats.truncated += 1;
                    }
                    self.log(format!("{to} fails its connection from {from}: {e}"));
                    self.cut(from, to);
                    return;
                }
                Ok(Step::Read) | Ok(Step::Closed) => return,
                Ok(Step::Room { .. }) => {
                    let node = &self.nodes[to];
                    let asking = to != OWNER && from == OWNER && !node.requests.is_empty();
                    let tickets = self.streams.get(&key).map_or(0, |s| s.inbound.ticket_bytes());
                    let slack = receive::room_slack(asking, node.budget.max_per_peer(), tickets);
                    let budget = node.budget.clone();
                    let s = self.streams.get_mut(&key).expect("present");
                    if !s.inbound.try_take_room(slack, now) {
                        return;
                    }
                    let used = budget.used();
                    if used > MAX_TOTAL + MAX_PER_PEER + MAX_MESSAGE {
                        self.violation(format!("node {to}'s budget holds {used} bytes"));
                    }
                }
                Ok(Step::CheckPulled { req, len }) => {
                    let asked = self.nodes[to].requests.asked(req);
                    let s = self.streams.get_mut(&key).expect("present");
                    s.inbound.pulled_verdict(receive::pulled(asked, len), now);
                }
                Ok(Step::Event(event)) => self.on_event(key, event),
            }
        }
    }

    fn on_event(&mut self, key: (usize, usize), event: Event) {
        let (from, to) = key;
        match event {
            Event::Message(mut m) => {
                self.stats.messages += 1;
                if let Some(p) = m.permit.take() {
                    self.nodes[to].app.push(p);
                }
                let id = u64::from_be_bytes(m.body[2..10].try_into().expect("the body is an id"));
                self.log(format!("{to} gets {} #{id} from {from}", m.type_name));
                for (f, frame) in m.frames.into_iter().enumerate() {
                    match frame {
                        Frame::Bytes(b) => {
                            if b.iter().enumerate().any(|(i, &x)| x != pattern(id, f, i)) {
                                self.violation(format!("message #{id} frame {f}: corrupt"));
                            }
                        }
                        Frame::Ticket(claim) => {
                            let token: [u8; 32] = claim.token.try_into().expect("32 bytes");
                            // (It may be dead already: a forwarded ticket whose hold ended
                            // with our last connection to the owner, or whose token a later
                            // forward replaced. The owner then refuses it, which is checked
                            // on its side.)
                            if self.streams.contains_key(&(to, OWNER)) {
                                self.nodes[to].holds.insert(claim.lease, token);
                            }
                        }
                        Frame::Shm { .. } | Frame::Mapped { .. } => self.violation("a shm frame on tcp".into()),
                        Frame::Device(_) => self.violation("a cuda frame on tcp".into()),
                    }
                }
            }
            Event::Owner { request, answer } if to == OWNER => self.owner_answers(from, request, answer),
            Event::Owner { .. } => self.violation(format!("{to} answered as an owner")),
            Event::Ticket(op) if to == OWNER => self.violation(format!("O's engine left {op:?} unanswered")),
            Event::Ticket(TicketOp::Forwarded { req, token }) => {
                self.nodes[to].requests.complete(req);
                let Some((lease, target)) = self.nodes[to].forwards.remove(&req) else {
                    return self.violation(format!("{to}: an answer to no forward (req {req})"));
                };
                // The forwarder sends the new holder its ticket.
                let data = &self.truth[&lease];
                let (data_len, digest) = (data.len() as u64, TicketDigest::Blake3(*blake3::hash(data).as_bytes()));
                let id = self.next_msg;
                self.next_msg += 1;
                let mut body = vec![0x91, 0xcf];
                body.extend(id.to_be_bytes());
                let out = Self::header(&Header::Msg {
                    type_name: "forwarded",
                    body: &body,
                    frames: vec![Descriptor::Ticket(TicketClaim {
                        len: data_len,
                        owner: node_id(OWNER),
                        addr: None,
                        lease,
                        token,
                        digest,
                        ttl_ms: TTL.as_millis() as u64,
                        lazy: true,
                    })],
                });
                self.log(format!("{to} forwards lease {lease} to {target} in #{id}"));
                self.send(to, target, &out);
            }
            Event::Ticket(TicketOp::Refused { req, code, message }) => {
                // Whether the refusal was due is checked on the owner's side.
                self.nodes[to].forwards.remove(&req);
                self.nodes[to].requests.complete(req);
                self.log(format!("{to}: request {req} refused: {message} [{code}]"));
            }
            Event::Ticket(op) => self.violation(format!("{to} got {op:?} from a holder")),
            Event::Pulled { req, bytes, digest } => {
                let Some((lease, offset, len)) = self.nodes[to].requests.complete(req) else {
                    return self.violation(format!("{to}: pulled bytes for no request"));
                };
                self.log(format!("{to} pulled {len} bytes of lease {lease}"));
                let want = self.truth[&lease].slice(offset as usize..(offset + len) as usize);
                if bytes != want {
                    self.violation(format!("lease {lease}: a corrupt pull"));
                }
                if let Digest::Hashed(d) = digest {
                    if d != *blake3::hash(&bytes).as_bytes() {
                        self.violation(format!("lease {lease}: a wrong digest"));
                    }
                }
            }
            Event::PulledMismatch { req, why } => self.violation(format!("{to}: req {req} mismatched: {why}")),
            Event::Release(_) | Event::PeerRefused { .. } => self.violation(format!("{to}: unexpected event")),
        }
    }

    /// The owner's answer to a holder's request, checked against the model, and the
    /// model's change.
    fn owner_answers(&mut self, holder: usize, op: TicketOp, answer: OwnerAnswer) {
        // (A host copy of device memory is made here, as a driver's thread would.)
        let answer = answer.finish();
        let (lease, token) = match &op {
            TicketOp::Pull { lease, token, .. }
            | TicketOp::Forward { lease, token, .. }
            | TicketOp::Unlease { lease, token }
            | TicketOp::Renew { lease, token } => (*lease, token.clone()),
            _ => unreachable!("answers are the holder's"),
        };
        let current = self.tokens.get(&(lease, holder)).is_some_and(|t| t[..] == token[..]);
        let refused = match &answer {
            OwnerAnswer::Refused { what, refusal, .. } => Some((
                *what == "forward" && refusal.code == "too-many-holders",
                refusal.message.clone(),
            )),
            OwnerAnswer::ReleaseIgnored(r) | OwnerAnswer::RenewalRefused(r) => Some((false, r.message.clone())),
            _ => None,
        };
        match refused {
            // A hold the model says is live must be served: anything else is an early free.
            Some((bound, why)) if current && !bound => {
                self.violation(format!("O refused {holder}'s live hold on lease {lease}: {why}"))
            }
            // A token that ended (released, its holder's connection lost, replaced) must not
            // work.
            None if !current => self.violation(format!("O served {holder} on lease {lease} with an ended token")),
            _ => {}
        }
        match (&op, &answer) {
            (TicketOp::Forward { to, .. }, OwnerAnswer::Forwarded { token, .. }) => {
                let to = (0..NODES).find(|i| &node_id(*i) == to).expect("a node");
                self.tokens.insert((lease, to), *token);
            }
            (TicketOp::Unlease { .. }, OwnerAnswer::Done) => {
                self.tokens.remove(&(lease, holder));
            }
            _ => {}
        }
        self.check_table();
        let out = match answer {
            OwnerAnswer::Pulled { req, bytes } => {
                let mut out = Self::header(&Header::Ticket(TicketOp::Pulled {
                    req,
                    len: bytes.len() as u64,
                }));
                out.extend_from_slice(&bytes);
                out
            }
            OwnerAnswer::Forwarded { req, token } => Self::header(&Header::Ticket(TicketOp::Forwarded {
                req,
                token: token.to_vec(),
            })),
            OwnerAnswer::Refused { req, refusal, .. } => Self::header(&Header::Ticket(TicketOp::Refused {
                req,
                code: refusal.code.to_string(),
                message: refusal.message,
            })),
            OwnerAnswer::Done => return,
            OwnerAnswer::CopyThenPull { .. } | OwnerAnswer::ReleaseIgnored(_) | OwnerAnswer::RenewalRefused(_) => {
                return
            }
        };
        self.send(OWNER, holder, &out);
    }

    /// The lease table keeps exactly the model's leases: those with a hold.
    fn check_table(&mut self) {
        let live: BTreeSet<u64> = self.tokens.keys().map(|(l, _)| *l).collect();
        let count = self.leases.stats().count;
        if count != live.len() {
            self.violation(format!("the table keeps {count} leases, the model {}", live.len()));
        }
        let early: Vec<u64> = live.into_iter().filter(|l| !self.leases.is_alive(*l)).collect();
        for lease in early {
            self.violation(format!("lease {lease} freed while it has holders"));
        }
    }

    /// The connection between `a` and `b` dies: both streams go, the owner drops the
    /// holder, the holder forgets what it held of the owner and its requests.
    fn cut(&mut self, a: usize, b: usize) {
        for key in [(a, b), (b, a)] {
            if let Some(mut s) = self.streams.remove(&key) {
                // The receiver sees the end of the stream where the cut fell.
                s.inbound.handle_eof();
                // Whole messages already read still come out; the connection ends where
                // its room runs out, or at the end of the stream.
                loop {
                    match s.inbound.poll(self.now()) {
                        Ok(Step::Event(e)) => self.on_event(key, e),
                        Ok(Step::CheckPulled { req, len }) => {
                            let asked = self.nodes[key.1].requests.asked(req);
                            s.inbound.pulled_verdict(receive::pulled(asked, len), self.now());
                        }
                        Ok(Step::Read) | Ok(Step::Closed) | Ok(Step::Room { .. }) => break,
                        Err(e) => {
                            if e.code() == "truncated" {
                                self.stats.truncated += 1;
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.stats.cuts += 1;
        self.log(format!("the connection {a}–{b} is cut"));
        if a == OWNER || b == OWNER {
            let holder = a.max(b);
            self.leases.drop_holder(&node_id(holder));
            self.tokens.retain(|(_, h), _| *h != holder);
            self.nodes[holder].holds.clear();
            self.nodes[holder].requests.clear();
            self.nodes[holder].forwards.clear();
            self.check_table();
        }
    }

    /// Time passes; receivers silent past the progress timeout inside a message fail.
    fn advance(&mut self, by: Duration) {
        *self.now.lock().unwrap() += by;
        let now = self.now();
        let timed_out: Vec<(usize, usize)> = self
            .streams
            .iter_mut()
            .filter_map(|(k, s)| s.inbound.handle_timeout(now).err().map(|_| *k))
            .collect();
        for (from, to) in timed_out {
            self.stats.timeouts += 1;
            self.log(format!("{to} times out {from} in the middle of a message"));
            self.cut(from, to);
        }
    }

    fn step(&mut self) {
        let keys: Vec<(usize, usize)> = self.streams.keys().copied().collect();
        match self.rng.below(100) {
            0..=39 if !keys.is_empty() => {
                let key = keys[self.rng.below(keys.len() as u64) as usize];
                let upto = if self.rng.chance(50) { 100 } else { 400 << 10 };
                let most = 1 + self.rng.below(upto) as usize;
                self.deliver(key, most);
            }
            40..=51 => {
                let to = 1 + self.rng.below(2) as usize;
                self.owner_sends(to);
            }
            52..=69 => {
                let h = 1 + self.rng.below(2) as usize;
                self.holder_acts(h);
            }
            70..=79 => {
                let n = 1 + self.rng.below(3) as usize;
                let h = self.rng.below(NODES as u64) as usize;
                for _ in 0..n.min(self.nodes[h].app.len()) {
                    let i = self.rng.below(self.nodes[h].app.len() as u64) as usize;
                    self.nodes[h].app.swap_remove(i);
                }
                let mine: Vec<(usize, usize)> = self.streams.keys().copied().filter(|k| k.1 == h).collect();
                for k in mine {
                    self.drive(k);
                }
            }
            80 if !keys.is_empty() => {
                let (a, b) = keys[self.rng.below(keys.len() as u64) as usize];
                self.cut(a, b);
            }
            81..=82 => {
                // A cut connection is dialled again.
                let a = self.rng.below(NODES as u64) as usize;
                let b = (a + 1 + self.rng.below(NODES as u64 - 1) as usize) % NODES;
                if !self.streams.contains_key(&(a, b)) {
                    self.log(format!("the connection {a}–{b} is made again"));
                    self.connect(a, b);
                    self.connect(b, a);
                }
            }
            83..=84 if !keys.is_empty() => {
                let key = keys[self.rng.below(keys.len() as u64) as usize];
                let for_ = Duration::from_millis(500 + self.rng.below(7_000));
                let until = self.now() + for_;
                self.log(format!("{key:?} stalls for {for_:?}"));
                self.streams.get_mut(&key).expect("present").stalled_until = Some(until);
            }
            _ => {
                let by = Duration::from_millis(10 + self.rng.below(2_000));
                self.advance(by);
            }
        }
    }

    /// Every holder releases each hold it has that no forward of its own waits on.
    fn release_held(&mut self) {
        for h in 1..NODES {
            let holds: Vec<(u64, [u8; 32])> = self.nodes[h].holds.iter().map(|(l, t)| (*l, *t)).collect();
            for (lease, token) in holds {
                if self.nodes[h].forwards.values().any(|(l, _)| *l == lease) {
                    continue;
                }
                self.nodes[h].holds.remove(&lease);
                let out = Self::header(&Header::Ticket(TicketOp::Unlease {
                    lease,
                    token: token.to_vec(),
                }));
                self.send(h, OWNER, &out);
            }
        }
    }

    /// Everything still in flight arrives; the holders release what they hold; the
    /// applications let go of their messages.
    fn finish(&mut self) {
        for s in self.streams.values_mut() {
            s.stalled_until = None;
        }
        for round in 0..40 {
            for h in 0..NODES {
                self.nodes[h].app.clear();
            }
            if round == 2 {
                self.release_held();
            }
            let keys: Vec<(usize, usize)> = self.streams.keys().copied().collect();
            for key in keys {
                self.deliver(key, usize::MAX);
            }
            // A forward answered late leaves the new holder a hold to release.
            if round > 2
                && self.nodes[1..]
                    .iter()
                    .all(|n| n.holds.is_empty() && n.forwards.is_empty())
            {
                let busy = self.streams.values().any(|s| !s.wire.is_empty());
                if !busy && round > 4 {
                    break;
                }
            }
            if round > 2 {
                self.release_held();
            }
        }
        for h in 0..NODES {
            self.nodes[h].app.clear();
        }
        for (key, s) in &self.streams {
            if !s.wire.is_empty() || s.inbound.buffered() > 0 || s.inbound.poll_timeout().is_some() {
                let what = format!("the stream {key:?} did not end between messages");
                self.violations.push(what);
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.budget.used() != 0 {
                let what = format!("node {i}'s budget still holds {} bytes", n.budget.used());
                self.violations.push(what);
            }
        }
        // Holds stranded by a cut (a forward to a node whose ticket never arrived) end by
        // their deadline, and nothing is left.
        self.check_table();
        *self.now.lock().unwrap() += TTL * 2;
        self.leases.expire();
        let left = self.leases.stats().count;
        if left != 0 {
            self.violation(format!("{left} leases leaked"));
        }
    }
}

fn run(seed: u64) -> (Vec<String>, Vec<String>, Stats) {
    let mut sim = Sim::new(seed);
    for _ in 0..300 {
        sim.step();
    }
    sim.finish();
    (sim.trace, sim.violations, sim.stats)
}

#[test]
fn transfers_run_clean_and_replay_exactly() {
    if let Ok(one) = std::env::var("HANDOFF_SIM_SEED") {
        let seed: u64 = one.parse().expect("HANDOFF_SIM_SEED is a number");
        let (trace, violations, stats) = run(seed);
        for line in &trace {
            println!("{line}");
        }
        println!("{stats:?}");
        assert!(violations.is_empty(), "seed {seed}: {violations:?}");
        return;
    }
    let seeds: u64 = std::env::var("HANDOFF_SIM_SEEDS").map_or(200, |s| s.parse().expect("a number"));
    let mut total = Stats::default();
    let mut failed = Vec::new();
    for seed in 0..seeds {
        let (trace, violations, stats) = run(seed);
        if !violations.is_empty() {
            failed.push(format!("seed {seed}: {}", violations[0]));
        }
        if seed < 5 {
            assert_eq!(run(seed).0, trace, "seed {seed} does not replay");
        }
        total.messages += stats.messages;
        total.pulls += stats.pulls;
        total.forwards += stats.forwards;
        total.cuts += stats.cuts;
        total.timeouts += stats.timeouts;
        total.truncated += stats.truncated;
    }
    println!("{seeds} seeds: {total:?}");
    assert!(
        failed.is_empty(),
        "{} seeds failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(total.messages > seeds, "the simulation delivers messages");
    assert!(total.pulls > seeds && total.cuts > 0 && total.timeouts > 0 && total.truncated > 0);
}

//! The connection handshake as a state machine with no I/O (spec §5): preambles, the
//! sequence of the negotiated version, then `ready`.
//!
//! A driver owns the socket and the clock. It writes what [`Handshake::take_transmit`] gives,
//! reads at most [`Handshake::wants`] bytes at a time into [`Handshake::handle_input`] (with
//! the number of descriptors that came with them), tells it of the end of the stream
//! ([`Handshake::handle_eof`]), of time ([`Handshake::poll_timeout`],
//! [`Handshake::handle_timeout`]) and of an eviction ([`Handshake::evict`]), and answers an
//! [`Status::Admit`] with [`Handshake::admit`]. Every check of the handshake — the
//! handshake's header limits, no descriptors before `ready`, the deadline, the order of the
//! steps, the proofs, the reflected and relayed nonces, the capabilities — is made here, so
//! every driver makes the same decisions.
//!
//! Both sides run the same steps, each writing before it reads, so neither waits on the
//! other. The versions differ between the preambles and `ready` (§5.4, §5.7): version 1
//! sends a hello, which says who we are before any proof; version 2 sends a challenge,
//! proves the secret, and says who we are only to a peer whose proof it verified;
//! version 3 (the default) does the same with proofs bound to each side's role and the
//! whole transcript, the acceptor proving second, so that a peer without the secret cannot
//! reflect the nodes' own proofs (§5.6).

mod input;
pub mod nonces;
mod refusal;

use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_wire::auth::{self, Role, Sent, Transcript};
use handoff_wire::framing::encode_header_into;
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::{Header, Hello, Ident, Limits, Preamble, WireError};

use input::{Input, Read};
pub use nonces::DialerNonces;
pub use refusal::{clipped, error_header, overloaded, MAX_ERROR_TEXT};

/// How long an `error` may take to write before a driver closes anyway.
pub const ERROR_WRITE_LIMIT: Duration = Duration::from_secs(1);
/// What a driver reads and drops after sending an `error`, before closing (spec §11.3).
pub const DRAIN_BYTES: usize = 1 << 20;
/// How long a driver waits for that.
pub const DRAIN_TIME: Duration = Duration::from_secs(1);

/// What we say about ourselves in a handshake, and what we check the peer against.
#[derive(Debug, Clone)]
pub struct Config {
    /// Who we are, as our ident (or v1 hello) says it.
    pub ident: Ident,
    /// The cluster secret.
    pub secret: Vec<u8>,
    /// The limits of an established connection; the handshake applies the smaller
    /// handshake header limits on top (spec §9).
    pub limits: Limits,
    /// The preamble we send: by default version 3 only; from version 2 or 1 when the node
    /// accepts such peers by its user's consent (spec §3).
    pub preamble: Preamble,
    /// Whether we dialed this connection or accepted it (version 3 depends on it, §5.7).
    pub role: Role,
    /// The 32 random bytes of our challenge (or v1 hello); the driver draws them, so that a
    /// simulation can replay a handshake exactly.
    pub nonce: [u8; 32],
    /// When the handshake must be complete.
    pub deadline: Instant,
    /// Silence allowed inside an item (the preamble, or a header after its first byte),
    /// spec §9.1's progress timeout.
    pub progress_timeout: Duration,
    /// The nonces this node recently sent as a dialer: the node's own set, shared by its
    /// handshakes (version 3, §5.7 step 3).
    pub dialed: Arc<DialerNonces>,
}

/// What a completed handshake established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshaken {
    /// What the peer said about itself: its v1 hello's identity fields, or its ident.
    pub ident: Ident,
    /// The protocol version the preambles chose.
    pub version: u16,
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// We refused the connection for this reason; when the peer had sent its whole
    /// preamble, an `error` saying so is queued in [`Handshake::take_transmit`].
    Refused(WireError),
    /// The peer reported an error; it is not answered.
    PeerRefused {
        /// The peer's error code.
        code: String,
        /// The peer's explanation.
        message: String,
    },
    /// The peer closed the stream at a message boundary, while we waited for `waiting_for`.
    PeerClosed {
        /// The header we were waiting for.
        waiting_for: &'static str,
    },
}

/// Where a handshake stands, for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Waiting for the peer's bytes (or for ours to be written).
    InProgress,
    /// The peer proved the secret and said who it is; the driver checks it (node-id
    /// uniqueness, §5.1) and answers with [`Handshake::admit`].
    Admit(Ident),
    /// Both sides sent `ready`: the connection is established.
    Done(Handshaken),
    /// The handshake failed. Write what is left to transmit (within
    /// [`ERROR_WRITE_LIMIT`]), shut the sending side down, then drain the peer for
    /// [`DRAIN_TIME`] if [`Handshake::drain_after_failure`] says so, and close.
    Failed(Failure),
}

/// The step the handshake waits at.
#[derive(Debug)]
enum Step {
    Preamble,
    V1Hello {
        own_hello: Vec<u8>,
    },
    V1Auth {
        own_hello: Vec<u8>,
        peer_hello: Vec<u8>,
        ident: Ident,
    },
    Challenge {
        own_challenge: Vec<u8>,
    },
    V2Auth {
        own_challenge: Vec<u8>,
        peer_challenge: Vec<u8>,
    },
    V3Auth {
        own_challenge: Vec<u8>,
        peer_challenge: Vec<u8>,
        own_proof: Option<[u8; 32]>,
    },
    Ident,
    Admitting {
        ident: Ident,
    },
    Ready {
        ident: Ident,
    },
    Over,
}

/// One connection's handshake, from our preamble to `ready` (see the module docs).
#[derive(Debug)]
pub struct Handshake {
    config: Config,
    own_preamble: [u8; PREAMBLE_LEN],
    peer_preamble: Option<[u8; PREAMBLE_LEN]>,
    version: u16,
    step: Step,
    input: Input,
    /// The time of the latest input, for the dialer-nonce window and the progress timeout.
    now: Instant,
    /// How long it had from its start until its deadline (errors say it).
    allowed: Duration,
    transmit: Vec<u8>,
    status: Status,
}

/// The version the handshake runs after the preambles (set once they negotiated).
const NOT_YET: u16 = 0;

impl Handshake {
    /// A handshake that starts by sending our preamble. A dialer's nonce is remembered in
    /// the node's set at `now` (version 3, §5.7 step 3).
    pub fn new(config: Config, now: Instant) -> Handshake {
        if config.role == Role::Dialer {
            config.dialed.remember(config.nonce, now);
        }
        let own_preamble = config.preamble.encode();
        let input = Input::new(config.limits.during_handshake());
        let allowed = config.deadline.saturating_duration_since(now);
        let mut hs = Handshake {
            config,
            own_preamble,
            peer_preamble: None,
            version: NOT_YET,
            step: Step::Preamble,
            input,
            allowed,
            now,
            transmit: own_preamble.to_vec(),
            status: Status::InProgress,
        };
        if now >= hs.config.deadline {
            hs.handle_timeout(now);
        }
        hs
    }

    /// How long the handshake had, from its start until its deadline.
    pub fn allowed(&self) -> Duration {
        self.allowed
    }

    /// Where the handshake stands.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// The protocol version the preambles chose, once they were exchanged.
    pub fn version(&self) -> Option<u16> {
        (self.version != NOT_YET).then_some(self.version)
    }

    /// Whether the handshake is over (done or failed).
    pub fn is_over(&self) -> bool {
        matches!(self.status, Status::Done(_) | Status::Failed(_))
    }

    /// The bytes to write now (taken: the next call returns only what was queued since).
    pub fn take_transmit(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.transmit)
    }

    /// Whether anything waits to be written.
    pub fn has_transmit(&self) -> bool {
        !self.transmit.is_empty()
    }

    /// The most bytes the driver may read now: the rest of the item being read, so that no
    /// read takes bytes (or descriptors) of what follows `ready`. 0 when not reading.
    pub fn wants(&self) -> usize {
        match (&self.status, &self.step) {
            (Status::InProgress, Step::Admitting { .. }) => 0,
            (Status::InProgress, _) => self.input.wants(),
            _ => 0,
        }
    }

    /// When the handshake times out, while it runs: its deadline, or sooner the progress
    /// timeout while an item is half read.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_over() {
            return None;
        }
        Some(match self.stall_at() {
            Some(stall) => stall.min(self.config.deadline),
            None => self.config.deadline,
        })
    }

    /// When a half-read item stalls, if one is.
    fn stall_at(&self) -> Option<Instant> {
        let reading = self.wants() > 0 && !self.input.at_boundary();
        reading.then(|| self.now + self.config.progress_timeout)
    }

    /// Time passed: past the deadline the handshake fails with `timeout` (the `error` names
    /// neither side: the peer proved nothing); so it does when the peer sent nothing for the
    /// progress timeout in the middle of an item.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_over() {
            return;
        }
        if now >= self.config.deadline {
            self.refuse(WireError::Timeout(format!(
                "the handshake did not complete within {} s",
                seconds(self.allowed)
            )));
        } else if self.stall_at().is_some_and(|stall| now >= stall) {
            let what = self.input.reading();
            self.refuse(WireError::Timeout(format!(
                "the peer sent nothing for {:?} in the middle of a message (waiting for its {what})",
                self.config.progress_timeout
            )));
        }
    }

    /// The node needs this handshake's place for a newer one (§9.1 `max_handshakes`).
    pub fn evict(&mut self) {
        if !self.is_over() {
            self.refuse(WireError::Overloaded(
                "too many handshakes in progress; this one was the oldest, try again".into(),
            ));
        }
    }

    /// Whether, after a failure, the driver reads and drops what the peer still sends before
    /// closing (§11.3): only after an `error` was sent, and not for a silent, evicted or
    /// descriptor-sending peer, which would only hold the slot longer.
    pub fn drain_after_failure(&self) -> bool {
        match &self.status {
            Status::Failed(Failure::Refused(e)) => {
                self.peer_preamble.is_some()
                    && !matches!(
                        e,
                        WireError::Timeout(_) | WireError::Overloaded(_) | WireError::BadShm(_)
                    )
            }
            _ => false,
        }
    }

    /// The stream ended. At a message boundary that is the peer closing; inside an item it
    /// is a truncated item, which we refuse.
    pub fn handle_eof(&mut self) {
        if self.is_over() {
            return;
        }
        if self.input.at_boundary() && self.peer_preamble.is_some() {
            self.status = Status::Failed(Failure::PeerClosed {
                waiting_for: self.waiting_for(),
            });
            self.step = Step::Over;
        } else {
            let what = self.input.reading();
            let (needed, available) = self.input.progress();
            self.refuse(WireError::Truncated {
                what,
                needed: needed as u64,
                available: available as u64,
            });
        }
    }

    /// One read of the socket at `now`: the bytes read (none at the end of the stream) and
    /// how many descriptors came with them (closed by the driver already, and counted here
    /// whether the read took them or the kernel closed them).
    pub fn handle_read(&mut self, bytes: &[u8], fds: usize, now: Instant) {
        match (bytes.is_empty(), fds) {
            (true, 0) => self.handle_eof(),
            _ => {
                self.handle_input(bytes, fds, now);
            }
        }
    }

    /// Bytes read from the peer at `now`, with `fds` descriptors that came with them;
    /// returns how many bytes were used (at most [`wants`](Self::wants): a driver that reads
    /// no more than that has none left over). Any descriptor before the connection is
    /// established fails the handshake (§5.1): the driver must already have closed them.
    pub fn handle_input(&mut self, mut bytes: &[u8], fds: usize, now: Instant) -> usize {
        if self.is_over() {
            return 0;
        }
        if !bytes.is_empty() {
            self.now = self.now.max(now);
        }
        // Nothing read after the deadline moves the handshake on, whichever of the read and
        // the timer a driver saw first (the dialer-nonce window W relies on it, §5.7).
        if now >= self.config.deadline {
            self.handle_timeout(now);
            return 0;
        }
        if fds > 0 {
            self.refuse(WireError::BadShm(format!(
                "the peer sent {fds} file descriptor(s) before the connection was established; they were closed"
            )));
            return 0;
        }
        let mut used = 0;
        while !bytes.is_empty() && self.wants() > 0 {
            let (n, read) = match self.input.take(bytes) {
                Ok(r) => r,
                Err(e) => {
                    self.refuse(e);
                    return used;
                }
            };
            used += n;
            bytes = &bytes[n..];
            if let Some(read) = read {
                self.on_read(read);
            }
        }
        used
    }

    /// The driver's answer to [`Status::Admit`]: `Ok` sends `ready`; an error refuses the
    /// connection with it.
    pub fn admit(&mut self, verdict: Result<(), WireError>) {
        if !matches!(self.step, Step::Admitting { .. }) || self.is_over() {
            return;
        }
        let Step::Admitting { ident } = std::mem::replace(&mut self.step, Step::Over) else {
            unreachable!("checked above");
        };
        match verdict {
            Ok(()) => {
                self.status = Status::InProgress;
                self.send(&Header::Ready);
                self.step = Step::Ready { ident };
            }
            Err(e) => self.refuse(e),
        }
    }

    fn waiting_for(&self) -> &'static str {
        match &self.step {
            Step::Preamble => "preamble",
            Step::V1Hello { .. } => "hello",
            Step::Challenge { .. } => "challenge",
            Step::V1Auth { .. } | Step::V2Auth { .. } | Step::V3Auth { .. } => "auth",
            Step::Ident => "ident",
            Step::Admitting { .. } | Step::Ready { .. } => "ready",
            Step::Over => "nothing",
        }
    }

    fn refuse(&mut self, err: WireError) {
        // An error goes only to a peer that sent its whole preamble (§3, §11.3).
        if self.peer_preamble.is_some() {
            self.transmit.extend_from_slice(&error_header(&err));
        }
        self.status = Status::Failed(Failure::Refused(err));
        self.step = Step::Over;
    }

    /// Writes a header and returns its bytes without the length prefix.
    fn send(&mut self, header: &Header<'_>) -> Vec<u8> {
        let start = self.transmit.len();
        encode_header_into(header, &mut self.transmit);
        self.transmit[start + 4..].to_vec()
    }

    fn on_read(&mut self, read: Read) {
        match read {
            Read::Preamble(p) => self.on_preamble(p),
            Read::Header(bytes) => self.on_header(bytes),
        }
    }

    fn on_preamble(&mut self, peer: [u8; PREAMBLE_LEN]) {
        self.peer_preamble = Some(peer);
        let version = match Preamble::decode(&peer).and_then(|p| self.config.preamble.negotiate(&p)) {
            Ok(v) => v,
            Err(e) => return self.refuse(e),
        };
        self.version = version;
        let nonce = self.config.nonce.to_vec();
        self.step = match version {
            1 => {
                let hello = Hello::from_ident(self.config.ident.clone(), 1, nonce);
                Step::V1Hello {
                    own_hello: self.send(&Header::Hello(hello)),
                }
            }
            2 | 3 => Step::Challenge {
                own_challenge: self.send(&Header::Challenge { version, nonce }),
            },
            other => {
                return self.refuse(WireError::Handshake(format!(
                    "no handshake for protocol version {other}"
                )));
            }
        };
    }

    /// Decodes a header that must be `what`. The peer's own `error` ends the handshake
    /// unanswered; any other kind is a `handshake` error (§5.1, §11.2 step 3).
    fn expect<'h>(&mut self, bytes: &'h [u8], what: &str) -> Option<Header<'h>> {
        let header = match Header::decode(bytes, &self.input_limits()) {
            Ok(h) => h,
            Err(e) => {
                self.refuse(e);
                return None;
            }
        };
        if header.kind() == what {
            return Some(header);
        }
        match header {
            Header::Error { code, message } => {
                self.status = Status::Failed(Failure::PeerRefused { code, message });
                self.step = Step::Over;
            }
            other => self.refuse(WireError::Handshake(format!(
                "expected {what}, got a {:?} header",
                other.kind()
            ))),
        }
        None
    }

    fn input_limits(&self) -> Limits {
        self.config.limits.during_handshake()
    }

    fn on_header(&mut self, bytes: Vec<u8>) {
        let step = std::mem::replace(&mut self.step, Step::Over);
        let secret = self.config.secret.clone();
        match step {
            Step::V1Hello { own_hello } => {
                let Some(Header::Hello(peer)) = self.expect(&bytes, "hello") else {
                    return;
                };
                // Step 3, in the spec's order: a reflected nonce, the version, the capabilities.
                if let Err(e) = self
                    .check_nonce(&peer.nonce)
                    .and_then(|()| check_version("hello", peer.version, 1))
                    .and_then(|()| check_capabilities(&peer.capabilities))
                {
                    return self.refuse(e);
                }
                let proof = auth::proof(&secret, &own_hello, &bytes);
                self.send(&Header::Auth { mac: proof.to_vec() });
                self.step = Step::V1Auth {
                    own_hello,
                    ident: peer.ident(),
                    peer_hello: bytes,
                };
            }
            Step::V1Auth {
                own_hello,
                peer_hello,
                ident,
            } => {
                let Some(Header::Auth { mac }) = self.expect(&bytes, "auth") else {
                    return;
                };
                if let Err(e) = auth::verify(&secret, &mac, &peer_hello, &own_hello) {
                    return self.refuse(e);
                }
                self.identified(ident);
            }
            Step::Challenge { own_challenge } => {
                let Some(Header::Challenge { version, nonce }) = self.expect(&bytes, "challenge") else {
                    return;
                };
                // Step 3, in the spec's order: our own nonce, (v3) one we sent as a dialer,
                // the version.
                if let Err(e) = self
                    .check_nonce(&nonce)
                    .and_then(|()| check_version("challenge", version, self.version))
                {
                    return self.refuse(e);
                }
                self.on_challenge(own_challenge, bytes);
            }
            Step::V2Auth {
                own_challenge,
                peer_challenge,
            } => {
                let Some(Header::Auth { mac }) = self.expect(&bytes, "auth") else {
                    return;
                };
                let (own, peer) = self.sent(&own_challenge, &peer_challenge);
                if let Err(e) = auth::verify_v2(&secret, &mac, peer, own) {
                    return self.refuse(e);
                }
                self.send(&Header::Ident(self.config.ident.clone()));
                self.step = Step::Ident;
            }
            Step::V3Auth {
                own_challenge,
                peer_challenge,
                own_proof,
            } => {
                let Some(Header::Auth { mac }) = self.expect(&bytes, "auth") else {
                    return;
                };
                let (own, peer) = self.sent(&own_challenge, &peer_challenge);
                let transcript = Transcript::of(self.config.role, own, peer);
                let verified = match own_proof {
                    Some(dialer_proof) => auth::verify_acceptor(&secret, &mac, &transcript, &dialer_proof),
                    None => auth::verify_dialer(&secret, &mac, &transcript),
                };
                if let Err(e) = verified {
                    return self.refuse(e);
                }
                if own_proof.is_none() {
                    // The acceptor proves only to a dialer that did.
                    let proof = auth::acceptor_proof(&secret, &transcript, &mac);
                    self.send(&Header::Auth { mac: proof.to_vec() });
                }
                // Steps 5 and 6: the peer proved the secret; now, and only now, say who we are.
                self.send(&Header::Ident(self.config.ident.clone()));
                self.step = Step::Ident;
            }
            Step::Ident => {
                let Some(Header::Ident(ident)) = self.expect(&bytes, "ident") else {
                    return;
                };
                if let Err(e) = check_capabilities(&ident.capabilities) {
                    return self.refuse(e);
                }
                self.identified(ident);
            }
            Step::Ready { ident } => {
                if self.expect(&bytes, "ready").is_none() {
                    return;
                }
                self.status = Status::Done(Handshaken {
                    ident,
                    version: self.version,
                });
            }
            Step::Preamble | Step::Admitting { .. } | Step::Over => {
                unreachable!("no header is read at this step")
            }
        }
    }

    /// v2 and v3, after the peer's challenge passed step 3: the proofs (§5.5, §5.7 step 4).
    fn on_challenge(&mut self, own_challenge: Vec<u8>, peer_challenge: Vec<u8>) {
        let secret = self.config.secret.clone();
        let (own, peer) = self.sent(&own_challenge, &peer_challenge);
        if self.version == 2 {
            let proof = auth::proof_v2(&secret, own, peer);
            self.send(&Header::Auth { mac: proof.to_vec() });
            self.step = Step::V2Auth {
                own_challenge,
                peer_challenge,
            };
            return;
        }
        // Version 3: the dialer proves first; the acceptor proves only to a peer that did.
        let own_proof = (self.config.role == Role::Dialer).then(|| {
            let transcript = Transcript::of(Role::Dialer, own, peer);
            auth::dialer_proof(&secret, &transcript)
        });
        if let Some(proof) = own_proof {
            self.send(&Header::Auth { mac: proof.to_vec() });
        }
        self.step = Step::V3Auth {
            own_challenge,
            peer_challenge,
            own_proof,
        };
    }

    fn sent<'a>(&'a self, own_challenge: &'a [u8], peer_challenge: &'a [u8]) -> (Sent<'a>, Sent<'a>) {
        let own = Sent {
            preamble: &self.own_preamble,
            challenge: own_challenge,
        };
        let peer = Sent {
            preamble: self.peer_preamble.as_ref().expect("the preambles were exchanged"),
            challenge: peer_challenge,
        };
        (own, peer)
    }

    fn identified(&mut self, ident: Ident) {
        self.status = Status::Admit(ident.clone());
        self.step = Step::Admitting { ident };
    }

    /// A reflected nonce (every version), or on v3 a nonce this node sent as a dialer (one
    /// of its own handshakes relayed back to it, §5.8).
    fn check_nonce(&self, nonce: &[u8]) -> Result<(), WireError> {
        if nonce == self.config.nonce {
            return Err(WireError::Handshake(
                "the peer echoed our own nonce (a reflected handshake)".into(),
            ));
        }
        if self.version == 3 && self.config.dialed.sent_as_dialer(nonce, self.now) {
            return Err(WireError::Handshake(
                "the peer's challenge carries a nonce this node sent when it dialed a peer \
                 (one of our own handshakes relayed back to us)"
                    .into(),
            ));
        }
        Ok(())
    }
}

fn check_version(what: &str, got: u16, chose: u16) -> Result<(), WireError> {
    if got == chose {
        return Ok(());
    }
    Err(WireError::Handshake(format!(
        "peer's {what} says version {got}, the preambles chose {chose}"
    )))
}

/// The check on the peer's capabilities (v1: on its hello, step 3; v2, v3: on its ident).
fn check_capabilities(capabilities: &[String]) -> Result<(), WireError> {
    if capabilities.iter().any(|c| c == "inline") {
        return Ok(());
    }
    Err(WireError::Handshake(format!(
        "the peer lacks the capability \"inline\" that every node announces (it has: {})",
        capabilities.join(", ")
    )))
}

/// A duration in seconds as people write it: `0.5`, `20`, `1.25`.
pub fn seconds(d: Duration) -> String {
    // To the millisecond: a deadline set a moment before the handshake began reads as set.
    let ms = (d.as_secs_f64() * 1000.0).round() as u64;
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{}.{:03}", ms / 1000, ms % 1000)
            .trim_end_matches('0')
            .to_string()
    }
}

#[cfg(test)]
mod tests;

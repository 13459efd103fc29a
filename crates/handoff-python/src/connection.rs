//! [`Connection`]: one connection of a node, driven from Python's event loop.
//!
//! The engine (handoff-proto) makes every decision: the handshake of every version, then
//! the established connection's reading, its bounds, its budget, shared memory and the
//! owner's answers to ticket requests. This is the driver around it, as the tokio driver
//! of crate `handoff` is the other: the loop says when the socket is readable
//! ([`Connection::on_readable`]) or writable ([`Connection::on_writable`]), when the
//! engine's deadline passes ([`Connection::timeout`], [`Connection::on_timeout`]) and when
//! the engine's wake pipe fired ([`Connection::flush`]); each call reads and writes what it
//! can without waiting and hands Python whole events.
//!
//! Events are tuples:
//! - `("ready", peer)`: the handshake is over; `peer` is a dict of what the peer said
//!   (`node_id`, `name`, `host_id`, `pid`, `process_id`, `language`, `implementation`,
//!   `capabilities`, `listen`, `unix`, `version`);
//! - `("message", received)`: a [`Received`] message;
//! - `("closed", None)`: the peer ended the stream between messages;
//! - `("released", n)`: the peer released `n` of our shared-memory leases (a send that
//!   found no room may try again);
//! - `("error", code, message, by_peer)`: the connection failed; `by_peer` when the peer
//!   sent the error, else the engine refused what the peer did (and told it so).

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use handoff_proto::budget::{Account, Permit};
use handoff_proto::established::{Established, Refused, Step};
use handoff_proto::handshake::{error_header, Failure, Handshake, Status, DRAIN_BYTES, DRAIN_TIME};
use handoff_proto::inbound::{Digest, Event, Frame as InFrame};
use handoff_proto::outbound::{
    inline_routes, issued_leases, message_head, stream_parts, Planned, Routed, Router, ShmRouting,
};
use handoff_proto::receive::{self, Asked};
use handoff_proto::send_policy::{self, issued_claim, FramePlan, TicketPolicy};
use handoff_proto::shm::buffers::Held;
use handoff_proto::shm::buffers::{Release, RemoteView};
use handoff_proto::shm::leases::ShmLeases;
use handoff_proto::ticket_leases::{HostCopy, LeaseTable, OwnerAnswer};
use handoff_proto::ticket_requests::{Answer, Requests};
use handoff_proto::{peers, Handshaken};
use handoff_sys::hash_thread::HashThread;
use handoff_wire::auth::Role;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Header, Ident, WireError};
use handoff_wire::{Channel, Endpoint, TicketClaim, TicketOp};
use pyo3::exceptions::{PyOSError, PyPermissionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::device::{self, DeviceClaim, DeviceSource};
use crate::engine::{Engine, Shared};
use crate::frames::{bytes_of, Frame};
use crate::socket;
use crate::tickets::Ticket;
use handoff_proto::tls::{plain_refusal, Opening, TLS_REQUIRED_MESSAGE};
use handoff_proto::tls_session::TlsSession;
use handoff_sys::same_host::SameHostError;
use handoff_sys::stream::{StreamIo, TlsFailed};

/// The implementation this driver announces.
const IMPLEMENTATION: &str = concat!("handoff-py-engine/", env!("CARGO_PKG_VERSION"));

/// Where a connection is.
enum Phase {
    Handshake(Box<Handshake>),
    /// Waiters are our request ids.
    Established(Box<Established<u64>>),
    /// After an error was sent: what the peer still sends is read and dropped until it
    /// closes, `left` more bytes were read or `until` passed, so that closing does not reset
    /// the connection while the error is in flight (spec §11.3).
    Draining {
        until: Instant,
        left: usize,
    },
    /// Over: nothing more is read, and what is queued is written.
    Over,
}

/// A received message, its room in the node's receive budget held until
/// [`taken`](Received::taken) (or until it is dropped).
#[pyclass(module = "handoff._native")]
pub struct Received {
    #[pyo3(get)]
    type_name: String,
    #[pyo3(get)]
    body: Py<Frame>,
    #[pyo3(get)]
    frames: Py<PyList>,
    /// Whether it carries tickets a node that redeems eagerly pulls before delivery (the
    /// sender's lazy ones wait for use).
    #[pyo3(get)]
    eager_tickets: bool,
    /// Whether it carries the sender's GPU memory (`cuda` frames, spec §7.10), which the
    /// driver maps (or copies) before delivery.
    #[pyo3(get)]
    device_frames: bool,
    /// The bytes of those tickets (the room their redemption takes before it pulls them).
    eager_ticket_bytes: u64,
    /// Why its eager redemption failed (the message is delivered with the error).
    #[pyo3(get, set)]
    failure: Option<Py<PyAny>>,
    permit: Mutex<Option<Permit>>,
}

#[pymethods]
impl Received {
    /// The application took the message: its room in the receive budget goes back (the
    /// frames stay readable).
    fn taken(&self) {
        self.permit.lock().expect("permit lock").take();
    }

    /// Room for the tickets the node redeems on receipt, taken before they are pulled (spec
    /// §9.1): `False` while the sender's bounds do not allow it (wait for room, as
    /// `Engine.wait_for_room` tells). `behind` is the room of that peer's messages read
    /// after this one, waiting for it (`handoff_proto::budget::Permit::try_expand_ahead`).
    /// `bytes`: room for other bytes pulled before delivery (the GPU frames that could not
    /// be mapped, spec §7.10) instead of the tickets'.
    #[pyo3(signature = (behind, bytes=None))]
    fn reserve(&self, behind: u64, bytes: Option<u64>) -> bool {
        let bytes = bytes.unwrap_or(self.eager_ticket_bytes);
        match self.permit.lock().expect("permit lock").as_mut() {
            Some(permit) if bytes > 0 => permit.try_expand_ahead(bytes, behind),
            _ => true, // nothing to take, or taken already: nothing is buffered for it
        }
    }

    /// Bytes the message holds in the receive budget until it is taken.
    #[getter]
    fn room(&self) -> u64 {
        self.permit
            .lock()
            .expect("permit lock")
            .as_ref()
            .map_or(0, Permit::bytes)
    }
}

/// The connection's phase, through `&mut self` (no lock taken: `Mutex::get_mut`).
macro_rules! phase {
    ($self:ident) => {
        $self.phase.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner)
    };
}

/// One connection of a node, driven from Python's event loop (see the module's text). It
/// may be dropped on any thread (its socket is closed there).
#[pyclass(module = "handoff._native")]
pub struct Connection {
    shared: Arc<Shared>,
    socket: Option<OwnedFd>,
    unix: bool,
    label: String,
    /// Behind a lock only so that the connection may be shared between threads (what
    /// Python asks of a class); its methods reach it through `&mut self`.
    phase: Mutex<Phase>,
    /// The write queue and, on a TCP connection of an engine with TLS, the TLS session.
    stream: StreamIo,
    /// Leases of the peer's segments whose last view here was dropped: `release`s to send.
    releases: Arc<Mutex<Vec<u64>>>,
    account: Arc<Account>,
    /// The check of the peer's identity before `ready` (node-id uniqueness), from Python.
    admit: Option<Py<PyAny>>,
    peer: Option<Handshaken>,
    /// Counted in the engine's `waiting_for_room` (the last step found no room).
    waiting_for_room: bool,
    /// How frames go through shared memory, on a same-host connection.
    shm_routing: Option<ShmRouting>,
    /// What we keep alive for the peer until it releases each lease (spec §7.4, §9.1).
    shm_leases: ShmLeases<Held>,
    /// Our ticket requests on this connection that wait for the owner's answer, by id.
    requests: Arc<Mutex<Requests<u64>>>,
    /// The peer's process id, on a Unix socket (`SO_PEERCRED`).
    peer_pid: Option<u32>,
    /// The first byte is still to be looked at (a plain peer where TLS is required gets
    /// `tls-required`).
    opening: bool,
    /// The last drive stopped because the peer left our answers unread. Bytes it had read
    /// may wait in the engine then, which no readiness of the socket announces: once the
    /// answers drain, the loop must drive again on its own ([`state`](Self::state)).
    paused_for_answers: bool,
    /// Host copies of device memory the peer's pulls asked for, made on threads of their
    /// own ([`copy_off_loop`](Self::copy_off_loop)).
    copies: Arc<Mutex<HostCopies>>,
}

/// A connection's host copies of device memory under way, and the answers made of those
/// done (queued by the next [`Connection::flush`], which the wake pipe brings).
#[derive(Default)]
struct HostCopies {
    under_way: usize,
    made: Vec<OwnerAnswer>,
    /// The connection was closed: a copy made from now on is dropped at once.
    closed: bool,
}

/// Host copies smaller than this are made on the event loop (a thread would cost more).
const COPY_ON_LOOP_MAX: u64 = 1 << 20;

/// An `OSError` that says what failed, with the system's errno where there is one: Python
/// makes it the subclass the errno names (`ConnectionResetError` for `ECONNRESET`, …), as
/// a socket's own error is, so that Dask sees what its TCP comm would raise.
fn io_error(what: &str, e: std::io::Error) -> PyErr {
    let message = format!("{what}: {e}");
    match e.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, message)),
        None => PyOSError::new_err(message),
    }
}

/// A same-host check or set-up that failed: an `OSError` with its errno, or a
/// `PermissionError` for what belongs to another user.
pub(crate) fn same_host_error(e: SameHostError) -> PyErr {
    match e {
        SameHostError::Io { what, source } => io_error(&what, source),
        SameHostError::Refused(why) => PyPermissionError::new_err(why),
    }
}

#[pymethods]
impl Connection {
    /// Takes over the connected socket `fd` (detached from its Python socket object: the
    /// connection closes it) and starts the handshake as the `dialer` or the `acceptor`.
    /// `unix`: a Unix socket to a same-host node (shared memory). `admit(peer)` may refuse
    /// the peer's identity before `ready` by returning a reason. On TCP, an engine with TLS
    /// runs the connection inside TLS: a dialer checks the peer's certificate against
    /// `host` (the host part of the address it dialed) unless the engine was told which name
    /// to expect.
    #[new]
    #[pyo3(signature = (engine, fd, role, label, unix=false, admit=None, host=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &Engine,
        fd: i32,
        role: &str,
        label: String,
        unix: bool,
        admit: Option<Py<PyAny>>,
        host: Option<String>,
    ) -> PyResult<Connection> {
        let role = match role {
            "dialer" => Role::Dialer,
            "acceptor" => Role::Acceptor,
            other => {
                return Err(PyValueError::new_err(format!(
                    "role must be 'dialer' or 'acceptor', not {other:?}"
                )))
            }
        };
        if fd < 0 {
            return Err(PyValueError::new_err(format!("not a descriptor: {fd}")));
        }
        // SAFETY: the caller hands the descriptor over (`socket.detach()`).
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        rustix::io::ioctl_fionbio(&socket, true).map_err(|e| io_error("making the socket non-blocking", e.into()))?;
        let mut peer_pid = None;
        if unix {
            // A same-host peer shares our memory: only one of our own user (spec §7.1).
            peer_pid = handoff_sys::same_host::check_peer_uid(socket.as_fd()).map_err(same_host_error)?;
        }
        if let (Some(timeout), false) = (engine.shared.tcp_timeout, unix) {
            socket::set_tcp_timeout(socket.as_fd(), timeout).map_err(PyOSError::new_err)?;
        }
        let tls = match (&engine.shared.tls, unix, role) {
            (Some(tls), false, Role::Dialer) => {
                let name = tls.server_name.clone().or(host).ok_or_else(|| {
                    PyValueError::new_err(format!("TLS: no host to check {label}'s certificate against"))
                })?;
                Some(TlsSession::client(&tls.configs, &name, &label).map_err(PyValueError::new_err)?)
            }
            (Some(tls), false, Role::Acceptor) => {
                Some(TlsSession::server(&tls.configs, &label).map_err(PyValueError::new_err)?)
            }
            _ => None,
        };
        let shared = engine.shared.clone();
        let now = Instant::now();
        let config = shared.handshake_config(role, IMPLEMENTATION, shared.listen.clone(), shared.unix.clone(), now);
        let mut connection = Connection {
            shared,
            socket: Some(socket),
            unix,
            label,
            phase: Mutex::new(Phase::Handshake(Box::new(Handshake::new(config, now)))),
            releases: Arc::default(),
            account: Arc::default(),
            admit,
            peer: None,
            waiting_for_room: false,
            paused_for_answers: false,
            copies: Arc::default(),
            shm_routing: unix.then_some(ShmRouting {
                threshold: engine.shared.shm_threshold,
                sealed_only: false,
                max_fds: handoff_proto::inbound::MAX_FDS_PER_READ,
                copy: engine.shared.shm_copy,
            }),
            shm_leases: ShmLeases::new(
                engine.shared.bounds.max_shm_lease_bytes_per_peer,
                engine.shared.bounds.max_shm_leases_per_peer,
            ),
            // An accepting side with TLS looks at the first byte before TLS does.
            opening: tls.is_some() && role == Role::Acceptor,
            stream: StreamIo::new(tls),
            peer_pid,
            requests: Arc::default(),
        };
        connection.queue_handshake_bytes();
        Ok(connection)
    }

    /// The socket's descriptor (for the loop's `add_reader` and `add_writer`); -1 once closed.
    fn fileno(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.socket.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// Whether the loop should watch the socket for reading now: not while the connection
    /// waits for room in the receive budget (the wake pipe says when to try again), while
    /// the peer leaves our answers unread (as many pulled answers as spec §9.1 allows being
    /// written, or a backlog of control bytes), nor once it is over.
    #[getter]
    fn wants_read(&self) -> bool {
        if self.socket.is_none() || self.waiting_for_room || self.answers_backed_up() {
            return false;
        }
        !matches!(*self.phase_now(), Phase::Over)
    }

    /// While the connection waits for room and answers to our own requests are owed on it,
    /// the seconds after which to try again: whether we ask changes without the budget
    /// being told (spec §9.1, `receive::ROOM_RECHECK`).
    fn room_recheck(&self) -> Option<f64> {
        let asking = self.waiting_for_room && !self.requests.lock().expect("requests lock").is_empty();
        asking.then(|| receive::ROOM_RECHECK.as_secs_f64())
    }

    /// What the loop watches next, in one call: `(wants_read, wants_write, timeout,
    /// room_recheck, done, resume)` (see each; `resume`: call `on_readable` soon, without
    /// waiting for the socket, see [`resumes`](Self::resumes)).
    fn state(&self) -> (bool, bool, Option<f64>, Option<f64>, bool, bool) {
        (
            self.wants_read(),
            self.wants_write(),
            self.timeout(),
            self.room_recheck(),
            self.done(),
            self.resumes(),
        )
    }

    /// Whether reading stopped for answers the peer left unread and they have drained
    /// since: what was read before waits in the engine, and the socket may never become
    /// readable again (the peer sent all it had), so the loop calls `on_readable` itself.
    fn resumes(&self) -> bool {
        // Not `wants_read`: a connection that also waits for room must still be driven (it
        // then stops at the room, and the wake pipe says when to try again), or the bytes
        // read before would wait for a room given back that may never come.
        self.paused_for_answers
            && self.socket.is_some()
            && !self.answers_backed_up()
            && !matches!(*self.phase_now(), Phase::Over)
    }

    /// Whether bytes wait to be written (the loop then watches for writability).
    fn wants_write(&self) -> bool {
        self.stream.wants_write() && self.socket.is_some()
    }

    /// Whether the connection has nothing left to do: nothing to write, nothing to drain.
    /// The loop then stops watching it and closes it.
    #[getter]
    fn done(&self) -> bool {
        self.socket.is_none() || (matches!(*self.phase_now(), Phase::Over) && !self.stream.wants_write())
    }

    /// Whether the handshake is over and the connection not yet.
    #[getter]
    fn established(&self) -> bool {
        matches!(*self.phase_now(), Phase::Established(_))
    }

    /// Whether it is a Unix socket to a same-host peer (shared memory).
    #[getter]
    fn unix(&self) -> bool {
        self.unix
    }

    /// The peer's label as errors name it.
    #[getter]
    fn label(&self) -> &str {
        &self.label
    }

    /// Whether the connection runs inside TLS (spec §3.1).
    #[getter]
    fn tls(&self) -> bool {
        self.stream.tls().is_some()
    }

    /// Bytes of this peer's messages the node holds and the application has not taken.
    #[getter]
    fn buffered_bytes(&self) -> u64 {
        self.account.bytes()
    }

    /// How many messages of this peer the node holds and the application has not taken.
    #[getter]
    fn buffered_messages(&self) -> usize {
        self.account.messages()
    }

    /// Reads what the socket has, as far as the engine lets it, and returns the events.
    fn on_readable(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let mut events = Vec::new();
        self.drive(py, &mut events)?;
        self.write_queued()?;
        Ok(events)
    }

    /// Writes what is queued, as far as the socket takes it now; when that drained the
    /// answers a peer left unread, reads on (what was read before waits in the engine).
    fn on_writable(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let backed_up = self.answers_backed_up();
        self.write_queued()?;
        if backed_up && !self.answers_backed_up() {
            return self.on_readable(py);
        }
        Ok(Vec::new())
    }

    /// The engine's wake pipe fired: sends the `release`s of dropped views, and reads again
    /// if the connection waited for room in the receive budget (nothing for a connection
    /// that did neither).
    fn flush(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        self.queue_releases();
        self.queue_copies();
        if self.waiting_for_room {
            self.on_readable(py)
        } else {
            self.write_queued()?;
            Ok(Vec::new())
        }
    }

    /// Seconds until the engine's next deadline (the handshake's, or a message's progress);
    /// `None` when there is none.
    fn timeout(&self) -> Option<f64> {
        let phase = match &*self.phase_now() {
            Phase::Handshake(hs) => hs.poll_timeout(),
            Phase::Established(conn) => conn.poll_timeout(),
            Phase::Draining { until, .. } => Some(*until),
            Phase::Over => None,
        };
        let at = match (phase, self.write_deadline()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(at.saturating_duration_since(Instant::now()).as_secs_f64())
    }

    /// The loop's timer for [`timeout`](Self::timeout) fired.
    fn on_timeout(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let now = Instant::now();
        let mut events = Vec::new();
        if self.write_deadline().is_some_and(|at| at <= now) {
            // The peer read nothing for the write timeout: only this connection fails, and
            // what it held (queued answers, leased views) goes (spec §9.1).
            *phase!(self) = Phase::Over;
            let mut why = String::new();
            if let Some(socket) = &self.socket {
                self.stream
                    .fail_stalled(socket.as_fd(), self.shared.bounds.write_timeout);
                why = format!("writing to {}: {}", self.label, self.stream.refusal().expect("failed"));
            }
            events.push(error_event(py, "timeout", &why, false)?);
            return Ok(events);
        }
        match phase!(self) {
            Phase::Handshake(hs) => {
                hs.handle_timeout(now);
                let failed = matches!(hs.status(), Status::Failed(_));
                let allowed = hs.allowed();
                if failed && self.stream.tls().is_some_and(TlsSession::is_handshaking) {
                    // Inside a TLS handshake there is nothing to say in plain text: the
                    // TLS failure says which handshake stalled (spec §3.1).
                    let why = format!(
                        "the TLS handshake did not complete within {} s (the handshake timeout); the peer stalled",
                        handoff_proto::handshake::seconds(allowed)
                    );
                    events.push(self.tls_failed(py, &why)?);
                    return Ok(events);
                }
            }
            Phase::Established(conn) => {
                if let Err(e) = conn.inbound().handle_timeout(now) {
                    self.refuse(py, &e, &mut events)?;
                }
            }
            Phase::Draining { until, .. } => {
                if now >= *until {
                    *phase!(self) = Phase::Over;
                }
            }
            Phase::Over => {}
        }
        self.drive(py, &mut events)?;
        self.write_queued()?;
        Ok(events)
    }

    /// Queues the message `type_name` with `body` (its msgpack) and `frames` (any
    /// C-contiguous buffers, held without a copy until written) and writes what the socket
    /// takes now. On a same-host connection frames of `shm_threshold` bytes and more go as
    /// shared memory: copied once into a segment of this process's pool (the GIL released
    /// meanwhile), or passed as they are if they already lie in one, under a lease until
    /// the peer releases them. Returns `False`, and sends nothing, when the peer holds as
    /// much shared memory as it may: try again after a `released` event. Refuses what the
    /// peer would have to refuse (spec §9).
    ///
    /// Frames may also be [`Ticket`]s made for the receiver (a forward's answer). Over TCP,
    /// frames of the engine's `ticket_threshold` and more, or every frame `by_ticket`, go as
    /// tickets to a receiver that takes them: leased in the node's table until it releases
    /// them. Returns `None` once queued, or why nothing was sent and the send should wait:
    /// `"shm-leases"` (the peer holds as much of our shared memory as it may: wait for a
    /// `released` event) or `"ticket-leases"` (the lease table is full: wait for the wake
    /// pipe, `Engine.wait_for_leases`).
    #[pyo3(signature = (type_name, body, frames, by_ticket=false))]
    fn send(
        &mut self,
        py: Python<'_>,
        type_name: &str,
        body: &Bound<'_, PyAny>,
        frames: Vec<Bound<'_, PyAny>>,
        by_ticket: bool,
    ) -> PyResult<Option<&'static str>> {
        if !matches!(phase!(self), Phase::Established(_)) || !self.stream.takes_more() {
            return Err(PyOSError::new_err(format!(
                "the connection to {} is not open",
                self.label
            )));
        }
        let body = bytes_of(body)?;
        let unix = self.unix;
        let frames = frames
            .iter()
            .map(|f| Outbound::of(f, unix))
            .collect::<PyResult<Vec<Outbound>>>()?;
        let limits = self.shared.limits.for_sending();
        let label = self.label.clone();
        // (message, code, limit): Python raises `MessageTooLarge` with the code the peer
        // would have sent and the limit it would have applied.
        let unsendable = |e: WireError| {
            let limit = match &e {
                WireError::HeaderTooLarge { limit, .. }
                | WireError::TooManyFrames { limit, .. }
                | WireError::FrameTooLarge { limit, .. }
                | WireError::MessageTooLarge { limit, .. } => *limit,
                _ => 0,
            };
            PyValueError::new_err((format!("cannot send {type_name} to {label}: {e}"), e.code(), limit))
        };
        limits
            .check_outgoing(body.len(), frames.iter().map(Outbound::len))
            .map_err(unsendable)?;
        let Some(planned) = self.plan(py, frames, by_ticket)? else {
            return Ok(Some("ticket-leases"));
        };
        let issued = issued_leases(&planned, &self.shared.me.node_id);
        let (routed, leased) = if self.shm_routing.is_some() {
            match self.route_shared(py, planned) {
                Ok(Some(routed)) => routed,
                Ok(None) => {
                    self.withdraw(&issued);
                    return Ok(Some("shm-leases"));
                }
                Err(e) => {
                    self.withdraw(&issued);
                    return Err(e);
                }
            }
        } else {
            (inline_routes(planned), Vec::new())
        };
        let head = match message_head(type_name, &body, &routed, &leased, &limits) {
            Ok(head) => head,
            Err(e) => {
                self.shm_leases.release(&leased);
                self.withdraw(&issued);
                return Err(unsendable(e));
            }
        };
        let (fds, inline) = stream_parts(routed);
        let now = Instant::now();
        let out = self.stream.out_mut();
        out.push_with_fds(Bytes::from(head), fds, now);
        for b in inline {
            out.push(b, now);
        }
        self.write_queued()?;
        Ok(None)
    }

    /// Whether this TCP connection moves on to the peer's Unix socket (spec §7.1,
    /// `handoff_proto::peers::unix_switch`): `(path, None)`, or `(None, why)` when it may
    /// not. `we_offer_shm`: this node takes same-host peers on a Unix socket.
    fn unix_switch(&self, we_offer_shm: bool) -> PyResult<(Option<String>, Option<&'static str>)> {
        let done = self
            .peer
            .as_ref()
            .ok_or_else(|| PyOSError::new_err(format!("the connection to {} is not open", self.label)))?;
        let peer = peers::endpoint_of(&done.ident);
        let locality = handoff_wire::Locality::between(&self.shared.me, &peer);
        Ok(
            match peers::unix_switch(locality, we_offer_shm, &peer, done.ident.unix.as_deref()) {
                Ok(path) => (Some(path.to_string()), None),
                Err(why) => (None, Some(why)),
            },
        )
    }

    /// How a [`Ticket`] this node holds travels to this peer (spec §7.8): `"redeem"` (its
    /// bytes go: the peer is its owner, takes no tickets or would refuse its digest) or
    /// `"forward"` (ask the owner to make the peer a holder, and send that claim).
    fn plan_held(&self, ticket: &Bound<'_, Ticket>) -> PyResult<&'static str> {
        let receiver = self.receiver()?;
        let policy = self.policy(&receiver, false);
        Ok(match policy.plan(send_policy::Frame::Held(&ticket.get().claim)) {
            FramePlan::ForwardHeld => "forward",
            _ => "redeem",
        })
    }

    /// Asks the owner (this connection's peer) for `length` bytes from `offset` of a
    /// ticket's buffer, hashed with BLAKE3 as they arrive when `hash`; returns the request's
    /// id, answered by a `pulled` or an `answer` event.
    #[pyo3(signature = (ticket, offset, length, hash=false))]
    fn request_pull(&mut self, ticket: &Bound<'_, Ticket>, offset: u64, length: u64, hash: bool) -> PyResult<u64> {
        let claim = &ticket.get().claim;
        let op = |req| TicketOp::Pull {
            req,
            lease: claim.lease,
            token: claim.token.clone(),
            offset,
            len: length,
        };
        self.request(
            op,
            Asked {
                len: Some(length),
                hash,
            },
        )
    }

    /// Asks the owner (this connection's peer) to make node `to` a holder of a ticket's
    /// lease; returns the request's id, answered by an `answer` event with the new token
    /// (`Ticket.forwarded`).
    fn request_forward(&mut self, ticket: &Bound<'_, Ticket>, to: String) -> PyResult<u64> {
        let claim = &ticket.get().claim;
        let op = |req| TicketOp::Forward {
            req,
            lease: claim.lease,
            token: claim.token.clone(),
            to,
        };
        self.request(op, Asked { len: None, hash: false })
    }

    /// Gives up waiting for request `req` (its answer, if it comes, is dropped).
    fn forget_request(&self, req: u64) {
        self.requests.lock().expect("requests lock").complete(req);
    }

    /// Tells the owner (this connection's peer) that our hold on `lease` ended.
    /// Never waits: past a MiB of them unwritten (an owner that reads nothing), it is
    /// dropped, and the hold's deadline ends it (`Outgoing::push_unlease`); returns whether
    /// it was queued.
    fn send_unlease(&mut self, lease: u64, token: Vec<u8>) -> PyResult<bool> {
        if !matches!(phase!(self), Phase::Established(_)) || !self.stream.takes_more() {
            return Ok(false);
        }
        let mut head = Vec::with_capacity(96);
        encode_header_into(&Header::Ticket(TicketOp::Unlease { lease, token }), &mut head);
        if !self.stream.out_mut().push_unlease(Bytes::from(head), Instant::now()) {
            return Ok(false);
        }
        self.write_queued()?;
        Ok(true)
    }

    /// Extends our hold on a ticket's lease by the lease's ttl.
    fn send_renew(&mut self, ticket: &Bound<'_, Ticket>) -> PyResult<()> {
        let claim = &ticket.get().claim;
        let op = TicketOp::Renew {
            lease: claim.lease,
            token: claim.token.clone(),
        };
        self.control(&Header::Ticket(op))
    }

    /// The peer's node id, once the handshake is over.
    #[getter]
    fn peer_id(&self) -> Option<&str> {
        self.peer.as_ref().map(|p| p.ident.node_id.as_str())
    }

    /// The stream offset just past the last byte queued to be written (a send that wants
    /// its message written waits until [`written`](Connection::written) reaches it).
    #[getter]
    fn queued(&self) -> u64 {
        self.stream.out().queued()
    }

    /// The stream offset up to which the queue has been written to the socket.
    #[getter]
    fn written(&self) -> u64 {
        self.stream.out().written()
    }

    /// Answers to the peer's pulls queued and not yet written (at most `max_pull_answers`
    /// before the connection stops reading its requests).
    #[getter]
    fn queued_answers(&self) -> usize {
        self.stream.out().pulled_answers()
    }

    /// Leases of this node's segments that the peer holds: `(count, bytes)`.
    #[getter]
    fn shm_leases(&self) -> (usize, u64) {
        self.shm_leases.held()
    }

    /// Shuts our sending direction down once what is queued is written, and closes the
    /// socket.
    fn close(&mut self) {
        *phase!(self) = Phase::Over;
        self.stop_waiting_for_room();
        let _ = self.write_queued();
        self.socket = None;
        self.stream.out_mut().clear();
        // Host copies made for the peer's pulls go too, and any still under way when made.
        let mut copies = self.copies.lock().unwrap_or_else(PoisonError::into_inner);
        copies.closed = true;
        copies.made.clear();
        drop(copies);
        // The peer is gone: what it held goes back to the pool once its process cannot
        // map it any more (see `handoff_sys::end_leases_of`).
        socket::end_leases_of(self.peer_pid, self.shm_leases.take_all());
        self.unregister();
    }

    /// Evicts a handshake to make room for a newer connection (spec §9.1): the peer is told
    /// `overloaded`, and the connection ends.
    fn evict(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        if let Phase::Handshake(hs) = phase!(self) {
            hs.evict();
        }
        self.on_readable(py)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop_waiting_for_room();
        self.unregister();
    }
}

/// One frame Python gave a send: bytes (in an application's segment, for a
/// `SegmentFrame`), bytes to send only on demand (with their BLAKE3 if known), or a ticket
/// made for the receiver, or a CUDA array's device memory (spec §7.10).
enum Outbound {
    Bytes(Buffer),
    OnDemand(Bytes, Option<[u8; 32]>),
    Ticket(TicketClaim, String),
    Device(DeviceSource),
}

impl Outbound {
    /// The frame `obj`, to send on a Unix socket (`unix`) or a TCP connection. On a Unix
    /// socket, bytes that lie in one of this process's arenas (an array born in shared
    /// memory, `handoff.shared_arrays`) are lent as a window of the arena: no byte is copied.
    fn of(obj: &Bound<'_, PyAny>, unix: bool) -> PyResult<Outbound> {
        if let Ok(t) = obj.cast::<Ticket>() {
            let t = t.get();
            return Ok(Outbound::Ticket(t.claim.clone(), t.holder.clone()));
        }
        if let Ok(o) = obj.cast::<crate::frames::OnDemand>() {
            let o = o.get();
            return Ok(Outbound::OnDemand(o.bytes.clone(), o.digest));
        }
        if let Ok(s) = obj.cast::<crate::frames::SegmentFrame>() {
            return Ok(Outbound::Bytes(s.get().buffer.clone()));
        }
        if let Some(device) = DeviceSource::of(obj)? {
            return Ok(Outbound::Device(device));
        }
        let bytes = bytes_of(obj)?;
        if unix && !bytes.is_empty() {
            // A loan that cannot be made (the segment's checks failed): the bytes go as any
            // bytes. The buffer holds the loan, not the array, which may go meanwhile.
            if let Ok(Some(lent)) = handoff_arena::lent_buffer(bytes.as_ptr(), bytes.len()) {
                return Ok(Outbound::Bytes(lent));
            }
        }
        Ok(Outbound::Bytes(Buffer::from(bytes)))
    }

    /// Bytes the frame announces (a ticket: none on the stream).
    fn len(&self) -> u64 {
        match self {
            Outbound::Bytes(b) => b.len() as u64,
            Outbound::OnDemand(b, _) => b.len() as u64,
            Outbound::Ticket(..) => 0,
            Outbound::Device(d) => d.len(),
        }
    }
}

impl Connection {
    /// When the bytes waiting to be written will have made no progress for the write
    /// timeout.
    fn write_deadline(&self) -> Option<Instant> {
        self.socket.as_ref()?;
        self.stream.write_deadline(self.shared.bounds.write_timeout)
    }

    /// Whether the peer leaves our answers unread: as many pulled answers queued as spec
    /// §9.1 allows, or a backlog of other control bytes.
    fn answers_backed_up(&self) -> bool {
        self.stream.out().backed_up(self.shared.bounds.max_pull_answers) || {
            // A copy under way, or made and not yet queued (the wake pipe brings it).
            let copies = self.copies.lock().unwrap_or_else(PoisonError::into_inner);
            copies.under_way > 0 || !copies.made.is_empty()
        }
    }

    /// Makes a host copy of device memory for the peer's pull on a thread of its own, so
    /// that the event loop serves every other connection meanwhile; this connection reads
    /// no more until the answer is queued ([`answers_backed_up`](Self::answers_backed_up),
    /// spec §9.1). Where no thread can be started, the copy is made here.
    fn copy_off_loop(&mut self, req: u64, copy: HostCopy) {
        let small = copy.len() < COPY_ON_LOOP_MAX;
        let answer = OwnerAnswer::CopyThenPull { req, copy };
        if small {
            return answer.queue_reply(self.stream.out_mut(), Instant::now());
        }
        let slot = Arc::new(Mutex::new(Some(answer)));
        self.copies.lock().unwrap_or_else(PoisonError::into_inner).under_way += 1;
        let (copies, shared, taken) = (self.copies.clone(), Arc::downgrade(&self.shared), slot.clone());
        let started = std::thread::Builder::new()
            .name("handoff-device-copy".into())
            .spawn(move || {
                let Some(answer) = taken.lock().expect("copy slot lock").take() else {
                    return;
                };
                // (A copy that panicked is refused: the holder hears at once.)
                let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer.finish()))
                    .unwrap_or_else(|_| OwnerAnswer::copy_broke(req));
                let mut copies = copies.lock().unwrap_or_else(PoisonError::into_inner);
                copies.under_way -= 1;
                if !copies.closed {
                    copies.made.push(answer);
                }
                drop(copies);
                if let Some(shared) = shared.upgrade() {
                    shared.wake.signal();
                }
            });
        if started.is_err() {
            let answer = slot.lock().expect("copy slot lock").take();
            self.copies.lock().unwrap_or_else(PoisonError::into_inner).under_way -= 1;
            if let Some(answer) = answer {
                answer.queue_reply(self.stream.out_mut(), Instant::now());
            }
        }
    }

    /// Queues the answers whose host copies were made since the last call.
    fn queue_copies(&mut self) {
        let made = std::mem::take(&mut self.copies.lock().unwrap_or_else(PoisonError::into_inner).made);
        let now = Instant::now();
        for answer in made {
            if matches!(phase!(self), Phase::Established(_)) && self.stream.takes_more() {
                answer.queue_reply(self.stream.out_mut(), now);
            }
        }
    }

    /// The phase, for a look from `&self`.
    fn phase_now(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The receiving node, as its handshake described it.
    fn receiver(&self) -> PyResult<Endpoint> {
        let done = self
            .peer
            .as_ref()
            .ok_or_else(|| PyOSError::new_err(format!("the connection to {} is not open", self.label)))?;
        Ok(peers::endpoint_of(&done.ident))
    }

    fn policy<'a>(&self, receiver: &'a Endpoint, by_ticket: bool) -> TicketPolicy<'a> {
        TicketPolicy {
            receiver,
            channel: if self.unix { Channel::Shm } else { Channel::Tcp },
            threshold: self.shared.ticket_threshold,
            by_ticket,
        }
    }

    /// The ticket policy for each frame: bytes, or a lease issued to the receiver (its
    /// claim travels). `None` when the lease table has no room (the leases issued for this
    /// message end again).
    fn plan(&mut self, py: Python<'_>, frames: Vec<Outbound>, by_ticket: bool) -> PyResult<Option<Vec<Planned>>> {
        let receiver = self.receiver()?;
        let policy = self.policy(&receiver, by_ticket);
        let shared = self.shared.clone();
        let mut planned = Vec::with_capacity(frames.len());
        // (What it issued before a failure is withdrawn: `issued_leases` of `planned`.)
        let me = shared.me.node_id.clone();
        for frame in frames {
            let bytes = match frame {
                Outbound::Ticket(claim, holder) => {
                    if holder != receiver.node_id {
                        self.withdraw(&issued_leases(&planned, &me));
                        return Err(PyValueError::new_err(format!(
                            "a ticket made for node {holder} cannot go to {}: forward it to the receiver first \
                             (Connection.plan_held, request_forward)",
                            receiver.node_id
                        )));
                    }
                    planned.push(Planned::Ticket(claim));
                    continue;
                }
                Outbound::Bytes(b) => (b, false, None),
                Outbound::OnDemand(b, known) => (Buffer::from(b), true, known),
                Outbound::Device(source) => {
                    let shared_as = match policy.plan(send_policy::Frame::Device) {
                        // (Waits for the device's queued work: without the GIL.)
                        FramePlan::ShareDevice => py.detach(|| source.export()).ok(),
                        _ => None,
                    };
                    // Memory without an IPC handle (or a peer that cannot map it) gets a copy.
                    let Some(exported) = shared_as else {
                        planned.push(Planned::Bytes(Buffer::from(source.to_host(py)?)));
                        continue;
                    };
                    let len = source.len();
                    let Ok((lease, token)) = shared
                        .leases
                        .try_issue_device(device::leased(source), &receiver.node_id)
                    else {
                        self.withdraw(&issued_leases(&planned, &me));
                        return Ok(None);
                    };
                    planned.push(Planned::Device(send_policy::device_claim(
                        lease,
                        token,
                        len,
                        exported.ipc,
                        exported.device,
                        exported.offset,
                    )));
                    continue;
                }
            };
            let (buffer, on_demand, known) = bytes;
            let len = buffer.len();
            match policy.plan(send_policy::Frame::Bytes { len, on_demand }) {
                FramePlan::Issue { lazy, xxh3 } => {
                    // The digest is computed with the GIL released (a large buffer's BLAKE3).
                    let leases = &shared.leases;
                    let tried = py.detach(|| {
                        let digest = LeaseTable::digest_for(&buffer, known, xxh3);
                        leases.try_issue(&buffer, digest, &receiver.node_id)
                    });
                    let Ok(lease) = tried else {
                        self.withdraw(&issued_leases(&planned, &me));
                        return Ok(None);
                    };
                    let ttl = shared.leases.config.ttl;
                    let claim = issued_claim(&lease, len as u64, &me, shared.listen.clone(), ttl, lazy);
                    planned.push(Planned::Ticket(claim));
                }
                _ => planned.push(Planned::Bytes(buffer)),
            }
        }
        Ok(Some(planned))
    }

    /// Ends the leases issued for a message that was not sent after all
    /// ([`issued_leases`]).
    fn withdraw(&self, issued: &[(u64, Vec<u8>)]) {
        if let Some(peer) = &self.peer {
            self.shared.leases.withdraw(issued, &peer.ident.node_id);
        }
    }

    /// Sends a ticket request `op(req)` and records what it asked for.
    fn request(&mut self, op: impl FnOnce(u64) -> TicketOp, asked: Asked) -> PyResult<u64> {
        let req = self.shared.next_request();
        self.requests.lock().expect("requests lock").insert(req, asked, req);
        if let Err(e) = self.control(&Header::Ticket(op(req))) {
            self.requests.lock().expect("requests lock").complete(req);
            return Err(e);
        }
        Ok(req)
    }

    /// Queues a control header and writes what the socket takes now.
    fn control(&mut self, header: &Header<'_>) -> PyResult<()> {
        if !matches!(phase!(self), Phase::Established(_)) || !self.stream.takes_more() {
            return Err(PyOSError::new_err(format!(
                "the connection to {} is not open",
                self.label
            )));
        }
        let mut head = Vec::with_capacity(96);
        encode_header_into(header, &mut head);
        self.stream.out_mut().push(Bytes::from(head), Instant::now());
        self.write_queued()
    }

    /// Routes a message's frames for a same-host peer, leasing each shared one before the
    /// next is copied; `None` (every lease taken for it ended again) when the peer holds as
    /// much as it may. Copies run with the GIL released.
    fn route_shared(&mut self, py: Python<'_>, planned: Vec<Planned>) -> PyResult<Option<(Vec<Routed>, Vec<u64>)>> {
        let routing = self.shm_routing.expect("a same-host connection");
        // The GIL is let go only where a frame may be copied into a segment: a small
        // message's round trip does not pay for giving it up and taking it back.
        let copies = planned
            .iter()
            .any(|p| matches!(p, Planned::Bytes(b) if b.len() >= routing.threshold));
        let leases = &mut self.shm_leases;
        let route = || {
            let mut router = Router::new(routing);
            let mut routed = Vec::with_capacity(planned.len());
            let mut leased = Vec::new();
            for frame in planned {
                let r = match router.route(frame) {
                    Ok(r) => r,
                    Err(e) => {
                        leases.release(&leased);
                        return Err(format!("{}: {}", e.what, e.source));
                    }
                };
                if let Routed::Shared { held, .. } = &r {
                    match leases.try_lease(held.clone(), held.bytes() as u64) {
                        Ok(lease) => leased.push(lease),
                        Err(_) => {
                            leases.release(&leased);
                            return Ok(None);
                        }
                    }
                }
                routed.push(r);
            }
            Ok(Some((routed, leased)))
        };
        let result = if copies { py.detach(route) } else { route() };
        result.map_err(PyOSError::new_err)
    }

    /// No longer one of the node's connections to its peer.
    fn unregister(&mut self) {
        if let Some(done) = self.peer.take() {
            self.shared.unregister(&done.ident.node_id);
        }
    }

    /// No longer counted among the connections that wait for room.
    fn stop_waiting_for_room(&mut self) {
        if std::mem::take(&mut self.waiting_for_room) {
            self.shared.waiting_for_room.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Moves the handshake's bytes to the write queue.
    fn queue_handshake_bytes(&mut self) {
        if let Phase::Handshake(hs) = phase!(self) {
            if hs.has_transmit() {
                self.stream
                    .out_mut()
                    .push(Bytes::from(hs.take_transmit()), Instant::now());
            }
        }
    }

    /// Runs the engine until it needs the socket to be readable again (or room, or the
    /// connection ended), collecting events.
    fn drive(&mut self, py: Python<'_>, events: &mut Vec<Py<PyAny>>) -> PyResult<()> {
        let mut drained = false;
        let mut read_this_turn = 0usize;
        self.paused_for_answers = false;
        loop {
            let Some(socket) = self.socket.as_ref() else {
                return Ok(());
            };
            if self.opening {
                let mut first = [0u8; 1];
                match rustix::net::recv(socket, &mut first, rustix::net::RecvFlags::PEEK) {
                    Err(rustix::io::Errno::AGAIN) => return Ok(()),
                    Ok((1, _)) if Opening::of(first[0]) == Opening::Plain => {
                        // A plain handoff peer where TLS is required: our preamble, then
                        // `tls-required` (readable by every version), then the drain.
                        self.stream.drop_tls();
                        self.opening = false;
                        self.stream.out_mut().clear(); // our preamble, queued for TLS
                        self.stream.out_mut().push(Bytes::from(plain_refusal()), Instant::now());
                        *phase!(self) = draining();
                        let _ = self.write_queued();
                        self.shut_writing();
                        events.push(error_event(py, "tls-required", TLS_REQUIRED_MESSAGE, false)?);
                        return Ok(());
                    }
                    // TLS, something else (TLS refuses it) or the end (the handshake sees it).
                    _ => self.opening = false,
                }
                continue;
            }
            let backed_up = self.answers_backed_up();
            match phase!(self) {
                Phase::Over => return Ok(()),
                Phase::Draining { left, .. } => {
                    let mut scratch = [0u8; 8192];
                    match socket::recv(socket.as_fd(), &mut scratch, false) {
                        Ok(None) => return Ok(()),
                        // Descriptors that come now are closed by the kernel.
                        Ok(Some(got)) if got.bytes > 0 && got.bytes < *left => *left -= got.bytes,
                        _ => {
                            *phase!(self) = Phase::Over;
                            return Ok(());
                        }
                    }
                }
                Phase::Handshake(hs) => {
                    let status = hs.status().clone();
                    match status {
                        Status::Admit(ident) => {
                            let verdict = self.check_peer(py, &ident)?;
                            if let Phase::Handshake(hs) = phase!(self) {
                                hs.admit(verdict);
                            }
                            self.queue_handshake_bytes();
                            continue;
                        }
                        Status::Done(done) => {
                            self.queue_handshake_bytes();
                            events.push(ready_event(py, &done)?);
                            self.establish(done);
                            continue;
                        }
                        Status::Failed(failure) => {
                            self.queue_handshake_bytes();
                            events.push(self.handshake_failed(py, failure)?);
                            return Ok(());
                        }
                        Status::InProgress => {}
                    }
                    // Never past what the handshake reads: descriptors that come with the
                    // first message after `ready` are not the handshake's (spec §5.1).
                    let mut buf = vec![0u8; hs.wants()];
                    // No room for descriptors: any that come are closed by the kernel and only
                    // counted, so a flood of them before `ready` costs this process none.
                    let got = match read_from(&mut self.stream, socket.as_fd(), &mut buf, false) {
                        Ok(Some(got)) => got,
                        Ok(None) => return Ok(()),
                        Err(ReadError::Io(e)) => {
                            return Err(io_error(&format!("reading the handshake from {}", self.label), e))
                        }
                        Err(ReadError::Tls(why)) => {
                            events.push(self.tls_failed(py, &why)?);
                            return Ok(());
                        }
                    };
                    hs.handle_read(
                        &buf[..got.bytes],
                        got.fds.len() + usize::from(got.truncated),
                        Instant::now(),
                    );
                    self.queue_handshake_bytes();
                }
                Phase::Established(_) if backed_up => {
                    // The peer leaves our answers unread: nothing more of its is read or
                    // answered until they drain (spec §9.1).
                    self.paused_for_answers = true;
                    return Ok(());
                }
                Phase::Established(conn) => {
                    let now = Instant::now();
                    let step = match conn.poll(now) {
                        Ok(step) => step,
                        Err(e) => {
                            self.refuse(py, &e, events)?;
                            return Ok(());
                        }
                    };
                    match step {
                        Step::Read => {
                            // A read that did not fill its space found the socket empty: the
                            // loop (level-triggered) calls again when more comes, so no second
                            // read is spent to learn that nothing is there. (Not with TLS,
                            // which may hold plaintext the socket no longer signals.)
                            if drained && self.stream.tls().is_none() {
                                return Ok(());
                            }
                            let space = conn.recv_space().len();
                            let got = match read_from(&mut self.stream, socket.as_fd(), conn.recv_space(), true) {
                                Ok(Some(got)) => got,
                                Ok(None) => return Ok(()),
                                Err(ReadError::Io(e)) => {
                                    return Err(io_error(&format!("reading from {}", self.label), e))
                                }
                                Err(ReadError::Tls(why)) => {
                                    events.push(self.tls_failed(py, &why)?);
                                    return Ok(());
                                }
                            };
                            if let Err(e) = conn.inbound().handle_read(got.bytes, got.fds, got.truncated, now) {
                                self.refuse(py, &e, events)?;
                                return Ok(());
                            }
                            read_this_turn += got.bytes;
                            drained = conn.inbound().turn_ends_after_read(got.bytes, space, read_this_turn);
                        }
                        Step::Room => {
                            // Counted before the attempt, so that room given back after it
                            // fires the wake pipe (then `flush` reads on).
                            if !self.waiting_for_room {
                                self.waiting_for_room = true;
                                self.shared.waiting_for_room.fetch_add(1, Ordering::AcqRel);
                            }
                            if !conn.try_take_room(now) {
                                return Ok(());
                            }
                            self.stop_waiting_for_room();
                        }
                        Step::Answer { waiter, answer } => events.push(answer_event(py, waiter, answer)?),
                        // The helper thread may still read the bytes: it stops before they go.
                        Step::Unclaimed { digest, bytes } => {
                            py.detach(move || drop(digest));
                            drop(bytes);
                        }
                        Step::Pulled { waiter, bytes, digest } => {
                            let digest = match digest {
                                Digest::Hashed(d) => Some(d),
                                Digest::None => None,
                                // The helper is at most a few runs behind the last byte; the
                                // wait for it lets go of the interpreter.
                                Digest::Behind(behind) => py.detach(move || behind.finish()),
                            };
                            let frame = Py::new(py, Frame::received(bytes, "pulled"))?;
                            let digest = digest.map(|d| pyo3::types::PyBytes::new(py, &d).unbind());
                            events.push(("pulled", waiter, frame, digest).into_pyobject(py)?.into_any().unbind());
                        }
                        Step::Closed => {
                            *phase!(self) = Phase::Over;
                            self.shut_writing();
                            events.push(
                                PyTuple::new(py, ["closed".into_pyobject(py)?.into_any(), py.None().into_bound(py)])?
                                    .into_any()
                                    .unbind(),
                            );
                            return Ok(());
                        }
                        Step::Event(event) => {
                            if let Some(e) = self.on_event(py, event)? {
                                events.push(e);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The node's check of the peer's identity before `ready`.
    fn check_peer(&self, py: Python<'_>, ident: &Ident) -> PyResult<Result<(), WireError>> {
        // Node ids are unique (§5.1): one connected already from another process is kept.
        let connected = self
            .shared
            .connected
            .lock()
            .expect("connected lock")
            .get(&ident.node_id)
            .cloned();
        if let Err(e) = peers::admit(&self.shared.me.node_id, ident, connected.as_ref()) {
            return Ok(Err(e));
        }
        let Some(admit) = &self.admit else {
            return Ok(Ok(()));
        };
        // The application's check: a reason refuses the peer; so does a check that fails
        // (it is the application's error, but the peer is refused, not the loop's).
        let verdict = admit
            .call1(py, (ident_dict(py, ident, None)?,))
            .and_then(|v| v.extract::<Option<String>>(py));
        Ok(match verdict {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(WireError::Handshake(why)),
            Err(e) => Err(WireError::Handshake(format!("this node's admission check failed: {e}"))),
        })
    }

    /// The handshake is over: the established connection's engine takes the socket over.
    fn establish(&mut self, done: Handshaken) {
        let shared = self.shared.clone();
        let check = Arc::new(move |name: &str| shared.check_type(name));
        let inbound = self
            .shared
            .inbound(self.unix, check, self.account.clone(), &done.ident.node_id)
            .with_private_mappings(self.shared.shm_private)
            // A large `pulled` answer is hashed on a helper thread while it arrives, as the
            // Rust node does: on one thread, reading and hashing add up.
            .with_hash_behind(Box::new(HashThread::start));
        self.shared.register(&done.ident);
        self.peer = Some(done);
        let conn = Established::new(
            inbound,
            self.requests.clone(),
            self.shared.bounds.max_buffered_bytes_per_peer,
        );
        *phase!(self) = Phase::Established(Box::new(conn));
    }

    /// The TLS session failed: nothing more can be said to the peer in the format.
    fn tls_failed(&mut self, py: Python<'_>, why: &str) -> PyResult<Py<PyAny>> {
        *phase!(self) = Phase::Over;
        self.stream.out_mut().clear();
        let _ = self.write_queued();
        self.shut_writing();
        error_event(py, "tls", why, false)
    }

    /// The event Python gets for a failed handshake (the engine queued the `error` to send).
    fn handshake_failed(&mut self, py: Python<'_>, failure: Failure) -> PyResult<Py<PyAny>> {
        let drain = matches!(phase!(self), Phase::Handshake(hs) if hs.drain_after_failure());
        *phase!(self) = if drain { draining() } else { Phase::Over };
        let _ = self.write_queued();
        self.shut_writing();
        let (code, message, by_peer) = match failure {
            Failure::Refused(e) => (e.code().to_string(), e.to_string(), false),
            Failure::PeerRefused { code, message } => (code, message, true),
            Failure::PeerClosed { waiting_for } => (
                "peer-closed".to_string(),
                format!(
                    "{} closed the connection during the handshake, waiting for {waiting_for}",
                    self.label
                ),
                true,
            ),
        };
        error_event(py, &code, &message, by_peer)
    }

    /// The engine refused what the peer did: the peer is told why, and the connection ends.
    fn refuse(&mut self, py: Python<'_>, e: &WireError, events: &mut Vec<Py<PyAny>>) -> PyResult<()> {
        *phase!(self) = if receive::drain_after(e) {
            draining()
        } else {
            Phase::Over
        };
        self.stream.out_mut().push(Bytes::from(error_header(e)), Instant::now());
        let _ = self.write_queued();
        self.shut_writing();
        events.push(error_event(py, e.code(), &e.to_string(), false)?);
        Ok(())
    }

    /// One received event, as Python gets it (`None` for what the engine and this driver
    /// handle themselves).
    fn on_event(&mut self, py: Python<'_>, event: Event) -> PyResult<Option<Py<PyAny>>> {
        Ok(match event {
            Event::Message(incoming) => {
                let device_frames = incoming.frames.iter().any(|f| matches!(f, InFrame::Device(_)));
                let mut frames = Vec::with_capacity(incoming.frames.len());
                for frame in incoming.frames {
                    frames.push(self.frame(py, frame)?);
                }
                let received = Received {
                    device_frames,
                    eager_tickets: incoming.eager_tickets,
                    eager_ticket_bytes: incoming.eager_ticket_bytes,
                    failure: None,
                    type_name: incoming.type_name,
                    body: Py::new(py, Frame::new(incoming.body, "body"))?,
                    frames: PyList::new(py, frames)?.unbind(),
                    permit: Mutex::new(incoming.permit),
                };
                let received = Py::new(py, received)?;
                Some(
                    PyTuple::new(
                        py,
                        [
                            "message".into_pyobject(py)?.into_any(),
                            received.into_bound(py).into_any(),
                        ],
                    )?
                    .into_any()
                    .unbind(),
                )
            }
            Event::Owner {
                answer: OwnerAnswer::CopyThenPull { req, copy },
                ..
            } => {
                self.copy_off_loop(req, copy);
                None
            }
            Event::Owner { answer, .. } => {
                answer.queue_reply(self.stream.out_mut(), Instant::now());
                None
            }
            // Answers nobody waits for (the engine hands ours to their requests, and answers
            // the peer's itself).
            Event::Ticket(_) | Event::PulledMismatch { .. } | Event::Pulled { .. } => None,
            Event::Release(leases) => {
                let ended = self.shm_leases.release(&leases);
                Some(("released", ended).into_pyobject(py)?.into_any().unbind())
            }
            Event::PeerRefused { code, message } => {
                *phase!(self) = Phase::Over;
                self.shut_writing();
                Some(error_event(py, &code, &message, true)?)
            }
        })
    }

    /// A received frame as Python gets it.
    fn frame(&self, py: Python<'_>, frame: InFrame) -> PyResult<Py<PyAny>> {
        Ok(match frame {
            InFrame::Bytes(bytes) => Py::new(py, Frame::received(bytes, "inline"))?.into_any(),
            InFrame::Mapped {
                mapping,
                at,
                len,
                lease,
            } => {
                let releases = self.releases.clone();
                let shared = Arc::downgrade(&self.shared);
                let release: Release = Arc::new(move |lease| {
                    releases.lock().expect("releases lock").push(lease);
                    if let Some(shared) = shared.upgrade() {
                        shared.wake.signal();
                    }
                });
                let writable = mapping.writable();
                let origin = crate::frames::ShmOrigin {
                    lease,
                    inode: mapping.inode(),
                    offset: (mapping.file_offset() + at) as u64,
                    size: mapping.segment_size() as u64,
                    sealed: mapping.sealed(),
                };
                let view = RemoteView::new(mapping, at, len as usize, lease, release)
                    .ok_or_else(|| PyValueError::new_err("a frame outside its mapping"))?;
                let frame = Frame::shared(Bytes::from_owner(view), origin);
                let frame = if writable { frame.into_writable() } else { frame };
                Py::new(py, frame)?.into_any()
            }
            InFrame::Shm { .. } => unreachable!("the engine maps segments itself (with_mappings)"),
            InFrame::Ticket(claim) => Py::new(py, Ticket::held(claim, &self.shared))?.into_any(),
            InFrame::Device(claim) => {
                let owner = self.peer.as_ref().map(|p| p.ident.node_id.clone()).unwrap_or_default();
                Py::new(py, DeviceClaim::held(py, claim, &owner, &self.shared)?)?.into_any()
            }
        })
    }

    /// Queues `release` messages for the views dropped since the last call.
    fn queue_releases(&mut self) {
        let leases = {
            let mut releases = self.releases.lock().expect("releases lock");
            if releases.is_empty() {
                return;
            }
            std::mem::take(&mut *releases)
        };
        if !matches!(phase!(self), Phase::Established(_)) || !self.stream.takes_more() {
            return;
        }
        self.stream.out_mut().push_releases(&leases, Instant::now());
    }

    /// Writes what is queued, as far as the socket takes it now (and, once the connection
    /// is over, ends our sending direction after it).
    fn write_queued(&mut self) -> PyResult<()> {
        let Some(socket) = self.socket.as_ref() else {
            return Ok(());
        };
        if matches!(phase!(self), Phase::Over) {
            self.stream.shut();
        }
        match self.stream.flush(socket.as_fd()) {
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                Err(io_error(&format!("writing to {}", self.label), e))
            }
            _ => Ok(()),
        }
    }

    /// Shuts our sending direction down once the queue is written (the peer sees the end
    /// of the stream after what we sent, an `error` included).
    fn shut_writing(&mut self) {
        self.stream.shut();
        let _ = self.write_queued();
    }
}

/// Why a read failed.
enum ReadError {
    Io(std::io::Error),
    /// The TLS session failed (in words that say what to fix).
    Tls(String),
}

/// One read from the socket, through TLS when the connection has it; `None` when nothing is
/// there now.
fn read_from(
    stream: &mut StreamIo,
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    take_fds: bool,
) -> Result<Option<socket::Received>, ReadError> {
    match stream.read(socket, buf, take_fds) {
        Ok(got) => Ok(Some(got)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(match TlsFailed::of(&e) {
            Some(why) => ReadError::Tls(why.to_string()),
            None => ReadError::Io(e),
        }),
    }
}

/// The phase after an error that the peer should read before the end of the stream.
fn draining() -> Phase {
    Phase::Draining {
        until: Instant::now() + DRAIN_TIME,
        left: DRAIN_BYTES,
    }
}

/// What the peer said about itself, as a dict.
fn ident_dict<'py>(py: Python<'py>, ident: &Ident, version: Option<u16>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("node_id", &ident.node_id)?;
    d.set_item("name", &ident.name)?;
    d.set_item("host_id", &ident.host_id)?;
    d.set_item("pid", ident.pid)?;
    d.set_item("process_id", &ident.process_id)?;
    d.set_item("language", &ident.language)?;
    d.set_item("implementation", &ident.implementation)?;
    d.set_item("capabilities", &ident.capabilities)?;
    d.set_item("listen", &ident.listen)?;
    d.set_item("unix", &ident.unix)?;
    d.set_item("version", version)?;
    Ok(d)
}

/// `("answer", req, kind, value)`: `token` (a forward's new token), `mismatch` (what came
/// instead of what was asked), or `refused` (`(code, message)` of the owner's refusal).
fn answer_event(py: Python<'_>, req: u64, answer: Result<Answer, Refused>) -> PyResult<Py<PyAny>> {
    let event = match answer {
        Ok(Answer::Token(token)) => ("answer", req, "token", pyo3::types::PyBytes::new(py, &token).into_any()),
        Ok(Answer::Mismatch(why)) => ("answer", req, "mismatch", why.into_pyobject(py)?.into_any()),
        Ok(Answer::Bytes(..)) => unreachable!("pulled bytes come as their own step"),
        Err(r) => (
            "answer",
            req,
            "refused",
            (r.code, r.message).into_pyobject(py)?.into_any(),
        ),
    };
    Ok(event.into_pyobject(py)?.into_any().unbind())
}

fn ready_event(py: Python<'_>, done: &Handshaken) -> PyResult<Py<PyAny>> {
    let peer = ident_dict(py, &done.ident, Some(done.version))?;
    Ok(
        PyTuple::new(py, ["ready".into_pyobject(py)?.into_any(), peer.into_any()])?
            .into_any()
            .unbind(),
    )
}

fn error_event(py: Python<'_>, code: &str, message: &str, by_peer: bool) -> PyResult<Py<PyAny>> {
    Ok(("error", code.to_string(), message.to_string(), by_peer)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

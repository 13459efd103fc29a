//! [`Engine`]: a node's state as handoff-proto keeps it, for connections driven from
//! Python's event loop: who the node is, its secret and limits, its receive budget and
//! buffers, its mapping cache, the nonces it sent as a dialer, and the types it takes.
//!
//! Nothing here waits. What Python must hear about without asking (room given back in the
//! budget, a received view of a peer's segment dropped) is signalled on the engine's wake
//! pipe, which the event loop watches (`Engine.wake_fd`): a byte in it means "ask the
//! connections again" (`Connection.flush`, `Connection.on_readable`).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use handoff_proto::bounds::Bounds;
use handoff_proto::identity;
use handoff_proto::node::{CoreSettings, NodeCore};
use handoff_proto::ticket_leases::LeaseConfig;

use handoff_wire::{Endpoint, Limits, Preamble, WireError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// What the connections of one node share: the engine's [`NodeCore`], as the tokio
/// driver's nodes have it (reached through `Deref`), and what this driver adds.
pub(crate) struct Shared {
    pub(crate) core: NodeCore,
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    /// Frames this large and larger go through shared memory to a same-host peer.
    pub(crate) shm_threshold: usize,
    /// How a frame is copied into a segment (`HANDOFF_SHM_COPY`): with `pwrite` unless
    /// `map` is asked for.
    pub(crate) shm_copy: handoff_proto::shm::CopyInto,
    /// The message types the node takes; `None` until one is registered (then any).
    pub(crate) types: Mutex<Option<HashSet<String>>>,
    pub(crate) wake: Wake,
    /// Connections that wait for room in the receive budget: room given back wakes the
    /// loop only while there are some (most messages are taken with nobody waiting).
    pub(crate) waiting_for_room: AtomicUsize,
    /// Sends that wait for room in the lease table: a hold that ends wakes the loop only
    /// while there are some.
    pub(crate) waiting_for_leases: AtomicUsize,
    /// TLS for TCP connections (spec §3.1), if the node has it: then required of every TCP
    /// peer.
    pub(crate) tls: Option<Tls>,
    /// Over TCP, frames at least this large go as tickets (`None`: only when asked).
    pub(crate) ticket_threshold: Option<usize>,
    /// Within how long a TCP peer that stopped answering (its host lost power, or was cut
    /// off) fails the connection: keepalive and `TCP_USER_TIMEOUT` (`None`: the kernel's).
    pub(crate) tcp_timeout: Option<std::time::Duration>,
    /// Received segments are mapped private and writable, one mapping per frame
    /// (`Engine(shm_private=True)`).
    pub(crate) shm_private: bool,
    /// The peers connected now, by node id, with how many connections each has: a second
    /// node with the same id from another process is refused (spec §5.1).
    pub(crate) connected: Mutex<HashMap<String, Endpoint>>,
    connections_of: Mutex<HashMap<String, usize>>,
    /// How long a received segment no view uses stays mapped (`Engine(kept_map_seconds=)`;
    /// `None`: `HANDOFF_SHM_KEEP_SECONDS`, else 10 s).
    kept_idle: Option<Duration>,
}

/// A node's TLS: the engine's configurations, and the name to expect in an accepting
/// side's certificate instead of the host part of the dialed address.
pub(crate) struct Tls {
    pub(crate) configs: handoff_proto::tls::Configs,
    pub(crate) server_name: Option<String>,
}

/// How long the process's pool keeps an idle segment ([`configure_segment_pool`]; `None`:
/// `HANDOFF_SHM_POOL_IDLE_SECONDS`, else 10 s).
static POOL_IDLE: Mutex<Option<Duration>> = Mutex::new(None);

/// The longest time a bound or setting of the engine may be, in seconds
/// (`handoff_proto::bounds::MAX_DURATION`): a larger one is refused, naming it.
const MAX_SECONDS: u64 = handoff_proto::bounds::MAX_DURATION.as_secs();

use handoff_proto::bounds::duration_from_secs as duration_of;

/// The setting `what`, `s` seconds, as a duration the engine takes ([`duration_of`]; zero
/// only where `zero` allows it), or the `ValueError` that says what it must be.
fn seconds_setting(what: &str, s: f64, zero: bool) -> PyResult<Duration> {
    duration_of(s, zero).ok_or_else(|| {
        let least = if zero { "zero or a positive" } else { "a positive" };
        PyValueError::new_err(format!(
            "{what} must be {least} number of seconds (at most {MAX_SECONDS}), not {s}"
        ))
    })
}

impl Shared {
    /// The idle times this node's sweep applies: the process's pool's, and its own mappings'.
    fn idle_times(&self) -> handoff_proto::shm::IdleTimes {
        let mut times = handoff_proto::shm::IdleTimes::from_env();
        if let Some(pool) = *POOL_IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            times.pool = pool;
        }
        if let Some(keep) = self.kept_idle {
            times.keep = keep;
        }
        times
    }
}

/// Sets how much of the process's segment pool stays idle for reuse: at most
/// `max_idle_bytes` (default `HANDOFF_SHM_POOL_BYTES`, else 4 GiB), each segment for at most
/// `idle_seconds` (default `HANDOFF_SHM_POOL_IDLE_SECONDS`, else 10). `None` leaves a value
/// as it is. The Dask backend's `pool-idle-bytes` and `pool-idle-seconds`.
#[pyfunction]
#[pyo3(signature = (max_idle_bytes=None, idle_seconds=None))]
pub fn configure_segment_pool(max_idle_bytes: Option<usize>, idle_seconds: Option<f64>) -> PyResult<()> {
    if let Some(s) = idle_seconds {
        let idle = seconds_setting("idle_seconds", s, true)?;
        *POOL_IDLE.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(idle);
    }
    if let Some(bytes) = max_idle_bytes {
        handoff_proto::shm::SegmentPool::global().set_max_idle_bytes(bytes);
    }
    Ok(())
}

impl std::ops::Deref for Shared {
    type Target = NodeCore;

    fn deref(&self) -> &NodeCore {
        &self.core
    }
}

impl Shared {
    /// A connection to the node `ident` is established.
    pub(crate) fn register(&self, ident: &handoff_wire::Ident) {
        let mut counts = self.connections_of.lock().expect("connections lock");
        *counts.entry(ident.node_id.clone()).or_default() += 1;
        self.connected
            .lock()
            .expect("connected lock")
            .insert(ident.node_id.clone(), handoff_proto::peers::endpoint_of(ident));
    }

    /// A connection to node `node_id` ended; with its last, the node's holds end.
    pub(crate) fn unregister(&self, node_id: &str) {
        let mut counts = self.connections_of.lock().expect("connections lock");
        if let Some(n) = counts.get_mut(node_id) {
            *n -= 1;
            if *n == 0 {
                counts.remove(node_id);
                self.connected.lock().expect("connected lock").remove(node_id);
                // Its last connection gone, the peer's holds on our leases end (§7.7), and
                // a send waiting for room in the table may go on.
                if self.last_connection_ended(node_id) > 0 {
                    self.wake.signal();
                }
            }
        }
    }

    /// The node's check of a received message's type name (spec §11.2 step 3).
    pub(crate) fn check_type(&self, name: &str) -> Result<(), WireError> {
        let types = self.types.lock().expect("types lock");
        match &*types {
            Some(known) if !known.contains(name) => Err(handoff_proto::received::unknown_type(
                name,
                known.iter().map(String::as_str),
            )),
            _ => Ok(()),
        }
    }
}

/// The wake pipe: its write end is written (once until read) from whatever thread gives
/// room back or drops a view; the event loop watches its read end. Closed with its driver
/// ([`Engine::close_wake`]), not when the last of the many objects that keep the engine's
/// state alive (connections, tickets, views) is collected.
pub(crate) struct Wake {
    /// The read and write ends; `None` once closed.
    ends: Mutex<Option<(OwnedFd, OwnedFd)>>,
    read_raw: i32,
    pending: AtomicBool,
}

impl Wake {
    /// A new wake pipe (both ends close-on-exec and non-blocking).
    pub(crate) fn new() -> std::io::Result<Wake> {
        let (read, write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
        Ok(Wake {
            read_raw: read.as_raw_fd(),
            ends: Mutex::new(Some((read, write))),
            pending: AtomicBool::new(false),
        })
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, Option<(OwnedFd, OwnedFd)>> {
        self.ends.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells the event loop to look again (a byte in the pipe unless one waits there).
    pub(crate) fn signal(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            if let Some((_, write)) = &*self.ends() {
                let _ = rustix::io::write(write.as_fd(), &[1]);
            }
        }
    }

    /// Empties the pipe, so the next signal writes again.
    pub(crate) fn drain(&self) {
        let ends = self.ends();
        let Some((read, _)) = &*ends else { return };
        self.pending.store(false, Ordering::Release);
        let mut scratch = [0u8; 64];
        while matches!(rustix::io::read(read.as_fd(), &mut scratch), Ok(n) if n > 0) {}
    }

    /// Closes both ends: nothing signals any more.
    pub(crate) fn close(&self) {
        self.pending.store(true, Ordering::Release);
        self.ends().take();
    }

    /// The read end, which an event loop watches; -1 once [`close`](Self::close)d (the
    /// number may name another file by then).
    pub(crate) fn read_fd(&self) -> i32 {
        match &*self.ends() {
            Some(_) => self.read_raw,
            None => -1,
        }
    }
}

/// The limits of one message (spec §9) from `given`, by field name (`max_header_bytes`,
/// `max_frames`, `max_frame_bytes`, `max_message_bytes`, `max_header_values`), the rest
/// the defaults; an unknown name or a value out of range is refused naming it.
fn limits_of(given: std::collections::HashMap<String, u64>) -> PyResult<Limits> {
    let mut limits = Limits::default();
    for (name, value) in given {
        let small =
            || u32::try_from(value).map_err(|_| PyValueError::new_err(format!("limit {name} cannot be {value}")));
        match name.as_str() {
            "max_header_bytes" => limits.max_header_bytes = small()?,
            "max_frames" => limits.max_frames = small()?,
            "max_frame_bytes" => limits.max_frame_bytes = value,
            "max_message_bytes" => limits.max_message_bytes = value,
            "max_header_values" => limits.max_header_values = small()?,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "no limit named {name} (handoff_wire::Limits)"
                )))
            }
        }
    }
    Ok(limits)
}

/// The limits a node sends within (`handoff_wire::Limits::for_sending`: the defaults of
/// spec §9, or `limits` where smaller), from and as a dict of `handoff.wire.Limits`'s
/// fields (`limits_of`'s names).
#[pyfunction]
pub fn limits_for_sending(
    py: Python<'_>,
    limits: std::collections::HashMap<String, u64>,
) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use pyo3::types::IntoPyDict;
    let l = limits_of(limits)?.for_sending();
    [
        ("max_header_bytes", u64::from(l.max_header_bytes)),
        ("max_frames", u64::from(l.max_frames)),
        ("max_frame_bytes", l.max_frame_bytes),
        ("max_message_bytes", l.max_message_bytes),
        ("max_header_values", u64::from(l.max_header_values)),
    ]
    .into_py_dict(py)
}

/// The value at which the engine keeps one field of `handoff.bounds.Bounds` (see
/// [`FIXED_BOUNDS`]).
#[derive(Clone, Copy)]
pub(crate) enum FixedValue {
    /// A whole number (bytes, descriptors).
    Count(u64),
    /// A duration in seconds.
    Seconds(f64),
}

impl FixedValue {
    fn as_f64(self) -> f64 {
        match self {
            FixedValue::Count(n) => n as f64,
            FixedValue::Seconds(s) => s,
        }
    }

    /// The value as Python shows it (`65536`, `1.0`).
    fn shown(self) -> String {
        match self {
            FixedValue::Count(n) => n.to_string(),
            FixedValue::Seconds(s) => format!("{s:?}"),
        }
    }

    /// The value as a Python `int` or `float`.
    pub(crate) fn into_py_any(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(match self {
            FixedValue::Count(n) => n.into_pyobject(py)?.into_any(),
            FixedValue::Seconds(s) => s.into_pyobject(py)?.into_any(),
        })
    }
}

/// The fields of `handoff.bounds.Bounds` that the engine does not take from the node: it
/// keeps each at this value (its own constant), and refuses a node that asks for another
/// (`handoff._native.ENGINE_FIXED_BOUNDS` lists them). Checked in this order.
pub(crate) const FIXED_BOUNDS: [(&str, FixedValue); 5] = [
    (
        "handshake_header_bytes",
        FixedValue::Count(handoff_wire::HANDSHAKE_HEADER_BYTES as u64),
    ),
    (
        "max_pending_fds",
        FixedValue::Count(handoff_proto::inbound::MAX_PENDING_FDS as u64),
    ),
    (
        "message_overhead",
        FixedValue::Count(handoff_proto::bounds::MESSAGE_OVERHEAD),
    ),
    (
        "drain_seconds",
        FixedValue::Seconds(handoff_proto::handshake::DRAIN_TIME.as_secs_f64()),
    ),
    (
        "drain_bytes",
        FixedValue::Count(handoff_proto::handshake::DRAIN_BYTES as u64),
    ),
];

/// The only `handoff.bounds.Bounds.max_control_queued` (its default) a node on the engine
/// takes: the engine bounds the control headers queued for a connection by bytes
/// (`handoff_proto::outgoing::MAX_CONTROL_BACKLOG`), not by a count.
const CONTROL_QUEUED_DEFAULT: u64 = 1024;

/// The fields of `handoff.bounds.Bounds` that the Python driver applies itself (the waits
/// for lease room in `handoff.engine`, the rate-limited warnings in `handoff.node`): the
/// engine accepts them and leaves them alone.
const DRIVER_BOUNDS: [&str; 4] = [
    "lease_wait",
    "warnings_per_period",
    "warning_period",
    "warnings_in_all_per_period",
];

/// Why the engine refuses `value` (as Python shows it, `shown`) for the `handoff.bounds.Bounds`
/// field `name`, which it keeps fixed; `None` if `value` is the one it keeps.
fn fixed_bound_refusal(name: &str, value: f64, shown: &str) -> Option<String> {
    if name == "max_control_queued" {
        return (value != CONTROL_QUEUED_DEFAULT as f64).then(|| {
            format!(
                "Bounds(max_control_queued={shown}): a node on the engine bounds the ticket answers queued for a \
                 connection by bytes ({} MiB), not by this count; leave it at {CONTROL_QUEUED_DEFAULT}",
                handoff_proto::outgoing::MAX_CONTROL_BACKLOG >> 20
            )
        });
    }
    let (_, fixed) = FIXED_BOUNDS.iter().find(|(n, _)| *n == name)?;
    (value != fixed.as_f64()).then(|| {
        format!(
            "Bounds({name}={shown}): a node on the engine keeps {name} at {}; leave it at that value",
            fixed.shown()
        )
    })
}

/// Applies `given`, bounds by name, to `bounds` (`handoff_proto::bounds::Bounds`) and to the
/// lease table's `leases`. The names are the engine's (`max_pull_answers`, ...) or those of
/// the Python API's `handoff.bounds.Bounds` (as `dataclasses.asdict` gives them): a field the
/// engine keeps fixed must have its value ([`FIXED_BOUNDS`], `max_control_queued`), checked
/// first; one the Python driver applies ([`DRIVER_BOUNDS`]) is left alone; an unknown name,
/// or a value out of range, is refused naming it.
fn apply_bounds(given: &Bound<'_, pyo3::types::PyDict>, bounds: &mut Bounds, leases: &mut LeaseConfig) -> PyResult<()> {
    for name in FIXED_BOUNDS.iter().map(|(n, _)| *n).chain(["max_control_queued"]) {
        if let Some(value) = given.get_item(name)? {
            let shown = value.repr()?.to_string();
            if let Some(why) = fixed_bound_refusal(name, value.extract::<f64>()?, &shown) {
                return Err(PyValueError::new_err(why));
            }
        }
    }
    for (name, value) in given.iter() {
        let name: String = name.extract()?;
        set_bound(bounds, leases, &name, &value)?;
    }
    Ok(())
}

/// Raises the `ValueError` the engine would raise for these bounds (`Engine(bounds=...)`,
/// names as [`apply_bounds`] takes them), before a node makes its engine: a node on the
/// engine refuses `handoff.bounds.Bounds` it would not apply when it is made.
#[pyfunction]
pub fn check_engine_bounds(bounds: &Bound<'_, pyo3::types::PyDict>) -> PyResult<()> {
    let mut scratch = Bounds::DEFAULT;
    apply_bounds(bounds, &mut scratch, &mut LeaseConfig::default())
}

/// Sets the bound `name` (see [`apply_bounds`]; durations in seconds) to `value`; an unknown
/// name, or a value that is not a whole number of at least 1 (a positive number of seconds
/// for a duration), is refused naming it. A field kept fixed, or the Python driver's, is
/// left alone.
fn set_bound(bounds: &mut Bounds, leases: &mut LeaseConfig, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let bad = || PyValueError::new_err(format!("bound {name} cannot be {value}"));
    let seconds = || {
        let s: f64 = value.extract()?;
        duration_of(s, false).ok_or_else(bad)
    };
    let count = || -> PyResult<u64> {
        if value.is_instance_of::<pyo3::types::PyInt>() {
            // Exactly, however large (a float would round it).
            return value.extract::<u64>().ok().filter(|n| *n >= 1).ok_or_else(bad);
        }
        let n: f64 = value.extract()?;
        (n.is_finite() && n >= 1.0 && n.fract() == 0.0 && n <= u64::MAX as f64)
            .then_some(n as u64)
            .ok_or_else(bad)
    };
    match name {
        "max_handshakes" => bounds.max_handshakes = count()? as usize,
        "max_connections" => bounds.max_connections = count()? as usize,
        "handshake_timeout" => bounds.handshake_timeout = seconds()?,
        "progress_timeout" => bounds.progress_timeout = seconds()?,
        "write_timeout" => bounds.write_timeout = seconds()?,
        "max_buffered_bytes_per_peer" => bounds.max_buffered_bytes_per_peer = count()?,
        "max_buffered_bytes" => bounds.max_buffered_bytes = count()?,
        "max_buffered_messages_per_peer" => bounds.max_buffered_messages_per_peer = count()? as usize,
        "min_buffered_bytes_per_peer" => bounds.min_buffered_bytes_per_peer = count()?,
        "max_pull_answers" | "max_pulls_in_flight" => bounds.max_pull_answers = count()? as usize,
        "max_holders_per_lease" => bounds.max_holders_per_lease = count()? as usize,
        "max_shm_lease_bytes_per_peer" | "max_shm_bytes_per_peer" => bounds.max_shm_lease_bytes_per_peer = count()?,
        "max_shm_leases_per_peer" => bounds.max_shm_leases_per_peer = count()? as usize,
        "max_ticket_dials" | "max_owner_dials" => bounds.max_ticket_dials = count()? as usize,
        "max_owner_connections" => bounds.max_owner_connections = count()? as usize,
        "max_ticket_bytes" => leases.max_bytes = count()?,
        "max_ticket_bytes_per_peer" => leases.max_bytes_per_peer = count()?,
        "max_control_queued" => {} // kept fixed: checked by apply_bounds
        _ if FIXED_BOUNDS.iter().any(|(n, _)| *n == name) => {}
        _ if DRIVER_BOUNDS.contains(&name) => {}
        _ => {
            return Err(PyValueError::new_err(format!(
                "no bound named {name} (handoff_proto::bounds::Bounds)"
            )))
        }
    }
    Ok(())
}

/// The process's pool of shared segments that engines send from, as the Python peer's pool
/// reports itself: `segments`, `bytes`, `idle_segments`, `idle_bytes`, `busy_segments`,
/// `created`, `reused` and `retired`.
#[pyfunction]
pub fn segment_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let s = handoff_proto::shm::segment::SegmentPool::global().stats();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("segments", s.segments)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("idle_segments", s.idle_segments)?;
    d.set_item("idle_bytes", s.idle_bytes)?;
    d.set_item("busy_segments", s.segments - s.idle_segments)?;
    d.set_item("created", s.created)?;
    d.set_item("reused", s.reused)?;
    d.set_item("retired", s.retired)?;
    Ok(d)
}

/// How frames are copied into shared memory, from `HANDOFF_SHM_COPY`: `write` (the
/// default: `pwrite`, so the copy counts only in the receiver's RSS, as a Dask worker's
/// memory manager needs) or `map` (through this process's mapping: about twice as fast,
/// and the copy counts in this process's RSS too).
fn shm_copy_from_env() -> Result<handoff_proto::shm::CopyInto, String> {
    use handoff_proto::shm::CopyInto;
    match std::env::var("HANDOFF_SHM_COPY").as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("write") => Ok(CopyInto::Write),
        Ok("map") => Ok(CopyInto::Mapping),
        Ok(other) => Err(format!(
            "HANDOFF_SHM_COPY={other:?}: expected `write` (pwrite: the copy counts in the receiver's RSS only) or `map` (through a mapping: faster, counted in both)"
        )),
    }
}

/// The idle bytes of warm receive buffers an engine keeps: `HANDOFF_RECV_POOL_BYTES` (a
/// whole number of bytes, as the reference reads it), else 1 GiB.
fn recv_pool_bytes_from_env() -> Result<usize, String> {
    match std::env::var("HANDOFF_RECV_POOL_BYTES").as_deref().map(str::trim) {
        Err(_) | Ok("") => Ok(1 << 30),
        Ok(v) => v
            .parse::<usize>()
            .map_err(|_| format!("HANDOFF_RECV_POOL_BYTES={v:?}: expected a whole number of bytes")),
    }
}

/// The idle bytes of received segments an engine keeps mapped when its node does not say:
/// `HANDOFF_SHM_KEEP_BYTES` (a whole number of bytes; 0 keeps none), else `None` (the
/// default, `handoff_proto::node::DEFAULT_KEPT_MAPPINGS`). The error shows the value as
/// Python writes a string.
fn kept_map_bytes_from_env(py: Python<'_>) -> PyResult<Option<usize>> {
    let raw = match std::env::var_os("HANDOFF_SHM_KEEP_BYTES") {
        None => return Ok(None),
        Some(raw) => raw.to_string_lossy().trim().to_string(),
    };
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse::<usize>().map(Some).map_err(|_| {
        let shown = pyo3::types::PyString::new(py, &raw)
            .repr()
            .map_or_else(|_| format!("{raw:?}"), |r| r.to_string());
        PyValueError::new_err(format!(
            "HANDOFF_SHM_KEEP_BYTES={shown}: expected a number of bytes (0: keep none)"
        ))
    })
}

/// The engines of this process, for what they hold only for reuse ([`held_for_reuse`],
/// [`give_back_held`]).
static ENGINES: Mutex<Vec<std::sync::Weak<Shared>>> = Mutex::new(Vec::new());

/// What every engine of this process holds for reuse, summed.
fn held_now(give_back: bool) -> handoff_proto::shm::idle::HeldForReuse {
    use handoff_proto::shm::idle;
    let pool = handoff_proto::shm::SegmentPool::global();
    let engines: Vec<Arc<Shared>> = ENGINES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    let mut held = idle::HeldForReuse {
        pool_idle: pool.stats().idle_bytes,
        ..Default::default()
    };
    if give_back {
        pool.retire_idle(std::time::Instant::now(), std::time::Duration::ZERO);
    }
    for shared in &engines {
        let of = match give_back {
            true => shared.give_back(),
            false => shared.held_for_reuse(),
        };
        held.kept_idle += of.kept_idle;
        held.recv_idle += of.recv_idle;
    }
    held
}

fn held_dict(py: Python<'_>, held: handoff_proto::shm::idle::HeldForReuse) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let s = handoff_proto::shm::SegmentPool::global().stats();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("pool-busy", s.bytes - s.idle_bytes)?;
    d.set_item("pool-idle", held.pool_idle)?;
    d.set_item("pool-fds", s.segments)?;
    d.set_item("kept-idle", held.kept_idle)?;
    d.set_item("recv-idle", held.recv_idle)?;
    Ok(d)
}

/// What the engines of this process hold, in bytes, under the names of the Dask worker
/// metric `handoff` (`handoff.dask.memory.shared_bytes`): `pool-busy` (segments receivers
/// hold), `pool-idle` (idle segments, in no RSS), `pool-fds` (the pool's descriptors),
/// `kept-idle` (received segments kept mapped, in this RSS), `recv-idle` (warm receive
/// buffers, in this RSS).
#[pyfunction]
pub fn held_for_reuse(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let held = held_now(false);
    held_dict(py, held)
}

/// Gives back now everything the engines of this process hold only for reuse: idle pool
/// segments, idle kept mappings, warm receive buffers (the process nears a memory limit).
/// Returns what they held, as [`held_for_reuse`] says it.
#[pyfunction]
pub fn give_back_held(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let held = py.detach(|| held_now(true));
    held_dict(py, held)
}

/// A node's engine state, shared by its connections (see the module's text).
#[pyclass(frozen, module = "handoff._native")]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
}

#[pymethods]
impl Engine {
    /// A node named `name` holding the cluster `secret`; `host_id` defaults to this host's
    /// (spec §5.2). `capabilities` are announced in the handshake; `listen` and `unix` are
    /// the addresses the node announces. `bounds` sets bounds by name (durations in
    /// seconds), after the named arguments: the fields of `handoff_proto::bounds::Bounds`, or
    /// `dataclasses.asdict` of a `handoff.bounds.Bounds` (see `apply_bounds`).
    /// `kept_map_bytes` defaults to `HANDOFF_SHM_KEEP_BYTES`; keeping none (0) without a
    /// `kept_map_seconds` sweeps idle mappings at once. With `shm_private` each received frame of a same-host peer's segment is a
    /// private, writable (copy-on-write) mapping of its own, as `handoff.Node(shm_private=True)`
    /// gives Dask writable arrays. With `tls_check_name` false a dialing node checks the
    /// accepting node's certificate chain and not its name, as Dask's TLS does;
    /// `tls_min_version` "1.3" allows TLS 1.3 only (default "1.2": 1.2 and 1.3).
    #[new]
    #[pyo3(signature = (name, secret, *, host_id=None, capabilities=None, listen=None, unix=None,
                        accept_v1=false, accept_v2=false, handshake_timeout=None,
                        progress_timeout=None, max_buffered_bytes=None,
                        max_buffered_bytes_per_peer=None, shm_threshold=65536,
                        max_shm_lease_bytes_per_peer=None, tls_cert_chain=None, tls_key=None,
                        tls_ca=None, tls_server_name=None, ticket_threshold=None,
                        lease_ttl=None, max_lease_bytes=None, write_timeout=None,
                        tcp_timeout=None, bounds=None, shm_private=false, limits=None,
                        max_lease_bytes_per_peer=None, tls_check_name=true,
                        tls_min_version=None, kept_map_bytes=None, kept_map_seconds=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        secret: Vec<u8>,
        host_id: Option<String>,
        capabilities: Option<Vec<String>>,
        listen: Option<String>,
        unix: Option<String>,
        accept_v1: bool,
        accept_v2: bool,
        handshake_timeout: Option<f64>,
        progress_timeout: Option<f64>,
        max_buffered_bytes: Option<u64>,
        max_buffered_bytes_per_peer: Option<u64>,
        shm_threshold: usize,
        max_shm_lease_bytes_per_peer: Option<u64>,
        tls_cert_chain: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        tls_ca: Option<Vec<u8>>,
        tls_server_name: Option<String>,
        ticket_threshold: Option<usize>,
        lease_ttl: Option<f64>,
        max_lease_bytes: Option<u64>,
        write_timeout: Option<f64>,
        tcp_timeout: Option<f64>,
        bounds: Option<Bound<'_, pyo3::types::PyDict>>,
        shm_private: bool,
        limits: Option<std::collections::HashMap<String, u64>>,
        max_lease_bytes_per_peer: Option<u64>,
        tls_check_name: bool,
        tls_min_version: Option<String>,
        kept_map_bytes: Option<usize>,
        kept_map_seconds: Option<f64>,
    ) -> PyResult<Engine> {
        let tls = match (tls_cert_chain, tls_key, tls_ca) {
            (None, None, None) => None,
            (Some(chain), Some(key), Some(ca)) => {
                use handoff_proto::tls::{Configs, NameCheck, Policy};
                let policy = Policy {
                    name_check: if tls_check_name {
                        NameCheck::Name
                    } else {
                        NameCheck::ChainOnly
                    },
                    tls13_only: match tls_min_version.as_deref() {
                        None | Some("1.2") => false,
                        Some("1.3") => true,
                        Some(other) => {
                            return Err(PyValueError::new_err(format!(
                                "tls_min_version is \"1.2\" or \"1.3\", not {other:?}"
                            )))
                        }
                    },
                };
                Some(Tls {
                    configs: Configs::from_pem_with(&chain, &key, &ca, policy).map_err(PyValueError::new_err)?,
                    server_name: tls_server_name,
                })
            }
            _ => {
                return Err(PyValueError::new_err(
                    "TLS needs all three of tls_cert_chain, tls_key and tls_ca (PEM bytes)",
                ))
            }
        };
        handoff_proto::peers::check_own_identity(&name, host_id.as_deref()).map_err(PyValueError::new_err)?;
        let seconds = |what: &str, s: Option<f64>, default: Duration| match s {
            None => Ok(default),
            Some(s) => seconds_setting(what, s, false),
        };
        let shm_copy = shm_copy_from_env().map_err(PyValueError::new_err)?;
        let node_limits = match limits {
            None => Limits::default(),
            Some(given) => limits_of(given)?,
        };
        let given_bounds = bounds;
        let mut bounds = Bounds::DEFAULT;
        bounds.handshake_timeout = seconds("handshake_timeout", handshake_timeout, bounds.handshake_timeout)?;
        bounds.progress_timeout = seconds("progress_timeout", progress_timeout, bounds.progress_timeout)?;
        bounds.write_timeout = seconds("write_timeout", write_timeout, bounds.write_timeout)?;
        bounds.max_buffered_bytes = max_buffered_bytes.unwrap_or(bounds.max_buffered_bytes);
        bounds.max_buffered_bytes_per_peer = max_buffered_bytes_per_peer.unwrap_or(bounds.max_buffered_bytes_per_peer);
        // A Python peer reads less far ahead (spec §9.1: 64 messages for one peer).
        bounds.max_buffered_messages_per_peer = 64;
        bounds.max_shm_lease_bytes_per_peer =
            max_shm_lease_bytes_per_peer.unwrap_or(bounds.max_shm_lease_bytes_per_peer);
        let me = Endpoint {
            node_id: identity::random_id(),
            name,
            host_id: host_id.unwrap_or_else(identity::host_id),
            process_id: identity::process_id().to_string(),
            language: "python".into(),
            capabilities: capabilities.unwrap_or_else(|| vec!["inline".into()]),
        };
        let tcp_timeout = match tcp_timeout {
            None => None,
            Some(t) => {
                let t = seconds("tcp_timeout", Some(t), Duration::ZERO)?;
                handoff_proto::bounds::keepalive_plan(t).map_err(PyValueError::new_err)?;
                Some(t)
            }
        };
        let mut lease_config = LeaseConfig::default();
        lease_config.ttl = seconds("lease_ttl", lease_ttl, lease_config.ttl)?;
        lease_config.max_bytes = max_lease_bytes.unwrap_or(lease_config.max_bytes);
        lease_config.max_bytes_per_peer = max_lease_bytes_per_peer.unwrap_or(lease_config.max_bytes_per_peer);
        if let Some(given) = &given_bounds {
            apply_bounds(given, &mut bounds, &mut lease_config)?;
        }
        let kept_map_bytes = match kept_map_bytes {
            Some(n) => Some(n),
            None => kept_map_bytes_from_env(py)?,
        };
        let kept_bytes = kept_map_bytes.unwrap_or(handoff_proto::node::DEFAULT_KEPT_MAPPINGS);
        let wake = Wake::new().map_err(|e| PyValueError::new_err(format!("making the wake pipe: {e}")))?;
        let core = NodeCore::new(CoreSettings {
            me,
            secret,
            limits: node_limits,
            bounds,
            preamble: Preamble::ours(accept_v1, accept_v2),
            leases: lease_config,
            recv_pool_bytes: recv_pool_bytes_from_env().map_err(PyValueError::new_err)?,
            kept_mapping_bytes: kept_bytes,
        });
        let kept_idle = match kept_map_seconds {
            // The engine learns that a mapping went idle when it sweeps: keeping none means
            // sweeping often (every 50 ms), not at the default's pace.
            None if kept_bytes == 0 => Some(Duration::ZERO),
            None => None,
            Some(s) => Some(seconds_setting("kept_map_seconds", s, true)?),
        };
        let shared = Arc::new_cyclic(|weak: &std::sync::Weak<Shared>| {
            let weak = weak.clone();
            let lease_weak = weak.clone();
            core.leases.set_waker(Box::new(move || {
                if let Some(shared) = lease_weak.upgrade() {
                    if shared.waiting_for_leases.load(Ordering::Acquire) > 0 {
                        shared.wake.signal();
                    }
                }
            }));
            core.budget.set_waker(Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    if shared.waiting_for_room.load(Ordering::Acquire) > 0 {
                        shared.wake.signal();
                    }
                }
            }));
            Shared {
                core,
                listen,
                unix,
                shm_threshold: shm_threshold.max(1),
                shm_copy,
                types: Mutex::new(None),
                wake,
                waiting_for_room: AtomicUsize::new(0),
                tls,
                ticket_threshold,
                tcp_timeout,
                shm_private,
                connected: Mutex::default(),
                connections_of: Mutex::default(),
                waiting_for_leases: AtomicUsize::new(0),
                kept_idle,
            }
        });
        let mut live = ENGINES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|e| e.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        drop(live);
        Ok(Engine { shared })
    }

    /// Takes messages of these types from now on (once any is registered, others are
    /// refused with `unknown-type`).
    fn register(&self, names: Vec<String>) {
        let mut types = self.shared.types.lock().expect("types lock");
        types.get_or_insert_with(HashSet::new).extend(names);
    }

    /// The node's id (random, lower-case hex).
    #[getter]
    fn node_id(&self) -> &str {
        &self.shared.me.node_id
    }

    /// The random id of this process instance (an engine made after a fork has its own).
    #[getter]
    fn process_id(&self) -> &str {
        &self.shared.me.process_id
    }

    /// The node's name.
    #[getter]
    fn name(&self) -> &str {
        &self.shared.me.name
    }

    /// The node's host id (spec §5.2).
    #[getter]
    fn host_id(&self) -> &str {
        &self.shared.me.host_id
    }

    /// Bytes of received messages the node holds and the application has not taken.
    #[getter]
    fn buffered_bytes(&self) -> u64 {
        self.shared.budget.used()
    }

    /// Idle bytes of received segments this node keeps mapped for reuse, at most.
    #[getter]
    fn kept_map_bytes(&self) -> usize {
        self.shared.mappings.max_idle_bytes()
    }

    /// Bytes of peers' segments mapped now.
    #[getter]
    fn mapped_bytes(&self) -> usize {
        self.shared.mappings.mapped_bytes()
    }

    /// The descriptor the event loop watches: readable when connections should be asked
    /// again. Call [`take_wake`](Self::take_wake) when it is.
    fn wake_fd(&self) -> i32 {
        self.shared.wake.read_fd()
    }

    /// Closes the wake pipe, once the event loop no longer watches it (the driver closes):
    /// its two descriptors go now, not when the engine's state is collected.
    fn close_wake(&self) {
        self.shared.wake.close();
    }

    /// Empties the wake pipe (before asking the connections again).
    fn take_wake(&self) {
        self.shared.wake.drain();
    }

    /// Why the node reached at `addr`, whose id is `reached`, is not the ticket's owner
    /// `owner` (another node listens there now); `None` when it is.
    #[staticmethod]
    fn check_reached_owner(addr: &str, reached: &str, owner: &str) -> Option<String> {
        handoff_proto::dialing::check_reached_owner(addr, reached, owner).err()
    }

    /// Why a ticket owned by `owner` may not be redeemed from it at all (it names this node
    /// itself), or `None` (`handoff_proto::peers::check_owner`).
    fn check_owner(&self, owner: &str) -> Option<String> {
        handoff_proto::peers::check_owner(owner, &self.shared.me.node_id).err()
    }

    /// Before this node dials another ticket owner (spec §9.1, at most
    /// `max_owner_connections` kept): reserves a place, and returns the node id of the
    /// owner whose connection to close first (the one unused longest of those not in
    /// `busy`, the owners with a request of ours outstanding, where we hold no ticket and
    /// not used in the last 100 ms), or `None` when there was room. Kept owners not in
    /// `connected` (the node ids with a connection now) are forgotten first. Raises
    /// `ValueError` with why when none can make room (nothing reserved). Tell the dial's
    /// end with `owner_dialed` or `owner_gave_up` (`handoff_proto::dialing::OwnerDials`).
    fn owner_make_room(
        &self,
        connected: std::collections::HashSet<String>,
        busy: std::collections::HashSet<String>,
    ) -> PyResult<Option<String>> {
        self.shared
            .dials()
            .make_room(Instant::now(), |id| connected.contains(id), |id| busy.contains(id))
            .map_err(PyValueError::new_err)
    }

    /// The dial `owner_make_room` reserved for reached the owner `node_id`: kept, as the
    /// most recently used.
    fn owner_dialed(&self, node_id: String) {
        self.shared.dials().dialed(node_id, Instant::now());
    }

    /// The dial `owner_make_room` reserved for failed.
    fn owner_gave_up(&self) {
        self.shared.dials().gave_up();
    }

    /// A request goes to the owner `node_id` on a connection we have.
    fn owner_used(&self, node_id: String) {
        self.shared.dials().used(&node_id, Instant::now());
    }

    /// Why the node takes no more connections now (spec §9.1: it has `max_connections`
    /// established), or `None` (`handoff_proto::admission::over_connections`).
    fn over_connections(&self) -> Option<String> {
        let established = self
            .shared
            .connections_of
            .lock()
            .expect("connections lock")
            .values()
            .sum();
        handoff_proto::admission::over_connections(established, self.shared.bounds.max_connections)
    }

    /// The bounds of spec §9.1 this node keeps that its driver applies: `max_handshakes`,
    /// `max_connections`, `max_ticket_dials`, `max_owner_connections`, `write_timeout`
    /// (seconds).
    #[getter]
    fn bounds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let b = &self.shared.bounds;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("max_handshakes", b.max_handshakes)?;
        d.set_item("max_connections", b.max_connections)?;
        d.set_item("max_ticket_dials", b.max_ticket_dials)?;
        d.set_item("max_owner_connections", b.max_owner_connections)?;
        d.set_item("write_timeout", b.write_timeout.as_secs_f64())?;
        Ok(d)
    }

    /// The holds on other nodes' buffers that ended here since the last call, as
    /// `(owner node id, lease, token)`: send each its `unlease` on a connection to the owner
    /// (`Connection.send_unlease`).
    fn take_ended_holds(&self) -> Vec<(String, u64, Vec<u8>)> {
        self.shared
            .ended_holds
            .take()
            .into_iter()
            .map(|c| (c.owner, c.lease, c.token))
            .collect()
    }

    /// Ends the leases whose holds all expired; returns how many ended, and the seconds
    /// until the next expiry (`None`: none is due).
    fn expire_leases(&self) -> (usize, Option<f64>) {
        let ended = self.shared.leases.expire();
        let next = self
            .shared
            .leases
            .next_deadline()
            .map(|at| at.saturating_duration_since(std::time::Instant::now()).as_secs_f64());
        (ended, next)
    }

    /// The leases this node issued and holds for others: `(count, bytes)`.
    #[getter]
    fn ticket_leases(&self) -> (usize, u64) {
        let s = self.shared.leases.stats();
        (s.count, s.bytes)
    }

    /// What the node says to a connection it cannot take at all (spec §9.1, §12): its
    /// preamble, then, once the peer's whole preamble arrived, `error {code: "overloaded",
    /// message}` (both framed, as they go on the wire).
    fn overloaded<'py>(
        &self,
        py: Python<'py>,
        message: &str,
    ) -> (Bound<'py, pyo3::types::PyBytes>, Bound<'py, pyo3::types::PyBytes>) {
        let error = handoff_proto::handshake::error_header(&handoff_wire::WireError::Overloaded(message.to_string()));
        (
            pyo3::types::PyBytes::new(py, &self.shared.preamble.encode()),
            pyo3::types::PyBytes::new(py, &error),
        )
    }

    /// The lease table's figures, as `handoff.admin.Stats` carries them: `count`, `bytes`,
    /// `holders`, `oldest_seconds`, `expired`, `pulls` and `bytes_pulled`.
    fn ticket_lease_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = self.shared.leases.stats();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("count", s.count)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("holders", s.holders)?;
        d.set_item("oldest_seconds", s.oldest_seconds)?;
        d.set_item("expired", s.expired)?;
        d.set_item("pulls", s.pulls)?;
        d.set_item("bytes_pulled", s.bytes_pulled)?;
        Ok(d)
    }

    /// Gives idle shared memory back to the host: the pool's segments idle for
    /// `HANDOFF_SHM_POOL_IDLE_SECONDS` (default 10) and this node's mappings no view has
    /// used for `HANDOFF_SHM_KEEP_SECONDS` (default 10), the knobs of the Python
    /// implementation's pool and mapping cache. Returns how long until it should run again
    /// (seconds): the driver runs it from a timer.
    fn sweep_idle(&self) -> f64 {
        self.shared
            .sweep_idle(&self.shared.idle_times(), std::time::Instant::now())
            .as_secs_f64()
    }

    /// A redemption waits for room in the receive budget (the wake pipe fires when room is
    /// given back), or stops waiting.
    fn wait_for_room(&self, waiting: bool) {
        if waiting {
            self.shared.waiting_for_room.fetch_add(1, Ordering::AcqRel);
        } else {
            self.shared.waiting_for_room.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A sender waits for room in the lease table (the wake pipe fires when a hold ends),
    /// or stops waiting.
    fn wait_for_leases(&self, waiting: bool) {
        if waiting {
            self.shared.waiting_for_leases.fetch_add(1, Ordering::AcqRel);
        } else {
            self.shared.waiting_for_leases.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

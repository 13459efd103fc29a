//! Who this node is and where its host keeps things, as the engine computes them: node and
//! process ids and the host identity (`handoff_proto::identity`, spec §5.2), the runtime
//! directory of node sockets (`handoff_sys::same_host`, §7.1), the check of a node's own
//! identity against the bounds of §5.2, the keepalive plan of a TCP timeout, the
//! capabilities a node announces, and its listening Unix socket. The
//! Python API (`handoff.identity`, `handoff.node`) calls these, so that Python and Rust
//! nodes cannot disagree on them; the pure-Python reference keeps its own copies.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// 128 random bits from the operating system, as 32 lower-case hex characters (a node id).
#[pyfunction]
pub fn random_id() -> String {
    handoff_proto::identity::random_id()
}

/// The random id of this process instance, shared by all its nodes; a forked child gets
/// its own.
#[pyfunction]
pub fn process_id() -> &'static str {
    handoff_proto::identity::process_id()
}

/// The host identity (§5.2): `$HANDOFF_HOST_ID` if set and not empty, else the derivation
/// from the machine id, the boot id and this process's network namespace.
#[pyfunction]
pub fn host_id() -> String {
    handoff_proto::identity::host_id()
}

/// The folder of this user's node sockets (its path): `$HANDOFF_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/handoff`, else `/tmp/handoff-UID`; created with mode 0700.
/// `PermissionError` if another user owns it, `OSError` if it cannot be made.
#[pyfunction]
pub fn runtime_dir(py: Python<'_>) -> PyResult<String> {
    let dir = py
        .detach(handoff_sys::same_host::runtime_dir)
        .map_err(crate::connection::same_host_error)?;
    dir.into_os_string()
        .into_string()
        .map_err(|d| PyValueError::new_err(format!("the runtime directory {d:?} is not UTF-8")))
}

/// `ValueError` if what a node says about itself breaks a bound of §5.2 that every peer
/// enforces: its `name`, and its `host_id` when set.
#[pyfunction]
#[pyo3(signature = (name, host_id=None))]
pub fn check_own_identity(name: &str, host_id: Option<&str>) -> PyResult<()> {
    handoff_proto::peers::check_own_identity(name, host_id)
        .map_err(|why| PyValueError::new_err(format!("this node's identity is too long for the wire format: {why}")))
}

/// `(idle, interval, probes)` in whole seconds for a TCP connection that must notice a
/// silent peer within `timeout` seconds (Dask's derivation, `handoff_proto::bounds`);
/// `ValueError` where none exists (under 11 s).
#[pyfunction]
pub fn keepalive_plan(timeout: f64) -> PyResult<(u32, u32, u32)> {
    let timeout = std::time::Duration::try_from_secs_f64(timeout)
        .map_err(|e| PyValueError::new_err(format!("a TCP timeout of {timeout} s: {e}")))?;
    handoff_proto::bounds::keepalive_plan(timeout).map_err(PyValueError::new_err)
}

/// The capabilities a node on the engine announces (`handoff_proto::settings::CAPABILITIES`
/// by `NodeSettings::capabilities`): `shm` only with a Unix socket for same-host peers
/// (`shm`), and `cuda` with it where the node maps their GPU memory (`device_memory`).
#[pyfunction]
pub fn node_capabilities(shm: bool, device_memory: bool) -> Vec<String> {
    let mut settings = handoff_proto::settings::NodeSettings::new("");
    settings.shm = shm;
    settings.device_memory = device_memory;
    settings.capabilities()
}

/// The Unix socket for same-host peers of node `node_id` named `name`, listening
/// (`handoff_sys::same_host::listen`: in the [`runtime_dir`], a stale file replaced, mode
/// 0600, non-blocking): its descriptor, which the caller owns from now on, and its path.
#[pyfunction]
pub fn listen_unix(py: Python<'_>, name: &str, node_id: &str) -> PyResult<(i32, String)> {
    use std::os::fd::IntoRawFd;
    let (listener, path) = py
        .detach(|| handoff_sys::same_host::listen(name, node_id))
        .map_err(crate::connection::same_host_error)?;
    let path = match path.into_os_string().into_string() {
        Ok(path) => path,
        Err(p) => {
            // (The listener closes as it goes; its file goes with it.)
            let _ = std::fs::remove_file(&p);
            return Err(PyValueError::new_err(format!("the socket path {p:?} is not UTF-8")));
        }
    };
    Ok((listener.into_raw_fd(), path))
}

/// Adds this module's functions to `handoff._native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(random_id, m)?)?;
    m.add_function(wrap_pyfunction!(process_id, m)?)?;
    m.add_function(wrap_pyfunction!(host_id, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_dir, m)?)?;
    m.add_function(wrap_pyfunction!(check_own_identity, m)?)?;
    m.add_function(wrap_pyfunction!(keepalive_plan, m)?)?;
    m.add_function(wrap_pyfunction!(node_capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(listen_unix, m)?)?;
    Ok(())
}

//! `handoff._native`: the Rust core under the Python peer.
//!
//! What runs here so far is the codec of plain messages ([`plain`], see `docs/native.md`):
//! packing bodies of plain Python values, and reading the `msg` headers that encoders lay
//! out as they always do, on handoff-wire's msgpack reader.

use pyo3::prelude::*;

mod body_read;
pub mod connection;
pub mod datasets;
pub mod device;
pub mod engine;
pub mod frames;
pub mod host;
pub mod inbox;
pub mod log_limits;
mod numpy_api;
pub mod plain;
pub mod pooled;
pub mod shared_arrays;
/// The system calls both drivers share.
use handoff_sys as socket;
pub mod tickets;

/// The module `handoff._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // How often a wait for room looks again at what the budget is not told of (seconds).
    m.add("ROOM_RECHECK", handoff_proto::receive::ROOM_RECHECK.as_secs_f64())?;
    // The bounds of `handoff.bounds.Bounds` that the engine keeps fixed, at these values.
    let fixed = pyo3::types::PyDict::new(m.py());
    for (name, value) in engine::FIXED_BOUNDS {
        fixed.set_item(name, value.into_py_any(m.py())?)?;
    }
    m.add("ENGINE_FIXED_BOUNDS", fixed)?;
    // The most descriptors a connection takes with one read (spec §7.2).
    m.add("MAX_FDS_PER_READ", handoff_proto::inbound::MAX_FDS_PER_READ)?;
    m.add_class::<plain::PlainCodec>()?;
    m.add_class::<body_read::BodyReader>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<connection::Connection>()?;
    m.add_class::<connection::Received>()?;
    m.add_class::<inbox::Inbox>()?;
    m.add_class::<log_limits::LogLimits>()?;
    m.add_class::<frames::Frame>()?;
    m.add_class::<frames::OnDemand>()?;
    m.add_class::<frames::SegmentFrame>()?;
    m.add_class::<pooled::PooledBuffer>()?;
    m.add_class::<tickets::Ticket>()?;
    m.add_class::<device::DeviceFrame>()?;
    m.add_class::<device::DeviceClaim>()?;
    m.add_function(wrap_pyfunction!(device::cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(device::shares_device_memory, m)?)?;
    m.add_function(wrap_pyfunction!(device::cuda_memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(device::cuda_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(device::cuda_upload, m)?)?;
    m.add_function(wrap_pyfunction!(engine::segment_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(engine::held_for_reuse, m)?)?;
    m.add_function(wrap_pyfunction!(engine::give_back_held, m)?)?;
    m.add_function(wrap_pyfunction!(engine::configure_segment_pool, m)?)?;
    m.add_function(wrap_pyfunction!(engine::check_engine_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(engine::limits_for_sending, m)?)?;
    m.add("SHARED_ARRAYS_HANDLER", shared_arrays::HANDLER_NAME)?;
    m.add_function(wrap_pyfunction!(shared_arrays::shared_arrays_set_handler, m)?)?;
    m.add_function(wrap_pyfunction!(shared_arrays::arena_locate, m)?)?;
    m.add_function(wrap_pyfunction!(shared_arrays::arena_stats, m)?)?;
    m.add_function(wrap_pyfunction!(shared_arrays::arena_configure, m)?)?;
    m.add_function(wrap_pyfunction!(shared_arrays::arena_trim, m)?)?;
    m.add_function(wrap_pyfunction!(shared_arrays::arena_trim_idle, m)?)?;
    host::register(m)?;
    datasets::register(m)?;
    Ok(())
}

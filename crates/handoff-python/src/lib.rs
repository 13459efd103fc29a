//! `handoff._native`: the Rust core under the Python peer.
//!
//! This first cut holds the two prototypes that issue 27 asks to measure before the line
//! between Rust and Python is drawn (see `docs/native.md`):
//!
//! - [`thread_channel::ThreadChannel`], option (a): the connection's reads and writes run on
//!   a tokio thread of this extension, and each batch of received frames crosses into the
//!   asyncio loop with `loop.call_soon_threadsafe`;
//! - [`loop_channel::LoopChannel`], option (b): the asyncio loop watches the socket, and
//!   calls into Rust for the system calls and the framing when it is readable.
//!
//! Both carry the same frames (`u32` big-endian length, then the bytes), bounded by
//! [`frames::FrameReader`], so that a run compares only where the work happens.

use pyo3::prelude::*;

pub mod crossing;
pub mod frames;
pub mod loop_channel;
pub mod plain;
pub mod runtime;
pub mod sys;
pub mod thread_channel;

/// The module `handoff._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_FRAME_BYTES", frames::MAX_FRAME_BYTES)?;
    m.add("FRAMES_PER_CALL", loop_channel::FRAMES_PER_CALL)?;
    m.add("MAX_UNSENT", loop_channel::MAX_UNSENT)?;
    m.add("MAX_UNDELIVERED", thread_channel::MAX_UNDELIVERED)?;
    m.add_class::<thread_channel::ThreadChannel>()?;
    m.add_class::<loop_channel::LoopChannel>()?;
    m.add_function(wrap_pyfunction!(crossing::post_from_thread, m)?)?;
    m.add_class::<plain::PlainCodec>()?;
    m.add_function(wrap_pyfunction!(plain::plain_msg, m)?)?;
    m.add_function(wrap_pyfunction!(plain::inline_msg, m)?)?;
    Ok(())
}

//! What it costs a thread of this extension to reach the asyncio loop: the crossing that
//! option (a) pays once per batch of received frames.

use std::time::Duration;

use pyo3::prelude::*;

fn monotonic_ns() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// Starts a thread that, `count` times, `interval_us` apart, calls
/// `event_loop.call_soon_threadsafe(callback, (t0, t1))`: `t0` is `CLOCK_MONOTONIC` (what
/// `time.monotonic_ns()` reads) before the thread asks for the GIL, `t1` once it holds it.
/// The callback, run by the loop, reads the clock again.
#[pyfunction]
pub fn post_from_thread(event_loop: Py<PyAny>, callback: Py<PyAny>, count: usize, interval_us: u64) {
    std::thread::spawn(move || {
        for _ in 0..count {
            std::thread::sleep(Duration::from_micros(interval_us));
            let t0 = monotonic_ns();
            Python::attach(|py| {
                let t1 = monotonic_ns();
                let sent = event_loop.call_method1(py, "call_soon_threadsafe", (&callback, (t0, t1)));
                if let Err(e) = sent {
                    e.print(py);
                }
            });
        }
    });
}

//! The tokio runtime that data reads run on, and how their results reach asyncio.
//!
//! Reads from object stores and the cache are `handoff-data`'s async code on a tokio runtime
//! of this module's own. Its threads never call into Python: a finished read leaves its
//! result here, as a conversion to run later, and writes a byte to a wake pipe that the
//! event loop watches; the loop's callback ([`data_completions`]) runs the conversions,
//! holding the GIL on the loop's own thread. A thread that called into Python could be
//! killed by the interpreter's exit halfway through (CPython ends such threads), and crash
//! the process as it goes.
//!
//! The runtime and the pipe are rebuilt in a forked child: a runtime's threads do not
//! survive `fork`, and tasks spawned on the parent's would never run.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

use crate::engine::Wake;

/// Worker threads of the data runtime: reads wait on storage and files, not on CPU.
const WORKERS: usize = 2;

/// What turns a finished read into its Python value (or exception), on the loop's thread.
pub(crate) type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// The data layer of one process.
struct Process {
    pid: u32,
    runtime: Arc<Runtime>,
    wake: Arc<Wake>,
    /// Finished reads by request id, waiting for the loop.
    done: VecDeque<(u64, Convert)>,
    /// Reads under way, so that a cancelled one can be stopped.
    running: HashMap<u64, tokio::task::AbortHandle>,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Process>> {
    PROCESS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This process's data layer, built on first use and again in a forked child.
fn process(slot: &mut Option<Process>) -> PyResult<&mut Process> {
    let pid = std::process::id();
    if slot.as_ref().is_some_and(|p| p.pid != pid) {
        // A child of fork: the parent's runtime has no threads here. Dropping it would wait
        // for them, so it is leaked, as the rest of the parent's memory is.
        if let Some(old) = slot.take() {
            std::mem::forget(old.runtime);
        }
    }
    if slot.is_none() {
        let started = |e: std::io::Error| PyRuntimeError::new_err(format!("handoff's data runtime cannot start: {e}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("handoff-data")
            .enable_all()
            .build()
            .map_err(started)?;
        *slot = Some(Process {
            pid,
            runtime: Arc::new(runtime),
            wake: Arc::new(Wake::new().map_err(started)?),
            done: VecDeque::new(),
            running: HashMap::new(),
        });
    }
    Ok(slot.as_mut().expect("built above"))
}

/// Runs `fut` on the data runtime as request `id`: its result waits for
/// [`data_completions`], and the wake pipe says so.
pub(crate) fn spawn<F>(id: u64, fut: F) -> PyResult<()>
where
    F: Future<Output = Convert> + Send + 'static,
{
    let mut slot = lock();
    let p = process(&mut slot)?;
    let wake = p.wake.clone();
    let task = p.runtime.spawn(async move {
        let convert = fut.await;
        let mut slot = lock();
        if let Some(p) = slot.as_mut() {
            if p.running.remove(&id).is_some() {
                p.done.push_back((id, convert));
                wake.signal();
            }
        }
    });
    p.running.insert(id, task.abort_handle());
    Ok(())
}

/// The [`Convert`] of a read's `result`: `make` for a value, the matching exception of
/// `handoff.datasets` for an error.
pub(crate) fn finish<T: Send + 'static>(
    result: handoff_data::Result<T>,
    make: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
) -> Convert {
    Box::new(move |py| match result {
        Ok(value) => make(py, value),
        Err(e) => Err(super::errors::to_py(e)),
    })
}

/// The read end of the wake pipe that says reads have finished; an event loop watches it.
#[pyfunction]
pub fn data_wake_fd() -> PyResult<i32> {
    let mut slot = lock();
    Ok(process(&mut slot)?.wake.read_fd())
}

/// The reads finished since the last call, each as `(id, ok, value)`: the value, or the
/// exception to raise. Empties the wake pipe.
#[pyfunction]
pub fn data_completions(py: Python<'_>) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
    let done: Vec<(u64, Convert)> = {
        let mut slot = lock();
        let p = process(&mut slot)?;
        p.wake.drain();
        p.done.drain(..).collect()
    };
    Ok(done
        .into_iter()
        .map(|(id, convert)| match convert(py) {
            Ok(value) => (id, true, value),
            Err(e) => (id, false, e.into_value(py).into_any()),
        })
        .collect())
}

/// Stops read `id` (its awaiting future was cancelled); a finished one is forgotten.
#[pyfunction]
pub fn data_cancel(id: u64) {
    let mut slot = lock();
    if let Some(p) = slot.as_mut() {
        if let Some(task) = p.running.remove(&id) {
            task.abort();
        }
        p.done.retain(|(done, _)| *done != id);
    }
}

//! The tokio runtime that data reads run on, and its bridge to asyncio.
//!
//! Reads from object stores and the cache are `handoff-data`'s async code on tokio; their
//! results reach Python as asyncio futures through `pyo3-async-runtimes`. The runtime is this
//! module's own, not the library's global one, so that a forked child builds a fresh one: a
//! runtime's worker threads do not survive `fork`, and tasks spawned on the parent's would
//! never run.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::IntoPyObject;
use pyo3_async_runtimes::generic::{ContextExt, Runtime as GenericRuntime};
use pyo3_async_runtimes::TaskLocals;
use std::cell::OnceCell;
use tokio::runtime::Runtime;

/// Worker threads of the data runtime: reads wait on storage and files, not on CPU.
const WORKERS: usize = 2;

/// The runtime of this process, with the pid that built it.
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// This process's runtime, built on first use and again in a forked child.
fn runtime() -> std::io::Result<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((built_by, rt)) = slot.as_ref() {
        if *built_by == pid {
            return Ok(rt.clone());
        }
    }
    // A child of fork: the parent's runtime has no threads here. Dropping it would wait for
    // them, so it is leaked, as the parent's memory is.
    if let Some((_, old)) = slot.take() {
        std::mem::forget(old);
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("handoff-data")
            .enable_all()
            .build()?,
    );
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// The runtime [`awaitable`] made sure of: it is built before any task is spawned on it.
fn started() -> Arc<Runtime> {
    match runtime() {
        Ok(rt) => rt,
        // Unreachable in practice: `awaitable` built it in this process and returned the
        // error to Python if it could not.
        Err(e) => panic!("handoff's data runtime did not start: {e}"),
    }
}

/// `pyo3-async-runtimes`' view of [`runtime`].
pub(crate) struct DataRuntime;

tokio::task_local! {
    static LOCALS: OnceCell<TaskLocals>;
}

impl GenericRuntime for DataRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        started().spawn(fut)
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        started().spawn_blocking(f)
    }
}

impl ContextExt for DataRuntime {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        let _ = cell.set(locals);
        Box::pin(LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        LOCALS.try_with(|c| c.get().cloned()).unwrap_or_default()
    }
}

/// An asyncio future of `fut`'s result, awaited on the running loop.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    runtime().map_err(|e| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("handoff's data runtime could not start its threads: {e}"))
    })?;
    pyo3_async_runtimes::generic::future_into_py::<DataRuntime, F, T>(py, fut)
}

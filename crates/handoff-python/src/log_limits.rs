//! [`LogLimits`]: the engine's log limiter (`handoff_proto::log_limit`, spec §9.1) for the
//! Python node's warnings, one limiter per source (a peer's name, or the address of a
//! connection still in its handshake) under one for the whole node, as the Rust node keeps
//! one per peer under its node's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use handoff_proto::log_limit::LogLimiter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Sources remembered at most: past this many, every source starts afresh (what each had
/// suppressed is then reported by none), so that a peer that makes up names cannot grow
/// the table.
pub const MAX_SOURCES: usize = 4096;

/// Warnings allowed per source and period, and in all per period (see the module's text).
#[pyclass(frozen)]
pub struct LogLimits {
    per_source: u32,
    period: Duration,
    node: Arc<LogLimiter>,
    sources: Mutex<HashMap<String, LogLimiter>>,
}

#[pymethods]
impl LogLimits {
    /// `per_source` warnings about one source per `period` seconds, `total` about all of
    /// them together.
    #[new]
    #[pyo3(signature = (per_source, period, total))]
    fn new(per_source: u32, period: f64, total: u32) -> PyResult<Self> {
        let period = Duration::try_from_secs_f64(period)
            .map_err(|e| PyValueError::new_err(format!("a warning period of {period} s: {e}")))?;
        Ok(LogLimits {
            per_source,
            period,
            node: Arc::new(LogLimiter::new(total, period)),
            sources: Mutex::default(),
        })
    }

    /// Whether to log a warning about `source` now: `None` to stay quiet (it is counted),
    /// else how many warnings were kept quiet before it, to mention.
    fn allow(&self, source: &str) -> Option<u64> {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if !sources.contains_key(source) && sources.len() >= MAX_SOURCES {
            sources.clear();
        }
        sources
            .entry(source.to_string())
            .or_insert_with(|| LogLimiter::under(self.node.clone(), self.per_source, self.period))
            .allow()
    }

    /// Sources remembered now (at most [`MAX_SOURCES`]).
    fn __len__(&self) -> usize {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

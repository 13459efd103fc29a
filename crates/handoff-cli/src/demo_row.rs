//! One row of `handoff demo`: a transfer from one node to another, timed and verified. The demo's table and
//! `--json` output are made of these, and so are the data-handle rows `demo_data` adds.
//!
//! A route's first transfer is *cold*: it writes into memory no process touched before (page faults, fresh
//! socket buffers, a segment pool still empty), and on this kind of machine it runs at a fraction of the
//! steady state. A row says which figure it holds (`cold`) and, where the demo repeated the transfer, the
//! warm one beside it (`warm_seconds`), so that the first figure a newcomer sees is not read as handoff's
//! speed.

use serde::{Deserialize, Serialize};

/// One transfer of the demo (keys are a public interface: keep them stable).
#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    /// Sending node.
    pub from: String,
    /// Receiving node.
    pub to: String,
    /// `same-process`, `same-host` or `remote`.
    pub locality: String,
    /// `inproc`, `shm` or `tcp`.
    pub channel: String,
    /// Bytes of the large buffer.
    pub bytes: u64,
    /// Seconds from send until the receiver held the decoded value (the first transfer where `cold`).
    pub seconds: f64,
    /// Whether the receiver's digest of the bytes matched the sender's.
    pub verified: bool,
    /// Data-handle rows: the dataset sent as a handle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Data-handle rows: where the receiver's bytes came from (`storage`, `shared-cache`,
    /// `remote-blob`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Data-handle rows: GET requests the storage server saw during the row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_gets: Option<u64>,
    /// Dask rows (an array between two Dask workers on `handoff://`): seconds the same
    /// transfer took between two workers on Dask's `tcp://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dask_tcp_seconds: Option<f64>,
    /// Whether `seconds` is the route's first transfer (cold): value rows and data-handle rows of the
    /// Rust nodes and data-handle rows of Dask. The Dask array rows' `seconds` is already warm (their
    /// median after one warm-up).
    #[serde(default)]
    pub cold: bool,
    /// Rows whose transfer was repeated: the median of the repeats after the first, the steady state
    /// that BENCHMARKS.md measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_seconds: Option<f64>,
    /// Dask array rows (whose `seconds` is warm): the first transfer, the warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_seconds: Option<f64>,
}

impl Row {
    /// The first transfer's seconds, where the row has it: `seconds` of a cold row, else `cold_seconds`.
    pub fn first_seconds(&self) -> Option<f64> {
        if self.cold {
            Some(self.seconds)
        } else {
            self.cold_seconds
        }
    }

    /// The warm seconds, where the row has them: `warm_seconds`, else `seconds` of a row that is not cold.
    pub fn warm(&self) -> Option<f64> {
        match (self.warm_seconds, self.cold) {
            (Some(w), _) => Some(w),
            (None, false) => Some(self.seconds),
            (None, true) => None,
        }
    }
}

//! One row of `handoff demo`: a transfer from one node to another, timed and verified. The demo's table and
//! `--json` output are made of these, and so are the data-handle rows `demo_data` adds.

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
    /// Seconds from send until the receiver held the decoded value.
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
}

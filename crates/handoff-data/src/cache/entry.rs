//! The small JSON records of the cache: index entries (key → digest) and seals (an object's checked size and mtime).

use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

/// An index entry: one version of one object in one store, and the digest of its content.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IndexEntry {
    /// The store's identity.
    pub identity: String,
    /// The object's path in the store.
    pub path: String,
    /// The version (see the cache key).
    pub version: String,
    /// Size in bytes.
    pub size: u64,
    /// BLAKE3 digest of the content (hex).
    pub digest: String,
}

/// What a block directory holds: which object and version, its size, and the block size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockMeta {
    /// The store's identity.
    pub identity: String,
    /// The object's path in the store.
    pub path: String,
    /// The version.
    pub version: String,
    /// The whole object's size.
    pub size: u64,
    /// The block size.
    pub block_size: u64,
}

/// An object file's size and mtime when its digest was last checked: if they still match, the content is trusted.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Seal {
    pub size: u64,
    pub mtime_ns: i128,
}

impl Seal {
    pub fn of(meta: &std::fs::Metadata) -> Seal {
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(-1);
        Seal {
            size: meta.len(),
            mtime_ns,
        }
    }
}

/// Reads a JSON record; `None` if missing or unreadable (a damaged record is treated as absent).
pub(crate) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let data = std::fs::read(path).ok()?;
    serde_json::from_slice(&data).ok()
}

//! `BlobTag`: what a `Blob` handle is when it travels — no bytes, no driver, no cache — to be bound by the
//! receiver to its own catalog and cache with [`Catalog::open_tag`](crate::Catalog::open_tag).

use serde::{Deserialize, Serialize};

/// A serializable description of a blob: dataset uuid, path within the dataset, and what is known of its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobTag {
    /// The dataset's uuid: the receiver looks it up in its own catalog.
    pub dataset: String,
    /// The dataset's name at the sender (for error messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The path within the dataset, `/`-separated; empty for a `Blob` dataset itself.
    #[serde(default)]
    pub path: String,
    /// The object's size in bytes, if the sender knew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The BLAKE3 digest (hex) of the content, if the sender knew it: a receiver whose cache holds content with this
    /// digest uses it without asking storage, and content fetched from storage is checked against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The storage version (ETag or version id) the sender saw, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

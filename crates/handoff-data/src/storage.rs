//! Where a dataset's bytes live, as its catalog entry configures them (`[datasets.storage]`), and the drivers this
//! build reads. Parsed only: opening the storage is [`crate::source`]'s job.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::embedded::Embedded;

/// Where a dataset's bytes live, as configured in `[datasets.storage]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageConfig {
    /// DataSets.jl's `FileSystem` driver: a local path, read in place (not copied into the cache).
    FileSystem {
        /// The absolute path, with `@__DIR__` expanded.
        path: PathBuf,
    },
    /// handoff's `ObjectStore` driver: an `object_store` url and builder options; reads go through the cache.
    ObjectStore {
        /// The url, e.g. `s3://bucket/prefix`.
        url: String,
        /// Builder options (`endpoint`, `region`, ...), values as strings.
        options: BTreeMap<String, String>,
    },
    /// DataSets.jl's `TomlDataStorage` driver: the bytes are in the catalog itself (base64).
    TomlData {
        /// The decoded content.
        content: Embedded,
    },
    /// A driver handoff does not have (a Julia package's own, say). The catalog still loads
    /// and lists the dataset; opening it fails with [`Error::DriverUnavailable`], and a
    /// received handle to it falls back on the sender's bytes.
    Unavailable {
        /// The driver the catalog names.
        driver: String,
    },
}

/// The storage drivers this build reads (`driver = ...` in `[datasets.storage]`).
pub const DRIVERS: &[&str] = &["FileSystem", "TomlDataStorage", "ObjectStore"];

impl StorageConfig {
    /// The driver, as the catalog names it.
    pub fn driver(&self) -> &str {
        match self {
            StorageConfig::FileSystem { .. } => "FileSystem",
            StorageConfig::ObjectStore { .. } => "ObjectStore",
            StorageConfig::TomlData { .. } => "TomlDataStorage",
            StorageConfig::Unavailable { driver } => driver,
        }
    }

    /// Whether this node can read the dataset (its driver is one of [`DRIVERS`]).
    pub fn is_available(&self) -> bool {
        !matches!(self, StorageConfig::Unavailable { .. })
    }

    /// Where the bytes are, for messages and listings: a path, a url, or the driver.
    pub fn location(&self) -> String {
        match self {
            StorageConfig::FileSystem { path } => path.display().to_string(),
            StorageConfig::ObjectStore { url, .. } => url.clone(),
            StorageConfig::TomlData { content } => match content {
                Embedded::Blob(b) => format!("(in the catalog: {} bytes)", b.len()),
                Embedded::Tree(t) => format!("(in the catalog: {} files)", t.len()),
            },
            StorageConfig::Unavailable { driver } => format!("(driver {driver})"),
        }
    }
}

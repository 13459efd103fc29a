//! handoff's data layer: DataSets.jl catalogs, lazy `Blob` / `BlobTree` handles, and a per-node cache.
//!
//! A handle travels between nodes as a [`BlobTag`] — dataset uuid, path, size and digest if known — and the
//! receiver binds it to its own catalog and cache with [`Catalog::open_tag`], fetching from storage on first use.
//!
//! ```no_run
//! # async fn demo() -> handoff_data::Result<()> {
//! use handoff_data::{Cache, CacheConfig, Catalog};
//! let cache = Cache::open(CacheConfig::new("/tmp/handoff-cache").max_bytes(Some(10 << 30)))?;
//! let catalog = Catalog::load("Data.toml", cache)?;
//! let blob = catalog.blob("a_text_file")?;     // lazy: nothing read yet
//! let header = blob.read_range(0..16).await?;  // fetches only the blocks it needs
//! let tag = blob.describe().await?;            // send this; the receiver calls its catalog's open_tag(&tag)
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod blob;
pub mod cache;
pub mod catalog;
mod dataset;
pub mod embedded;
pub mod error;
#[cfg(doctest)]
mod guide_examples;
#[cfg(feature = "node")]
pub mod handle;
mod kind;
pub mod name;
mod pinned;
mod relpath;
pub mod selection;
pub mod source;
pub mod spec;
pub mod stack;
mod storage;
pub mod tag;
pub mod tree;

pub use blob::{Blob, BlobMap, BlobReader, LocalPath, Origin};
pub use cache::{Cache, CacheConfig, CacheStats, CachedFile, GcReport, VerifyReport};
pub use catalog::{Catalog, DataKind, DataSet, StorageConfig, DRIVERS};
pub use error::{CatalogError, Error, Result};
#[cfg(feature = "node")]
pub use handle::BlobHandle;
pub use name::{check_name, NAME_RULE};
pub use relpath::local_file;
pub use selection::{Opened, Selection};
pub use spec::{DataSpec, SpecError};
pub use stack::{CatalogStack, StackEntry};
pub use tag::BlobTag;
pub use tree::{BlobTree, TreeEntry};

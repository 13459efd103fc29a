//! The catalog: DataSets.jl's `Data.toml` (`data_config_version = 1`) plus handoff's object-store driver.
//!
//! A Julia catalog works unchanged:
//!
//! ```toml
//! data_config_version = 1
//!
//! [[datasets]]
//! name = "a_text_file"
//! uuid = "b498f769-a7f6-4f67-8d74-40b770398f26"
//! description = "A text file"
//!
//!     [datasets.storage]
//!     driver = "FileSystem"
//!     type = "Blob"
//!     path = "@__DIR__/data/file.txt"
//! ```
//!
//! DataSets.jl's built-in `TomlDataStorage` driver (the bytes in the catalog, base64; see
//! [`crate::embedded`]) is read too, and the newer type names `File` and `FileTree` mean
//! `Blob` and `BlobTree`. A dataset whose driver handoff does not have (a Julia package's
//! own) does not stop the catalog from loading: it is listed, and opening it says which
//! drivers exist. Datasets may share a name or uuid, as DataSets.jl allows; a lookup by a
//! shared one is refused with the datasets that share it.
//!
//! handoff adds `driver = "ObjectStore"` with a `url` (`s3://bucket/prefix`, `http(s)://host/path`, `file:///abs`,
//! `memory://name/path`, and with cargo features `gs://` and `az://`) and `[datasets.storage.options]` passed to the
//! store's builder (`endpoint`, `region`, `allow_http`, `access_key_id`, `secret_access_key`, ...).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::blob::Blob;
use crate::cache::Cache;
use crate::dataset::{field_err, parse_dataset};
use crate::error::{CatalogError, Error, Result};
use crate::relpath;
use crate::tag::BlobTag;
use crate::tree::BlobTree;

pub use crate::dataset::DataSet;
pub use crate::kind::DataKind;
pub use crate::storage::{StorageConfig, DRIVERS};

/// A loaded catalog bound to a cache: datasets by name and uuid, opened as lazy handles.
#[derive(Debug, Clone)]
pub struct Catalog {
    file: PathBuf,
    datasets: Vec<Arc<DataSet>>,
    cache: Arc<Cache>,
}

impl Catalog {
    /// Reads and checks a catalog file; handles opened from it use `cache`.
    pub fn load(file: impl AsRef<Path>, cache: Arc<Cache>) -> Result<Self> {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file).map_err(|source| CatalogError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        Self::parse(&text, file, cache)
    }

    /// Parses catalog text as if read from `file` (whose folder is `@__DIR__`).
    pub fn parse(text: &str, file: impl AsRef<Path>, cache: Arc<Cache>) -> Result<Self> {
        let file = absolute(file.as_ref());
        let dir = file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let root: toml::Table = text.parse().map_err(|e: toml::de::Error| CatalogError::Toml {
            file: file.clone(),
            message: e.to_string(),
        })?;
        match root.get("data_config_version") {
            Some(toml::Value::Integer(1)) => {}
            other => {
                let found = other.map(|v| v.to_string()).unwrap_or_else(|| "missing".into());
                return Err(CatalogError::Version { file, found }.into());
            }
        }
        let entries = match root.get("datasets") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a.clone(),
            Some(_) => {
                return Err(field_err(
                    &file,
                    "(catalog)",
                    "datasets",
                    "must be an array of tables ([[datasets]])",
                )
                .into())
            }
        };
        let mut memory = HashMap::new();
        let mut datasets: Vec<Arc<DataSet>> = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            datasets.push(Arc::new(parse_dataset(&file, &dir, i, entry, &mut memory)?));
        }
        // DataSets.jl accepts a catalog whose datasets share a uuid (its own test catalog has
        // several): so does handoff, and only a lookup by that uuid (or name) is refused.
        Ok(Catalog { file, datasets, cache })
    }

    /// The catalog file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// All datasets, in file order.
    pub fn datasets(&self) -> &[Arc<DataSet>] {
        &self.datasets
    }

    /// The cache handles of this catalog use.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The dataset with this name or uuid. A key that several datasets share is refused
    /// with [`Error::Ambiguous`], naming them.
    pub fn dataset(&self, key: &str) -> Result<&Arc<DataSet>> {
        let lower = key.to_ascii_lowercase();
        self.only(key, |d| d.name() == key || d.uuid() == lower)?
            .ok_or_else(|| Error::NoSuchDataset {
                file: self.file.clone(),
                key: key.to_string(),
                known: self.known_names(),
            })
    }

    /// The one dataset that `matches`, `None` if none does, `Ambiguous` if several do.
    fn only(&self, key: &str, matches: impl Fn(&DataSet) -> bool) -> Result<Option<&Arc<DataSet>>> {
        let mut found = self.datasets.iter().filter(|d| matches(d));
        let first = found.next();
        let others: Vec<&Arc<DataSet>> = found.collect();
        match first {
            Some(first) if !others.is_empty() => Err(Error::Ambiguous {
                file: self.file.clone(),
                key: key.to_string(),
                datasets: std::iter::once(first)
                    .chain(others)
                    .map(|d| format!("{} ({})", d.name(), d.uuid()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            first => Ok(first),
        }
    }

    /// `ds` itself, if this node can read it: else why not (its driver is not in this build).
    fn available<'a>(&self, ds: &'a Arc<DataSet>) -> Result<&'a Arc<DataSet>> {
        match ds.storage() {
            StorageConfig::Unavailable { driver } => Err(Error::DriverUnavailable {
                file: self.file.clone(),
                dataset: ds.name().to_string(),
                driver: driver.clone(),
                drivers: DRIVERS.join(", "),
            }),
            _ => Ok(ds),
        }
    }

    /// A lazy handle to a `Blob` dataset (nothing is read yet).
    pub fn blob(&self, key: &str) -> Result<Blob> {
        let ds = self.available(self.dataset(key)?)?;
        if ds.kind() != DataKind::Blob {
            return Err(Error::WrongType {
                dataset: ds.name().to_string(),
                actual: ds.kind().as_str(),
                wanted: "Blob",
            });
        }
        Ok(Blob::new(ds.clone(), String::new(), self.cache.clone(), None))
    }

    /// A lazy handle to a `BlobTree` dataset (nothing is read yet).
    pub fn tree(&self, key: &str) -> Result<BlobTree> {
        let ds = self.available(self.dataset(key)?)?;
        if ds.kind() != DataKind::BlobTree {
            return Err(Error::WrongType {
                dataset: ds.name().to_string(),
                actual: ds.kind().as_str(),
                wanted: "BlobTree",
            });
        }
        Ok(BlobTree::new(ds.clone(), String::new(), self.cache.clone()))
    }

    /// Binds a tag received from another node to this node's catalog and cache.
    ///
    /// The dataset is found by uuid; the size and digest in the tag are checked against what this node reads.
    pub fn open_tag(&self, tag: &BlobTag) -> Result<Blob> {
        let lower = tag.dataset.to_ascii_lowercase();
        let ds = self
            .only(&tag.dataset, |d| d.uuid() == lower)?
            .ok_or_else(|| Error::UnknownTag {
                uuid: tag.dataset.clone(),
                name: tag.name.clone().unwrap_or_else(|| "no name given".into()),
                file: self.file.clone(),
            })?;
        let ds = self.available(ds)?;
        let path = if tag.path.is_empty() {
            if ds.kind() != DataKind::Blob {
                return Err(Error::WrongType {
                    dataset: ds.name().to_string(),
                    actual: ds.kind().as_str(),
                    wanted: "Blob",
                });
            }
            String::new()
        } else {
            relpath::normalize(ds.name(), &tag.path)?
        };
        if !path.is_empty() {
            relpath::check_local_symlinks(ds.name(), ds.source().local_root(), &path)?;
        }
        Ok(Blob::new(ds.clone(), path, self.cache.clone(), Some(tag.clone())))
    }

    fn known_names(&self) -> String {
        if self.datasets.is_empty() {
            return "no datasets".into();
        }
        self.datasets.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

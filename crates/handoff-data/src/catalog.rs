//! The catalog: DataSets.jl's `Data.toml` (`data_config_version` 0 or 1) plus handoff's object-store driver.
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
//! shared one is refused with the datasets that share it. A dataset whose name breaks DataSets.jl's rule
//! ([`crate::name`]) is listed too, and opening it says why it cannot be.
//!
//! Lookups take DataSets.jl's specs, `name[?query][#fragment]` ([`crate::spec`]): `a_tree_example#1.csv`
//! is the file `1.csv` of the tree `a_tree_example`. A stack of catalogs searched in order, as Julia's
//! `JULIA_DATASETS_PATH`, is a [`crate::stack::CatalogStack`].
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
use crate::selection::{Opened, Selection};
use crate::spec::DataSpec;
use crate::tag::BlobTag;
use crate::tree::{BlobTree, TreeEntry};

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
        // Version 0 (DataSets.jl <= 0.2.3) has the same structure as version 1, which added `/` in names and
        // the `[[drivers]]` section: DataSets.jl reads both with one parser, and so does handoff.
        match root.get("data_config_version") {
            Some(toml::Value::Integer(0 | 1)) => {}
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

    /// The dataset a spec (`name[?query][#fragment]`, [`crate::spec`]) names by its name or uuid, with the
    /// spec's query and fragment. A key that several datasets share is refused with [`Error::Ambiguous`],
    /// naming them; a dataset whose name breaks DataSets.jl's rule with [`Error::InvalidName`].
    pub fn dataset(&self, spec: &str) -> Result<Selection> {
        let spec = DataSpec::parse(spec)?;
        let dataset = self.find(&spec.name)?.ok_or_else(|| Error::NoSuchDataset {
            file: self.file.clone(),
            key: spec.name.clone(),
            known: self.known_names(),
        })?;
        Ok(Selection::new(dataset.clone(), spec))
    }

    /// The dataset with this name or uuid (`None` if none has it); ambiguous and invalid names are errors.
    pub fn find(&self, key: &str) -> Result<Option<&Arc<DataSet>>> {
        let lower = key.to_ascii_lowercase();
        let found = self.only(key, |d| d.name() == key || d.uuid() == lower)?;
        if let Some(ds) = found {
            self.openable(ds)?;
        }
        Ok(found)
    }

    /// `Ok` unless the dataset's name breaks the name rule (then it cannot be opened).
    fn openable(&self, ds: &DataSet) -> Result<()> {
        match ds.invalid_name() {
            None => Ok(()),
            Some(reason) => Err(Error::InvalidName {
                file: self.file.clone(),
                name: ds.name().to_string(),
                uuid: ds.uuid().to_string(),
                reason: reason.to_string(),
            }),
        }
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
    pub(crate) fn available<'a>(&self, ds: &'a Arc<DataSet>) -> Result<&'a Arc<DataSet>> {
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

    /// A lazy handle to a `Blob` dataset, or (with a fragment) to a file in a `BlobTree` dataset; nothing is
    /// read yet, so a fragment that names no file fails on the first read ([`Catalog::open`] checks it now).
    pub fn blob(&self, spec: &str) -> Result<Blob> {
        let sel = self.dataset(spec)?;
        let ds = self.available(sel.dataset())?;
        match (ds.kind(), sel.fragment()) {
            (DataKind::Blob, None) => Ok(Blob::new(ds.clone(), String::new(), self.cache.clone(), None)),
            (DataKind::Blob, Some(fragment)) => Err(fragment_of_blob(ds, fragment)),
            (DataKind::BlobTree, Some(fragment)) => self.root(ds).blob(fragment),
            (DataKind::BlobTree, None) => Err(Error::WrongType {
                dataset: ds.name().to_string(),
                actual: ds.kind().as_str(),
                wanted: "Blob",
            }),
        }
    }

    /// A lazy handle to a `BlobTree` dataset, or (with a fragment) to a folder in it; nothing is read yet.
    pub fn tree(&self, spec: &str) -> Result<BlobTree> {
        let sel = self.dataset(spec)?;
        let ds = self.available(sel.dataset())?;
        if ds.kind() != DataKind::BlobTree {
            return Err(Error::WrongType {
                dataset: ds.name().to_string(),
                actual: ds.kind().as_str(),
                wanted: "BlobTree",
            });
        }
        match sel.fragment() {
            None => Ok(self.root(ds)),
            Some(fragment) => self.root(ds).join(fragment),
        }
    }

    /// What DataSets.jl's `open(dataset(project, spec))` gives: the `Blob` or the `BlobTree` the spec names.
    /// A fragment selects a file or a folder inside a tree; one that names neither fails, naming it.
    pub async fn open(&self, spec: &str) -> Result<Opened> {
        let sel = self.dataset(spec)?;
        let ds = self.available(sel.dataset())?;
        open_selected(ds, sel.fragment(), self.cache.clone()).await
    }

    fn root(&self, ds: &Arc<DataSet>) -> BlobTree {
        BlobTree::new(ds.clone(), String::new(), self.cache.clone())
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
        self.openable(ds)?;
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
            // A path names a file of a tree: a Blob dataset has none (spec §8.5: its path is "").
            if ds.kind() != DataKind::BlobTree {
                return Err(Error::WrongType {
                    dataset: ds.name().to_string(),
                    actual: ds.kind().as_str(),
                    wanted: "BlobTree",
                });
            }
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

/// Opens a selected dataset: the whole of it, or what the fragment names inside a tree.
pub(crate) async fn open_selected(ds: &Arc<DataSet>, fragment: Option<&str>, cache: Arc<Cache>) -> Result<Opened> {
    let root = BlobTree::new(ds.clone(), String::new(), cache.clone());
    match (ds.kind(), fragment) {
        (DataKind::Blob, None) => Ok(Opened::Blob(Blob::new(ds.clone(), String::new(), cache, None))),
        (DataKind::Blob, Some(fragment)) => Err(fragment_of_blob(ds, fragment)),
        (DataKind::BlobTree, None) => Ok(Opened::Tree(root)),
        (DataKind::BlobTree, Some(fragment)) => match root.kind_of(fragment).await? {
            Some(DataKind::Blob) => Ok(Opened::Blob(root.blob(fragment)?)),
            Some(DataKind::BlobTree) => Ok(Opened::Tree(root.join(fragment)?)),
            None => {
                let entries = root.list().await?;
                let names: Vec<String> = entries.iter().map(TreeEntry::shown).collect();
                Err(Error::NoSuchPath {
                    dataset: ds.name().to_string(),
                    path: fragment.to_string(),
                    entries: if names.is_empty() {
                        "nothing".into()
                    } else {
                        names.join(", ")
                    },
                })
            }
        },
    }
}

fn fragment_of_blob(ds: &DataSet, fragment: &str) -> Error {
    Error::FragmentOfBlob {
        dataset: ds.name().to_string(),
        fragment: fragment.to_string(),
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

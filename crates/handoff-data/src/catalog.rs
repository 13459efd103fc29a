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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::blob::Blob;
use crate::cache::Cache;
use crate::embedded::Embedded;
use crate::error::{CatalogError, Error, Result};
use crate::source::Source;
use crate::tag::BlobTag;
use crate::tree::BlobTree;

/// Whether a dataset is one object or a tree of them (DataSets.jl's `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// One object (`type = "Blob"`, or `"File"` in later DataSets.jl versions).
    Blob,
    /// A directory tree or object-store prefix (`type = "BlobTree"` or `"FileTree"`).
    BlobTree,
}

impl DataKind {
    /// The name DataSets.jl uses.
    pub fn as_str(self) -> &'static str {
        match self {
            DataKind::Blob => "Blob",
            DataKind::BlobTree => "BlobTree",
        }
    }
}

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

/// One dataset of a catalog.
#[derive(Debug)]
pub struct DataSet {
    name: String,
    uuid: String,
    description: Option<String>,
    kind: DataKind,
    storage: StorageConfig,
    storage_table: toml::Table,
    table: toml::Table,
    source: Arc<Source>,
}

impl DataSet {
    /// The dataset's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The dataset's uuid, lower case.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }
    /// The description, if the catalog has one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    /// `Blob` or `BlobTree`.
    pub fn kind(&self) -> DataKind {
        self.kind
    }
    /// The parsed storage configuration.
    pub fn storage(&self) -> &StorageConfig {
        &self.storage
    }
    /// Every key of `[datasets.storage]` as written, including driver-specific keys handoff does not use.
    pub fn storage_table(&self) -> &toml::Table {
        &self.storage_table
    }
    /// The whole `[[datasets]]` entry as written, including keys handoff does not use (DataSets.jl's `tags`,
    /// `layers`, ...).
    pub fn table(&self) -> &toml::Table {
        &self.table
    }
    /// The opened storage of this dataset.
    pub fn source(&self) -> &Arc<Source> {
        &self.source
    }
    /// The underlying object store (for tools and tests); `None` for the `FileSystem` driver.
    pub fn object_store(&self) -> Option<Arc<dyn object_store::ObjectStore>> {
        self.source.object_store()
    }
}

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
        self.only(key, |d| d.name == key || d.uuid == lower)?
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
                    .map(|d| format!("{} ({})", d.name, d.uuid))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            first => Ok(first),
        }
    }

    /// `ds` itself, if this node can read it: else why not (its driver is not in this build).
    fn available<'a>(&self, ds: &'a Arc<DataSet>) -> Result<&'a Arc<DataSet>> {
        match &ds.storage {
            StorageConfig::Unavailable { driver } => Err(Error::DriverUnavailable {
                file: self.file.clone(),
                dataset: ds.name.clone(),
                driver: driver.clone(),
                drivers: DRIVERS.join(", "),
            }),
            _ => Ok(ds),
        }
    }

    /// A lazy handle to a `Blob` dataset (nothing is read yet).
    pub fn blob(&self, key: &str) -> Result<Blob> {
        let ds = self.available(self.dataset(key)?)?;
        if ds.kind != DataKind::Blob {
            return Err(Error::WrongType {
                dataset: ds.name.clone(),
                actual: ds.kind.as_str(),
                wanted: "Blob",
            });
        }
        Ok(Blob::new(ds.clone(), String::new(), self.cache.clone(), None))
    }

    /// A lazy handle to a `BlobTree` dataset (nothing is read yet).
    pub fn tree(&self, key: &str) -> Result<BlobTree> {
        let ds = self.available(self.dataset(key)?)?;
        if ds.kind != DataKind::BlobTree {
            return Err(Error::WrongType {
                dataset: ds.name.clone(),
                actual: ds.kind.as_str(),
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
            .only(&tag.dataset, |d| d.uuid == lower)?
            .ok_or_else(|| Error::UnknownTag {
                uuid: tag.dataset.clone(),
                name: tag.name.clone().unwrap_or_else(|| "no name given".into()),
                file: self.file.clone(),
            })?;
        let ds = self.available(ds)?;
        let path = if tag.path.is_empty() {
            if ds.kind != DataKind::Blob {
                return Err(Error::WrongType {
                    dataset: ds.name.clone(),
                    actual: ds.kind.as_str(),
                    wanted: "Blob",
                });
            }
            String::new()
        } else {
            crate::relpath::normalize(&ds.name, &tag.path)?
        };
        if !path.is_empty() {
            crate::relpath::check_local_symlinks(ds, &path)?;
        }
        Ok(Blob::new(ds.clone(), path, self.cache.clone(), Some(tag.clone())))
    }

    fn known_names(&self) -> String {
        if self.datasets.is_empty() {
            return "no datasets".into();
        }
        self.datasets
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn field_err(file: &Path, dataset: &str, field: &str, problem: &str) -> CatalogError {
    CatalogError::Field {
        file: file.to_path_buf(),
        dataset: dataset.to_string(),
        field: field.to_string(),
        problem: problem.to_string(),
    }
}

fn string_field<'a>(file: &Path, label: &str, table: &'a toml::Table, key: &str, prefix: &str) -> Result<&'a str> {
    match table.get(key) {
        Some(toml::Value::String(s)) if !s.is_empty() => Ok(s),
        Some(toml::Value::String(_)) => Err(field_err(file, label, &format!("{prefix}{key}"), "is empty").into()),
        Some(_) => Err(field_err(file, label, &format!("{prefix}{key}"), "must be a string").into()),
        None => Err(field_err(file, label, &format!("{prefix}{key}"), "is missing").into()),
    }
}

fn parse_dataset(
    file: &Path,
    dir: &Path,
    index: usize,
    entry: &toml::Value,
    memory: &mut HashMap<String, Arc<object_store::memory::InMemory>>,
) -> Result<DataSet> {
    let position = format!("#{}", index + 1);
    let table = entry
        .as_table()
        .ok_or_else(|| field_err(file, &position, "[[datasets]]", "must be a table"))?;
    let name = string_field(file, &position, table, "name", "")?.to_string();
    let label = format!("{position} ({name})");
    let uuid = string_field(file, &label, table, "uuid", "")?;
    let uuid = check_uuid(uuid).ok_or_else(|| {
        field_err(
            file,
            &label,
            "uuid",
            &format!("{uuid:?} is not a uuid (like b498f769-a7f6-4f67-8d74-40b770398f26)"),
        )
    })?;
    let description = match table.get("description") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(field_err(file, &label, "description", "must be a string").into()),
    };
    let storage_table = match table.get("storage") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(_) => return Err(field_err(file, &label, "storage", "must be a table ([datasets.storage])").into()),
        None => return Err(field_err(file, &label, "storage", "is missing: add a [datasets.storage] table").into()),
    };
    let kind = match string_field(file, &label, &storage_table, "type", "storage.")? {
        "Blob" | "File" => DataKind::Blob,
        "BlobTree" | "FileTree" => DataKind::BlobTree,
        other => {
            return Err(field_err(
                file,
                &label,
                "storage.type",
                &format!("is {other:?}; use \"Blob\" or \"BlobTree\""),
            )
            .into())
        }
    };
    let driver = string_field(file, &label, &storage_table, "driver", "storage.")?;
    let storage = match driver {
        "FileSystem" => {
            let raw = string_field(file, &label, &storage_table, "path", "storage.")?;
            StorageConfig::FileSystem {
                path: expand_dir(raw, dir),
            }
        }
        "ObjectStore" => {
            let url = string_field(file, &label, &storage_table, "url", "storage.")?.to_string();
            let mut options = BTreeMap::new();
            match storage_table.get("options") {
                None => {}
                Some(toml::Value::Table(t)) => {
                    for (k, v) in t {
                        let v = match v {
                            toml::Value::String(s) => s.clone(),
                            toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Float(_) => v.to_string(),
                            _ => {
                                let f = format!("storage.options.{k}");
                                return Err(field_err(file, &label, &f, "must be a string, number or boolean").into());
                            }
                        };
                        options.insert(k.clone(), v);
                    }
                }
                Some(_) => return Err(field_err(file, &label, "storage.options", "must be a table").into()),
            }
            StorageConfig::ObjectStore { url, options }
        }
        "TomlDataStorage" => StorageConfig::TomlData {
            content: Embedded::parse(kind, storage_table.get("data"))
                .map_err(|problem| field_err(file, &label, "storage.data", &problem))?,
        },
        other => StorageConfig::Unavailable {
            driver: other.to_string(),
        },
    };
    let source = Source::open(&storage, memory).map_err(|message| CatalogError::Store {
        file: file.to_path_buf(),
        dataset: label.clone(),
        url: storage.location(),
        message,
    })?;
    Ok(DataSet {
        name,
        uuid,
        description,
        kind,
        storage,
        storage_table,
        table: table.clone(),
        source: Arc::new(source),
    })
}

/// Expands DataSets.jl's `@__DIR__` (the catalog's folder); a relative path is taken relative to that folder too.
fn expand_dir(raw: &str, dir: &Path) -> PathBuf {
    let expanded = match raw.strip_prefix("@__DIR__") {
        Some(rest) => dir.join(rest.trim_start_matches(['/', '\\'])),
        None => PathBuf::from(raw),
    };
    if expanded.is_absolute() {
        expanded
    } else {
        dir.join(expanded)
    }
}

/// Checks the 8-4-4-4-12 hex form and returns it in lower case.
fn check_uuid(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        };
        if !ok {
            return None;
        }
    }
    Some(s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_dir() {
        assert_eq!(
            expand_dir("@__DIR__/data/x.txt", Path::new("/c")),
            PathBuf::from("/c/data/x.txt")
        );
        assert_eq!(expand_dir("rel/x", Path::new("/c")), PathBuf::from("/c/rel/x"));
        assert_eq!(expand_dir("/abs/x", Path::new("/c")), PathBuf::from("/abs/x"));
    }

    #[test]
    fn uuids() {
        assert_eq!(
            check_uuid("B498F769-a7f6-4f67-8d74-40b770398f26").unwrap(),
            "b498f769-a7f6-4f67-8d74-40b770398f26"
        );
        assert!(check_uuid("b498f769a7f64f678d7440b770398f26").is_none());
        assert!(check_uuid("g498f769-a7f6-4f67-8d74-40b770398f26").is_none());
    }
}

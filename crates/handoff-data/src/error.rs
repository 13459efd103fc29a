//! The errors of the data layer: each names the file, dataset, path or cache key involved and says what to do.

use std::path::PathBuf;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A problem in a catalog file (`Data.toml`): it names the file and, where there is one, the dataset.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The catalog file could not be read.
    #[error("cannot read catalog {file}: {source}")]
    Read {
        /// The catalog file.
        file: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The catalog is not valid TOML.
    #[error("catalog {file} is not valid TOML: {message}")]
    Toml {
        /// The catalog file.
        file: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// `data_config_version` is missing, or neither 0 nor 1.
    #[error("catalog {file}: data_config_version is {found}; handoff reads DataSets.jl catalogs of versions 0 and 1")]
    Version {
        /// The catalog file.
        file: PathBuf,
        /// What the file had (or "missing").
        found: String,
    },
    /// A required field is missing or has the wrong type.
    #[error("catalog {file}, dataset {dataset}: {field} {problem}")]
    Field {
        /// The catalog file.
        file: PathBuf,
        /// The dataset's name (or its position when it has no name).
        dataset: String,
        /// The field, e.g. `storage.path`.
        field: String,
        /// What is wrong with it and what it should be.
        problem: String,
    },
    /// The object store could not be configured from the url and options.
    #[error("catalog {file}, dataset {dataset}: cannot configure storage {url}: {message}")]
    Store {
        /// The catalog file.
        file: PathBuf,
        /// The dataset.
        dataset: String,
        /// The configured url.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// An error of the data layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A catalog problem.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Several datasets have the name or uuid asked for.
    #[error("catalog {file}: {key:?} names several datasets: {datasets}; use a name or uuid that only one has")]
    Ambiguous {
        /// The catalog file.
        file: PathBuf,
        /// The name or uuid asked for.
        key: String,
        /// The datasets that have it (name and uuid).
        datasets: String,
    },
    /// The dataset's storage driver is not one this build has.
    #[error("catalog {file}, dataset {dataset}: its storage driver {driver:?} is not available here; this build reads: {drivers}")]
    DriverUnavailable {
        /// The catalog file.
        file: PathBuf,
        /// The dataset's name.
        dataset: String,
        /// The driver the catalog names.
        driver: String,
        /// The drivers that exist.
        drivers: String,
    },
    /// A dataset specification (`name[?query][#fragment]`) that is not one.
    #[error(transparent)]
    InvalidSpec(#[from] crate::spec::SpecError),
    /// The dataset's name breaks DataSets.jl's rule: it is listed, and cannot be opened.
    #[error("catalog {file}: dataset {name:?} ({uuid}) cannot be opened: {reason}")]
    InvalidName {
        /// The catalog file.
        file: PathBuf,
        /// The dataset's name as written.
        name: String,
        /// Its uuid.
        uuid: String,
        /// What is wrong with the name.
        reason: String,
    },
    /// A spec's fragment names a path that is not in the tree.
    #[error("dataset {dataset}: the fragment {path:?} is no file or folder of the tree; its top level has: {entries}")]
    NoSuchPath {
        /// The dataset.
        dataset: String,
        /// The path the fragment names.
        path: String,
        /// What the tree's top level holds.
        entries: String,
    },
    /// A spec gave a fragment for a dataset that is one blob.
    #[error("dataset {dataset} is a Blob: a fragment (#{fragment}) selects a path only inside a BlobTree")]
    FragmentOfBlob {
        /// The dataset.
        dataset: String,
        /// The fragment given.
        fragment: String,
    },
    /// No dataset has the name or uuid asked for.
    #[error("catalog {file}: no dataset named or with uuid {key:?}; it has: {known}")]
    NoSuchDataset {
        /// The catalog file.
        file: PathBuf,
        /// What was asked for.
        key: String,
        /// The names it has.
        known: String,
    },
    /// No catalog of a stack has the name or uuid asked for.
    #[error("no dataset named or with uuid {key:?} in the catalogs {files}; they have: {known}")]
    NoSuchDatasetInStack {
        /// What was asked for.
        key: String,
        /// The catalogs searched, in order, `:`-separated.
        files: String,
        /// The names they have.
        known: String,
    },
    /// The dataset is a `Blob` but a `BlobTree` was asked for, or the reverse.
    #[error("dataset {dataset} is a {actual}, not a {wanted}")]
    WrongType {
        /// The dataset.
        dataset: String,
        /// Its type.
        actual: &'static str,
        /// The type asked for.
        wanted: &'static str,
    },
    /// A relative path within a tree was refused (escape, absolute path, symlink out of the tree).
    #[error("dataset {dataset}: path {path:?} refused: {reason}")]
    BadPath {
        /// The dataset.
        dataset: String,
        /// The path asked for.
        path: String,
        /// Why.
        reason: String,
    },
    /// The object does not exist in its storage.
    #[error("dataset {dataset}: {path} not found in {store}")]
    NotFound {
        /// The dataset.
        dataset: String,
        /// The object's path.
        path: String,
        /// The storage identity.
        store: String,
    },
    /// The storage failed.
    #[error("dataset {dataset}: storage {store} failed for {path}: {source}")]
    Storage {
        /// The dataset.
        dataset: String,
        /// The object's path.
        path: String,
        /// The storage identity.
        store: String,
        /// The object_store error.
        source: Box<object_store::Error>,
    },
    /// The cache is offline and does not hold what was asked for.
    #[error("offline: dataset {dataset} path {path:?} ({what}) is not in the cache {cache}; go online or fetch it first with `handoff data fetch`")]
    Offline {
        /// The dataset.
        dataset: String,
        /// The object's path.
        path: String,
        /// What is missing (the object, or a byte range).
        what: String,
        /// The cache directory.
        cache: PathBuf,
    },
    /// Data did not have the digest it should have.
    #[error("dataset {dataset}: {path} has BLAKE3 {actual} but {expected} was expected ({context})")]
    DigestMismatch {
        /// The dataset.
        dataset: String,
        /// The object's path.
        path: String,
        /// The expected digest (hex).
        expected: String,
        /// The digest found (hex).
        actual: String,
        /// Where this was noticed and what it means.
        context: String,
    },
    /// A read range lies outside the object.
    #[error("dataset {dataset}: range {start}..{end} is outside {path} ({size} bytes)")]
    Range {
        /// The dataset.
        dataset: String,
        /// The object's path.
        path: String,
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// The object's size.
        size: u64,
    },
    /// A tag named a dataset this node's catalog does not have.
    #[error("tag names dataset {uuid} ({name}) but catalog {file} has no such uuid; add it to the catalog (same uuid) or fetch the bytes from the sender")]
    UnknownTag {
        /// The uuid in the tag.
        uuid: String,
        /// The dataset name in the tag, if any.
        name: String,
        /// The receiver's catalog file.
        file: PathBuf,
    },
    /// A received data handle can neither be read here nor from its sender.
    #[error("{what}: this node cannot read it ({reason}) and the sender sent no fallback")]
    Unbound {
        /// The dataset (and path).
        what: String,
        /// Why this node cannot read it.
        reason: String,
    },
    /// Pulling a data handle's bytes from its sender (the RemoteBlob fallback) failed.
    #[cfg(feature = "node")]
    #[error("{what}: pulling the bytes from the sender failed ({reason}): {source}")]
    Fallback {
        /// The dataset (and path).
        what: String,
        /// Why the sender was asked.
        reason: String,
        /// The ticket error.
        source: Box<handoff::Error>,
    },
    /// A file system operation on the cache or a local dataset failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "cannot write cache entry".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done and the file.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the error says the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}

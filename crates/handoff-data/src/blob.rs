//! `Blob`: a lazy handle to one object of a dataset. Nothing is read until it is used; then the bytes come from
//! the node's cache, fetched from storage on first use (FileSystem datasets are read in place).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::OnceCell;

use crate::cache::{blocking, Cache, CachedFile, ColdRequest, Fetched, Meta, ObjectKey, Request};
use crate::dataset::DataSet;
use crate::error::{Error, Result};
use crate::source::Backend;
use crate::tag::BlobTag;

pub use crate::pinned::{BlobMap, BlobReader, LocalPath};

/// A lazy handle to one object. Cloning is cheap; clones share what the handle learned (size, version, digest).
///
/// The handle asks storage for the object's current version (one HEAD) the first time it is used and keeps that
/// version for its lifetime: open a new handle to see later changes.
#[derive(Clone)]
pub struct Blob {
    inner: Arc<Inner>,
}

struct Inner {
    dataset: Arc<DataSet>,
    rel: String,
    cache: Arc<Cache>,
    tag: Option<BlobTag>,
    meta: OnceCell<Meta>,
    digest: Mutex<Option<String>>,
    origin: Mutex<Option<Origin>>,
}

/// Where a blob's bytes came from on its last whole-object access (`read_all`, `reader`, `local_path`, `mmap`,
/// `buffer`, `fetch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Origin {
    /// A FileSystem dataset: the file itself, read in place.
    ReadInPlace,
    /// Downloaded from storage by this access.
    Storage,
    /// Found in the cache under this object's current version.
    Cache,
    /// Found in the cache by the digest in the tag it was opened from; storage was not asked at all (a node on
    /// the same host sharing the cache directory had fetched it).
    CacheByDigest,
    /// Pulled from the node that sent the handle, through a ticket (the "RemoteBlob" fallback): this node could
    /// not open the dataset or its storage failed.
    Sender,
}

impl Origin {
    /// The name used in CLI output and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::ReadInPlace => "read-in-place",
            Origin::Storage => "storage",
            Origin::Cache => "cache",
            Origin::CacheByDigest => "shared-cache",
            Origin::Sender => "remote-blob",
        }
    }
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blob")
            .field("dataset", &self.inner.dataset.name())
            .field("path", &self.inner.rel)
            .finish()
    }
}

/// Where a FileSystem blob or a store blob lives.
enum Place<'a> {
    Local(PathBuf),
    Store {
        store: &'a Arc<dyn ObjectStore>,
        /// The object as requests name it.
        location: StorePath,
        /// The object as cache keys name it (spec/CACHE.md §2.3).
        key_path: StorePath,
    },
}

impl Blob {
    pub(crate) fn new(dataset: Arc<DataSet>, rel: String, cache: Arc<Cache>, tag: Option<BlobTag>) -> Blob {
        let digest = Mutex::new(tag.as_ref().and_then(|t| t.digest.clone()));
        Blob {
            inner: Arc::new(Inner {
                dataset,
                rel,
                cache,
                tag,
                meta: OnceCell::new(),
                digest,
                origin: Mutex::new(None),
            }),
        }
    }

    /// The dataset this blob belongs to.
    pub fn dataset(&self) -> &Arc<DataSet> {
        &self.inner.dataset
    }

    /// The path within the dataset (empty for a `Blob` dataset itself).
    pub fn path(&self) -> &str {
        &self.inner.rel
    }

    /// The cache this handle reads through.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.inner.cache
    }

    /// The tag that describes this blob, with what the handle knows so far (size, digest and version once used).
    pub fn tag(&self) -> BlobTag {
        let meta = self.inner.meta.get();
        let from_tag = self.inner.tag.as_ref();
        BlobTag {
            dataset: self.inner.dataset.uuid().to_string(),
            name: Some(self.inner.dataset.name().to_string()),
            path: self.inner.rel.clone(),
            size: meta.map(|m| m.size).or(from_tag.and_then(|t| t.size)),
            digest: self.known_digest(),
            version: meta
                .and_then(|m| m.version_id.clone().or(m.etag.clone()))
                .or(from_tag.and_then(|t| t.version.clone())),
        }
    }

    /// Like [`tag`](Self::tag), but first learns the size and version (one HEAD unless known) and the digest if the
    /// cache holds this version.
    pub async fn describe(&self) -> Result<BlobTag> {
        if let Place::Store { .. } = self.place() {
            let meta = self.meta().await?;
            if self.known_digest().is_none() {
                let key = self.key(&meta);
                let cache = self.inner.cache.clone();
                if let Some(e) = blocking(move || cache.entry(&key)).await {
                    self.learn_digest(&e.digest);
                }
            }
        } else {
            self.meta().await?;
        }
        Ok(self.tag())
    }

    /// The whole object's bytes if they are on this node right now, without I/O beyond mapping a file: a
    /// FileSystem dataset's file, or the cached copy of a store object whose digest this handle knows. With the
    /// BLAKE3 digest when known. Used to offer the bytes as a fallback when the handle is sent.
    #[cfg(feature = "node")]
    pub(crate) fn local_bytes_now(&self) -> Option<(Bytes, Option<[u8; 32]>)> {
        let (file, pin, digest) = match self.place() {
            Place::Local(path) => (std::fs::File::open(path).ok()?, None, None),
            Place::Store { .. } => {
                let digest = self.known_digest()?;
                let cached = self.inner.cache.open_digest(&digest).ok()??;
                let file = cached.file().try_clone().ok()?;
                let mut raw = [0u8; 32];
                hex::decode_to_slice(&digest, &mut raw).ok()?;
                (file, Some(cached), Some(raw))
            }
        };
        if file.metadata().ok()?.len() == 0 {
            return Some((Bytes::new(), digest));
        }
        // SAFETY: as in `map`: cache files are replaced only by rename, never written in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        Some((Bytes::from_owner(BlobMap { map, _pin: pin }), digest))
    }

    /// Where the bytes came from on the last whole-object access of this handle (or a clone), if any.
    pub fn last_origin(&self) -> Option<Origin> {
        *self.inner.origin.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_origin(&self, origin: Origin) {
        *self.inner.origin.lock().unwrap_or_else(|e| e.into_inner()) = Some(origin);
    }

    fn known_digest(&self) -> Option<String> {
        self.inner.digest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn learn_digest(&self, digest: &str) {
        *self.inner.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(digest.to_string());
    }

    fn place(&self) -> Place<'_> {
        let source = self.inner.dataset.source();
        match &source.backend {
            Backend::Local { .. } => {
                Place::Local(source.local_path(&self.inner.rel).expect("local sources have paths"))
            }
            Backend::Store { store, .. } => Place::Store {
                store,
                location: source.object_path(&self.inner.rel),
                key_path: source.key_path(&self.inner.rel),
            },
        }
    }

    fn display_path(&self) -> String {
        if self.inner.rel.is_empty() {
            "(the dataset's object)".into()
        } else {
            self.inner.rel.clone()
        }
    }

    fn key(&self, meta: &Meta) -> ObjectKey {
        let source = self.inner.dataset.source();
        ObjectKey {
            identity: source.identity().to_string(),
            path: source.key_path(&self.inner.rel).to_string(),
            version: meta.version.clone(),
        }
    }

    /// Size, version: from storage (one HEAD per handle), or from the cache when offline.
    async fn meta(&self) -> Result<Meta> {
        self.inner.meta.get_or_try_init(|| self.fetch_meta()).await.cloned()
    }

    async fn fetch_meta(&self) -> Result<Meta> {
        let ds = &self.inner.dataset;
        match self.place() {
            Place::Local(path) => {
                let m = tokio::fs::metadata(&path)
                    .await
                    .map_err(|e| local_error(ds, &path, e))?;
                Ok(Meta {
                    size: m.len(),
                    version: String::new(),
                    etag: None,
                    version_id: None,
                })
            }
            Place::Store {
                store,
                location,
                key_path,
            } => {
                let cache = &self.inner.cache;
                if cache.is_offline() {
                    let identity = ds.source().identity().to_string();
                    let (c, loc) = (cache.clone(), key_path.to_string());
                    if let Some(m) = blocking(move || c.offline_meta(&identity, &loc)).await {
                        return Ok(m);
                    }
                    return Err(cache.offline_error(ds.name(), &self.display_path(), "the object".into()));
                }
                cache.count_head();
                let m = store.head(&location).await.map_err(|e| store_error(ds, &location, e))?;
                Ok(Meta::from_object(&m))
            }
        }
    }

    /// The object's size in bytes.
    pub async fn size(&self) -> Result<u64> {
        if let Some(f) = self.by_digest().await? {
            return Ok(f.size());
        }
        Ok(self.meta().await?.size)
    }

    /// If the tag gave a digest and the cache holds that content, the pinned file: no storage request at all.
    async fn by_digest(&self) -> Result<Option<CachedFile>> {
        let Some(digest) = self.inner.tag.as_ref().and_then(|t| t.digest.clone()) else {
            return Ok(None);
        };
        if let Place::Local(_) = self.place() {
            return Ok(None);
        }
        let cache = self.inner.cache.clone();
        let d = digest.clone();
        let found = blocking(move || cache.open_digest(&d))
            .await
            .map_err(|e| Error::io("cannot read cache entry", self.inner.cache.dir(), e))?;
        Ok(found)
    }

    async fn cached(&self, collect: bool, progress: Option<&(dyn Fn(u64) + Send + Sync)>) -> Result<Fetched> {
        if let Some(f) = self.by_digest().await? {
            self.set_origin(Origin::CacheByDigest);
            return Ok(Fetched::File(f));
        }
        let Place::Store {
            store,
            location,
            key_path,
        } = self.place()
        else {
            unreachable!("only store blobs are cached")
        };
        let expected = self.inner.tag.as_ref().and_then(|t| t.digest.as_deref());
        let rel = self.display_path();
        let cache = &self.inner.cache;
        let identity = self.inner.dataset.source().identity();
        if self.inner.meta.get().is_none() && !cache.is_offline() {
            let (c, id, loc) = (cache.clone(), identity.to_string(), key_path.to_string());
            if !blocking(move || c.has_path(&id, &loc)).await {
                // Never cached here: GET straight away, without a HEAD first.
                let cold = ColdRequest {
                    dataset: self.inner.dataset.name(),
                    rel: &rel,
                    store,
                    location: &location,
                    key_path: &key_path,
                    identity,
                    expected_digest: expected,
                    progress,
                };
                if let Some((meta, fetched)) = cache.object_cold(&cold, collect).await? {
                    let _ = self.inner.meta.set(meta);
                    return self.check_digest(fetched, expected, rel);
                }
            }
        }
        let meta = self.meta().await?;
        let req = Request {
            dataset: self.inner.dataset.name(),
            rel: &rel,
            store,
            location: &location,
            key: self.key(&meta),
            meta: &meta,
            expected_digest: expected,
            progress,
        };
        let fetched = self.inner.cache.object(&req, collect).await?;
        self.check_digest(fetched, expected, rel)
    }

    /// Checks fetched content against the tag's digest, and remembers the digest.
    fn check_digest(&self, fetched: Fetched, expected: Option<&str>, rel: String) -> Result<Fetched> {
        let digest = match &fetched {
            Fetched::File(f) => {
                self.set_origin(Origin::Cache);
                f.digest().to_string()
            }
            Fetched::Filled(f) => {
                self.set_origin(Origin::Storage);
                f.digest().to_string()
            }
            Fetched::Bytes { digest, .. } => {
                self.set_origin(Origin::Storage);
                digest.clone()
            }
        };
        if let Some(exp) = expected {
            if exp != digest {
                return Err(Error::DigestMismatch {
                    dataset: self.inner.dataset.name().to_string(),
                    path: rel,
                    expected: exp.to_string(),
                    actual: digest,
                    context: "storage holds different content than the sender's tag describes".into(),
                });
            }
        }
        self.learn_digest(&digest);
        Ok(fetched)
    }

    /// Makes sure the whole object is in the cache (downloading it if needed), reporting bytes received to
    /// `progress`; returns the pinned cached file. FileSystem blobs are not copied: their own file is returned as
    /// `None`.
    pub async fn fetch(&self, progress: Option<&(dyn Fn(u64) + Send + Sync)>) -> Result<Option<CachedFile>> {
        if let Place::Local(path) = self.place() {
            self.set_origin(Origin::ReadInPlace);
            tokio::fs::metadata(&path)
                .await
                .map_err(|e| local_error(&self.inner.dataset, &path, e))?;
            return Ok(None);
        }
        match self.cached(false, progress).await? {
            Fetched::File(f) | Fetched::Filled(f) => Ok(Some(f)),
            Fetched::Bytes { .. } => unreachable!("not collected"),
        }
    }

    /// Reads the whole object.
    pub async fn read_all(&self) -> Result<Bytes> {
        if let Place::Local(path) = self.place() {
            self.set_origin(Origin::ReadInPlace);
            let data = tokio::fs::read(&path)
                .await
                .map_err(|e| local_error(&self.inner.dataset, &path, e))?;
            return Ok(Bytes::from(data));
        }
        match self.cached(true, None).await? {
            Fetched::Bytes { bytes, .. } => Ok(bytes),
            Fetched::File(f) | Fetched::Filled(f) => {
                let path = f.path().to_path_buf();
                let data = blocking(move || f.read_all())
                    .await
                    .map_err(|e| Error::io("cannot read cache file", path, e))?;
                Ok(Bytes::from(data))
            }
        }
    }

    /// Reads `range` of the object. When the object is not cached whole, only the cache blocks the range touches
    /// are fetched.
    pub async fn read_range(&self, range: Range<u64>) -> Result<Bytes> {
        let size = self.size().await?;
        if range.start > range.end || range.end > size {
            return Err(Error::Range {
                dataset: self.inner.dataset.name().to_string(),
                path: self.display_path(),
                start: range.start,
                end: range.end,
                size,
            });
        }
        let len = (range.end - range.start) as usize;
        if let Place::Local(path) = self.place() {
            let ds = self.inner.dataset.clone();
            return blocking(move || {
                use std::os::unix::fs::FileExt;
                let file = std::fs::File::open(&path).map_err(|e| local_error(&ds, &path, e))?;
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, range.start)
                    .map_err(|e| local_error(&ds, &path, e))?;
                Ok(Bytes::from(buf))
            })
            .await;
        }
        if let Some(f) = self.by_digest().await? {
            let path = f.path().to_path_buf();
            let data = blocking(move || f.read_at(range.start, len))
                .await
                .map_err(|e| Error::io("cannot read cache file", path, e))?;
            return Ok(Bytes::from(data));
        }
        let meta = self.meta().await?;
        let Place::Store { store, location, .. } = self.place() else {
            unreachable!()
        };
        let rel = self.display_path();
        let req = Request {
            dataset: self.inner.dataset.name(),
            rel: &rel,
            store,
            location: &location,
            key: self.key(&meta),
            meta: &meta,
            expected_digest: None,
            progress: None,
        };
        self.inner.cache.read_range(&req, range).await
    }

    /// The whole object as an open file: the dataset's own file for local datasets, else
    /// the cached copy (fetched first if needed), pinned while the returned guard lives.
    async fn open_whole(&self) -> Result<(std::fs::File, Option<CachedFile>, std::path::PathBuf)> {
        match self.place() {
            Place::Local(path) => {
                self.set_origin(Origin::ReadInPlace);
                let f = std::fs::File::open(&path).map_err(|e| local_error(&self.inner.dataset, &path, e))?;
                Ok((f, None, path))
            }
            Place::Store { .. } => {
                let f = self.fetch(None).await?.expect("store blobs are cached");
                let dup = f
                    .file()
                    .try_clone()
                    .map_err(|e| Error::io("cannot open cache file", f.path(), e))?;
                let path = f.path().to_path_buf();
                Ok((dup, Some(f), path))
            }
        }
    }

    /// Opens the object as an async reader (the object is cached whole first, and stays pinned while reading).
    pub async fn reader(&self) -> Result<BlobReader> {
        let (file, pin, path) = self.open_whole().await?;
        Ok(BlobReader {
            file: tokio::fs::File::from_std(file),
            path,
            _pin: pin,
        })
    }

    /// A local file path with the object's content: the cached file (pinned while the guard lives), or the
    /// dataset's own file for FileSystem datasets. Do not write to it.
    pub async fn local_path(&self) -> Result<LocalPath> {
        match self.place() {
            Place::Local(path) => {
                self.set_origin(Origin::ReadInPlace);
                tokio::fs::metadata(&path)
                    .await
                    .map_err(|e| local_error(&self.inner.dataset, &path, e))?;
                Ok(LocalPath { path, _pin: None })
            }
            Place::Store { .. } => {
                let f = self.fetch(None).await?.expect("store blobs are cached");
                Ok(LocalPath {
                    path: f.path().to_path_buf(),
                    _pin: Some(f),
                })
            }
        }
    }

    /// Maps the object into memory (read-only; pinned in the cache while the map lives). Pages are read on first
    /// touch.
    pub async fn mmap(&self) -> Result<BlobMap> {
        self.map(false).await
    }

    async fn map(&self, populate: bool) -> Result<BlobMap> {
        let (file, pin, path) = self.open_whole().await?;
        // SAFETY: cache files are read-only and replaced only by rename, never written in place; FileSystem
        // datasets are the user's files, which the caller promises not to truncate while mapped (as with any mmap).
        let mut options = memmap2::MmapOptions::new();
        if populate {
            options.populate();
        }
        let map = unsafe { options.map(&file) }.map_err(|e| Error::io("cannot map", &path, e))?;
        Ok(BlobMap { map, _pin: pin })
    }

    /// The whole object as `Bytes` without copying: a view of a memory map (its pages mapped up front) that keeps
    /// the cache entry pinned until the last clone of the `Bytes` is dropped.
    pub async fn buffer(&self) -> Result<Bytes> {
        let map = self.map(true).await?;
        if map.is_empty() {
            return Ok(Bytes::new());
        }
        Ok(Bytes::from_owner(map))
    }
}

fn local_error(ds: &DataSet, path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        return Error::NotFound {
            dataset: ds.name().to_string(),
            path: path.display().to_string(),
            store: ds.source().identity().to_string(),
        };
    }
    Error::io("cannot read dataset file", path, e)
}

pub(crate) fn store_error(ds: &DataSet, location: &StorePath, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::NotFound {
            dataset: ds.name().to_string(),
            path: location.to_string(),
            store: ds.source().identity().to_string(),
        },
        source => Error::Storage {
            dataset: ds.name().to_string(),
            path: location.to_string(),
            store: ds.source().identity().to_string(),
            source: Box::new(source),
        },
    }
}

//! The cache value and what every part of the cache builds on: its configuration, counters and directory, the
//! requests handles make, and lookups of what is already cached (a hit, an entry, the newest version offline).
//! Filling (`fill`, `blocks`), eviction and verification sit above this file; `mod.rs` joins them into a read.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use object_store::path::Path as StorePath;
use object_store::{ObjectMeta, ObjectStore};

use super::entry::{read_json, BlockMeta, IndexEntry, Seal};
use super::flight::Flights;
use super::layout::{self, write_atomic, Layout, ObjectKey};
use super::pin::CachedFile;
use crate::error::{Error, Result};

/// Default block size of range reads: 4 MiB.
pub const DEFAULT_BLOCK_SIZE: u64 = 4 << 20;

/// How to open a cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// The cache directory (created if missing).
    pub dir: PathBuf,
    /// Size cap in bytes: least recently used entries not in use are evicted beyond it. `None`: no cap.
    pub max_bytes: Option<u64>,
    /// Block size of range reads (same for every process sharing the directory, else blocks are not shared).
    pub block_size: u64,
    /// Serve only what is cached; never contact storage.
    pub offline: bool,
}

impl CacheConfig {
    /// A cache at `dir`, no cap, 4 MiB blocks, online.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CacheConfig {
            dir: dir.into(),
            max_bytes: None,
            block_size: DEFAULT_BLOCK_SIZE,
            offline: false,
        }
    }

    /// Sets the size cap.
    pub fn max_bytes(mut self, cap: Option<u64>) -> Self {
        self.max_bytes = cap;
        self
    }

    /// Sets the block size of range reads.
    pub fn block_size(mut self, size: u64) -> Self {
        self.block_size = size;
        self
    }

    /// Sets offline mode.
    pub fn offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    /// The default directory: `$HANDOFF_CACHE_DIR`, else `$XDG_CACHE_HOME/handoff/data`, else
    /// `~/.cache/handoff/data`, else `/tmp/handoff-data-cache`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("HANDOFF_CACHE_DIR") {
            return d.into();
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return PathBuf::from(d).join("handoff/data");
        }
        if let Some(d) = std::env::var_os("HOME") {
            return PathBuf::from(d).join(".cache/handoff/data");
        }
        PathBuf::from("/tmp/handoff-data-cache")
    }
}

/// Counters of one `Cache` value (this process's use of it), for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Reads served from the cache (including waiters who found the data another task or process had fetched).
    pub hits: u64,
    /// Downloads this process made (whole objects and blocks).
    pub misses: u64,
    /// GET requests issued to storage.
    pub gets: u64,
    /// HEAD requests issued to storage (revalidation).
    pub heads: u64,
    /// Bytes received from storage.
    pub bytes_fetched: u64,
    /// Entries evicted by the size cap or `gc`.
    pub evictions: u64,
    /// Cached files found corrupt (digest mismatch) and dropped.
    pub corrupt: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) gets: AtomicU64,
    pub(super) heads: AtomicU64,
    pub(super) bytes_fetched: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) corrupt: AtomicU64,
}

/// Adds `n` to a counter.
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A node's data cache. Open it once per process and share the `Arc`.
#[derive(Debug)]
pub struct Cache {
    pub(super) layout: Layout,
    pub(super) max_bytes: Option<u64>,
    pub(super) block_size: u64,
    pub(super) offline: AtomicBool,
    pub(super) counters: Counters,
    pub(super) flights: Flights,
}

/// What storage says about one version of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Meta {
    pub size: u64,
    /// The version string of the cache key.
    pub version: String,
    pub etag: Option<String>,
    pub version_id: Option<String>,
}

impl Meta {
    pub fn from_object(m: &ObjectMeta) -> Meta {
        let version = match (&m.version, &m.e_tag) {
            (Some(v), _) => format!("v:{v}"),
            (None, Some(e)) => format!("e:{e}"),
            (None, None) => format!(
                "m:{}:{}",
                m.size,
                m.last_modified.timestamp_nanos_opt().unwrap_or_default()
            ),
        };
        Meta {
            size: m.size,
            version,
            etag: m.e_tag.clone(),
            version_id: m.version.clone(),
        }
    }
}

/// One object to read through the cache.
pub(crate) struct Request<'a> {
    /// Dataset name (for messages).
    pub dataset: &'a str,
    /// Path within the dataset (for messages).
    pub rel: &'a str,
    pub store: &'a Arc<dyn ObjectStore>,
    pub location: &'a StorePath,
    pub key: ObjectKey,
    pub meta: &'a Meta,
    /// Digest the content must have (from a tag).
    pub expected_digest: Option<&'a str>,
    /// Called with the bytes received so far while downloading.
    pub progress: Option<&'a (dyn Fn(u64) + Send + Sync)>,
}

/// An object to read for the first time, version not yet known.
pub(crate) struct ColdRequest<'a> {
    pub dataset: &'a str,
    pub rel: &'a str,
    pub store: &'a Arc<dyn ObjectStore>,
    pub location: &'a StorePath,
    /// The object as cache keys name it (spec/CACHE.md §2.3).
    pub key_path: &'a StorePath,
    pub identity: &'a str,
    pub expected_digest: Option<&'a str>,
    pub progress: Option<&'a (dyn Fn(u64) + Send + Sync)>,
}

/// The result of asking for a whole object.
pub(crate) enum Fetched {
    /// Found in the cache, pinned.
    File(CachedFile),
    /// Just downloaded by this call, pinned.
    Filled(CachedFile),
    /// Just downloaded by this call, with the bytes kept in memory (when asked to collect).
    Bytes { bytes: Bytes, digest: String },
}

/// Runs blocking file work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking cache task panicked")
}

impl Cache {
    /// Opens (creating) a cache directory.
    pub fn open(config: CacheConfig) -> Result<Arc<Cache>> {
        let layout = Layout {
            dir: config.dir.clone(),
        };
        layout
            .create()
            .map_err(|e| Error::io("cannot create cache directory", &config.dir, e))?;
        Ok(Arc::new(Cache {
            layout,
            max_bytes: config.max_bytes,
            block_size: config.block_size.max(4096),
            offline: AtomicBool::new(config.offline),
            counters: Counters::default(),
            flights: Flights::default(),
        }))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// The size cap, if any.
    pub fn max_bytes(&self) -> Option<u64> {
        self.max_bytes
    }

    /// The block size of range reads.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// True when the cache serves only what it holds.
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Relaxed)
    }

    /// Switches offline mode on or off.
    pub fn set_offline(&self, offline: bool) {
        self.offline.store(offline, Ordering::Relaxed);
    }

    /// This process's counters.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            hits: l(&c.hits),
            misses: l(&c.misses),
            gets: l(&c.gets),
            heads: l(&c.heads),
            bytes_fetched: l(&c.bytes_fetched),
            evictions: l(&c.evictions),
            corrupt: l(&c.corrupt),
        }
    }

    pub(crate) fn count_head(&self) {
        bump(&self.counters.heads, 1);
    }

    pub(crate) fn offline_error(&self, dataset: &str, rel: &str, what: String) -> Error {
        Error::Offline {
            dataset: dataset.to_string(),
            path: rel.to_string(),
            what,
            cache: self.layout.dir.clone(),
        }
    }

    /// Opens the object with this digest, pinned, if the cache holds it intact (re-hashing it if its seal changed).
    pub(crate) fn open_digest(&self, digest: &str) -> io::Result<Option<CachedFile>> {
        if !layout::is_digest(digest) {
            return Ok(None);
        }
        let path = self.layout.object(digest);
        let Some(file) = CachedFile::open(&path, digest)? else {
            return Ok(None);
        };
        let now = Seal::of(&file.file().metadata()?);
        if read_json::<Seal>(&self.layout.seal(digest)) == Some(now) {
            return Ok(Some(file));
        }
        let actual = hash_file(file.file())?;
        if actual == digest {
            let _ = write_atomic(&self.layout, &self.layout.seal(digest), &serde_json::to_vec(&now)?);
            return Ok(Some(file));
        }
        tracing::warn!(file = %path.display(), expected = digest, actual, "corrupt cache entry: dropping it");
        bump(&self.counters.corrupt, 1);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(self.layout.seal(digest));
        Ok(None)
    }

    /// The cached, intact, pinned object for this key; marks the entry used.
    pub(super) fn hit(&self, key: &ObjectKey) -> io::Result<Option<CachedFile>> {
        let entry_path = self.layout.entry(key);
        let Some(entry) = read_json::<IndexEntry>(&entry_path) else {
            return Ok(None);
        };
        match self.open_digest(&entry.digest)? {
            Some(file) => {
                touch(&entry_path);
                Ok(Some(file))
            }
            None => {
                let _ = std::fs::remove_file(&entry_path);
                Ok(None)
            }
        }
    }

    /// Synchronous hit check, counting it.
    pub(crate) fn hit_counted(&self, key: &ObjectKey) -> io::Result<Option<CachedFile>> {
        let hit = self.hit(key)?;
        if hit.is_some() {
            bump(&self.counters.hits, 1);
        }
        Ok(hit)
    }

    /// True if the cache has an entry for any version of this object.
    pub(crate) fn has_path(&self, identity: &str, path: &str) -> bool {
        let probe = ObjectKey {
            identity: identity.to_string(),
            path: path.to_string(),
            version: String::new(),
        };
        std::fs::read_dir(self.layout.entry_dir(&probe)).is_ok_and(|mut d| d.next().is_some())
    }

    /// What the cache knows of an object when offline: the newest cached version (whole, or as blocks).
    pub(crate) fn offline_meta(&self, identity: &str, path: &str) -> Option<Meta> {
        let probe = ObjectKey {
            identity: identity.to_string(),
            path: path.to_string(),
            version: String::new(),
        };
        let newest = |dir: PathBuf, file: Option<&str>| -> Option<PathBuf> {
            let mut best: Option<(SystemTime, PathBuf)> = None;
            for e in std::fs::read_dir(dir).ok()?.flatten() {
                let p = match file {
                    Some(f) => e.path().join(f),
                    None => e.path(),
                };
                if let Ok(t) = std::fs::metadata(&p).and_then(|m| m.modified()) {
                    if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                        best = Some((t, p));
                    }
                }
            }
            best.map(|(_, p)| p)
        };
        if let Some(p) = newest(self.layout.entry_dir(&probe), None) {
            if let Some(e) = read_json::<IndexEntry>(&p) {
                return Some(Meta {
                    size: e.size,
                    version: e.version,
                    etag: None,
                    version_id: None,
                });
            }
        }
        let p = newest(self.layout.block_parent(&probe), Some("meta.json"))?;
        let m = read_json::<BlockMeta>(&p)?;
        Some(Meta {
            size: m.size,
            version: m.version,
            etag: None,
            version_id: None,
        })
    }

    /// The index entry of one key, if cached.
    pub(crate) fn entry(&self, key: &ObjectKey) -> Option<IndexEntry> {
        read_json(&self.layout.entry(key))
    }

    /// Every index entry (what is cached whole), with whether its content is present.
    pub fn entries(&self) -> Vec<(IndexEntry, bool)> {
        let mut out = Vec::new();
        for dir in std::fs::read_dir(self.layout.index()).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                if let Some(e) = read_json::<IndexEntry>(&f.path()) {
                    let present = self.layout.object(&e.digest).exists();
                    out.push((e, present));
                }
            }
        }
        out
    }

    /// Every set of cached blocks: which object, how many blocks, how many bytes.
    pub fn block_sets(&self) -> Vec<(BlockMeta, u64, u64)> {
        let mut out = Vec::new();
        for parent in std::fs::read_dir(self.layout.blocks()).into_iter().flatten().flatten() {
            for dir in std::fs::read_dir(parent.path()).into_iter().flatten().flatten() {
                let Some(meta) = read_json::<BlockMeta>(&dir.path().join("meta.json")) else {
                    continue;
                };
                let (mut n, mut bytes) = (0, 0);
                for f in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                    if f.file_name().to_string_lossy().parse::<u64>().is_ok() {
                        n += 1;
                        bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
                    }
                }
                out.push((meta, n, bytes));
            }
        }
        out
    }
}

/// Marks a file used now (its mtime orders eviction).
pub(super) fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// BLAKE3 of a whole file (hex).
pub(crate) fn hash_file(file: &std::fs::File) -> io::Result<String> {
    let mut h = blake3::Hasher::new();
    let mut reader = io::BufReader::with_capacity(1 << 20, file);
    io::copy(&mut reader, &mut h)?;
    Ok(h.finalize().to_hex().to_string())
}

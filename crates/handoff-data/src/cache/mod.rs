//! The cache of a node: a directory that nodes on one host may share.
//!
//! Content is stored under its BLAKE3 digest, computed while it is downloaded; entries map (store identity, path,
//! version) to a digest. Files are written to `tmp/` and renamed into place, so readers never see partial data.
//! One download per key: an in-process single flight, then an exclusive flock on the key's lock file across
//! processes. Range reads of objects that are not cached whole fetch fixed-size blocks. A size cap evicts the least
//! recently used entries, skipping content that is pinned (open by a reader, a memory map or a path guard, in any
//! process). Offline mode serves only what is cached.
//!
//! Integrity: the digest is checked when content is filled, and its size and mtime are sealed; a later open
//! re-hashes the file when those changed (and drops it if the digest no longer matches), and
//! [`Cache::verify`] re-hashes everything.

mod base;
mod blocks;
mod entry;
mod evict;
mod fill;
mod flight;
mod layout;
mod lock;
mod pin;
mod verify;

use std::io;
use std::sync::Arc;

use bytes::Bytes;

pub(crate) use base::{blocking, ColdRequest, Fetched, Meta, Request};
pub use base::{Cache, CacheConfig, CacheStats, DEFAULT_BLOCK_SIZE};
pub use entry::{BlockMeta, IndexEntry};
pub use evict::GcReport;
pub(crate) use layout::ObjectKey;
pub use pin::CachedFile;
pub use verify::{CorruptFile, VerifyReport};

use crate::error::{Error, Result};
use base::bump;

/// Reading whole objects through the cache: a hit, or one download under the object's lock, then the size cap.
impl Cache {
    /// The whole object, from the cache or downloaded once (however many tasks and processes ask at once).
    pub(crate) async fn object(self: &Arc<Self>, req: &Request<'_>, collect: bool) -> Result<Fetched> {
        let io_err = |e| Error::io("cannot read cache entry", self.layout.entry(&req.key), e);
        let key = req.key.clone();
        let me = self.clone();
        if let Some(f) = blocking(move || me.hit_counted(&key)).await.map_err(io_err)? {
            return Ok(Fetched::File(f));
        }
        if self.is_offline() {
            return Err(self.offline_error(req.dataset, req.rel, format!("object of {} bytes", req.meta.size)));
        }
        // The lock of the object's path, which a first (cold) fill takes too: a fill of a
        // known version and a first fill of the same object never run at once (spec/CACHE.md §5.1).
        let lock_path = self.layout.path_lock(&req.key);
        let _flight = self.flights.enter(lock_path.display().to_string()).await;
        let _lock = lock::exclusive(lock_path.clone())
            .await
            .map_err(|e| Error::io("cannot lock", &lock_path, e))?;
        let (key, me) = (req.key.clone(), self.clone());
        if let Some(f) = blocking(move || me.hit_counted(&key)).await.map_err(io_err)? {
            return Ok(Fetched::File(f));
        }
        let (digest, bytes) = self.fill(req, collect).await?;
        self.finish_fill(digest, bytes).await
    }

    /// First use of an object the cache has never held: one GET without a HEAD before it (the response says the
    /// version), under a lock per object path. `None` if another task or process cached a version meanwhile: then
    /// the caller revalidates with a HEAD and reads through [`object`](Self::object).
    pub(crate) async fn object_cold(
        self: &Arc<Self>,
        req: &ColdRequest<'_>,
        collect: bool,
    ) -> Result<Option<(Meta, Fetched)>> {
        let probe = ObjectKey {
            identity: req.identity.to_string(),
            path: req.key_path.to_string(),
            version: String::new(),
        };
        let lock_path = self.layout.path_lock(&probe);
        let _flight = self.flights.enter(lock_path.display().to_string()).await;
        let _lock = lock::exclusive(lock_path.clone())
            .await
            .map_err(|e| Error::io("cannot lock", &lock_path, e))?;
        let (me, id, loc) = (self.clone(), req.identity.to_string(), req.key_path.to_string());
        if blocking(move || me.has_path(&id, &loc)).await {
            return Ok(None);
        }
        bump(&self.counters.misses, 1);
        bump(&self.counters.gets, 1);
        let res = req
            .store
            .get_opts(req.location, Default::default())
            .await
            .map_err(|e| {
                let r = Request {
                    dataset: req.dataset,
                    rel: req.rel,
                    store: req.store,
                    location: req.location,
                    key: probe.clone(),
                    meta: &Meta {
                        size: 0,
                        version: String::new(),
                        etag: None,
                        version_id: None,
                    },
                    expected_digest: None,
                    progress: None,
                };
                fill::storage_error(&r, req.identity, e)
            })?;
        let meta = Meta::from_object(&res.meta);
        let full = Request {
            dataset: req.dataset,
            rel: req.rel,
            store: req.store,
            location: req.location,
            key: ObjectKey {
                version: meta.version.clone(),
                ..probe
            },
            meta: &meta,
            expected_digest: req.expected_digest,
            progress: req.progress,
        };
        let (digest, bytes) = self.fill_from(res, &full, collect).await?;
        let fetched = self.finish_fill(digest, bytes).await?;
        Ok(Some((meta, fetched)))
    }

    /// After a fill: pins the new content, applies the size cap, and hands back the file or the collected bytes.
    async fn finish_fill(self: &Arc<Self>, digest: String, bytes: Option<Bytes>) -> Result<Fetched> {
        let io_err = |e| Error::io("cannot read cache entry", self.layout.object(&digest), e);
        let (me, d) = (self.clone(), digest.clone());
        let pinned = blocking(move || me.open_digest(&d)).await.map_err(io_err)?;
        let me = self.clone();
        blocking(move || me.enforce_cap()).await;
        match (bytes, pinned) {
            (Some(bytes), _) => Ok(Fetched::Bytes { bytes, digest }),
            (None, Some(file)) => Ok(Fetched::Filled(file)),
            (None, None) => Err(Error::io(
                "cached object vanished right after it was filled (is the size cap smaller than the object?)",
                self.layout.object(&digest),
                io::Error::from(io::ErrorKind::NotFound),
            )),
        }
    }
}

//! Test support: one storage backend per test (S3 via moto behind a counting proxy, the HTTP file server, the
//! local file system, memory), a catalog over it, and a fresh cache.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use handoff_data::{Cache, CacheConfig, Catalog};
use handoff_testkit::{CountingProxy, HttpFileServer, MotoServer, RequestCounter};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// A folder removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "handoff-data-{what}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    S3,
    Http,
    Fs,
    Memory,
}

/// One backend with a catalog over it. Datasets: `blob` (B/blob.bin), `big` (B/big.bin), `tree` (B/tree),
/// `missing` (B/nothing-here.bin), where B is the backend's base.
pub struct Env {
    pub kind: Kind,
    pub dir: TempDir,
    pub catalog: Catalog,
    pub catalog_file: PathBuf,
    /// Requests seen by the storage server (S3: the proxy in front of moto; HTTP: the server itself).
    pub server: Option<RequestCounter>,
    store: Arc<dyn ObjectStore>,
    base: String,
    _moto: Option<MotoServer>,
    _proxy: Option<CountingProxy>,
    _http: Option<HttpFileServer>,
}

pub const BLOB: &[u8] = b"hello from a blob\n";

/// Deterministic bytes that differ per offset.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + (i >> 13)) as u8) ^ seed).collect()
}

impl Env {
    pub async fn new(kind: Kind) -> Env {
        Self::with_cache(kind, |c| c).await
    }

    pub async fn with_cache(kind: Kind, config: impl FnOnce(CacheConfig) -> CacheConfig) -> Env {
        let dir = TempDir::new("env");
        let (mut moto, mut proxy, mut http, mut server) = (None, None, None, None);
        let (base_url, options, base) = match kind {
            Kind::S3 => {
                let m = MotoServer::start()
                    .await
                    .unwrap_or_else(|e| panic!("cannot start the S3 server: {e}"));
                m.create_bucket("bkt").await.unwrap();
                let p = CountingProxy::start(m.addr()).await.unwrap();
                server = Some(p.counter().clone());
                let options = format!(
                    "endpoint = \"{}\"\nregion = \"us-east-1\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n",
                    p.url()
                );
                moto = Some(m);
                proxy = Some(p);
                ("s3://bkt/base".to_string(), options, "base".to_string())
            }
            Kind::Http => {
                let h = HttpFileServer::start(dir.path().join("http-root")).await.unwrap();
                server = Some(h.counter().clone());
                let url = format!("{}/base", h.url());
                http = Some(h);
                (url, String::new(), "base".to_string())
            }
            Kind::Fs => {
                let root = dir.path().join("store/base");
                std::fs::create_dir_all(&root).unwrap();
                let base = root.to_str().unwrap().trim_start_matches('/').to_string();
                (format!("file://{}", root.display()), String::new(), base)
            }
            Kind::Memory => ("memory://mem/base".to_string(), String::new(), "base".to_string()),
        };
        let mut toml = String::from("data_config_version = 1\n");
        for (name, uuid, ty, rel) in [
            ("blob", "11111111-1111-4111-8111-111111111111", "Blob", "blob.bin"),
            ("big", "22222222-2222-4222-8222-222222222222", "Blob", "big.bin"),
            ("tree", "33333333-3333-4333-8333-333333333333", "BlobTree", "tree"),
            (
                "missing",
                "44444444-4444-4444-8444-444444444444",
                "Blob",
                "nothing-here.bin",
            ),
        ] {
            toml.push_str(&format!(
                "\n[[datasets]]\nname = \"{name}\"\nuuid = \"{uuid}\"\n\n[datasets.storage]\ndriver = \"ObjectStore\"\n\
                 type = \"{ty}\"\nurl = \"{base_url}/{rel}\"\n"
            ));
            if !options.is_empty() {
                toml.push_str(&format!("\n[datasets.storage.options]\n{options}"));
            }
        }
        let catalog_file = dir.path().join("Data.toml");
        std::fs::write(&catalog_file, &toml).unwrap();
        let cache = Cache::open(config(CacheConfig::new(dir.path().join("cache")))).unwrap();
        let catalog = Catalog::load(&catalog_file, cache).unwrap();
        let store = catalog.dataset("tree").unwrap().object_store().unwrap();
        Env {
            kind,
            dir,
            catalog,
            catalog_file,
            server,
            store,
            base,
            _moto: moto,
            _proxy: proxy,
            _http: http,
        }
    }

    /// The HTTP file server, for the HTTP backend.
    pub fn http(&self) -> Option<&HttpFileServer> {
        self._http.as_ref()
    }

    /// Writes an object at `rel` below the base (e.g. `blob.bin`, `tree/a/b.txt`).
    pub async fn put(&self, rel: &str, data: impl Into<Bytes>) {
        let loc = StorePath::from(format!("{}/{rel}", self.base));
        self.store.put(&loc, PutPayload::from_bytes(data.into())).await.unwrap();
    }

    /// A second catalog over the same storage and cache directory (another "node" on this host), with its own
    /// `Cache` value (own counters) — for memory stores the same in-process store.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// GET requests the storage server saw (S3 and HTTP); for file and memory stores, the cache's own count.
    pub fn storage_gets(&self) -> u64 {
        match &self.server {
            Some(c) => c.counts().get,
            None => self.catalog.cache().stats().gets,
        }
    }
}

//! The data-handle rows of `handoff demo`: a `Blob` sent to a remote-host node (which fetches it from storage),
//! to a same-host node sharing the cache (no second download), and one the receiver's catalog lacks (pulled from
//! the sender through a ticket). The storage is an HTTP server on loopback that counts its GETs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use handoff::{Message as _, Node, Peer};
use handoff_data::{BlobHandle, Cache, CacheConfig, Catalog};
use handoff_testkit::HttpFileServer;

use crate::demo_row::Row;
use crate::protocol::{self, BlobReceipt, BlobWork};
use crate::scratch::{private_dir, TempDir};

const WAIT: Duration = Duration::from_secs(120);
const SHARED_UUID: &str = "6c6f6361-6c68-4f73-8464-656d6f626c62";
const LOCAL_UUID: &str = "616c7068-616f-4e6c-a96e-6f7465736e6f";

/// Storage, catalogs and caches for the data rows; removed when dropped.
pub(crate) struct DataSetup {
    server: HttpFileServer,
    alpha: Arc<Catalog>,
    /// The catalog the child nodes load: the shared dataset only.
    pub(crate) child_catalog: PathBuf,
    /// Alpha's cache folder (delta shares it: same host).
    pub(crate) alpha_cache: PathBuf,
    /// Gamma's own cache folder (another host).
    pub(crate) gamma_cache: PathBuf,
    digests: [(String, Vec<u8>, u64); 2],
    _dir: TempDir,
}

/// Writes `bytes` of the demo pattern for dataset `seed` to `path`; returns their BLAKE3.
fn write_pattern(path: &std::path::Path, bytes: u64, seed: u64) -> Result<Vec<u8>> {
    let mut data = vec![0u8; bytes as usize];
    protocol::fill_pattern(&mut data, seed);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, &data).with_context(|| format!("writing {}", path.display()))?;
    Ok(protocol::digest(&data))
}

/// Creates the storage (an object of `bytes` behind an HTTP server), the catalogs and alpha's cache, and makes
/// alpha's catalog answer for handles alpha receives.
pub(crate) async fn setup(alpha: &Node, bytes: u64) -> Result<DataSetup> {
    let dir = private_dir()?;
    let root = dir.path().to_path_buf();
    let shared = write_pattern(&root.join("storage/demo/blob.bin"), bytes, 11)?;
    let local_file = root.join("alpha-only/notes.bin");
    let local = write_pattern(&local_file, bytes, 12)?;
    let server = HttpFileServer::start(root.join("storage"))
        .await
        .context("starting the demo's storage server")?;
    let shared_entry = format!(
        "[[datasets]]\nname = \"demo-blob\"\nuuid = \"{SHARED_UUID}\"\ndescription = \"an object in storage every node can \
         reach\"\n\n[datasets.storage]\ndriver = \"ObjectStore\"\ntype = \"Blob\"\nurl = \"{}/demo/blob.bin\"\n",
        server.url()
    );
    let local_entry = format!(
        "\n[[datasets]]\nname = \"alpha-notes\"\nuuid = \"{LOCAL_UUID}\"\ndescription = \"a file only alpha's host \
         has\"\n\n[datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"{}\"\n",
        local_file.display()
    );
    let child_catalog = root.join("Data.toml");
    std::fs::write(&child_catalog, format!("data_config_version = 1\n\n{shared_entry}"))?;
    let alpha_file = root.join("alpha-Data.toml");
    std::fs::write(
        &alpha_file,
        format!("data_config_version = 1\n\n{shared_entry}{local_entry}"),
    )?;
    let alpha_cache = root.join("cache-alpha");
    let catalog = Catalog::load(&alpha_file, Cache::open(CacheConfig::new(&alpha_cache))?)?;
    let catalog = Arc::new(catalog);
    catalog.serve(alpha.resources());
    Ok(DataSetup {
        server,
        alpha: catalog,
        child_catalog,
        alpha_cache,
        gamma_cache: root.join("cache-gamma"),
        digests: [
            ("demo-blob".into(), shared, bytes),
            ("alpha-notes".into(), local, bytes),
        ],
        _dir: dir,
    })
}

impl DataSetup {
    /// The `handoff node` flags of a child: the shared catalog and a cache folder.
    pub(crate) fn child_args(&self, cache: &std::path::Path) -> Vec<String> {
        vec![
            "--catalog".into(),
            self.child_catalog.display().to_string(),
            "--cache-dir".into(),
            cache.display().to_string(),
        ]
    }

    fn storage_gets(&self) -> u64 {
        self.server.counter().counts().get
    }

    /// Sends dataset `name` from alpha to `peer` as a handle; the peer reads it and reports the path it took.
    pub(crate) async fn send(&self, alpha: &Node, peer: &Peer, id: u64, name: &str) -> Result<Row> {
        let (_, digest, bytes) = self
            .digests
            .iter()
            .find(|(n, _, _)| n == name)
            .context("demo dataset")?;
        let blob = self.alpha.blob(name)?;
        // Alpha has the bytes (cached or its own file), so the handle carries a fallback.
        blob.fetch(None).await?;
        let gets = self.storage_gets();
        let started = Instant::now();
        peer.send(BlobWork {
            id,
            blob: BlobHandle::from(blob),
            digest: digest.clone(),
        })
        .await?;
        let env = alpha.recv_timeout(WAIT).await?;
        let seconds = started.elapsed().as_secs_f64();
        if env.type_name() != BlobReceipt::TYPE_NAME {
            bail!("expected a blob receipt from {}, got {}", peer.name(), env.type_name());
        }
        let r: BlobReceipt = env.decode()?;
        if r.path == "failed" {
            bail!(
                "{} could not read {name}: {}",
                peer.name(),
                r.detail.unwrap_or_default()
            );
        }
        Ok(Row {
            from: alpha.name().to_string(),
            to: peer.name().to_string(),
            locality: peer.locality().to_string(),
            channel: peer.channel().to_string(),
            bytes: *bytes,
            seconds,
            verified: r.verified && r.id == id && r.bytes == *bytes,
            data: Some(name.to_string()),
            path: Some(r.path),
            storage_gets: Some(self.storage_gets() - gets),
            dask_tcp_seconds: None,
            // The first read of the handle; a second one would come from the receiver's own cache.
            cold: true,
            warm_seconds: None,
            cold_seconds: None,
        })
    }

    /// The data rows: the shared dataset to gamma (remote: its own download) and to delta (same host, shared
    /// cache), and alpha's own file to gamma (not in gamma's catalog: pulled from alpha).
    pub(crate) async fn rows(&self, alpha: &Node, gamma: &Peer, delta: &Peer) -> Result<Vec<Row>> {
        Ok(vec![
            self.send(alpha, gamma, 101, "demo-blob").await?,
            self.send(alpha, delta, 102, "demo-blob").await?,
            self.send(alpha, gamma, 103, "alpha-notes").await?,
        ])
    }
}

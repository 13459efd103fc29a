//! The data cases that `handoff bench` runs (`blob-hit`, `blob-cold`): reading a blob through the cache against the
//! plain operation it wraps.
//!
//! Each returns `(ours_seconds, baseline_seconds)`, medians of several alternating runs; efficiency is
//! `baseline / ours`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use object_store::path::Path as StorePath;
use object_store::{ObjectStoreExt, PutPayload};

use handoff_data::{Cache, CacheConfig, Catalog};
use handoff_testkit::MotoServer;

/// Runs per measurement.
const RUNS: usize = 5;

struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> std::io::Result<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("handoff-bench-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Scratch(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn payload(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

fn one_blob_catalog(url: &str, options: &str) -> String {
    let mut t = format!(
        "data_config_version = 1\n\n[[datasets]]\nname = \"bench\"\nuuid = \"0b0b0b0b-0000-4000-8000-000000000001\"\n\n\
         [datasets.storage]\ndriver = \"ObjectStore\"\ntype = \"Blob\"\nurl = \"{url}\"\n"
    );
    if !options.is_empty() {
        t.push_str(&format!("\n[datasets.storage.options]\n{options}"));
    }
    t
}

/// Reading a cached blob of `size` bytes (`Blob::read_all` on a fresh handle: index lookup, revalidation against a
/// local `file://` store, pinned read) against `std::fs::read` of the same cached file.
pub(super) async fn blob_hit(size: usize) -> anyhow::Result<(f64, f64)> {
    let dir = Scratch::new("hit")?;
    let src = dir.0.join("store");
    std::fs::create_dir_all(&src)?;
    std::fs::write(src.join("blob.bin"), payload(size))?;
    let cache = Cache::open(CacheConfig::new(dir.0.join("cache")))?;
    let file = dir.0.join("Data.toml");
    let catalog = Catalog::parse(
        &one_blob_catalog(&format!("file://{}/blob.bin", src.display()), ""),
        &file,
        cache,
    )?;
    let path = catalog.blob("bench")?.local_path().await?.path().to_path_buf();
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let t = Instant::now();
        let data = catalog.blob("bench")?.read_all().await?;
        ours.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(data.len() == size, "read {} bytes, expected {size}", data.len());
        drop(data);
        let p = path.clone();
        let t = Instant::now();
        let data = tokio::task::spawn_blocking(move || std::fs::read(p)).await??;
        base.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(data.len() == size);
    }
    Ok((median(ours), median(base)))
}

/// Reads one byte of every 4 KiB page, so that both sides pay for bringing the bytes into memory.
fn touch(data: &[u8]) -> u64 {
    data.iter().step_by(4096).map(|&b| b as u64).sum()
}

/// A first fetch of a `size`-byte object from a local S3-compatible server (moto) into an empty cache, as a buffer
/// (`Blob::buffer`: HEAD, one streamed GET hashed and written to the cache by a second thread, then mapped) against
/// a plain `object_store` GET of the same object into memory; both then touch every page of the bytes.
pub(super) async fn blob_cold(size: usize) -> anyhow::Result<(f64, f64)> {
    let moto = MotoServer::start()
        .await
        .map_err(anyhow::Error::msg)
        .context("starting the S3 server")?;
    moto.create_bucket("bench").await.map_err(anyhow::Error::msg)?;
    let dir = Scratch::new("cold")?;
    let options = format!(
        "endpoint = \"{}\"\nregion = \"us-east-1\"\naccess_key_id = \"bench\"\nsecret_access_key = \"bench\"\n",
        moto.endpoint()
    );
    let text = one_blob_catalog("s3://bench/blob.bin", &options);
    let file = dir.0.join("Data.toml");
    let setup = Catalog::parse(&text, &file, Cache::open(CacheConfig::new(dir.0.join("setup-cache")))?)?;
    let store = setup.dataset("bench")?.object_store().expect("an object store");
    let location = StorePath::from("blob.bin");
    store.put(&location, PutPayload::from(payload(size))).await?;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        let cache_dir = dir.0.join(format!("cache-{run}"));
        let catalog = Catalog::parse(&text, &file, Cache::open(CacheConfig::new(&cache_dir))?)?;
        let blob = catalog.blob("bench")?;
        let t = Instant::now();
        let data = blob.buffer().await?;
        std::hint::black_box(touch(&data));
        ours.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            data.len() == size && catalog.cache().stats().gets == 1,
            "expected one GET of {size} bytes"
        );
        drop(data);
        let _ = std::fs::remove_dir_all(&cache_dir);
        let t = Instant::now();
        let data = store.get(&location).await?.bytes().await?;
        std::hint::black_box(touch(&data));
        base.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(data.len() == size);
    }
    Ok((median(ours), median(base)))
}

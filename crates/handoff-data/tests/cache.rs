//! The cache across handles, tasks and processes: size cap and pins, gc, one download for two processes. (The
//! `handoff data` commands are tested in handoff-cli, where they live.)

mod common;

use std::process::Command;
use std::time::Duration;

use common::{pattern, Env, Kind};
use handoff_data::{Cache, CacheConfig, Catalog};

/// Eviction keeps the cache under its cap, least recently used first, and never evicts what is in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_respects_cap_and_pins() {
    let size = 100_000usize;
    let env = Env::with_cache(Kind::Memory, |c| c.max_bytes(Some(250_000))).await;
    for name in ["a", "b", "c", "d", "e"] {
        env.put(&format!("tree/{name}.bin"), pattern(size, name.as_bytes()[0]))
            .await;
    }
    let tree = env.catalog.tree("tree").unwrap();
    let cache = env.catalog.cache();
    let cached = || {
        let mut v: Vec<String> = cache
            .entries()
            .into_iter()
            .filter(|(_, p)| *p)
            .map(|(e, _)| e.path.rsplit('/').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    // a is read first (least recently used) but stays pinned through a path guard.
    let a = tree.blob("a.bin").unwrap();
    let pin = a.local_path().await.unwrap();
    tree.blob("b.bin").unwrap().read_all().await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    tree.blob("c.bin").unwrap().read_all().await.unwrap();
    assert!(cache.usage() <= 250_000, "usage {}", cache.usage());
    assert_eq!(cached(), ["a.bin", "c.bin"], "b evicted, a pinned");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // A memory map pins too.
    let map = tree.blob("d.bin").unwrap().mmap().await.unwrap();
    assert_eq!(cached(), ["a.bin", "d.bin"]);
    assert_eq!(
        std::fs::read(pin.path()).unwrap(),
        pattern(size, b'a'),
        "pinned file intact"
    );
    // Unpin a: it is the oldest and goes next; the map keeps d.
    drop(pin);
    tree.blob("e.bin").unwrap().read_all().await.unwrap();
    assert_eq!(cached(), ["d.bin", "e.bin"]);
    assert_eq!(&map[..10], &pattern(size, b'd')[..10]);
    // gc down to zero keeps only what is in use.
    let report = cache.evict_to(0).unwrap();
    assert_eq!(
        (report.after_bytes, report.skipped_in_use),
        (size as u64, 1),
        "{report:?}"
    );
    assert_eq!(cached(), ["d.bin"]);
    drop(map);
    assert_eq!(cache.evict_to(0).unwrap().after_bytes, 0);
    assert!(cache.stats().evictions >= 4);
}

/// Child processes started by `two_processes_share_one_download` run this (ignored when run normally).
#[tokio::test]
#[ignore = "helper: run by the multi-process tests as a child process"]
async fn helper_child() {
    let (Ok(catalog), Ok(cache_dir)) = (std::env::var("HELPER_CATALOG"), std::env::var("HELPER_CACHE")) else {
        return;
    };
    let cache = Cache::open(CacheConfig::new(cache_dir)).unwrap();
    let catalog = Catalog::load(catalog, cache.clone()).unwrap();
    let path = catalog.blob("big").unwrap().local_path().await.unwrap();
    let digest = blake3::hash(&std::fs::read(path.path()).unwrap()).to_hex().to_string();
    let s = cache.stats();
    println!(
        "HELPER gets={} misses={} hits={} digest={digest}",
        s.gets, s.misses, s.hits
    );
}

async fn processes_share_one_download(kind: Kind) {
    let env = Env::new(kind).await;
    let data = pattern(8 << 20, 42);
    env.put("big.bin", data.clone()).await;
    if let Some(h) = env.http() {
        h.set_get_delay(Duration::from_millis(300)); // every child is waiting while the first one downloads
    }
    let before = env.storage_gets();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "helper_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("HELPER_CATALOG", &env.catalog_file)
                .env("HELPER_CACHE", env.cache_dir())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut gets, mut misses) = (0, 0);
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // libtest may print "test helper_child ... " on the same line first.
        let line = text
            .lines()
            .find_map(|l| l.find("HELPER ").map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("no report:\n{text}"));
        let field = |k: &str| -> String {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap()
                .to_string()
        };
        gets += field("gets").parse::<u64>().unwrap();
        misses += field("misses").parse::<u64>().unwrap();
        assert_eq!(field("digest"), blake3::hash(&data).to_hex().as_str());
    }
    assert_eq!(
        env.storage_gets() - before,
        1,
        "three processes sharing a cache directory: one storage GET"
    );
    assert_eq!((gets, misses), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_download_http() {
    processes_share_one_download(Kind::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_download_s3() {
    processes_share_one_download(Kind::S3).await;
}

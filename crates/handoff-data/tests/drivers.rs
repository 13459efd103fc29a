//! The same driver tests against S3 (moto), HTTP (the test file server), the local file system and memory.

mod common;

use std::sync::Arc;

use common::{pattern, Env, Kind, BLOB};
use handoff_data::{BlobTag, Cache, CacheConfig, Catalog, Error, Origin};
use tokio::io::AsyncReadExt;

macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn s3() { super::$name(Kind::S3).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn http() { super::$name(Kind::Http).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn fs() { super::$name(Kind::Fs).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn memory() { super::$name(Kind::Memory).await }
        }
    )*};
}

per_backend!(
    handles,
    concurrent_requesters_one_get,
    range_reads_fetch_only_needed_blocks,
    stale_etag_refetches,
    corrupt_entry_refetched,
    offline_mode,
    tags_bind_to_receiver_cache
);

/// Blob reads (all, range, reader, path, mmap, buffer), tree list/walk/join, and path checks.
async fn handles(kind: Kind) {
    let env = Env::new(kind).await;
    env.put("blob.bin", BLOB).await;
    env.put("tree/a.txt", &b"A"[..]).await;
    env.put("tree/sub/b.txt", &b"BB"[..]).await;
    env.put("tree/sub/deeper/c.txt", &b"CCC"[..]).await;

    let blob = env.catalog.blob("blob").unwrap();
    assert_eq!(env.catalog.cache().stats().gets, 0, "opening a handle reads nothing");
    assert_eq!(blob.size().await.unwrap(), BLOB.len() as u64);
    assert_eq!(&blob.read_all().await.unwrap()[..], BLOB);
    assert_eq!(blob.last_origin(), Some(Origin::Storage));
    assert_eq!(&blob.read_range(6..10).await.unwrap()[..], &BLOB[6..10]);
    let mut text = String::new();
    blob.reader().await.unwrap().read_to_string(&mut text).await.unwrap();
    assert_eq!(text.as_bytes(), BLOB);
    let path = blob.local_path().await.unwrap();
    assert_eq!(blob.last_origin(), Some(Origin::Cache));
    assert!(path.starts_with(env.cache_dir()), "{} is in the cache", path.display());
    assert_eq!(std::fs::read(&*path).unwrap(), BLOB);
    assert_eq!(&blob.mmap().await.unwrap()[..], BLOB);
    assert_eq!(&blob.buffer().await.unwrap()[..], BLOB);
    assert_eq!(env.catalog.cache().stats().gets, 1, "one download served every read");
    let range_err = blob.read_range(5..100).await.unwrap_err();
    assert!(matches!(range_err, Error::Range { .. }), "{range_err}");

    let tree = env.catalog.tree("tree").unwrap();
    let top: Vec<_> = tree
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.path, e.is_dir))
        .collect();
    assert_eq!(top, vec![("a.txt".to_string(), false), ("sub".to_string(), true)]);
    let all: Vec<_> = tree
        .walk()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.path, e.size))
        .collect();
    assert_eq!(
        all,
        vec![
            ("a.txt".to_string(), Some(1)),
            ("sub/b.txt".to_string(), Some(2)),
            ("sub/deeper/c.txt".to_string(), Some(3))
        ]
    );
    let sub = tree.join("sub").unwrap();
    let under: Vec<_> = sub.walk().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(under, vec!["b.txt", "deeper/c.txt"]);
    assert_eq!(&sub.blob("deeper/c.txt").unwrap().read_all().await.unwrap()[..], b"CCC");
    assert_eq!(
        &sub.blob("../a.txt").unwrap().read_all().await.unwrap()[..],
        b"A",
        "'..' inside the tree is fine"
    );
    for bad in ["../../etc/passwd", "/etc/passwd", "deeper/../../../x"] {
        let err = sub.blob(bad).unwrap_err();
        assert!(matches!(err, Error::BadPath { .. }), "{bad}: {err}");
        assert!(err.to_string().contains("tree"), "{err}");
    }

    let missing = env.catalog.blob("missing").unwrap();
    let err = missing.read_all().await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// 16 tasks ask for the same object at once: storage sees one GET.
async fn concurrent_requesters_one_get(kind: Kind) {
    let env = Env::new(kind).await;
    let data = pattern(3 << 20, 7);
    env.put("big.bin", data.clone()).await;
    let before = env.storage_gets();
    let blob = env.catalog.blob("big").unwrap();
    let mut tasks = Vec::new();
    for i in 0..16 {
        // Half share one handle, half open their own.
        let b = if i % 2 == 0 {
            blob.clone()
        } else {
            env.catalog.blob("big").unwrap()
        };
        tasks.push(tokio::spawn(async move { b.read_all().await.unwrap() }));
    }
    for t in tasks {
        assert!(t.await.unwrap() == data[..]);
    }
    assert_eq!(
        env.storage_gets() - before,
        1,
        "16 concurrent requesters, one storage GET"
    );
    let s = env.catalog.cache().stats();
    assert_eq!((s.gets, s.misses, s.hits), (1, 1, 15), "{s:?}");
}

/// A small read of a large object fetches only the blocks it touches.
async fn range_reads_fetch_only_needed_blocks(kind: Kind) {
    let block = 64 * 1024;
    let env = Env::with_cache(kind, |c| c.block_size(block)).await;
    let data = pattern(40 * block as usize, 3);
    env.put("big.bin", data.clone()).await;
    let blob = env.catalog.blob("big").unwrap();
    let b = block as usize;
    // 100 bytes inside block 5, then a read spanning blocks 9..=11.
    assert_eq!(
        &blob.read_range(5 * block + 10..5 * block + 110).await.unwrap()[..],
        &data[5 * b + 10..5 * b + 110]
    );
    let s = env.catalog.cache().stats();
    assert_eq!((s.gets, s.bytes_fetched), (1, block), "one block fetched: {s:?}");
    let r = (9 * block + 1)..(11 * block + 5);
    assert_eq!(
        &blob.read_range(r.clone()).await.unwrap()[..],
        &data[r.start as usize..r.end as usize]
    );
    let s = env.catalog.cache().stats();
    assert_eq!((s.gets, s.bytes_fetched), (4, 4 * block), "three more blocks: {s:?}");
    // Cached blocks are not fetched again, by this handle or a new one.
    let again = env.catalog.blob("big").unwrap();
    assert_eq!(
        &again.read_range(5 * block..5 * block + 1).await.unwrap()[..],
        &data[5 * b..5 * b + 1]
    );
    assert_eq!(env.catalog.cache().stats().gets, 4);
    if let Some(server) = &env.server {
        assert!(server.counts().get == 4, "server saw {:?}", server.log());
    }
}

/// Storage gets a new version: a new handle sees the new ETag and fetches again; the old handle keeps its version.
async fn stale_etag_refetches(kind: Kind) {
    let env = Env::new(kind).await;
    env.put("blob.bin", &b"version one"[..]).await;
    let old = env.catalog.blob("blob").unwrap();
    assert_eq!(&old.read_all().await.unwrap()[..], b"version one");
    // File mtimes can be coarse: make sure the new version is distinguishable.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    env.put("blob.bin", &b"version two, longer"[..]).await;
    let fresh = env.catalog.blob("blob").unwrap();
    assert_eq!(&fresh.read_all().await.unwrap()[..], b"version two, longer");
    let s = env.catalog.cache().stats();
    // The first read had nothing cached: a GET with no HEAD; the second revalidated (HEAD) and fetched again.
    assert_eq!((s.gets, s.heads), (2, 1), "{s:?}");
    // Reading the fresh version again is a hit.
    assert_eq!(
        &env.catalog.blob("blob").unwrap().read_all().await.unwrap()[..],
        b"version two, longer"
    );
    assert_eq!(env.catalog.cache().stats().gets, 2);
}

/// A cached file altered on disk is detected by its digest and fetched again.
async fn corrupt_entry_refetched(kind: Kind) {
    let env = Env::new(kind).await;
    let data = pattern(200_000, 9);
    env.put("big.bin", data.clone()).await;
    let blob = env.catalog.blob("big").unwrap();
    let path = blob.local_path().await.unwrap().path().to_path_buf();
    // Flip bytes in the middle (same size).
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100_000] ^= 0xff;
    let mut perm = std::fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&path, perm).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    // `verify` reports it without removing it...
    let report = env.catalog.cache().verify(false).unwrap();
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    // ...and the next read detects it, drops it, and fetches again.
    assert!(blob.read_all().await.unwrap() == data[..]);
    let s = env.catalog.cache().stats();
    assert_eq!(s.gets, 2, "{s:?}");
    assert!(s.corrupt >= 2, "{s:?}");
    assert!(env.catalog.cache().verify(false).unwrap().corrupt.is_empty());
}

/// Offline: what is cached is served; anything else fails saying it is offline and what is missing.
async fn offline_mode(kind: Kind) {
    let block = 64 * 1024;
    let env = Env::with_cache(kind, |c| c.block_size(block)).await;
    env.put("blob.bin", BLOB).await;
    env.put("big.bin", pattern(10 * block as usize, 1)).await;
    env.put("tree/x.txt", &b"x"[..]).await;
    env.catalog.blob("blob").unwrap().read_all().await.unwrap();
    env.catalog
        .tree("tree")
        .unwrap()
        .blob("x.txt")
        .unwrap()
        .read_all()
        .await
        .unwrap();
    env.catalog.blob("big").unwrap().read_range(0..10).await.unwrap();
    let cache = env.catalog.cache();
    cache.set_offline(true);
    let before = env.storage_gets();
    let heads = cache.stats().heads;
    assert_eq!(&env.catalog.blob("blob").unwrap().read_all().await.unwrap()[..], BLOB);
    let walk = env.catalog.tree("tree").unwrap().walk().await.unwrap();
    assert_eq!(walk.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), vec!["x.txt"]);
    let big = env.catalog.blob("big").unwrap();
    assert_eq!(
        big.read_range(0..5).await.unwrap().len(),
        5,
        "the cached block serves offline"
    );
    let err = big.read_range(5 * block..5 * block + 1).await.unwrap_err();
    assert!(matches!(err, Error::Offline { .. }), "{err}");
    assert!(
        err.to_string().contains("offline") && err.to_string().contains("block 5"),
        "{err}"
    );
    let err = env.catalog.blob("missing").unwrap().read_all().await.unwrap_err();
    assert!(
        err.to_string().contains("offline") && err.to_string().contains("missing"),
        "{err}"
    );
    assert_eq!(env.storage_gets(), before, "offline: no GET");
    assert_eq!(cache.stats().heads, heads, "offline: no HEAD");
}

/// A tag sent to another node binds to that node's catalog and cache; with a shared cache no second download.
async fn tags_bind_to_receiver_cache(kind: Kind) {
    let env = Env::new(kind).await;
    let data = pattern(300_000, 5);
    env.put("big.bin", data.clone()).await;
    let sender = env.catalog.blob("big").unwrap();
    sender.read_all().await.unwrap();
    let tag = sender.describe().await.unwrap();
    assert_eq!(tag.size, Some(300_000));
    assert_eq!(tag.digest.as_deref(), Some(blake3::hash(&data).to_hex().as_str()));
    let wire = serde_json::to_string(&tag).unwrap();
    let tag: BlobTag = serde_json::from_str(&wire).unwrap();

    // Same host, shared cache directory, its own catalog and Cache value: found by digest, nothing fetched.
    let cache2 = Cache::open(CacheConfig::new(env.cache_dir())).unwrap();
    let text = std::fs::read_to_string(&env.catalog_file).unwrap();
    let catalog2 = if kind == Kind::Memory {
        env.catalog.clone() // memory stores live in the first catalog
    } else {
        Catalog::parse(&text, &env.catalog_file, cache2.clone()).unwrap()
    };
    let received = catalog2.open_tag(&tag).unwrap();
    assert!(received.read_all().await.unwrap() == data[..]);
    assert_eq!(received.last_origin(), Some(Origin::CacheByDigest));
    if kind != Kind::Memory {
        let s = cache2.stats();
        assert_eq!((s.gets, s.heads), (0, 0), "bound by digest to the shared cache: {s:?}");
    }

    // Another host: own empty cache; fetches from storage itself, and checks the digest.
    let dir = common::TempDir::new("receiver");
    let cache3 = Cache::open(CacheConfig::new(dir.path())).unwrap();
    if kind != Kind::Memory {
        let catalog3 = Catalog::parse(&text, &env.catalog_file, cache3.clone()).unwrap();
        let before = env.storage_gets();
        let blob = catalog3.open_tag(&tag).unwrap();
        assert!(blob.read_all().await.unwrap() == data[..]);
        assert_eq!(blob.last_origin(), Some(Origin::Storage));
        blob.local_path().await.unwrap();
        assert_eq!(
            blob.last_origin(),
            Some(Origin::CacheByDigest),
            "the tag's digest is now in this cache"
        );
        assert_eq!(cache3.stats().gets, 1);
        if env.server.is_some() {
            assert_eq!(env.storage_gets() - before, 1, "the receiver fetched from storage");
        }
        // A tag whose digest does not match what storage holds is refused.
        let mut wrong = tag.clone();
        wrong.digest = Some(blake3::hash(b"other").to_hex().to_string());
        let cache4 = Cache::open(CacheConfig::new(dir.path().join("c4"))).unwrap();
        let catalog4 = Catalog::parse(&text, &env.catalog_file, cache4).unwrap();
        let err = catalog4.open_tag(&wrong).unwrap().read_all().await.unwrap_err();
        assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    }
    // A tag for a dataset this catalog does not have names the uuid.
    let mut unknown = tag.clone();
    unknown.dataset = "99999999-9999-4999-8999-999999999999".into();
    let err = env.catalog.open_tag(&unknown).unwrap_err();
    assert!(
        err.to_string().contains("99999999-9999-4999-8999-999999999999"),
        "{err}"
    );
    let _ = Arc::clone(env.catalog.cache());
}

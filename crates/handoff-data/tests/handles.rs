//! Data handles between nodes: a `Blob` sent to another node is bound to that node's catalog and cache and
//! fetched there from storage; a same-host node sharing the cache reads the cached copy; a node that cannot reach
//! the storage pulls the bytes from the sender through a ticket, and says so.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{pattern, Env, Kind, TempDir};
use handoff::{Message, Node, WireError};
use handoff_data::{Blob, BlobHandle, Cache, CacheConfig, Catalog, Origin};
use serde::{Deserialize, Serialize};

const SECRET: &str = "handles";
const T: Duration = Duration::from_secs(20);
const BIG_LEN: usize = 3 << 20;

#[derive(Serialize, Deserialize)]
struct Work {
    input: BlobHandle,
}
impl Message for Work {
    const TYPE_NAME: &'static str = "test.Work";
}

#[derive(Serialize, Deserialize)]
struct StrictWork {
    input: Blob,
}
impl Message for StrictWork {
    const TYPE_NAME: &'static str = "test.StrictWork";
}

/// A sender on host `h1` and a receiver on `host` (names unique per test: nodes are per process).
async fn nodes(tag: &str, receiver_host: &str) -> (Node, Node) {
    let a = Node::builder(format!("{tag}-sender"))
        .secret(SECRET)
        .host_id("h1")
        .listen("127.0.0.1:0")
        .build()
        .await
        .unwrap();
    let b = Node::builder(format!("{tag}-receiver"))
        .secret(SECRET)
        .host_id(receiver_host)
        .listen("127.0.0.1:0")
        .register::<Work>()
        .register::<StrictWork>()
        .build()
        .await
        .unwrap();
    (a, b)
}

/// An HTTP-backed catalog with `big` stored, read once by the sender (so its cache holds it).
async fn sender_env() -> (Env, Blob) {
    let env = Env::new(Kind::Http).await;
    env.put("big.bin", pattern(BIG_LEN, 3)).await;
    let blob = env.catalog.blob("big").unwrap();
    assert_eq!(blob.read_all().await.unwrap().len(), BIG_LEN);
    assert_eq!(env.storage_gets(), 1);
    (env, blob)
}

async fn send_and_receive(a: &Node, b: &Node, blob: &Blob) -> BlobHandle {
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(Work {
        input: BlobHandle::from(blob.clone()),
    })
    .await
    .unwrap();
    let work: Work = tokio::time::timeout(T, b.recv())
        .await
        .unwrap()
        .unwrap()
        .decode()
        .unwrap();
    work.input
}

fn own_catalog(env: &Env, cache_dir: &std::path::Path) -> Arc<Catalog> {
    let cache = Cache::open(CacheConfig::new(cache_dir)).unwrap();
    Arc::new(Catalog::load(&env.catalog_file, cache).unwrap())
}

#[tokio::test]
async fn a_remote_node_fetches_from_storage_not_from_the_sender() {
    let (env, blob) = sender_env().await;
    let (a, b) = nodes("remote", "h2").await;
    let other = TempDir::new("remote-cache");
    own_catalog(&env, other.path()).serve(b.resources());

    let handle = send_and_receive(&a, &b, &blob).await;
    assert!(handle.blob().is_some(), "bound to the receiver's catalog");
    assert_eq!(env.storage_gets(), 1, "nothing is fetched before first use");
    assert_eq!(a.ticket_leases().count, 1, "the sender offers its bytes as a fallback");
    let bytes = handle.read_all().await.unwrap();
    assert_eq!(&bytes[..], &pattern(BIG_LEN, 3)[..]);
    assert_eq!(handle.last_origin(), Some(Origin::Storage));
    assert_eq!(env.storage_gets(), 2, "the receiver made its own GET");
    assert_eq!(handle.fallback_reason(), None);
    // The fallback is no longer needed: the sender's lease ends.
    assert!(!handle.has_fallback());
    common_wait(|| a.ticket_leases().count == 0).await;
    assert_eq!(a.ticket_leases().pulls, 0, "no byte came from the sender");
}

#[tokio::test]
async fn a_same_host_node_sharing_the_cache_does_not_download_again() {
    let (env, blob) = sender_env().await;
    let (a, b) = nodes("shared", "h1").await;
    own_catalog(&env, &env.cache_dir()).serve(b.resources());

    let handle = send_and_receive(&a, &b, &blob).await;
    assert!(handle.tag().digest.is_some(), "the sender knew the digest and said so");
    let bytes = handle.read_all().await.unwrap();
    assert_eq!(&bytes[..], &pattern(BIG_LEN, 3)[..]);
    assert_eq!(handle.last_origin(), Some(Origin::CacheByDigest));
    assert_eq!(env.storage_gets(), 1, "no second download");
}

#[tokio::test]
async fn a_node_without_the_dataset_pulls_from_the_sender() {
    let (env, blob) = sender_env().await;
    let (a, b) = nodes("fallback", "h2").await;
    let handle = send_and_receive(&a, &b, &blob).await;
    assert!(handle.blob().is_none());
    let reason = handle.fallback_reason().unwrap();
    assert!(
        reason.contains("dataset:22222222-2222-4222-8222-222222222222"),
        "{reason}"
    );

    // A range pulls only that range.
    let part = handle.read_range(1000..1100).await.unwrap();
    assert_eq!(&part[..], &pattern(BIG_LEN, 3)[1000..1100]);
    assert_eq!(a.ticket_leases().bytes_pulled, 100);

    let bytes = handle.read_all().await.unwrap();
    assert_eq!(&bytes[..], &pattern(BIG_LEN, 3)[..]);
    assert_eq!(handle.last_origin(), Some(Origin::Sender));
    assert_eq!(env.storage_gets(), 1, "the receiver never asked storage");
    drop(handle);
    common_wait(|| a.ticket_leases().count == 0).await;
}

#[tokio::test]
async fn a_node_whose_storage_fails_pulls_from_the_sender() {
    let (env, blob) = sender_env().await;
    let (a, b) = nodes("broken", "h2").await;
    // The receiver's catalog has the dataset, but its storage url leads nowhere.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let text = std::fs::read_to_string(&env.catalog_file).unwrap();
    let url = env.http().unwrap().url();
    let dir = TempDir::new("broken");
    let file = dir.path().join("Data.toml");
    std::fs::write(&file, text.replace(&url, &dead_url)).unwrap();
    let cache = Cache::open(CacheConfig::new(dir.path().join("cache"))).unwrap();
    Arc::new(Catalog::load(&file, cache).unwrap()).serve(b.resources());

    let handle = send_and_receive(&a, &b, &blob).await;
    assert!(handle.blob().is_some());
    let bytes = handle.read_all().await.unwrap();
    assert_eq!(&bytes[..], &pattern(BIG_LEN, 3)[..]);
    assert_eq!(handle.last_origin(), Some(Origin::Sender));
    let reason = handle.fallback_reason().unwrap();
    assert!(reason.contains("storage failed"), "{reason}");
}

#[tokio::test]
async fn a_strict_blob_names_the_missing_dataset_and_the_keys_the_node_has() {
    let (env, blob) = sender_env().await;
    let (a, b) = nodes("strict", "h2").await;
    // The receiver serves a catalog that lacks `big`.
    let dir = TempDir::new("strict");
    let file = dir.path().join("Data.toml");
    std::fs::write(
        &file,
        "data_config_version = 1\n\n[[datasets]]\nname = \"other\"\nuuid = \"99999999-9999-4999-8999-999999999999\"\n\
         [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"/nonexistent\"\n",
    )
    .unwrap();
    let cache = Cache::open(CacheConfig::new(dir.path().join("cache"))).unwrap();
    Arc::new(Catalog::load(&file, cache).unwrap()).serve(b.resources());
    drop(env);

    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(StrictWork { input: blob }).await.unwrap();
    let err = b.recv().await.unwrap().decode::<StrictWork>().err().unwrap();
    assert!(
        matches!(&err, handoff::Error::Wire(WireError::UnknownResource(_))),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("dataset:22222222-2222-4222-8222-222222222222")
            && text.contains("dataset:99999999-9999-4999-8999-999999999999"),
        "{text}"
    );
}

#[tokio::test]
async fn without_a_catalog_or_a_fallback_the_decode_fails_clearly() {
    // The sender never read the blob, so it has no bytes to offer.
    let env = Env::new(Kind::Http).await;
    env.put("big.bin", pattern(1000, 1)).await;
    let blob = env.catalog.blob("big").unwrap();
    let (a, b) = nodes("nothing", "h2").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(Work { input: blob.into() }).await.unwrap();
    let err = b.recv().await.unwrap().decode::<Work>().err().unwrap();
    assert!(
        matches!(&err, handoff::Error::Wire(WireError::UnknownResource(_))),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("dataset:2222") && text.contains("no resources"), "{text}");
    assert_eq!(env.storage_gets(), 0);
}

async fn common_wait(mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + T;
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "condition not met in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

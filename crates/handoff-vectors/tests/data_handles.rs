//! The data-handle vectors (`msg-blob-handle`, `msg-blob-handle-no-fallback`, WIRE.md §8.5)
//! against the reference's data layer: their bodies decode as `handoff_data::Blob` and
//! `BlobHandle` bound to a catalog that has the datasets, a `Blob` without a fallback writes
//! exactly the vector's bytes, and a node without the dataset is told which key it lacks.

use std::path::PathBuf;
use std::sync::Arc;

use handoff_data::handle::dataset_key;
use handoff_data::{Blob, BlobHandle, BlobTag, Cache, CacheConfig, Catalog};
use handoff_vectors::{all, BLOB_DATASET, TREE_DATASET};
use handoff_wire::{Buffer, Header, Limits, Resources, WireError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Strict {
    input: Blob,
}

#[derive(Serialize)]
struct StrictOut<'a> {
    input: &'a Blob,
}

#[derive(Deserialize)]
struct Lenient {
    input: BlobHandle,
}

/// A folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("handoff-vectors-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A catalog with the two datasets of the vectors: `big` (a Blob) and `images` (a BlobTree
/// holding `cats/1.png`), both on the local file system.
fn catalog(dir: &Scratch) -> Arc<Catalog> {
    std::fs::write(dir.0.join("big.bin"), b"big").unwrap();
    std::fs::create_dir_all(dir.0.join("images/cats")).unwrap();
    std::fs::write(dir.0.join("images/cats/1.png"), b"png").unwrap();
    let text = format!(
        "data_config_version = 1\n\n\
         [[datasets]]\nname = \"big\"\nuuid = \"{BLOB_DATASET}\"\n\
         [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"@__DIR__/big.bin\"\n\n\
         [[datasets]]\nname = \"images\"\nuuid = \"{TREE_DATASET}\"\n\
         [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"BlobTree\"\npath = \"@__DIR__/images\"\n"
    );
    let cache = Cache::open(CacheConfig::new(dir.0.join("cache"))).unwrap();
    Arc::new(Catalog::parse(&text, dir.0.join("Data.toml"), cache).unwrap())
}

/// The body of a vector and placeholders for its frames (the fallback's bytes are not in the stream).
fn body_of(name: &str) -> (Vec<u8>, Vec<Buffer>) {
    let v = all().into_iter().find(|v| v.name == name).expect("the vector exists");
    let m = handoff_wire::decode_message(&v.bytes, &Limits::DEFAULT).unwrap();
    let Header::Msg { body, frames, .. } = m.header else {
        panic!("{name} is a msg")
    };
    let placeholders = frames.iter().map(|_| Buffer::from(Vec::new())).collect();
    (body.to_vec(), placeholders)
}

/// The tag as the vector's JSON describes it.
fn tag_of(name: &str) -> BlobTag {
    let v = all().into_iter().find(|v| v.name == name).unwrap();
    serde_json::from_value(v.description["body"]["input"]["tag"].clone()).unwrap()
}

#[test]
fn the_vectors_bind_to_a_catalog_that_has_the_datasets() {
    let dir = Scratch::new("bind");
    let resources = Arc::new(Resources::new("beta"));
    catalog(&dir).serve(&resources);
    for (name, uuid) in [
        ("msg-blob-handle", BLOB_DATASET),
        ("msg-blob-handle-no-fallback", TREE_DATASET),
    ] {
        let (body, frames) = body_of(name);
        let strict: Strict = Resources::with(&resources, || handoff_wire::decode("demo.Work", &body, &frames, None))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(strict.input.tag(), tag_of(name), "{name}");
        assert_eq!(strict.input.tag().dataset, uuid);
        let lenient: Lenient = Resources::with(&resources, || handoff_wire::decode("demo.Work", &body, &frames, None))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(lenient.input.blob().is_some(), "{name}: bound to the catalog");
        assert_eq!(lenient.input.tag(), &tag_of(name));
    }
}

#[test]
fn a_blob_without_a_fallback_writes_the_vectors_bytes() {
    let dir = Scratch::new("write");
    let resources = Arc::new(Resources::new("beta"));
    catalog(&dir).serve(&resources);
    let (body, frames) = body_of("msg-blob-handle-no-fallback");
    let got: Strict = Resources::with(&resources, || handoff_wire::decode("demo.Work", &body, &frames, None)).unwrap();
    // Without a route there is no receiver to offer bytes to: the handle is its key and tag.
    let again = handoff_wire::encode(&StrictOut { input: &got.input }, None).unwrap();
    assert_eq!(hex::encode(&again.body), hex::encode(&body));
    assert!(again.frames.is_empty());
}

#[test]
fn the_dataset_key_is_the_reference_one() {
    for (name, uuid) in [
        ("msg-blob-handle", BLOB_DATASET),
        ("msg-blob-handle-no-fallback", TREE_DATASET),
    ] {
        let v = all().into_iter().find(|v| v.name == name).unwrap();
        assert_eq!(
            v.description["body"]["input"]["catalog"]["$resource"],
            serde_json::json!(dataset_key(&uuid.to_uppercase())),
            "{name}"
        );
    }
}

#[test]
fn a_node_without_the_dataset_is_told_which_key_it_lacks() {
    let resources = Arc::new(Resources::new("beta"));
    resources.insert("db", Arc::new(0u8));
    let (body, frames) = body_of("msg-blob-handle");
    let err = Resources::with(&resources, || {
        handoff_wire::decode::<Strict>("demo.Work", &body, &frames, None)
    })
    .err()
    .unwrap();
    assert_eq!(err.code(), "unknown-resource", "{err}");
    let text = err.to_string();
    let key = dataset_key(BLOB_DATASET);
    assert!(
        text.contains(&key) && text.contains("\"beta\"") && text.contains("db"),
        "{text}"
    );
    assert!(matches!(err, WireError::UnknownResource(_)));
    // A lenient handle needs the fallback to be a ticket; the placeholder frame is not one,
    // so it has nothing to fall back on: unknown-resource too (spec §8.5, rule 3).
    let err = Resources::with(&resources, || {
        handoff_wire::decode::<Lenient>("demo.Work", &body, &frames, None)
    })
    .err()
    .unwrap();
    assert_eq!(err.code(), "unknown-resource", "{err}");
    let text = err.to_string();
    assert!(text.contains(&key) && text.contains("db"), "{text}");
}

//! Catalogs: a DataSets.jl Data.toml loads unchanged; bad catalogs fail naming the file and the dataset; local
//! trees refuse paths that escape them.

mod common;

use std::path::{Path, PathBuf};

use common::TempDir;
use handoff_data::{Cache, CacheConfig, Catalog, DataKind, Error, StorageConfig};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/julia/Data.toml")
}

fn cache(dir: &TempDir) -> std::sync::Arc<Cache> {
    Cache::open(CacheConfig::new(dir.path().join("cache"))).unwrap()
}

#[tokio::test]
async fn datasets_jl_catalog_loads_unchanged() {
    let tmp = TempDir::new("julia");
    let catalog = Catalog::load(fixture(), cache(&tmp)).unwrap();
    let names: Vec<_> = catalog.datasets().iter().map(|d| d.name().to_string()).collect();
    assert_eq!(names, ["a_text_file", "some_namespace/a_text_file", "a_tree_example"]);
    let ds = catalog.dataset("a_text_file").unwrap();
    assert_eq!(ds.uuid(), "b498f769-a7f6-4f67-8d74-40b770398f26");
    assert_eq!(ds.description(), Some("A text file containing the standard greeting"));
    assert_eq!(ds.kind(), DataKind::Blob);
    let dir = fixture().parent().unwrap().to_path_buf();
    assert_eq!(
        ds.storage(),
        &StorageConfig::FileSystem {
            path: dir.join("data/file.txt")
        },
        "@__DIR__ expanded"
    );
    assert_eq!(
        ds.storage_table().get("driver").and_then(|v| v.as_str()),
        Some("FileSystem")
    );
    // Lookup by uuid (any case) finds the same dataset.
    assert_eq!(
        catalog.dataset("B498F769-A7F6-4F67-8D74-40B770398F27").unwrap().name(),
        "some_namespace/a_text_file"
    );

    let blob = catalog.blob("a_text_file").unwrap();
    assert_eq!(&blob.read_all().await.unwrap()[..], b"Hello world!\n");
    assert_eq!(blob.last_origin(), Some(handoff_data::Origin::ReadInPlace));
    assert_eq!(&blob.read_range(6..11).await.unwrap()[..], b"world");
    assert_eq!(
        blob.local_path().await.unwrap().path(),
        dir.join("data/file.txt"),
        "read in place, not copied"
    );
    let tree = catalog.tree("a_tree_example").unwrap();
    let files: Vec<_> = tree.walk().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(files, ["1.csv", "2.csv"]);
    assert!(tree
        .blob("1.csv")
        .unwrap()
        .read_all()
        .await
        .unwrap()
        .starts_with(b"Name,Age"));
    assert_eq!(
        catalog.cache().usage(),
        0,
        "FileSystem datasets are not copied into the cache"
    );

    let err = catalog.blob("a_tree_example").unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err}");
    let err = catalog.dataset("nope").unwrap_err().to_string();
    assert!(
        err.contains("nope") && err.contains("a_text_file") && err.contains("Data.toml"),
        "{err}"
    );
}

#[tokio::test]
async fn local_trees_refuse_escapes() {
    let tmp = TempDir::new("escape");
    let tree_dir = tmp.path().join("tree");
    std::fs::create_dir_all(tree_dir.join("sub")).unwrap();
    std::fs::write(tree_dir.join("sub/in.txt"), b"inside").unwrap();
    std::fs::write(tmp.path().join("secret.txt"), b"outside").unwrap();
    std::os::unix::fs::symlink(tmp.path(), tree_dir.join("out")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("secret.txt"), tree_dir.join("sub/leak.txt")).unwrap();
    std::os::unix::fs::symlink(tree_dir.join("sub/in.txt"), tree_dir.join("alias.txt")).unwrap();
    let text = "data_config_version = 1\n[[datasets]]\nname = \"t\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
                [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"BlobTree\"\npath = \"@__DIR__/tree\"\n";
    let catalog = Catalog::parse(text, tmp.path().join("Data.toml"), cache(&tmp)).unwrap();
    let tree = catalog.tree("t").unwrap();
    assert_eq!(
        &tree.blob("alias.txt").unwrap().read_all().await.unwrap()[..],
        b"inside",
        "symlink inside the tree"
    );
    for bad in [
        "out/secret.txt",
        "out",
        "sub/leak.txt",
        "../secret.txt",
        "/etc/passwd",
        "sub/../../secret.txt",
    ] {
        let err = tree.blob(bad).unwrap_err();
        assert!(matches!(err, Error::BadPath { .. }), "{bad}: {err}");
        assert!(err.to_string().contains(bad), "{err}");
    }
    assert!(tree.join("out").is_err());
    assert!(tree
        .join("sub")
        .unwrap()
        .blob("leak.txt")
        .unwrap_err()
        .to_string()
        .contains("symlink"));
    let listed: Vec<_> = tree.walk().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(
        listed,
        ["alias.txt", "sub/in.txt"],
        "symlinks out of the tree are not listed"
    );
}

fn parse_err(body: &str) -> String {
    let tmp = TempDir::new("bad");
    let file = tmp.path().join("Bad.toml");
    let text = format!("data_config_version = 1\n{body}");
    match Catalog::parse(&text, &file, cache(&tmp)) {
        Ok(_) => panic!("expected an error for:\n{body}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("Bad.toml"), "names the file: {msg}");
            msg
        }
    }
}

const OK_STORAGE: &str = "[datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"x\"\n";

#[test]
fn bad_catalogs_name_file_and_dataset() {
    let m = parse_err(
        "[[datasets]]\nname = \"toml64\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"TomlDataStorage\"\ntype = \"Blob\"\ndata = \"not base64!\"\n",
    );
    assert!(
        m.contains("toml64") && m.contains("storage.data is not valid base64"),
        "{m}"
    );
    let m = parse_err(
        "[[datasets]]\nname = \"tomltree\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"TomlDataStorage\"\ntype = \"BlobTree\"\n\
         [datasets.storage.data]\n\"..\" = \"YQ==\"\n",
    );
    assert!(m.contains("tomltree") && m.contains("one path part"), "{m}");

    let m = parse_err(&format!("[[datasets]]\nname = \"no_uuid\"\n{OK_STORAGE}"));
    assert!(m.contains("no_uuid") && m.contains("uuid is missing"), "{m}");

    let m = parse_err("[[datasets]]\nname = \"no_storage\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n");
    assert!(m.contains("no_storage") && m.contains("storage is missing"), "{m}");

    let m = parse_err(
        "[[datasets]]\nname = \"no_path\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\n",
    );
    assert!(m.contains("no_path") && m.contains("storage.path is missing"), "{m}");

    let m = parse_err(
        "[[datasets]]\nname = \"bad_type\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Table\"\npath = \"x\"\n",
    );
    assert!(m.contains("bad_type") && m.contains("\"Blob\" or \"BlobTree\""), "{m}");

    let m = parse_err(
        "[[datasets]]\nname = \"s3opt\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"ObjectStore\"\ntype = \"Blob\"\nurl = \"s3://b/k\"\n\
         [datasets.storage.options]\nendpiont = \"http://x\"\n",
    );
    assert!(m.contains("s3opt") && m.contains("endpiont"), "{m}");

    let m = parse_err(
        "[[datasets]]\nname = \"ftp\"\nuuid = \"12345678-1234-4234-8234-123456789abc\"\n\
         [datasets.storage]\ndriver = \"ObjectStore\"\ntype = \"Blob\"\nurl = \"ftp://host/k\"\n",
    );
    assert!(m.contains("ftp") && m.contains("unsupported url scheme"), "{m}");

    let tmp = TempDir::new("ver");
    let err = Catalog::parse("data_config_version = 2\n", tmp.path().join("V.toml"), cache(&tmp)).unwrap_err();
    assert!(
        err.to_string().contains("V.toml") && err.to_string().contains("version"),
        "{err}"
    );
    let err = Catalog::parse(
        "data_config_version = 1\n[[datasets]\n",
        tmp.path().join("T.toml"),
        cache(&tmp),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("T.toml") && err.to_string().contains("TOML"),
        "{err}"
    );
}

fn tag_for(uuid: &str) -> handoff_data::BlobTag {
    handoff_data::BlobTag {
        dataset: uuid.to_string(),
        name: None,
        path: String::new(),
        size: None,
        digest: None,
        version: None,
    }
}

fn embedded() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/julia/Embedded.toml")
}

#[tokio::test]
async fn toml_data_storage_blobs_and_trees_read_from_the_catalog() {
    let tmp = TempDir::new("embedded");
    let catalog = Catalog::load(embedded(), cache(&tmp)).unwrap();
    let names: Vec<_> = catalog.datasets().iter().map(|d| d.name().to_string()).collect();
    assert_eq!(
        names,
        [
            "embedded_blob",
            "embedded_tree",
            "embedded_file",
            "embedded_filetree",
            "old_backend_blob",
            "a_text_file"
        ]
    );
    let blob = catalog.blob("embedded_blob").unwrap();
    assert_eq!(&blob.read_all().await.unwrap()[..], &[0, 0, 0, 0, 0, 0, 0x45, 0x40]);
    assert_eq!(&blob.read_range(6..8).await.unwrap()[..], &[0x45, 0x40]);
    let file = catalog.blob("embedded_file").unwrap();
    assert_eq!(&file.read_all().await.unwrap()[..], b"hello from TOML\n");
    assert_eq!(catalog.dataset("embedded_filetree").unwrap().kind(), DataKind::BlobTree);

    let tree = catalog.tree("embedded_tree").unwrap();
    let files: Vec<_> = tree.walk().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(
        files,
        [
            "d01/a.txt",
            "d01/b.txt",
            "d02/a.txt",
            "d02/b.txt",
            "d03/a.txt",
            "d03/b.txt",
            "d04/a.txt",
            "d04/b.txt"
        ]
    );
    assert_eq!(
        &tree.blob("d02/b.txt").unwrap().read_all().await.unwrap()[..],
        b"2 b content"
    );
    assert_eq!(
        &tree.blob("d04/b.txt").unwrap().read_all().await.unwrap()[..],
        b"4 b content"
    );
    let top = catalog.tree("embedded_filetree").unwrap();
    let files: Vec<_> = top.walk().await.unwrap().into_iter().map(|e| e.path).collect();
    assert_eq!(files, ["a.txt", "b.txt"]);
    assert!(tree.blob("../d01/a.txt").is_err(), "no path leaves the tree");

    // A received tag binds to the embedded bytes, digest checked.
    let tag = file.describe().await.unwrap();
    let bound = catalog.open_tag(&tag).unwrap();
    assert_eq!(&bound.read_all().await.unwrap()[..], b"hello from TOML\n");

    // A tag's path names a file of a tree: on a Blob dataset it is refused, as the Python peer refuses it.
    let mut into_blob = tag.clone();
    into_blob.path = "x.txt".into();
    let err = catalog.open_tag(&into_blob).unwrap_err();
    assert!(matches!(err, Error::WrongType { wanted: "BlobTree", .. }), "{err}");
}

#[tokio::test]
async fn a_driver_handoff_lacks_does_not_stop_the_catalog() {
    let tmp = TempDir::new("unavailable");
    let catalog = Catalog::load(embedded(), cache(&tmp)).unwrap();
    let ds = catalog.dataset("old_backend_blob").unwrap();
    assert_eq!(ds.storage().driver(), "OldBackendAPI");
    assert!(!ds.storage().is_available());
    let err = catalog.blob("old_backend_blob").unwrap_err();
    assert!(matches!(err, Error::DriverUnavailable { .. }), "{err}");
    let msg = err.to_string();
    for part in [
        "old_backend_blob",
        "OldBackendAPI",
        "FileSystem",
        "TomlDataStorage",
        "ObjectStore",
        "Embedded.toml",
    ] {
        assert!(msg.contains(part), "{part} missing from: {msg}");
    }
    // The others still open.
    assert_eq!(
        &catalog.blob("a_text_file").unwrap().read_all().await.unwrap()[..],
        b"Hello world!\n"
    );
    // A tag for it is refused the same way (the receiver then takes the sender's bytes).
    let tag = tag_for(ds.uuid());
    assert!(matches!(catalog.open_tag(&tag), Err(Error::DriverUnavailable { .. })));
}

#[test]
fn datasets_may_share_a_uuid_and_only_a_lookup_by_it_is_refused() {
    let tmp = TempDir::new("shared");
    let catalog = Catalog::load(embedded(), cache(&tmp)).unwrap();
    let shared = "b498f769-a7f6-4f67-8d74-40b770398f26";
    let err = catalog.dataset(shared).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Ambiguous { .. }), "{msg}");
    assert!(msg.contains("embedded_blob") && msg.contains("embedded_tree"), "{msg}");
    assert_eq!(
        catalog.dataset("embedded_tree").unwrap().uuid(),
        shared,
        "by name it is found"
    );
    let tag = tag_for(shared);
    assert!(matches!(catalog.open_tag(&tag), Err(Error::Ambiguous { .. })));
}

/// Files whose names object_store's `Path` would percent-encode (`é`, `#`, `%`, `?`, `~`), in an embedded tree and a
/// `file://` store: listed by their names, opened by them, and read; offline, the cache lists them by name too. The
/// Python peer reads the same (python/tests/test_catalog_agreement.py).
#[tokio::test]
async fn names_a_store_would_encode_are_listed_and_read_as_written() {
    const NAMES: [&str; 6] = ["é.txt", "x#y", "50%", "q?", "c~d.txt", "a%41"];
    let tmp = TempDir::new("odd-names");
    let root = tmp.path().join("odd");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let mut embedded = String::new();
    for name in NAMES {
        std::fs::write(root.join(name), name).unwrap();
        let b64 = base64_of(name.as_bytes());
        embedded.push_str(&format!("\"{name}\" = \"{b64}\"\n"));
    }
    std::fs::write(root.join("sub/ü"), "ü").unwrap();
    let text = format!(
        "data_config_version = 1\n\
         [[datasets]]\nname = \"emb\"\nuuid = \"5e1e7c2a-0000-4000-8000-0000000000a1\"\n\
         [datasets.storage]\ndriver = \"TomlDataStorage\"\ntype = \"BlobTree\"\n\
         [datasets.storage.data]\n{embedded}[datasets.storage.data.sub]\n\"ü\" = \"{}\"\n\
         [[datasets]]\nname = \"store\"\nuuid = \"5e1e7c2a-0000-4000-8000-0000000000a2\"\n\
         [datasets.storage]\ndriver = \"ObjectStore\"\ntype = \"BlobTree\"\nurl = \"file://{}\"\n",
        base64_of("ü".as_bytes()),
        root.display()
    );
    let file = tmp.path().join("Data.toml");
    let catalog = Catalog::parse(&text, &file, cache(&tmp)).unwrap();
    let mut want: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
    want.push("sub/ü".into());
    want.sort();
    for ds in ["emb", "store"] {
        let tree = catalog.tree(ds).unwrap();
        let walk: Vec<String> = tree.walk().await.unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(walk, want, "{ds}");
        for name in NAMES.iter().copied().chain(["sub/ü"]) {
            let bytes = tree.blob(name).unwrap().read_all().await.unwrap();
            let expected = name.rsplit('/').next().unwrap();
            assert_eq!(&bytes[..], expected.as_bytes(), "{ds}: {name}");
        }
        let opened = catalog.open(&format!("{ds}#x%23y")).await.unwrap().into_blob().unwrap();
        assert_eq!(&opened.read_all().await.unwrap()[..], b"x#y");
        let sub = catalog.open(&format!("{ds}#sub")).await.unwrap().into_tree().unwrap();
        assert_eq!(sub.list().await.unwrap()[0].path, "ü");
    }
    // Offline, from the cache alone (whose keys spell the names percent-encoded): the same names.
    catalog.cache().set_offline(true);
    let walk: Vec<String> = catalog
        .tree("store")
        .unwrap()
        .walk()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(walk, want, "offline");
}

fn base64_of(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

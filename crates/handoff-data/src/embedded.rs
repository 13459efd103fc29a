//! DataSets.jl's built-in `TomlDataStorage` driver: a dataset's bytes kept in the catalog itself.
//!
//! ```toml
//! [[datasets]]
//! name = "embedded_blob"
//! uuid = "b498f769-a7f6-4f67-8d74-40b770398f26"
//!     [datasets.storage]
//!     driver = "TomlDataStorage"
//!     type = "Blob"                  # or "File"
//!     data = "AAAAAAAARUA="          # base64
//!
//! [[datasets]]
//! name = "embedded_tree"
//! uuid = "e7fd7080-e346-4a68-9ca9-98593a99266a"
//!     [datasets.storage]
//!     driver = "TomlDataStorage"
//!     type = "BlobTree"              # or "FileTree"
//!         [datasets.storage.data.d01]  # a folder: nested tables
//!         "a.txt" = "MSBhIGNvbnRlbnQ="   # a file: its bytes in base64
//! ```
//!
//! The content is decoded when the catalog loads, checked (base64, names that are one path
//! part each), and served from memory through an `object_store` in-memory store, so that a
//! `Blob` or `BlobTree` of it reads like any other. Its identity, which keys cache entries,
//! is the BLAKE3 digest of the content: two catalogs with the same embedded bytes share
//! entries, and different bytes never collide.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::kind::DataKind;
use crate::relpath::raw_store_path;

/// Folders nested deeper than this in an embedded tree are refused (a catalog is small).
pub const MAX_DEPTH: usize = 64;

/// The decoded content of a `TomlDataStorage` dataset.
#[derive(Clone, PartialEq, Eq)]
pub enum Embedded {
    /// A `Blob`'s bytes.
    Blob(Bytes),
    /// A `BlobTree`'s files, by path relative to the tree (`d01/a.txt`), sorted.
    Tree(BTreeMap<String, Bytes>),
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Embedded::Blob(b) => write!(f, "Embedded::Blob({} bytes)", b.len()),
            Embedded::Tree(t) => write!(f, "Embedded::Tree({} files)", t.len()),
        }
    }
}

impl Embedded {
    /// Decodes `[datasets.storage] data` for a dataset of `kind`; the error says what is wrong
    /// with `storage.data` (the catalog adds file and dataset).
    pub fn parse(kind: DataKind, data: Option<&toml::Value>) -> Result<Embedded, String> {
        match (kind, data) {
            (_, None) => Err("is missing: TomlDataStorage keeps the bytes in `data` (base64)".into()),
            (DataKind::Blob, Some(toml::Value::String(s))) => Ok(Embedded::Blob(decode(s, "")?)),
            (DataKind::Blob, Some(_)) => Err("must be a base64 string for a Blob".into()),
            (DataKind::BlobTree, Some(toml::Value::Table(t))) => {
                let mut files = BTreeMap::new();
                walk(t, "", 1, &mut files)?;
                Ok(Embedded::Tree(files))
            }
            (DataKind::BlobTree, Some(_)) => Err(
                "must be a table for a BlobTree: a folder is a table, a file a base64 string ([datasets.storage.data.FOLDER])"
                    .into(),
            ),
        }
    }

    /// The identity that keys this content's cache entries: `toml-data:` and its BLAKE3 digest.
    pub fn identity(&self) -> String {
        let mut h = blake3::Hasher::new();
        match self {
            Embedded::Blob(b) => {
                h.update(b"blob\0");
                h.update(b);
            }
            Embedded::Tree(t) => {
                h.update(b"tree\0");
                for (path, b) in t {
                    h.update(&(path.len() as u64).to_le_bytes());
                    h.update(path.as_bytes());
                    h.update(&(b.len() as u64).to_le_bytes());
                    h.update(b);
                }
            }
        }
        format!("toml-data:{}", h.finalize().to_hex())
    }

    /// An in-memory store holding the content, and the root below which it lies (the Blob's
    /// object, or the tree's prefix).
    pub fn store(&self) -> Result<(Arc<dyn ObjectStore>, StorePath), String> {
        let store = InMemory::new();
        let put = |path: StorePath, bytes: &Bytes| {
            // The in-memory store completes at once: no runtime is needed to drive it.
            futures::executor::block_on(store.put(&path, PutPayload::from(bytes.clone())))
                .map(|_| ())
                .map_err(|e| format!("cannot hold the embedded data in memory: {e}"))
        };
        let root = match self {
            Embedded::Blob(b) => {
                let root = StorePath::from("blob");
                put(root.clone(), b)?;
                root
            }
            Embedded::Tree(t) => {
                let root = StorePath::from("tree");
                for (path, b) in t {
                    put(raw_store_path(&root, path), b)?;
                }
                root
            }
        };
        Ok((Arc::new(store), root))
    }
}

fn decode(text: &str, path: &str) -> Result<Bytes, String> {
    // DataSets.jl writes standard base64 with padding; line breaks in a multi-line TOML
    // string are not part of it.
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map(Bytes::from)
        .map_err(|e| {
            let what = if path.is_empty() {
                String::new()
            } else {
                format!(" (file {path:?})")
            };
            format!("is not valid base64{what}: {e}")
        })
}

fn walk(table: &toml::Table, prefix: &str, depth: usize, files: &mut BTreeMap<String, Bytes>) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("nests folders deeper than {MAX_DEPTH} levels (at {prefix:?})"));
    }
    for (name, value) in table {
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.contains('/')
            || name.contains('\\')
            || name.chars().any(|c| c.is_ascii_control())
        {
            return Err(format!(
                "has an entry named {name:?} in folder {prefix:?}: a name must be one path part (no '/', not '.' or \
                 '..', no control characters)"
            ));
        }
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        match value {
            toml::Value::String(s) => {
                files.insert(path.clone(), decode(s, &path)?);
            }
            toml::Value::Table(t) => walk(t, &path, depth + 1, files)?,
            _ => {
                return Err(format!(
                    "has {path:?} that is neither a file (base64 string) nor a folder (table)"
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(text: &str) -> Result<Embedded, String> {
        let v: toml::Table = text.parse().unwrap();
        Embedded::parse(DataKind::BlobTree, v.get("data"))
    }

    #[test]
    fn a_blob_is_its_base64() {
        let v = toml::Value::String("AAAAAAAARUA=".into());
        let e = Embedded::parse(DataKind::Blob, Some(&v)).unwrap();
        assert_eq!(e, Embedded::Blob(Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0x45, 0x40])));
        let bad = toml::Value::String("not base64!".into());
        let err = Embedded::parse(DataKind::Blob, Some(&bad)).unwrap_err();
        assert!(err.contains("not valid base64"), "{err}");
        assert!(Embedded::parse(DataKind::Blob, None).unwrap_err().contains("missing"));
    }

    #[test]
    fn a_tree_is_nested_tables_of_base64_files() {
        let e = tree("[data]\n\"top.txt\" = \"YQ==\"\n[data.d01]\n\"a.txt\" = \"MSBhIGNvbnRlbnQ=\"\n[data.d01.deeper]\n\"x\" = \"\"\n")
            .unwrap();
        let Embedded::Tree(files) = e else { panic!("a tree") };
        let paths: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(paths, ["d01/a.txt", "d01/deeper/x", "top.txt"]);
        assert_eq!(files["d01/a.txt"], Bytes::from_static(b"1 a content"));
        assert!(files["d01/deeper/x"].is_empty());
    }

    #[test]
    fn names_that_would_leave_the_tree_are_refused() {
        for bad in [
            "\"..\" = \"YQ==\"",
            "\"a/b\" = \"YQ==\"",
            "\"\" = \"YQ==\"",
            "\"x\" = 3",
            "\"a\\tb\" = \"YQ==\"",
        ] {
            let err = tree(&format!("[data]\n{bad}\n")).unwrap_err();
            assert!(err.contains("name") || err.contains("neither"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_identity_is_spelled_as_the_python_peer_spells_it() {
        // The same values as python/tests/test_datasets.py: both languages key a cache alike.
        let blob = Embedded::Blob(Bytes::from_static(b"hello from TOML\n"));
        assert_eq!(
            blob.identity(),
            "toml-data:004701f545ae09d44ca92991a8c55b460732a2b553de4f4607d434b9d4fd015c"
        );
        let t = tree("[data]\ntop = \"YQ==\"\n[data.d01]\n\"a.txt\" = \"MSBhIGNvbnRlbnQ=\"\n").unwrap();
        assert_eq!(
            t.identity(),
            "toml-data:1d6fe1b7991cb520355d6b71410b68ccab65327cd2d8c9b134ffeba633e80a2e"
        );
    }

    #[test]
    fn the_identity_follows_the_content() {
        let a = tree("[data]\n\"a\" = \"YQ==\"\n").unwrap();
        let b = tree("[data]\n\"a\" = \"Yg==\"\n").unwrap();
        assert_ne!(a.identity(), b.identity());
        assert_eq!(a.identity(), tree("[data]\n\"a\" = \"YQ==\"\n").unwrap().identity());
    }
}

//! Where things live in a cache directory, and the keys that name them.
//!
//! ```text
//! objects/<d0d1>/<digest>          content, named by its BLAKE3 digest (read-only once renamed into place)
//! objects/<d0d1>/<digest>.seal     size and mtime at the time the digest was checked
//! index/<path key>/<version key>.json   store identity + path + version -> digest (mtime = last use)
//! blocks/<path key>/<version key>-<block KiB>k/<n>   block n of a range-read object: 32-byte digest, then data
//! locks/…                          advisory lock files (one download per key across processes)
//! tmp/                             files being written, renamed into place when complete
//! ```

use std::path::{Path, PathBuf};

/// The key of a cached object: which store, which object, which version of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectKey {
    /// The store's identity (url and endpoint).
    pub identity: String,
    /// The object's path in the store.
    pub path: String,
    /// The version: `v:<version id>`, `e:<etag>`, or `m:<size>:<last modified>` when the store gives neither.
    pub version: String,
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0]);
    }
    hex::encode(&h.finalize().as_bytes()[..16])
}

impl ObjectKey {
    /// Names every version of one object in one store.
    pub fn path_key(&self) -> String {
        short_hash(&["handoff-data path v1", &self.identity, &self.path])
    }
    /// Names one version.
    pub fn version_key(&self) -> String {
        short_hash(&["handoff-data version v1", &self.version])
    }
}

/// The paths of one cache directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn objects(&self) -> PathBuf {
        self.dir.join("objects")
    }
    pub fn index(&self) -> PathBuf {
        self.dir.join("index")
    }
    pub fn blocks(&self) -> PathBuf {
        self.dir.join("blocks")
    }
    pub fn locks(&self) -> PathBuf {
        self.dir.join("locks")
    }
    pub fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    /// Creates the folders.
    pub fn create(&self) -> std::io::Result<()> {
        for d in [self.objects(), self.index(), self.blocks(), self.locks(), self.tmp()] {
            std::fs::create_dir_all(d)?;
        }
        Ok(())
    }
    pub fn object(&self, digest: &str) -> PathBuf {
        self.objects().join(&digest[..2]).join(digest)
    }
    pub fn seal(&self, digest: &str) -> PathBuf {
        self.objects().join(&digest[..2]).join(format!("{digest}.seal"))
    }
    pub fn entry_dir(&self, key: &ObjectKey) -> PathBuf {
        self.index().join(key.path_key())
    }
    pub fn entry(&self, key: &ObjectKey) -> PathBuf {
        self.entry_dir(key).join(format!("{}.json", key.version_key()))
    }
    pub fn block_parent(&self, key: &ObjectKey) -> PathBuf {
        self.blocks().join(key.path_key())
    }
    pub fn block_dir(&self, key: &ObjectKey, block_size: u64) -> PathBuf {
        self.block_parent(key)
            .join(format!("{}-{}k", key.version_key(), block_size / 1024))
    }
    pub fn block(&self, key: &ObjectKey, block_size: u64, index: u64) -> PathBuf {
        self.block_dir(key, block_size).join(index.to_string())
    }
    /// The lock of every whole-object fill of one object path, whatever the version
    /// (spec/CACHE.md §5.1).
    pub fn path_lock(&self, key: &ObjectKey) -> PathBuf {
        self.locks().join(format!("{}.lock", key.path_key()))
    }
    pub fn block_lock(&self, key: &ObjectKey, index: u64) -> PathBuf {
        self.locks()
            .join(format!("{}-{}-{index}.lock", key.path_key(), key.version_key()))
    }
    pub fn evict_lock(&self) -> PathBuf {
        self.locks().join("evict.lock")
    }
    /// A fresh temporary file name in `tmp/` (same file system as the cache, so renames are atomic).
    pub fn tmp_file(&self, what: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        self.tmp()
            .join(format!("{what}-{}-{nanos}-{n}.tmp", std::process::id()))
    }
}

/// True for a 64-character lower-case hex digest (a valid object file name).
pub(crate) fn is_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Writes `data` to `dest` through a temporary file and an atomic rename.
pub(crate) fn write_atomic(layout: &Layout, dest: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = layout.tmp_file("meta");
    std::fs::write(&tmp, data)?;
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(&tmp, dest).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::ObjectKey;

    /// The worked example of spec/CACHE.md §10, which python/tests/test_datasets.py checks too.
    #[test]
    fn keys_are_named_as_the_spec_example_says() {
        let key = ObjectKey {
            identity: "s3://ml-data/mnist?endpoint=http://127.0.0.1:9000".into(),
            path: "mnist/train/labels.txt".into(),
            version: "e:\"5eb63bbbe01eeed093cb22bb8f5acdc3\"".into(),
        };
        assert_eq!(key.path_key(), "693ef5e8dfeeac9eb3e29143714ffa5b");
        assert_eq!(key.version_key(), "0cd18f59cccfc5b9510b74b1756be13b");
        let embedded = ObjectKey {
            identity: "toml-data:a6847e7a830b5518ee25768c2e14f597601a386d2b21508333ed1549c8dc9c32".into(),
            path: "blob".into(),
            version: "e:\"0\"".into(),
        };
        assert_eq!(embedded.path_key(), "718942a0ec0abc644a049104f3693dcb");
        let path = crate::relpath::join_store_path(&object_store::path::Path::from("tree"), "a b/c~d.txt");
        assert_eq!(path.as_ref(), "tree/a b/c%7Ed.txt");
    }
}

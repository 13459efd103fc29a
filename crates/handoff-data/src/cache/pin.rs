//! Cached content in use: an open object file holding a shared lock, so that eviction leaves it alone.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::lock;

/// An object file of the cache, open and pinned (a shared flock) for as long as this value lives.
#[derive(Debug)]
pub struct CachedFile {
    file: File,
    path: PathBuf,
    size: u64,
    digest: String,
}

impl CachedFile {
    /// Opens and pins the object file at `path`; `None` if it is not there (or was evicted while opening).
    pub(crate) fn open(path: &Path, digest: &str) -> io::Result<Option<CachedFile>> {
        for _ in 0..3 {
            let file = match File::open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            lock::shared(&file)?;
            // An evictor may have unlinked the file between open and lock: check that the name still leads here.
            let held = file.metadata()?;
            match std::fs::metadata(path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(Some(CachedFile {
                        file,
                        path: path.to_path_buf(),
                        size: held.len(),
                        digest: digest.to_string(),
                    }))
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The file's path in the cache (valid while this value lives).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// BLAKE3 digest of the content (hex).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Reads the whole file (into one allocation of exactly its size).
    pub(crate) fn read_all(&self) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; self.size as usize];
        self.file.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }

    /// Reads `len` bytes at `offset`.
    pub(crate) fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }
}

//! What a blob hands out to read its bytes: an async reader, a local path, a memory map. Each holds the cache
//! entry it reads pinned (never evicted, by any process) while it lives; `Blob` makes them.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use crate::cache::CachedFile;

/// An async reader of a blob's content; the cache entry stays pinned while it lives.
#[derive(Debug)]
pub struct BlobReader {
    pub(crate) file: tokio::fs::File,
    pub(crate) path: PathBuf,
    pub(crate) _pin: Option<CachedFile>,
}

impl BlobReader {
    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsyncRead for BlobReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

/// A local path to a blob's content; the cache entry stays pinned (not evicted) while this guard lives.
#[derive(Debug)]
pub struct LocalPath {
    pub(crate) path: PathBuf,
    pub(crate) _pin: Option<CachedFile>,
}

impl LocalPath {
    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Deref for LocalPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for LocalPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// A read-only memory map of a blob; the cache entry stays pinned while it lives.
#[derive(Debug)]
pub struct BlobMap {
    pub(crate) map: memmap2::Mmap,
    pub(crate) _pin: Option<CachedFile>,
}

impl Deref for BlobMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl AsRef<[u8]> for BlobMap {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

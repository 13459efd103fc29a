//! Advisory file locks (flock): exclusive locks make one download per key across processes; shared locks pin
//! content that is in use so eviction skips it. flock locks belong to an open file, so they also exclude within one
//! process.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// An exclusive lock on a lock file, released when dropped.
#[derive(Debug)]
pub(crate) struct LockGuard {
    _file: File,
}

/// Opens (creating) `path` and waits for an exclusive lock on it, on a blocking thread.
pub(crate) async fn exclusive(path: PathBuf) -> io::Result<LockGuard> {
    tokio::task::spawn_blocking(move || {
        let file = File::options().create(true).truncate(false).write(true).open(&path)?;
        flock(&file, FlockOperation::LockExclusive)?;
        Ok(LockGuard { _file: file })
    })
    .await
    .map_err(io::Error::other)?
}

/// Tries an exclusive lock on `path` without waiting; `None` if someone else holds it.
pub(crate) fn try_exclusive_path(path: &Path) -> io::Result<Option<LockGuard>> {
    let file = File::options().create(true).truncate(false).write(true).open(path)?;
    Ok(try_exclusive(&file)?.then_some(LockGuard { _file: file }))
}

/// Tries an exclusive lock on an open file without waiting: false if a shared or exclusive lock is held elsewhere.
pub(crate) fn try_exclusive(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Takes a shared lock on an open file (a pin), waiting for a brief exclusive holder (an evictor) to finish.
pub(crate) fn shared(file: &File) -> io::Result<()> {
    flock(file, FlockOperation::LockShared).map_err(Into::into)
}

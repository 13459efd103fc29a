//! The receiving side of shared memory: read-only mappings of peers' segments, kept
//! per segment (by device and inode) so that a reused segment is not mapped — and
//! faulted in — again.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{Mmap, MmapOptions};
use rustix::fs::SealFlags;

use super::segment::inode_of;

/// A peer's segment mapped read-only into this process.
pub(crate) struct Mapping {
    file: File,
    map: Mmap,
    inode: (u64, u64),
    sealed: bool,
}

impl Mapping {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub(crate) fn base(&self) -> *const u8 {
        self.map.as_ptr()
    }

    pub(crate) fn size(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn inode(&self) -> (u64, u64) {
        self.inode
    }

    pub(crate) fn sealed(&self) -> bool {
        self.sealed
    }
}

/// Why a received segment was refused.
#[derive(Debug)]
pub(crate) struct MapError(pub(crate) String);

struct Entry {
    mapping: Arc<Mapping>,
    last_used: u64,
}

/// Mappings of received segments, reused while the segment lives.
pub(crate) struct MappingCache {
    entries: Mutex<HashMap<(u64, u64), Entry>>,
    tick: AtomicU64,
    max_idle_bytes: usize,
}

const SEALS_REQUIRED: SealFlags = SealFlags::WRITE.union(SealFlags::SHRINK).union(SealFlags::GROW);

impl MappingCache {
    pub(crate) fn new(max_idle_bytes: usize) -> MappingCache {
        MappingCache {
            entries: Mutex::default(),
            tick: AtomicU64::new(0),
            max_idle_bytes,
        }
    }

    /// Maps the segment behind `fd` (or reuses the mapping we have), checking that its
    /// size is the one the descriptor announced and, if it claims to be sealed, its seals.
    pub(crate) fn map(&self, fd: OwnedFd, size: u64, sealed: bool) -> Result<Arc<Mapping>, MapError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| MapError(format!("cannot stat the received descriptor: {e}")))?;
        if st.st_size as u64 != size {
            return Err(MapError(format!(
                "the descriptor says the segment has {size} bytes, the received file has {}",
                st.st_size
            )));
        }
        if sealed {
            let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| MapError(format!("cannot read seals: {e}")))?;
            if !seals.contains(SEALS_REQUIRED) {
                return Err(MapError(format!(
                    "the descriptor claims a sealed segment, but its seals are {seals:?}"
                )));
            }
        }
        let inode = inode_of(fd.as_fd()).map_err(|e| MapError(e.to_string()))?;
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().expect("mapping cache lock");
        if let Some(entry) = entries.get_mut(&inode) {
            if entry.mapping.size() as u64 == size && (entry.mapping.sealed || !sealed) {
                entry.last_used = tick;
                return Ok(entry.mapping.clone());
            }
        }
        if size == 0 {
            return Err(MapError("an empty shared segment".into()));
        }
        let file = File::from(fd);
        // SAFETY: read-only shared mapping of a memfd whose size we checked. A peer that
        // shrinks an unsealed segment could make reads fault; peers are authenticated and
        // of the same user, and sealed mode rules it out.
        let map = unsafe { MmapOptions::new().len(size as usize).map(&file) }
            .map_err(|e| MapError(format!("cannot map the received segment: {e}")))?;
        let mapping = Arc::new(Mapping {
            file,
            map,
            inode,
            sealed,
        });
        entries.insert(
            inode,
            Entry {
                mapping: mapping.clone(),
                last_used: tick,
            },
        );
        evict(&mut entries, self.max_idle_bytes);
        Ok(mapping)
    }

    /// Drops every mapping no view uses (when the peers that sent them are gone).
    pub(crate) fn forget_idle(&self) {
        let mut entries = self.entries.lock().expect("mapping cache lock");
        entries.retain(|_, e| Arc::strong_count(&e.mapping) > 1);
    }

    /// Bytes mapped now.
    pub(crate) fn mapped_bytes(&self) -> usize {
        let entries = self.entries.lock().expect("mapping cache lock");
        entries.values().map(|e| e.mapping.size()).sum()
    }
}

/// Evicts least recently used mappings that no view holds, down to `max_idle_bytes` idle.
fn evict(entries: &mut HashMap<(u64, u64), Entry>, max_idle_bytes: usize) {
    let mut idle: Vec<((u64, u64), u64, usize)> = entries
        .iter()
        .filter(|(_, e)| Arc::strong_count(&e.mapping) == 1)
        .map(|(k, e)| (*k, e.last_used, e.mapping.size()))
        .collect();
    let mut idle_bytes: usize = idle.iter().map(|i| i.2).sum();
    idle.sort_by_key(|i| i.1);
    for (key, _, size) in idle {
        if idle_bytes <= max_idle_bytes {
            break;
        }
        entries.remove(&key);
        idle_bytes -= size;
    }
}

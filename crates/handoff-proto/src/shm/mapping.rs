//! The receiving side of shared memory: read-only mappings of peers' segments, kept
//! per segment (by device and inode) so that a reused segment is not mapped — and
//! faulted in — again.
//!
//! A received segment must be sealed against shrinking (spec §7.2), so no read of a
//! mapping can fault. A small window of a much larger segment is mapped alone (its pages
//! only), so that a peer cannot make this process map terabytes of sparse segments.
//!
//! A mapping keeps no descriptor: a mapped file stays mapped after its descriptor is closed,
//! and the cache finds a segment again by its (device, inode). So received frames held by
//! the thousand cost no descriptors. The only use of a received segment's descriptor is to
//! pass the segment on to a third node with no copy (forwarding); for that the cache keeps
//! the descriptors of the [`FORWARDABLE`] segments received last, and a buffer of an older
//! one is copied when it is forwarded.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapMut, MmapOptions};
use rustix::fs::SealFlags;

/// Received segments whose descriptors the cache keeps, so that their buffers can be
/// forwarded with no copy: the ones received last.
pub const FORWARDABLE: usize = 64;

/// How a segment is mapped here.
enum Map {
    /// Shared and read-only: the segment's own pages (kept in the cache for reuse).
    Shared(Mmap),
    /// Private and writable (copy-on-write): the receiver may write, its writes go to pages
    /// of its own and never reach the segment; made for one frame and never reused.
    Private(MmapMut),
}

impl Map {
    fn as_ptr(&self) -> *const u8 {
        match self {
            Map::Shared(m) => m.as_ptr(),
            Map::Private(m) => m.as_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Map::Shared(m) => m.len(),
            Map::Private(m) => m.len(),
        }
    }
}

/// A peer's segment, or the part of it around a window, mapped into this process:
/// read-only and shared, or private and writable ([`MappingCache::map_private`]).
pub struct Mapping {
    /// The segment's descriptor while it is among the [`FORWARDABLE`] received last.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    map: Map,
    inode: (u64, u64),
    sealed: bool,
    /// Size of the whole segment.
    segment_size: u64,
    /// Where the mapping starts in the segment.
    file_offset: u64,
}

impl Mapping {
    fn new(map: Map, inode: (u64, u64), sealed: bool, segment_size: u64, file_offset: u64) -> Arc<Mapping> {
        Arc::new(Mapping {
            fd: Mutex::new(None),
            map,
            inode,
            sealed,
            segment_size,
            file_offset,
        })
    }

    /// The segment's memfd, to pass the segment on, while the cache keeps it (see
    /// [`FORWARDABLE`]); `None` once it was closed.
    pub fn fd(&self) -> Option<Arc<OwnedFd>> {
        self.fd.lock().expect("mapping fd lock").clone()
    }

    /// The first mapped byte (byte `file_offset` of the segment).
    pub fn base(&self) -> *const u8 {
        self.map.as_ptr()
    }

    /// Whether the mapping is private and writable: the one holder of a view of it may
    /// write through it, and its writes stay in this process.
    pub fn writable(&self) -> bool {
        matches!(self.map, Map::Private(_))
    }

    /// Bytes mapped.
    #[allow(clippy::len_without_is_empty)] // a mapping is never empty
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Size of the whole segment.
    pub fn segment_size(&self) -> usize {
        self.segment_size as usize
    }

    /// Where the mapping starts in the segment.
    pub fn file_offset(&self) -> usize {
        self.file_offset as usize
    }

    /// The segment's (device, inode): its identity, however it reached us.
    pub fn inode(&self) -> (u64, u64) {
        self.inode
    }

    /// Whether the segment is sealed against writes (its bytes can no longer change).
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    fn covers(&self, offset: u64, len: u64) -> bool {
        offset >= self.file_offset && offset + len <= self.file_offset + self.map.len() as u64
    }
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapping({} bytes)", self.len())
    }
}

/// Why a received segment was refused.
#[derive(Debug)]
pub struct MapError(pub String);

struct Entry {
    mapping: Arc<Mapping>,
    last_used: u64,
    /// When a sweep first found no view using it ([`MappingCache::forget_idle_for`]).
    idle_since: Option<Instant>,
}

/// Mappings of received segments, reused while the segment lives.
pub struct MappingCache {
    entries: Mutex<HashMap<(u64, u64), Vec<Entry>>>,
    tick: AtomicU64,
    max_idle_bytes: usize,
    /// Mappings that keep their segment's descriptor, oldest first (at most [`FORWARDABLE`]).
    with_fds: Mutex<VecDeque<Weak<Mapping>>>,
}

/// Every received segment must carry this seal (spec §7.2 rule 1).
const SEAL_NEEDED: SealFlags = SealFlags::SHRINK;
/// A segment said to be sealed must carry these (rule 2).
const SEALS_FOR_SEALED: SealFlags = SealFlags::WRITE.union(SealFlags::SHRINK).union(SealFlags::GROW);
/// A window this much smaller than its segment is mapped alone.
const WHOLE_SEGMENT_SLACK: u64 = 1 << 20;

fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// The part of a segment of `size` bytes to map for the window `offset .. offset + len`:
/// the whole segment unless it is much larger than the window (spec §7.2 step 4).
fn span(size: u64, offset: u64, len: u64) -> (u64, u64) {
    if size <= 2 * len + WHOLE_SEGMENT_SLACK {
        return (0, size);
    }
    let page = page_size();
    let start = offset / page * page;
    let end = (offset + len).div_ceil(page) * page;
    (start, end.min(size).max(start + 1) - start)
}

impl MappingCache {
    /// A cache that keeps at most `max_idle_bytes` of mappings no buffer uses any more.
    pub fn new(max_idle_bytes: usize) -> MappingCache {
        MappingCache {
            entries: Mutex::default(),
            tick: AtomicU64::new(0),
            max_idle_bytes,
            with_fds: Mutex::default(),
        }
    }

    /// Lets `mapping` keep `fd` for forwarding, closing the descriptor of the mapping that
    /// kept one longest once more than [`FORWARDABLE`] do.
    fn keep_fd(&self, mapping: &Arc<Mapping>, fd: OwnedFd) {
        {
            let mut slot = mapping.fd.lock().expect("mapping fd lock");
            if slot.is_some() {
                return;
            }
            *slot = Some(Arc::new(fd));
        }
        let mut kept = self.with_fds.lock().expect("mapping fds lock");
        kept.push_back(Arc::downgrade(mapping));
        while kept.len() > FORWARDABLE {
            if let Some(oldest) = kept.pop_front().and_then(|w| w.upgrade()) {
                oldest.fd.lock().expect("mapping fd lock").take();
            }
        }
    }

    /// Maps the window `offset .. offset + len` of the segment behind `fd` (or reuses a
    /// mapping that covers it), after the checks of spec §7.2: seals, then size. Returns
    /// the mapping and where the window starts in it.
    pub fn map(
        &self,
        fd: OwnedFd,
        size: u64,
        sealed: bool,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Mapping>, usize), MapError> {
        let inode = checked(&fd, size, sealed)?;
        self.map_checked(fd, inode, size, sealed, offset, len)
    }

    /// Maps the window `offset .. offset + len` of the segment behind `fd` private and
    /// writable (copy-on-write), after the same checks as [`map`](Self::map): a mapping of
    /// the window's pages for this one frame, never shared with another frame nor reused,
    /// so that the receiver's writes reach neither the segment nor any later frame in it.
    /// The descriptor is closed here (such a frame is copied if it is passed on).
    pub fn map_private(
        &self,
        fd: OwnedFd,
        size: u64,
        sealed: bool,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Mapping>, usize), MapError> {
        let inode = checked(&fd, size, sealed)?;
        let page = page_size();
        let start = offset / page * page;
        let end = ((offset + len).div_ceil(page) * page).min(size).max(start + 1);
        // SAFETY: a private mapping of a file sealed against shrinking, within the size we
        // checked: no part of it can disappear while it is mapped; our writes go to pages of
        // our own (copy-on-write) and never to the file.
        let map = unsafe {
            MmapOptions::new()
                .offset(start)
                .len((end - start) as usize)
                .map_copy(&fd)
        }
        .map_err(|e| MapError(format!("cannot map the received segment privately: {e}")))?;
        let mapping = Mapping::new(Map::Private(map), inode, sealed, size, start);
        Ok((mapping, (offset - start) as usize))
    }

    fn map_checked(
        &self,
        fd: OwnedFd,
        inode: (u64, u64),
        size: u64,
        sealed: bool,
        offset: u64,
        len: u64,
    ) -> Result<(Arc<Mapping>, usize), MapError> {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().expect("mapping cache lock");
        if let Some(list) = entries.get_mut(&inode) {
            let reuse = list.iter_mut().find(|e| {
                e.mapping.segment_size == size && (e.mapping.sealed || !sealed) && e.mapping.covers(offset, len)
            });
            if let Some(entry) = reuse {
                entry.last_used = tick;
                entry.idle_since = None;
                let at = (offset - entry.mapping.file_offset) as usize;
                let mapping = entry.mapping.clone();
                drop(entries);
                self.keep_fd(&mapping, fd);
                return Ok((mapping, at));
            }
        }
        let (start, map_len) = span(size, offset, len);
        // SAFETY: a read-only shared mapping of a file sealed against shrinking, within the
        // size we checked: no part of it can disappear while it is mapped (closing the
        // descriptor later does not unmap it).
        let map = unsafe { MmapOptions::new().offset(start).len(map_len as usize).map(&fd) }
            .map_err(|e| MapError(format!("cannot map the received segment: {e}")))?;
        let mapping = Mapping::new(Map::Shared(map), inode, sealed, size, start);
        entries.entry(inode).or_default().push(Entry {
            mapping: mapping.clone(),
            last_used: tick,
            idle_since: None,
        });
        evict(&mut entries, self.max_idle_bytes);
        drop(entries);
        self.keep_fd(&mapping, fd);
        Ok((mapping, (offset - start) as usize))
    }
}

/// The checks of spec §7.2 on a received segment (seals, then size); its (device, inode).
fn checked(fd: &OwnedFd, size: u64, sealed: bool) -> Result<(u64, u64), MapError> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| {
        MapError(format!(
            "the received descriptor is not a sealable shared-memory file (F_GET_SEALS: {e}); \
                 segments must be memfds sealed against shrinking"
        ))
    })?;
    if !seals.contains(SEAL_NEEDED) {
        return Err(MapError(format!(
            "the received segment is not sealed against shrinking (its seals are {seals:?}); \
                 a sender must add F_SEAL_SHRINK before passing a segment"
        )));
    }
    if sealed && !seals.contains(SEALS_FOR_SEALED) {
        return Err(MapError(format!(
            "the descriptor claims a sealed segment, but its seals are {seals:?}"
        )));
    }
    let st = rustix::fs::fstat(fd).map_err(|e| MapError(format!("cannot stat the received descriptor: {e}")))?;
    if st.st_size as u64 != size {
        return Err(MapError(format!(
            "the descriptor says the segment has {size} bytes, the received file has {}",
            st.st_size
        )));
    }
    if size == 0 {
        return Err(MapError("an empty shared segment".into()));
    }
    // The same `fstat` names the segment (device and inode): one system call, not two.
    Ok((st.st_dev, st.st_ino))
}

impl MappingCache {
    /// Drops every mapping no view uses (when the peers that sent them are gone).
    pub fn forget_idle(&self) {
        let mut entries = self.entries.lock().expect("mapping cache lock");
        for list in entries.values_mut() {
            list.retain(|e| Arc::strong_count(&e.mapping) > 1);
        }
        entries.retain(|_, list| !list.is_empty());
    }

    /// Drops the mappings no view has used for `keep` or longer at `now`, as far as the
    /// sweeps can tell (a mapping is idle from the first sweep that finds no view using it);
    /// whether idle mappings are left (then sweep again). A driver calls it from a timer, as
    /// the Python implementation's mapping cache does with `HANDOFF_SHM_KEEP_SECONDS`.
    pub fn forget_idle_for(&self, now: Instant, keep: Duration) -> bool {
        let mut entries = self.entries.lock().expect("mapping cache lock");
        let mut left = false;
        for list in entries.values_mut() {
            list.retain_mut(|e| {
                if Arc::strong_count(&e.mapping) > 1 {
                    e.idle_since = None;
                    return true;
                }
                let since = *e.idle_since.get_or_insert(now);
                let keep_it = now.saturating_duration_since(since) < keep;
                left |= keep_it;
                keep_it
            });
        }
        entries.retain(|_, list| !list.is_empty());
        left
    }

    /// The most bytes of idle mappings this cache keeps (what it was made with).
    pub fn max_idle_bytes(&self) -> usize {
        self.max_idle_bytes
    }

    /// Bytes mapped that no view uses (kept for reuse).
    pub fn idle_bytes(&self) -> usize {
        let entries = self.entries.lock().expect("mapping cache lock");
        entries
            .values()
            .flatten()
            .filter(|e| Arc::strong_count(&e.mapping) == 1)
            .map(|e| e.mapping.len())
            .sum()
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> usize {
        let entries = self.entries.lock().expect("mapping cache lock");
        entries.values().flatten().map(|e| e.mapping.len()).sum()
    }
}

/// Evicts least recently used mappings that no view holds, down to `max_idle_bytes` idle.
fn evict(entries: &mut HashMap<(u64, u64), Vec<Entry>>, max_idle_bytes: usize) {
    let mut idle: Vec<((u64, u64), u64, usize, u64)> = entries
        .iter()
        .flat_map(|(k, list)| {
            list.iter()
                .filter(|e| Arc::strong_count(&e.mapping) == 1)
                .map(move |e| (*k, e.last_used, e.mapping.len(), e.mapping.file_offset))
        })
        .collect();
    let mut idle_bytes: usize = idle.iter().map(|i| i.2).sum();
    idle.sort_by_key(|i| i.1);
    for (key, _, len, file_offset) in idle {
        if idle_bytes <= max_idle_bytes {
            break;
        }
        if let Some(list) = entries.get_mut(&key) {
            list.retain(|e| {
                !(Arc::strong_count(&e.mapping) == 1 && e.mapping.file_offset == file_offset && e.mapping.len() == len)
            });
            if list.is_empty() {
                entries.remove(&key);
            }
        }
        idle_bytes -= len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_window_of_a_huge_segment_maps_its_pages_only() {
        let page = page_size();
        assert_eq!(span(1 << 20, 0, 1 << 20), (0, 1 << 20), "a frame filling its segment");
        assert_eq!(
            span(128 << 10, 10, 64 << 10),
            (0, 128 << 10),
            "a pooled segment, twice the frame"
        );
        assert_eq!(
            span(1 << 40, 5 * page + 3, 1),
            (5 * page, page),
            "one byte of a terabyte"
        );
        let (start, len) = span(1 << 40, page - 1, 2);
        assert_eq!((start, len), (0, 2 * page), "a window across a page boundary");
    }

    /// A memfd of `size` bytes holding `fill`, sealed against shrinking (as senders pass).
    fn segment(size: usize, fill: u8) -> OwnedFd {
        use rustix::fs::MemfdFlags;
        let fd = rustix::fs::memfd_create("test-segment", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, size as u64).unwrap();
        rustix::io::pwrite(&fd, &vec![fill; size], 0).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
        fd
    }

    fn dup(fd: &OwnedFd) -> OwnedFd {
        rustix::io::fcntl_dupfd_cloexec(fd, 0).unwrap()
    }

    #[test]
    fn a_private_mapping_takes_writes_that_reach_neither_the_segment_nor_the_next_frame() {
        let cache = MappingCache::new(1 << 30);
        let fd = segment(3 * 4096, 7);
        let (first, at) = cache.map_private(dup(&fd), 3 * 4096, false, 4096 + 10, 100).unwrap();
        assert!(first.writable());
        // SAFETY: a private mapping of ours, `at + 100` within it.
        unsafe { std::ptr::write_bytes(first.base().add(at) as *mut u8, 9, 100) };
        // The segment keeps its bytes: what the sender and any later frame see.
        let mut back = [0u8; 100];
        rustix::io::pread(&fd, &mut back, 4096 + 10).unwrap();
        assert_eq!(back, [7u8; 100], "a write went to the segment");
        let (second, at2) = cache.map_private(dup(&fd), 3 * 4096, false, 4096 + 10, 100).unwrap();
        // SAFETY: within the mapping just made.
        let seen = unsafe { std::slice::from_raw_parts(second.base().add(at2), 100) };
        assert_eq!(seen, [7u8; 100], "the next frame saw the first one's writes");
        assert_eq!(cache.mapped_bytes(), 0, "private mappings are not kept for reuse");
        // A shared mapping of the same window is read-only, and cached.
        let (shared, _) = cache.map(dup(&fd), 3 * 4096, false, 4096 + 10, 100).unwrap();
        assert!(!shared.writable() && cache.mapped_bytes() > 0);
    }

    #[test]
    fn a_private_mapping_is_refused_as_a_shared_one_is() {
        let cache = MappingCache::new(1 << 30);
        let fd = segment(4096, 1);
        let err = cache.map_private(dup(&fd), 8192, false, 0, 10).unwrap_err();
        assert!(err.0.contains("the received file has 4096"), "{}", err.0);
        let err = cache.map_private(dup(&fd), 4096, true, 0, 10).unwrap_err();
        assert!(err.0.contains("claims a sealed segment"), "{}", err.0);
    }

    #[test]
    fn a_mapping_no_view_uses_is_forgotten_after_the_keep_time() {
        let cache = MappingCache::new(1 << 30);
        let fd = segment(64 << 10, 1);
        let (view, _) = cache.map(dup(&fd), 64 << 10, false, 0, 100).unwrap();
        let keep = Duration::from_secs(10);
        let t0 = Instant::now();
        assert!(!cache.forget_idle_for(t0, keep), "in use: nothing idle");
        drop(view);
        assert!(cache.forget_idle_for(t0, keep), "idle from this sweep on");
        assert!(cache.forget_idle_for(t0 + keep / 2, keep), "kept until its time");
        assert_eq!(cache.mapped_bytes(), 64 << 10);
        assert!(!cache.forget_idle_for(t0 + keep, keep), "then forgotten");
        assert_eq!(cache.mapped_bytes(), 0);
    }
}

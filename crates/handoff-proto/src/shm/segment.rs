//! Shared-memory segments (memfd) and the pool that reuses them.
//!
//! Fresh memfd pages fault at 0.5–1.6 GB/s on these machines, so segments are kept
//! and reused: a segment returns to the pool when the last holder (local buffers,
//! leases held for peers) lets go of it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use memmap2::{MmapMut, MmapOptions};
use rustix::fs::{MemfdFlags, SealFlags};

/// Smallest segment the pool creates.
pub const MIN_SEGMENT: usize = 64 * 1024;

/// Most idle segments the pool keeps, whatever their bytes: each keeps its descriptor open
/// (a memfd cannot be reopened once its last one is closed), so this bounds what the pool's
/// idle segments cost the process's descriptor table.
pub const MAX_IDLE_SEGMENTS: usize = 64;

/// The memory of one segment: its memfd and a writable mapping of it.
pub struct SegmentData {
    id: u64,
    file: File,
    map: MmapMut,
    inode: (u64, u64),
}

impl SegmentData {
    fn create(id: u64, size: usize) -> std::io::Result<SegmentData> {
        let fd = rustix::fs::memfd_create("handoff-segment", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, size as u64)?;
        // Receivers refuse segments that could shrink under their mapping (spec §7.2): a
        // pooled segment keeps its size for life, so it loses nothing and stays writable.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
        let inode = inode_of(fd.as_fd())?;
        let file = File::from(fd);
        // SAFETY: the memfd is ours and sized above; the mapping lives as long as `file`.
        let map = unsafe { MmapOptions::new().len(size).map_mut(&file)? };
        Ok(SegmentData { id, file, map, inode })
    }

    fn size(&self) -> usize {
        self.map.len()
    }
}

/// Device and inode of a file: the identity of a shared segment across processes.
pub fn inode_of(fd: BorrowedFd<'_>) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// A pooled segment; shared by everything that holds views of it.
pub struct Segment {
    data: Option<SegmentData>,
    pool: Weak<SegmentPool>,
    /// Never reused: a peer that may still map it outlived the lease on it.
    retired: std::sync::atomic::AtomicBool,
}

impl Segment {
    fn data(&self) -> &SegmentData {
        self.data.as_ref().expect("a live segment has its data")
    }

    /// Keeps the segment out of the pool when its last holder lets go: a peer that may still
    /// map it (its connection closed with the lease outstanding, its process alive) would
    /// see the next sender's bytes in what it holds. The memory goes when the peer unmaps.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Id of the segment, unique in this process.
    pub fn id(&self) -> u64 {
        self.data().id
    }

    /// Size of the segment in bytes.
    pub fn size(&self) -> usize {
        self.data().size()
    }

    /// The segment's memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.data().file.as_fd()
    }

    /// The segment's (device, inode).
    pub fn inode(&self) -> (u64, u64) {
        self.data().inode
    }

    /// The first byte of the writable mapping.
    pub fn base(&self) -> *mut u8 {
        self.data().map.as_ptr() as *mut u8
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let (Some(data), Some(pool)) = (self.data.take(), self.pool.upgrade()) {
            if self.retired.load(Ordering::Acquire) {
                pool.retire(data);
            } else {
                pool.give_back(data);
            }
        }
    }
}

#[derive(Default)]
struct PoolState {
    /// Idle segments by size, each with when it became idle.
    free: BTreeMap<usize, Vec<(SegmentData, Instant)>>,
    idle_bytes: usize,
    segments: usize,
    bytes: usize,
    created: u64,
    reused: u64,
    retired: u64,
}

/// What the pool holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Segments alive (idle or in use).
    pub segments: usize,
    /// Bytes of all live segments.
    pub bytes: usize,
    /// Segments waiting for reuse.
    pub idle_segments: usize,
    /// Bytes of idle segments.
    pub idle_bytes: usize,
    /// Segments created since the process started.
    #[serde(default)]
    pub created: u64,
    /// Times an idle segment was taken again.
    #[serde(default)]
    pub reused: u64,
    /// Segments given back when the pool held as many idle bytes as it keeps (closed).
    #[serde(default)]
    pub retired: u64,
}

/// The process's pool of shared-memory segments.
pub struct SegmentPool {
    state: Mutex<PoolState>,
    max_idle_bytes: AtomicU64,
    next_id: AtomicU64,
    me: Weak<SegmentPool>,
}

impl SegmentPool {
    /// A pool that keeps at most `max_idle_bytes` of idle segments.
    pub fn new(max_idle_bytes: usize) -> Arc<SegmentPool> {
        Arc::new_cyclic(|me| SegmentPool {
            state: Mutex::default(),
            max_idle_bytes: AtomicU64::new(max_idle_bytes as u64),
            next_id: AtomicU64::new(1),
            me: me.clone(),
        })
    }

    /// The process-wide pool (idle cap from `HANDOFF_SHM_POOL_BYTES`, default 4 GiB).
    pub fn global() -> &'static Arc<SegmentPool> {
        static POOL: OnceLock<Arc<SegmentPool>> = OnceLock::new();
        POOL.get_or_init(|| {
            let cap = std::env::var("HANDOFF_SHM_POOL_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(4usize << 30);
            SegmentPool::new(cap)
        })
    }

    /// Changes how many idle bytes the pool keeps.
    pub fn set_max_idle_bytes(&self, bytes: usize) {
        self.max_idle_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    /// A segment of at least `len` bytes: an idle one if one fits, else a new one.
    pub fn take(&self, len: usize) -> std::io::Result<Arc<Segment>> {
        let class = len.max(MIN_SEGMENT).next_power_of_two();
        let reused = {
            let mut state = self.state.lock().expect("pool lock");
            let found = state.free.get_mut(&class).and_then(Vec::pop).map(|(d, _)| d);
            if let Some(d) = &found {
                state.idle_bytes -= d.size();
                state.reused += 1;
            }
            found
        };
        let data = match reused {
            Some(d) => d,
            None => {
                let d = SegmentData::create(self.next_id.fetch_add(1, Ordering::Relaxed), class)?;
                let mut state = self.state.lock().expect("pool lock");
                state.segments += 1;
                state.bytes += class;
                state.created += 1;
                d
            }
        };
        Ok(Arc::new(Segment {
            data: Some(data),
            pool: self.me.clone(),
            retired: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// A segment that must not be reused: counted out (its memfd is closed here; a peer's
    /// mapping keeps the memory until it unmaps).
    fn retire(&self, data: SegmentData) {
        let mut state = self.state.lock().expect("pool lock");
        state.segments -= 1;
        state.bytes -= data.size();
        state.retired += 1;
    }

    fn give_back(&self, data: SegmentData) {
        let mut state = self.state.lock().expect("pool lock");
        let size = data.size();
        if (state.idle_bytes + size) as u64 <= self.max_idle_bytes.load(Ordering::Relaxed) {
            // At the count bound, the segment idle longest makes room (a large warm segment
            // given back is worth more than an old one of any size).
            if state.free.values().map(Vec::len).sum::<usize>() >= MAX_IDLE_SEGMENTS {
                Self::close_oldest_idle(&mut state);
            }
            state.idle_bytes += size;
            state.free.entry(size).or_default().push((data, Instant::now()));
        } else {
            state.segments -= 1;
            state.bytes -= size;
            state.retired += 1;
        }
    }

    /// Closes the segment idle longest (its descriptor and, once no peer maps it, its memory).
    fn close_oldest_idle(state: &mut PoolState) {
        let oldest = state
            .free
            .iter()
            .flat_map(|(&size, list)| list.iter().enumerate().map(move |(i, (_, since))| (*since, size, i)))
            .min();
        let Some((_, size, i)) = oldest else { return };
        if let Some(list) = state.free.get_mut(&size) {
            drop(list.remove(i));
            if list.is_empty() {
                state.free.remove(&size);
            }
        }
        state.idle_bytes -= size;
        state.segments -= 1;
        state.bytes -= size;
        state.retired += 1;
    }

    /// Counts of live and idle segments.
    pub fn stats(&self) -> PoolStats {
        let state = self.state.lock().expect("pool lock");
        PoolStats {
            segments: state.segments,
            bytes: state.bytes,
            idle_segments: state.free.values().map(Vec::len).sum(),
            idle_bytes: state.idle_bytes,
            created: state.created,
            reused: state.reused,
            retired: state.retired,
        }
    }

    /// Retires the segments idle for `idle` or longer at `now` (their memory goes back to
    /// the host); when the next idle one is due, if any is left. A driver calls it from a
    /// timer, as the Python implementation's pool does with `HANDOFF_SHM_POOL_IDLE_SECONDS`.
    pub fn retire_idle(&self, now: Instant, idle: Duration) -> Option<Instant> {
        let mut state = self.state.lock().expect("pool lock");
        let mut next: Option<Instant> = None;
        let mut retired = Vec::new();
        for list in state.free.values_mut() {
            list.retain_mut(|(data, since)| {
                let due = *since + idle;
                if due <= now {
                    retired.push(data.size());
                    false
                } else {
                    next = Some(next.map_or(due, |n| n.min(due)));
                    true
                }
            });
        }
        state.free.retain(|_, list| !list.is_empty());
        for size in retired {
            state.idle_bytes -= size;
            state.segments -= 1;
            state.bytes -= size;
            state.retired += 1;
        }
        next
    }

    /// Whether the segment with this id is idle in the pool (returned by every holder).
    pub fn is_idle(&self, id: u64) -> bool {
        let state = self.state.lock().expect("pool lock");
        state.free.values().flatten().any(|(d, _)| d.id == id)
    }
}

/// A fresh memfd holding a copy of `data`, sealed against writes, shrinking and growing
/// (for peers that must never see the bytes change).
pub fn sealed_copy(data: &[u8]) -> std::io::Result<SealedSegment> {
    let fd = rustix::fs::memfd_create("handoff-sealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut written = 0;
    while written < data.len() {
        written += rustix::io::write(&fd, &data[written..])?;
    }
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )?;
    Ok(SealedSegment { fd, size: data.len() })
}

/// A sealed, unpooled segment; freed when its last holder drops it.
pub struct SealedSegment {
    /// The sealed memfd.
    pub fd: OwnedFd,
    /// Bytes in the segment.
    pub size: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_at_most_its_bound_of_idle_segments_and_their_descriptors() {
        let pool = SegmentPool::new(1 << 30);
        let taken: Vec<_> = (0..MAX_IDLE_SEGMENTS + 6).map(|_| pool.take(1).unwrap()).collect();
        assert_eq!(pool.stats().segments, MAX_IDLE_SEGMENTS + 6);
        drop(taken);
        let s = pool.stats();
        assert_eq!(
            s.idle_segments, MAX_IDLE_SEGMENTS,
            "far below the byte bound, the count bound holds"
        );
        assert_eq!((s.segments, s.retired), (MAX_IDLE_SEGMENTS, 6), "the rest are closed");
    }

    #[test]
    fn at_the_count_bound_the_segment_idle_longest_makes_room() {
        let pool = SegmentPool::new(1 << 30);
        let small: Vec<_> = (0..MAX_IDLE_SEGMENTS).map(|_| pool.take(1).unwrap()).collect();
        drop(small);
        let large = pool.take(8 << 20).unwrap();
        let id = large.id();
        drop(large);
        assert!(pool.is_idle(id), "the large segment given back last is kept");
        let s = pool.stats();
        assert_eq!(
            (s.idle_segments, s.retired),
            (MAX_IDLE_SEGMENTS, 1),
            "one small one closed"
        );
        assert_eq!(s.idle_bytes, (MAX_IDLE_SEGMENTS - 1) * MIN_SEGMENT + (8 << 20));
        assert_eq!(pool.take(8 << 20).unwrap().id(), id, "and reused");
    }

    #[test]
    fn a_retired_segment_never_goes_back_to_the_pool() {
        let pool = SegmentPool::new(1 << 30);
        let first = pool.take(100_000).unwrap();
        let id = first.id();
        drop(first);
        assert!(pool.is_idle(id), "a segment let go of is idle, to be reused");
        let again = pool.take(100_000).unwrap();
        assert_eq!(again.id(), id, "reused");
        again.retire();
        drop(again);
        let stats = pool.stats();
        assert!(!pool.is_idle(id), "a retired segment is not idle");
        assert_eq!((stats.segments, stats.retired, stats.reused), (0, 1, 1));
        assert_ne!(pool.take(100_000).unwrap().id(), id, "and never handed out again");
    }

    #[test]
    fn idle_segments_are_retired_after_their_idle_time() {
        let pool = SegmentPool::new(1 << 30);
        let (a, b) = (pool.take(100_000).unwrap(), pool.take(300_000).unwrap());
        drop(a);
        let t0 = Instant::now();
        drop(b);
        let idle = Duration::from_secs(10);
        let next = pool.retire_idle(t0, idle).expect("both idle, neither due");
        assert!(next >= t0 + Duration::from_secs(9), "due after its idle time");
        assert_eq!(pool.stats().idle_segments, 2);
        let in_use = pool.take(100_000).unwrap(); // taken again: not idle any more
        assert_eq!(
            pool.retire_idle(Instant::now() + idle * 2, idle),
            None,
            "the idle one retired"
        );
        let stats = pool.stats();
        assert_eq!((stats.segments, stats.idle_segments, stats.idle_bytes), (1, 0, 0));
        drop(in_use);
        assert_eq!(pool.stats().idle_segments, 1, "and the one in use is idle anew");
    }
}

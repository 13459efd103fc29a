//! Buffers that are views of shared segments: a local segment filled in place
//! ([`SharedBufMut`]), a peer's segment mapped here ([`RemoteView`]), where a buffer's
//! bytes live ([`ShmOrigin`], [`segment_info`]), and what a sender holds and passes for a
//! peer ([`Held`], [`PassFd`]).

use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use handoff_wire::Buffer;

use super::{Mapping, SealedSegment, Segment, SegmentPool};

/// What a received view runs when it is dropped: the driver sends the lease's `release`.
pub type Release = Arc<dyn Fn(u64) + Send + Sync>;

/// Where a shared buffer's bytes live (the `Origin` the runtime records in a `Buffer`).
pub enum ShmOrigin {
    /// A segment of this process's pool.
    Local(Arc<Segment>),
    /// A peer's segment mapped here.
    Remote(Arc<Mapping>),
    /// A segment the application made and filled itself.
    App(Arc<AppSegment>),
}

/// A segment's descriptor, held open while it is passed to a peer.
pub enum PassFd {
    /// A segment of our pool.
    Local(Arc<Segment>),
    /// A received segment among those the mapping cache keeps a descriptor of.
    Received(Arc<OwnedFd>),
    /// A sealed copy.
    Sealed(Arc<SealedSegment>),
    /// A segment of the application's.
    App(Arc<AppSegment>),
}

impl PassFd {
    /// The descriptor, to pass.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            PassFd::Local(s) => s.fd(),
            PassFd::Received(fd) => fd.as_fd(),
            PassFd::Sealed(s) => s.fd.as_fd(),
            PassFd::App(s) => s.fd.as_fd(),
        }
    }
}

/// What runs when the last lease on an [`AppSegment`] ends: `true` when the segment may be
/// written again (every receiver released it, or exited), `false` when a receiver that may
/// still map it outlived its lease (the connection closed): then it must never be written.
pub type SegmentEnded = Box<dyn FnOnce(bool) + Send + Sync>;

/// A segment an application made and filled itself (a Python `ShmBuffer`, say), sent as it
/// is, with no copy: a descriptor of its own, the segment's size, seals and identity, where
/// this process maps it, and what runs when the last lease on it ends.
pub struct AppSegment {
    fd: Arc<OwnedFd>,
    size: usize,
    sealed: bool,
    inode: (u64, u64),
    /// The address of the segment's first byte in this process's mapping of it.
    base: usize,
    /// How many bytes of the segment that mapping covers.
    mapped_len: usize,
    retired: std::sync::atomic::AtomicBool,
    ended: std::sync::Mutex<Option<SegmentEnded>>,
}

impl AppSegment {
    /// The segment behind `fd` (a descriptor of its own: dup it first), of which `mapped`
    /// is this process's mapping from the segment's first byte; `sealed` if it says it is
    /// sealed against writes. Refused, with why, unless it carries the seals a receiver
    /// requires (spec §7.2: `F_SEAL_SHRINK` always, `F_SEAL_WRITE` and `F_SEAL_GROW` too when
    /// sealed) and its size covers the mapping: no node sends what a peer must refuse.
    pub fn new(
        fd: OwnedFd,
        mapped: &[u8],
        sealed: bool,
        ended: Option<SegmentEnded>,
    ) -> Result<Arc<AppSegment>, String> {
        AppSegment::sharing(Arc::new(fd), mapped, sealed, ended)
    }

    /// As [`AppSegment::new`], with a descriptor that other segments share (an arena lends
    /// many windows of one memfd, each with its own `ended`, and one descriptor).
    pub fn sharing(
        fd: Arc<OwnedFd>,
        mapped: &[u8],
        sealed: bool,
        ended: Option<SegmentEnded>,
    ) -> Result<Arc<AppSegment>, String> {
        use rustix::fs::SealFlags;
        let seals = rustix::fs::fcntl_get_seals(&*fd).map_err(|e| format!("reading the segment's seals: {e}"))?;
        let needed = match sealed {
            true => SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE,
            false => SealFlags::SHRINK,
        };
        if !seals.contains(needed) {
            return Err(format!(
                "the segment lacks the seals a receiver requires (it has {seals:?}, needs {needed:?})"
            ));
        }
        let st = rustix::fs::fstat(&*fd).map_err(|e| format!("reading the segment's size: {e}"))?;
        let size = usize::try_from(st.st_size).unwrap_or(0);
        if mapped.len() > size {
            return Err(format!("a mapping of {} bytes of a segment of {size}", mapped.len()));
        }
        Ok(Arc::new(AppSegment {
            fd,
            size,
            sealed,
            inode: (st.st_dev, st.st_ino),
            base: mapped.as_ptr() as usize,
            mapped_len: mapped.len(),
            retired: std::sync::atomic::AtomicBool::new(false),
            ended: std::sync::Mutex::new(ended),
        }))
    }

    /// A receiver that may still map the segment outlived its lease: it must never be
    /// written again (see [`SegmentEnded`]).
    pub fn retire(&self) {
        self.retired.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for AppSegment {
    fn drop(&mut self) {
        let ended = self
            .ended
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(ended) = ended {
            ended(!self.retired.load(std::sync::atomic::Ordering::Acquire));
        }
    }
}

/// A buffer over `bytes`, which lie in the application's `segment` (a view of its mapping):
/// a same-host send passes the segment's descriptor instead of copying them. `None` if the
/// bytes do not lie in the segment's mapping.
pub fn app_buffer(bytes: Bytes, segment: Arc<AppSegment>) -> Option<Buffer> {
    let start = bytes.as_ptr() as usize;
    let inside = start >= segment.base && start + bytes.len() <= segment.base + segment.mapped_len;
    inside.then(|| Buffer::with_origin(bytes, Arc::new(ShmOrigin::App(segment))))
}

impl ShmOrigin {
    /// The segment's descriptor, if it can be passed on: always for ours; for a received
    /// one while the mapping cache keeps its descriptor (else it is copied to be forwarded).
    pub fn pass_fd(&self) -> Option<PassFd> {
        match self {
            ShmOrigin::Local(s) => Some(PassFd::Local(s.clone())),
            ShmOrigin::Remote(m) => m.fd().map(PassFd::Received),
            ShmOrigin::App(s) => Some(PassFd::App(s.clone())),
        }
    }

    /// The first byte mapped here, and where it lies in the segment.
    fn base(&self) -> (*const u8, usize) {
        match self {
            ShmOrigin::Local(s) => (s.base(), 0),
            ShmOrigin::Remote(m) => (m.base(), m.file_offset()),
            ShmOrigin::App(s) => (s.base as *const u8, 0),
        }
    }

    /// Bytes of the segment mapped here (a received window may be mapped alone).
    fn mapped_len(&self) -> usize {
        match self {
            ShmOrigin::Local(s) => s.size(),
            ShmOrigin::Remote(m) => m.len(),
            ShmOrigin::App(s) => s.mapped_len,
        }
    }

    /// Size of the whole segment.
    pub fn size(&self) -> usize {
        match self {
            ShmOrigin::Local(s) => s.size(),
            ShmOrigin::Remote(m) => m.segment_size(),
            ShmOrigin::App(s) => s.size,
        }
    }

    /// Whether the segment is sealed against change.
    pub fn sealed(&self) -> bool {
        match self {
            ShmOrigin::Local(_) => false,
            ShmOrigin::Remote(m) => m.sealed(),
            ShmOrigin::App(s) => s.sealed,
        }
    }

    fn inode(&self) -> (u64, u64) {
        match self {
            ShmOrigin::Local(s) => s.inode(),
            ShmOrigin::Remote(m) => m.inode(),
            ShmOrigin::App(s) => s.inode,
        }
    }

    /// Offset of `buf`'s bytes in the segment, if they lie inside what is mapped here.
    pub fn offset_of(&self, buf: &[u8]) -> Option<usize> {
        let (base, file_offset) = self.base();
        let base = base as usize;
        let start = buf.as_ptr() as usize;
        (start >= base && start + buf.len() <= base + self.mapped_len()).then(|| start - base + file_offset)
    }
}

/// The shared-memory origin of a buffer, if its bytes live in a segment.
pub fn origin_of(buf: &Buffer) -> Option<&ShmOrigin> {
    buf.origin().and_then(|o| o.downcast_ref::<ShmOrigin>())
}

/// Where a buffer lives in shared memory (for tests and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentInfo {
    /// Device of the segment's memfd: with `inode`, the same in every process that maps it.
    pub device: u64,
    /// Inode of the segment's memfd.
    pub inode: u64,
    /// Offset of the buffer in the segment.
    pub offset: u64,
    /// Size of the whole segment.
    pub size: u64,
    /// Id in this process's pool, if the segment is ours.
    pub pool_id: Option<u64>,
    /// Whether the segment is sealed.
    pub sealed: bool,
}

/// The segment a buffer's bytes live in, or `None` for ordinary memory.
pub fn segment_info(buf: &Buffer) -> Option<SegmentInfo> {
    let origin = origin_of(buf)?;
    let (device, inode) = origin.inode();
    Some(SegmentInfo {
        device,
        inode,
        offset: origin.offset_of(buf)? as u64,
        size: origin.size() as u64,
        pool_id: match origin {
            ShmOrigin::Local(s) => Some(s.id()),
            ShmOrigin::Remote(_) | ShmOrigin::App(_) => None,
        },
        sealed: origin.sealed(),
    })
}

/// The process's segment pool.
pub fn pool() -> &'static Arc<SegmentPool> {
    SegmentPool::global()
}

/// A writable buffer in shared memory: fill it in place, then [`freeze`](Self::freeze) it
/// and send it to same-host peers with no copy at all.
pub struct SharedBufMut {
    segment: Arc<Segment>,
    len: usize,
}

impl SharedBufMut {
    /// A writable shared buffer of `len` bytes from the process's pool (contents unspecified:
    /// a reused segment still holds what it held).
    pub fn new(len: usize) -> std::io::Result<SharedBufMut> {
        Ok(SharedBufMut {
            segment: pool().take(len)?,
            len,
        })
    }

    /// The segment behind the buffer.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Makes the buffer immutable and shareable.
    pub fn freeze(self) -> Buffer {
        let bytes = Bytes::from_owner(LocalView {
            segment: self.segment.clone(),
            len: self.len,
        });
        Buffer::with_origin(bytes, Arc::new(ShmOrigin::Local(self.segment)))
    }
}

impl Deref for SharedBufMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the segment is at least `len` bytes and mapped while `segment` lives.
        unsafe { std::slice::from_raw_parts(self.segment.base(), self.len) }
    }
}

impl DerefMut for SharedBufMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; a `SharedBufMut` is the only handle to a segment taken from the
        // pool until it is frozen, so no one else reads or writes it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.segment.base(), self.len) }
    }
}

/// How a heap buffer is copied into a segment to go through shm ([`copy_in`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CopyInto {
    /// Through this process's mapping of the segment: the fastest copy (about 10 GB/s on
    /// these machines), but its pages then count in this process's RSS too, beside the
    /// receiver's and beside the application's own copy of the data.
    #[default]
    Mapping,
    /// With `pwrite` to the segment's memfd: about half as fast (5 GB/s here), and this
    /// process never maps the pages, so they count only in the receiver's RSS. What a
    /// process whose memory is judged by its RSS wants: a Dask worker (its memory manager
    /// pauses and restarts workers by RSS), as the Python implementation's pool does.
    Write,
}

/// Copies `data` into a pooled segment (the one copy a heap buffer pays to go through shm),
/// through this process's mapping.
pub fn copy_in(data: &[u8]) -> std::io::Result<Buffer> {
    copy_with(data, CopyInto::Mapping)
}

/// Copies `data` into a pooled segment as `how` says.
pub fn copy_with(data: &[u8], how: CopyInto) -> std::io::Result<Buffer> {
    let mut buf = SharedBufMut::new(data.len())?;
    match how {
        CopyInto::Mapping => buf.copy_from_slice(data),
        CopyInto::Write => {
            let mut at = 0;
            while at < data.len() {
                match rustix::io::pwrite(buf.segment.fd(), &data[at..], at as u64) {
                    Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(n) => at += n,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(buf.freeze())
}

/// The `Bytes` owner of a frozen local buffer.
struct LocalView {
    segment: Arc<Segment>,
    len: usize,
}

impl AsRef<[u8]> for LocalView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: frozen: nobody writes the segment while views exist.
        unsafe { std::slice::from_raw_parts(self.segment.base(), self.len) }
    }
}

/// The `Bytes` owner of a received view: when the last view drops, the lease is
/// released to the peer that sent it.
pub struct RemoteView {
    mapping: Arc<Mapping>,
    offset: usize,
    len: usize,
    lease: u64,
    release: Release,
}

impl RemoteView {
    /// A view of `len` bytes at `offset` of `mapping`, which runs `release(lease)` when it
    /// is dropped; `None` if the window does not lie inside the mapping.
    pub fn new(mapping: Arc<Mapping>, offset: usize, len: usize, lease: u64, release: Release) -> Option<RemoteView> {
        (offset.checked_add(len)? <= mapping.len()).then_some(RemoteView {
            mapping,
            offset,
            len,
            lease,
            release,
        })
    }
}

impl AsRef<[u8]> for RemoteView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the window lies inside the mapping (checked in `new`), which stays mapped
        // while `mapping` lives.
        unsafe { std::slice::from_raw_parts(self.mapping.base().add(self.offset), self.len) }
    }
}

impl Drop for RemoteView {
    fn drop(&mut self) {
        (self.release)(self.lease);
    }
}

/// A received view of a peer's segment, as a `Buffer` that remembers its origin.
pub fn remote_buffer(view: RemoteView) -> Buffer {
    let origin = Arc::new(ShmOrigin::Remote(view.mapping.clone()));
    Buffer::with_origin(Bytes::from_owner(view), origin)
}

/// What a node holds on behalf of a peer until the peer releases it.
#[derive(Clone)]
pub enum Held {
    /// A buffer (its segment stays out of the pool while held).
    Buffer(Buffer),
    /// A sealed copy.
    Sealed(Arc<SealedSegment>),
}

impl Held {
    /// Keeps a segment of our pool out of the pool for good (see [`Segment::retire`]); a
    /// sealed copy is never reused anyway.
    pub fn retire(&self) {
        if let Held::Buffer(b) = self {
            match origin_of(b) {
                Some(ShmOrigin::Local(segment)) => segment.retire(),
                Some(ShmOrigin::App(segment)) => segment.retire(),
                _ => {}
            }
        }
    }

    /// The bytes it keeps alive.
    pub fn bytes(&self) -> usize {
        match self {
            Held::Buffer(b) => b.len(),
            Held::Sealed(s) => s.size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{MemfdFlags, SealFlags};
    use std::sync::Mutex;

    /// A memfd of `size` bytes with `seals`, and a mapping of it.
    fn segment(size: usize, seals: SealFlags) -> (OwnedFd, memmap2::MmapMut) {
        let fd = rustix::fs::memfd_create("app", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, size as u64).unwrap();
        // SAFETY: a fresh memfd of this size, ours alone.
        let map = unsafe { memmap2::MmapOptions::new().len(size).map_mut(&fd).unwrap() };
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        (fd, map)
    }

    fn ended_log() -> (Arc<Mutex<Vec<bool>>>, SegmentEnded) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let to = log.clone();
        (log, Box::new(move |reusable| to.lock().unwrap().push(reusable)))
    }

    #[test]
    fn an_application_segment_is_passed_as_itself_and_says_when_its_last_holder_let_go() {
        let (fd, map) = segment(1 << 16, SealFlags::SHRINK | SealFlags::GROW);
        let bytes = Bytes::from_owner(map);
        let (log, ended) = ended_log();
        let seg = AppSegment::new(fd, &bytes, false, Some(ended)).unwrap();
        let buf = app_buffer(bytes.slice(4096..8192), seg).expect("inside the mapping");
        let origin = origin_of(&buf).expect("an shm origin");
        assert_eq!(origin.offset_of(&buf), Some(4096));
        assert_eq!(origin.size(), 1 << 16);
        assert!(origin.pass_fd().is_some());
        let held = Held::Buffer(buf.clone());
        drop(buf);
        assert!(log.lock().unwrap().is_empty(), "held still");
        drop(held);
        assert_eq!(*log.lock().unwrap(), vec![true]);
    }

    #[test]
    fn a_segment_a_receiver_may_still_map_is_never_reusable() {
        let (fd, map) = segment(1 << 16, SealFlags::SHRINK);
        let bytes = Bytes::from_owner(map);
        let (log, ended) = ended_log();
        let seg = AppSegment::new(fd, &bytes, false, Some(ended)).unwrap();
        let held = Held::Buffer(app_buffer(bytes, seg).unwrap());
        held.retire();
        drop(held);
        assert_eq!(*log.lock().unwrap(), vec![false]);
    }

    #[test]
    fn a_segment_without_the_seals_a_receiver_requires_is_refused() {
        let (fd, map) = segment(1 << 16, SealFlags::GROW);
        let why = AppSegment::new(fd, &map, false, None).err().expect("refused");
        assert!(why.contains("lacks the seals"), "{why}");
        let (fd, map) = segment(1 << 16, SealFlags::SHRINK | SealFlags::GROW);
        let why = AppSegment::new(fd, &map, true, None)
            .err()
            .expect("said sealed, is not");
        assert!(why.contains("lacks the seals"), "{why}");
    }

    #[test]
    fn bytes_outside_the_segments_mapping_are_not_taken_for_it() {
        let (fd, map) = segment(1 << 16, SealFlags::SHRINK);
        let seg = AppSegment::new(fd, &map[..4096], false, None).unwrap();
        assert!(app_buffer(Bytes::from(vec![0u8; 16]), seg).is_none());
    }
}

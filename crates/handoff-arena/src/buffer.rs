//! Buffers in arenas as the drivers send them: a window lent to peers
//! ([`lent_buffer`]), and a buffer an application writes in place ([`ArenaBufMut`]).

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;
use handoff_proto::shm::buffers::{AppSegment, SegmentEnded, ShmOrigin};
use handoff_wire::Buffer;

use crate::registry::{arenas, Lend};

/// A window of an arena, valid while its loan lasts (held by the segment), and what else
/// goes with the bytes (an [`ArenaBufMut`]'s range, freed with the last of them).
struct InArena {
    window: NonNull<[u8]>,
    _segment: Arc<AppSegment>,
    _range: Option<Range>,
}

// SAFETY: plain memory, only read; the loan keeps it mapped and out of reuse.
unsafe impl Send for InArena {}
// SAFETY: as above.
unsafe impl Sync for InArena {}

impl AsRef<[u8]> for InArena {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the arena's mapping of the range stays while a loan on it is out (the
        // range is not reused, even once its owner freed it). These bytes are read only
        // when the frame goes inline; then they are the producer's, as any buffer's.
        unsafe { self.window.as_ref() }
    }
}

/// `len` bytes at `ptr` as a buffer that a same-host send passes by descriptor: a loan of
/// their window of the arena they lie in. `None` when they lie in no arena, or must be
/// copied (written since a loan that is still out). The buffer holds the loan, not the
/// caller's memory; it ends when the last peer released the window and the buffer is gone.
pub fn lent_buffer(ptr: *const u8, len: usize) -> Result<Option<Buffer>, String> {
    lend(ptr, len, &mut None)
}

/// As [`lent_buffer`]; the buffer takes `range` (freed with its last byte) when it is made.
fn lend(ptr: *const u8, len: usize, range: &mut Option<Range>) -> Result<Option<Buffer>, String> {
    let (loan, fd) = match arenas().lend(ptr, len) {
        Lend::NotOurs | Lend::Copy(_) => return Ok(None),
        Lend::Shared { loan, fd } => (loan, fd),
    };
    let mapped = loan.segment;
    let window = NonNull::from(&mapped[loan.offset..loan.offset + len]);
    let ended: SegmentEnded = Box::new(move |reusable| loan.end(reusable));
    let segment = AppSegment::sharing(fd, mapped, false, Some(ended))?;
    let kept = Bytes::from_owner(InArena {
        window,
        _segment: segment.clone(),
        _range: range.take(),
    });
    // The window lies in the segment's mapping by construction (a slice of it).
    Ok(Some(Buffer::with_origin(kept, Arc::new(ShmOrigin::App(segment)))))
}

/// A range this process allocated, freed when dropped.
struct Range(NonNull<u8>);

// SAFETY: the registry takes a range back from any thread.
unsafe impl Send for Range {}
// SAFETY: as above.
unsafe impl Sync for Range {}

impl Drop for Range {
    fn drop(&mut self) {
        arenas().free(self.0.as_ptr());
    }
}

/// Bytes in an arena, written in place, then [frozen](ArenaBufMut::freeze) into a `Buffer`
/// that a same-host peer maps without a copy, as a `SharedBufMut` of the pool is; unlike
/// one, the arena's pages are reused from one buffer to the next once peers released them.
pub struct ArenaBufMut {
    range: Range,
    len: usize,
}

impl ArenaBufMut {
    /// `len` zeroed bytes in an arena, or why no arena can serve them.
    pub fn new(len: usize) -> Result<ArenaBufMut, String> {
        let ptr = arenas().allocate_any(len, true)?;
        let ptr = NonNull::new(ptr).ok_or("an arena returned a null range")?;
        Ok(ArenaBufMut { range: Range(ptr), len })
    }

    /// The bytes, immutable from now on, as a buffer a same-host send passes by descriptor
    /// (anywhere else, its bytes are copied as any buffer's).
    pub fn freeze(self) -> Buffer {
        let ptr = self.range.0.as_ptr();
        let len = self.len;
        let mut range = Some(self.range);
        match lend(ptr, len, &mut range) {
            Ok(Some(buffer)) => buffer,
            // Cannot be lent (a remap failed): the bytes, copied; `range` (still ours)
            // frees them after.
            // SAFETY: the range is live (held by `range`) and `len` long.
            _ => Buffer::from(unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()),
        }
    }
}

impl Deref for ArenaBufMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: a live range of at least `len` bytes, ours alone until frozen.
        unsafe { std::slice::from_raw_parts(self.range.0.as_ptr(), self.len) }
    }
}

impl DerefMut for ArenaBufMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.range.0.as_ptr(), self.len) }
    }
}

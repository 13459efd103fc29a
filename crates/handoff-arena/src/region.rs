//! The system calls on one arena: create its memfd and map it, switch a range of the
//! mapping between shared and private, write private pages back, punch freed pages out,
//! and give a forked child anonymous copies.

use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MremapFlags, ProtFlags};

use crate::error::ArenaError;

/// An arena's memfd, the read-only descriptor of it that sends pass, and this process's
/// mapping of all of it.
pub struct Region {
    pub fd: OwnedFd,
    /// The memfd reopened read-only (through `/proc/self/fd`): a peer that receives it can
    /// map the arena, private or read-only, but never write it, punch it or seal it.
    pub lend_fd: Arc<OwnedFd>,
    pub base: usize,
    pub size: usize,
    pub inode: (u64, u64),
}

/// The system's page size.
pub fn page() -> usize {
    rustix::param::page_size()
}

/// `n` rounded up to whole pages (at least one).
pub fn round_up(n: usize) -> Option<usize> {
    let p = page();
    n.max(1).checked_add(p - 1).map(|m| m / p * p)
}

impl Region {
    /// A fresh memfd of `size` bytes (whole pages), sealed against shrinking and growing
    /// (receivers refuse a segment that could shrink, spec §7.2), mapped shared and writable.
    pub fn create(size: usize) -> Result<Region, ArenaError> {
        let fd = rustix::fs::memfd_create("handoff-arena", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| ArenaError::new("creating an arena (memfd_create)", e))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(|e| ArenaError::new("sizing an arena", e))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)
            .map_err(|e| ArenaError::new("sealing an arena", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| ArenaError::new("reading an arena's inode", e))?;
        let lend_fd = rustix::fs::open(
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| ArenaError::new("reopening an arena read-only", e))?;
        // SAFETY: a fresh mapping at an address the kernel picks, of a file we own and sized.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| ArenaError::new("mapping an arena", e))?;
        Ok(Region {
            fd,
            lend_fd: Arc::new(lend_fd),
            base: base as usize,
            size,
            inode: (st.st_dev, st.st_ino),
        })
    }

    /// Maps `len` bytes at offset `off` again over themselves, shared (`private` false: writes
    /// reach the file) or private (writes stay in this process). The bytes read the same.
    pub fn remap(&self, off: usize, len: usize, private: bool) -> Result<(), ArenaError> {
        let flags = if private { MapFlags::PRIVATE } else { MapFlags::SHARED } | MapFlags::FIXED;
        // SAFETY: the range lies in our own mapping of this arena (the registry's record
        // says so), and mapping the same file range over it keeps its contents readable;
        // the caller holds the registry's lock, so no other thread reuses the range.
        unsafe {
            rustix::mm::mmap(
                (self.base + off) as *mut c_void,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
                &self.fd,
                off as u64,
            )
        }
        .map(|_| ())
        .map_err(|e| ArenaError::new("remapping an arena's range", e))
    }

    /// Writes this process's pages `first .. first + count` (page indices into the arena)
    /// back to the file, then drops the private copies, so the range reads the file again.
    pub fn write_back(&self, first: usize, count: usize) -> Result<(), ArenaError> {
        let p = page();
        let (off, len) = (first * p, count * p);
        // SAFETY: the pages lie in our mapping of the arena, readable.
        let bytes = unsafe { std::slice::from_raw_parts((self.base + off) as *const u8, len) };
        let mut done = 0;
        while done < len {
            let n = rustix::io::pwrite(&self.fd, &bytes[done..], (off + done) as u64)
                .map_err(|e| ArenaError::new("writing a range back to its arena", e))?;
            done += n;
        }
        // SAFETY: a private file mapping: dropping its private pages makes it read the file,
        // which now holds the same bytes.
        unsafe { rustix::mm::madvise((self.base + off) as *mut c_void, len, rustix::mm::Advice::LinuxDontNeed) }
            .map_err(|e| ArenaError::new("dropping written-back pages", e))
    }

    /// Drops this process's private copies of a privately mapped range's pages (the range
    /// reads the file again); peers' mappings of the file are untouched.
    pub fn drop_private(&self, off: usize, len: usize) -> Result<(), ArenaError> {
        // SAFETY: a private mapping of our arena, which no one in this process uses any more.
        unsafe { rustix::mm::madvise((self.base + off) as *mut c_void, len, rustix::mm::Advice::LinuxDontNeed) }
            .map_err(|e| ArenaError::new("dropping a freed range's private pages", e))
    }

    /// Gives the pages of a freed range back to the system (they read as zeros again).
    pub fn punch(&self, off: usize, len: usize) -> Result<(), ArenaError> {
        rustix::fs::fallocate(
            &self.fd,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            off as u64,
            len as u64,
        )
        .map_err(|e| ArenaError::new("punching freed pages out of an arena", e))
    }
}

/// Replaces the `size` bytes at `base` (an arena's mapping) with one anonymous private
/// mapping that holds a copy of each range `(offset, len)` of `ranges` and zeros elsewhere
/// (a forked child's own memory, in no file a peer maps). On failure nothing changed.
pub fn copy_into_anonymous(
    base: usize,
    size: usize,
    ranges: impl Iterator<Item = (usize, usize)>,
) -> Result<(), ArenaError> {
    // SAFETY: a fresh anonymous mapping; the copies read the caller's live ranges, which lie
    // in `base .. base + size`; the final mremap moves the copy over the whole arena, which
    // the caller owns; on failure the fresh mapping goes.
    unsafe {
        let tmp = rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
        .map_err(|e| ArenaError::new("mapping a forked child's copy", e))?;
        for (off, len) in ranges {
            std::ptr::copy_nonoverlapping((base + off) as *const u8, (tmp as *mut u8).add(off), len);
        }
        if let Err(e) = rustix::mm::mremap_fixed(tmp, size, size, MremapFlags::MAYMOVE, base as *mut c_void) {
            let _ = rustix::mm::munmap(tmp, size);
            return Err(ArenaError::new("moving a forked child's copy in place", e));
        }
    }
    Ok(())
}

/// Makes the `size` bytes of an arena at `base` unreadable (a forked child that got no
/// memory for its copy: better a fault where they are used than a mapping shared with the
/// parent), or unmaps them if even that fails, and says so on standard error.
pub fn seal_off(base: usize, size: usize) {
    // SAFETY: the caller owns the arena's mapping; nothing in this process reads it until it
    // faults.
    let sealed = unsafe { rustix::mm::mprotect(base as *mut c_void, size, rustix::mm::MprotectFlags::empty()) };
    if sealed.is_err() {
        unmap(base, size);
    }
    // Straight to descriptor 2, and no allocation: this runs inside `fork`, where std's
    // stderr may be held by a thread of the parent's.
    const LINE: &[u8] = b"handoff-arena: a forked child could not copy an arena of shared arrays (no memory or mappings left); its arrays are unreadable in the child\n";
    // SAFETY: a write of static bytes.
    let _ = unsafe { libc::write(2, LINE.as_ptr().cast(), LINE.len()) };
}

/// Unmaps `len` bytes at `addr`.
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: the caller owns the range and nothing refers to it any more.
    let _ = unsafe { rustix::mm::munmap(addr as *mut c_void, len) };
}

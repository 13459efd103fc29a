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

/// Replaces `len` bytes at `addr` with an anonymous private copy of them (a forked child's
/// own memory, in no file a peer maps).
pub fn copy_to_anonymous(addr: usize, len: usize) -> Result<(), ArenaError> {
    // SAFETY: a fresh anonymous mapping; the copy reads the caller's live range; the final
    // mremap moves the copy over the range, which the caller owns.
    unsafe {
        let tmp = rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
        .map_err(|e| ArenaError::new("mapping a forked child's copy", e))?;
        std::ptr::copy_nonoverlapping(addr as *const u8, tmp as *mut u8, len);
        rustix::mm::mremap_fixed(tmp, len, len, MremapFlags::MAYMOVE, addr as *mut c_void)
            .map_err(|e| ArenaError::new("moving a forked child's copy in place", e))?;
    }
    Ok(())
}

/// Makes `len` bytes at `addr` unreadable (a forked child that got no memory for its copy
/// of them: better a fault where they are used than a mapping shared with the parent), and
/// says so on standard error (`why`: the copy's failure).
pub fn seal_off(addr: usize, len: usize, why: &ArenaError) {
    // SAFETY: the caller owns the range; nothing in this process reads it until it faults.
    let _ = unsafe { rustix::mm::mprotect(addr as *mut c_void, len, rustix::mm::MprotectFlags::empty()) };
    let line = format!("handoff-arena: a forked child could not copy {len} bytes of shared arrays ({why}); they are unreadable in the child\n");
    // Straight to descriptor 2: std's stderr has a lock another thread of the parent may have held.
    // SAFETY: a write of our own bytes.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Unmaps `len` bytes at `addr`.
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: the caller owns the range and nothing refers to it any more.
    let _ = unsafe { rustix::mm::munmap(addr as *mut c_void, len) };
}

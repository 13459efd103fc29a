//! The system calls the channels make, and the destination of a large frame.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// Takes ownership of a descriptor that Python detached from its socket object, and makes
/// it non-blocking.
pub fn adopt(fd: i32) -> PyResult<OwnedFd> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!("not a descriptor: {fd}")));
    }
    // SAFETY: the caller gave its descriptor up (`socket.detach()`); from here on only
    // this `OwnedFd` closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::ioctl_fionbio(&owned, true).map_err(io::Error::from)?;
    Ok(owned)
}

/// One non-blocking `read` into `buf`.
pub fn read_some(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One non-blocking `writev` of `bufs`.
pub fn write_some(fd: BorrowedFd<'_>, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    loop {
        match rustix::io::writev(fd, bufs) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A large frame being read straight into the Python `bytearray` that will carry it.
pub struct LargeFrame {
    obj: Py<PyByteArray>,
    ptr: *mut u8,
    len: usize,
    filled: usize,
}

// SAFETY: the bytearray is not handed to Python until it is full, so nothing else reads,
// writes or resizes its memory while another thread fills it through `ptr`.
unsafe impl Send for LargeFrame {}

impl LargeFrame {
    /// A `bytearray` of `len` bytes, not zeroed, with `head` already in it.
    pub fn new(py: Python<'_>, len: usize, head: &[u8]) -> PyResult<Self> {
        // SAFETY: a NULL source asks CPython for `len` uninitialised bytes; the result is
        // a new reference (or NULL with an exception set, which from_owned_ptr_or_err turns
        // into the error).
        let obj = unsafe {
            let raw = pyo3::ffi::PyByteArray_FromStringAndSize(std::ptr::null(), len as isize);
            Bound::from_owned_ptr_or_err(py, raw)?.cast_into_unchecked::<PyByteArray>()
        };
        // SAFETY: the bytearray is ours alone and `len` bytes long.
        let ptr = unsafe { pyo3::ffi::PyByteArray_AsString(obj.as_ptr()) as *mut u8 };
        advise_huge_pages(ptr, len);
        let mut frame = Self {
            obj: obj.unbind(),
            ptr,
            len,
            filled: 0,
        };
        frame.spare()[..head.len()].copy_from_slice(head);
        frame.filled = head.len();
        Ok(frame)
    }

    /// The part not yet filled.
    pub fn spare(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points at `len` bytes that only this value writes (see `Send`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(self.filled), self.len - self.filled) }
    }

    /// Records `n` more bytes filled.
    pub fn advance(&mut self, n: usize) {
        self.filled += n;
    }

    /// Whether every byte is there.
    pub fn is_full(&self) -> bool {
        self.filled == self.len
    }

    /// The full frame, for Python.
    pub fn into_object(self) -> Py<PyByteArray> {
        self.obj
    }
}

/// Asks for transparent huge pages over the 2 MiB-aligned part of `len` bytes at `ptr`:
/// a large frame read into fresh memory then takes one fault per 2 MiB, not per 4 KiB.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (ptr as usize).div_ceil(HUGE) * HUGE;
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside this frame's allocation; the advice changes how
        // its pages are backed, not what they hold.
        let _ = unsafe { rustix::mm::madvise(start as *mut _, end - start, rustix::mm::Advice::LinuxHugepage) };
    }
}

//! `handoff.ShmBuffer(pooled=True)` on the engine: a writable buffer at the start of a
//! segment of the process's pool (`handoff_proto::shm::buffers::SharedBufMut`), the same
//! pool the engine copies frames into, so that Python keeps no pool of its own.
//!
//! The application fills it in place through the buffer protocol, then
//! [`freeze`](PooledBuffer::freeze)s it: from then on views are read-only and the frozen
//! bytes go to same-host peers by descriptor, under a lease. The segment goes back to the
//! pool once this object and every lease sent on it are gone (or is retired when a
//! receiver that may still map it outlived its lease).

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use handoff_proto::shm::buffers::SharedBufMut;
use handoff_wire::Buffer;
use pyo3::exceptions::{PyBufferError, PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::frames::SegmentFrame;

enum State {
    /// Being filled: views may write.
    Writable(SharedBufMut),
    /// Frozen: what sends take (every clone keeps the segment busy).
    Frozen(Buffer),
}

/// A writable buffer of `len` bytes in a segment of the process's pool (its contents are
/// unspecified: a reused segment still holds what it held). Fill it through
/// `memoryview(buf)`, release every writable view, then [`freeze`](Self::freeze).
#[pyclass(frozen, module = "handoff._native")]
pub struct PooledBuffer {
    state: Mutex<State>,
    /// The first byte (the segment's mapping, which stays put while the segment lives).
    base: usize,
    len: usize,
    size: usize,
    fd: i32,
    /// Views exported and not yet released (writable ones, before `freeze`).
    exports: AtomicUsize,
}

#[pymethods]
impl PooledBuffer {
    /// Takes a segment of at least `len` bytes from the process's pool (an idle one that
    /// fits, else a new memfd).
    #[new]
    fn new(py: Python<'_>, len: usize) -> PyResult<PooledBuffer> {
        if len == 0 {
            return Err(PyValueError::new_err("a shared buffer needs at least one byte"));
        }
        let buf = py
            .detach(|| SharedBufMut::new(len))
            .map_err(|e| PyOSError::new_err(format!("taking a shared segment of {len} bytes from the pool: {e}")))?;
        let segment = buf.segment();
        let (base, size, fd) = (segment.base() as usize, segment.size(), segment.fd().as_raw_fd());
        Ok(PooledBuffer {
            state: Mutex::new(State::Writable(buf)),
            base,
            len,
            size,
            fd,
            exports: AtomicUsize::new(0),
        })
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// The size of the segment (the buffer's length rounded up to the pool's sizes).
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The segment's descriptor, valid while this object lives (the pool owns it: do not
    /// close it).
    #[getter]
    fn fd(&self) -> i32 {
        self.fd
    }

    /// Whether it was frozen.
    #[getter]
    fn frozen(&self) -> bool {
        matches!(*self.lock(), State::Frozen(_))
    }

    /// Ends writing and returns the frame sends take (the same one if called again).
    /// Refused with `BufferError` while a writable view of it is held: a write through one
    /// after this would reach the peers the frame went to.
    fn freeze(&self) -> PyResult<SegmentFrame> {
        let mut state = self.lock();
        if matches!(*state, State::Writable(_)) && self.exports.load(Ordering::Acquire) > 0 {
            return Err(PyBufferError::new_err(
                "cannot freeze the pooled buffer while views of it are held: release them first",
            ));
        }
        let buffer = match std::mem::replace(&mut *state, State::Frozen(Buffer::default())) {
            State::Writable(buf) => buf.freeze(),
            State::Frozen(buffer) => buffer,
        };
        *state = State::Frozen(buffer.clone());
        Ok(SegmentFrame { buffer })
    }

    fn __repr__(&self) -> String {
        format!("<PooledBuffer {} bytes in a segment of {}>", self.len, self.size)
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        // Held until the export is counted: a `freeze` on another thread (free-threaded
        // Python) sees either no export and freezes first, or this one and refuses.
        let state = this.lock();
        let writable = matches!(*state, State::Writable(_));
        if !writable && flags & pyo3::ffi::PyBUF_WRITABLE == pyo3::ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "the pooled buffer is frozen: it is read-only now",
            ));
        }
        // SAFETY: the view keeps this object alive (`obj` takes a reference), and with it
        // the segment, whose mapping never moves; before `freeze` only the application
        // writes it, after it views are read-only.
        let readonly = c_int::from(!writable);
        let r = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.base as *mut _,
                this.len as isize,
                readonly,
                flags,
            )
        };
        if r == 0 {
            if writable {
                this.exports.fetch_add(1, Ordering::AcqRel);
            }
            drop(state);
            Ok(())
        } else {
            drop(state);
            Err(PyErr::fetch(slf.py()))
        }
    }

    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: the view this object filled in `__getbuffer__`.
        if unsafe { (*view).readonly } == 0 {
            self.exports.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl PooledBuffer {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

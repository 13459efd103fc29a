//! Bytes crossing between Rust and Python without a copy: a received frame is a
//! [`Frame`], a Python object that exports Rust memory through the buffer protocol (a numpy
//! array made from it is a view of it), and a buffer Python sends is held as
//! [`bytes::Bytes`] for as long as the connection needs it.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Received bytes in Rust memory: a frame read off the socket, or a view of a peer's
/// shared-memory segment (whose lease goes back to the peer when the last view is gone).
///
/// `memoryview(frame)`, `bytes(frame)` and `numpy.frombuffer(frame)` read it. A frame read
/// off the socket is writable, as a buffer Python's sockets fill is (the bytes were copied
/// into memory of its own); a view of a peer's segment is writable only when mapped private.
#[pyclass(frozen, module = "handoff._native")]
pub struct Frame {
    bytes: Bytes,
    kind: &'static str,
    /// The bytes are this frame's alone (read off the socket, or a private copy-on-write
    /// mapping): views may write.
    writable: bool,
    /// For a view of a peer's segment: the sender's lease, and where the frame lies.
    shm: Option<ShmOrigin>,
    /// `host_array` was called: a second array would alias the first's bytes.
    host_array_made: AtomicBool,
}

/// Where a received shared-memory frame lies, and the lease that keeps it.
#[derive(Clone, Copy)]
pub(crate) struct ShmOrigin {
    /// The sender's lease on it (released when the last view is gone).
    pub(crate) lease: u64,
    /// The segment's (device, inode).
    pub(crate) inode: (u64, u64),
    /// Where the frame starts in the segment.
    pub(crate) offset: u64,
    /// The segment's size.
    pub(crate) size: u64,
    /// Whether the sender sealed the segment against writes.
    pub(crate) sealed: bool,
}

impl Frame {
    pub(crate) fn new(bytes: Bytes, kind: &'static str) -> Frame {
        Frame {
            bytes,
            kind,
            writable: false,
            shm: None,
            host_array_made: AtomicBool::new(false),
        }
    }

    /// Bytes read off the socket into memory no one else holds (a buffer of their own, or one
    /// of the receive pool's, which goes back to the pool only when the last view is gone):
    /// exported writable, as Python's own socket reads are, so that a deserializer that needs
    /// a writable buffer (Dask's, numpy's `require(..., "W")`) does not copy it again.
    pub(crate) fn received(bytes: Bytes, kind: &'static str) -> Frame {
        Frame {
            writable: true,
            ..Frame::new(bytes, kind)
        }
    }

    /// A view of a peer's segment (`origin` says which, and where).
    pub(crate) fn shared(bytes: Bytes, origin: ShmOrigin) -> Frame {
        Frame {
            shm: Some(origin),
            ..Frame::new(bytes, "shm")
        }
    }

    /// The same frame, exported writable: its bytes lie in a private mapping made for it
    /// alone (`handoff_proto::shm::MappingCache::map_private`), whose writes reach no other
    /// frame and not the sender.
    pub(crate) fn into_writable(self) -> Frame {
        Frame { writable: true, ..self }
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

#[pymethods]
impl Frame {
    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    /// How the frame came: `inline` (on the stream) or `shm` (a view of a peer's segment).
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn __repr__(&self) -> String {
        format!("<Frame {} {} bytes>", self.kind, self.bytes.len())
    }

    /// Whether views of the frame may write (read off the socket, or a private mapping of a
    /// peer's segment).
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// For a view of a peer's segment: the sender's lease on it; else `None`.
    #[getter]
    fn lease(&self) -> Option<u64> {
        self.shm.map(|s| s.lease)
    }

    /// For a view of a peer's segment, where it lies, as `handoff.demo.Held` says it
    /// (Appendix A): `{device, inode, offset, size, pool_id, sealed}`; else `None`.
    #[getter]
    fn segment<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        let Some(s) = self.shm else { return Ok(None) };
        let d = pyo3::types::PyDict::new(py);
        d.set_item("device", s.inode.0)?;
        d.set_item("inode", s.inode.1)?;
        d.set_item("offset", s.offset)?;
        d.set_item("size", s.size)?;
        d.set_item("pool_id", py.None())?;
        d.set_item("sealed", s.sealed)?;
        Ok(Some(d))
    }

    /// The frame's bytes as a one-dimensional `uint8` NumPy array that owns no memory and has
    /// no base (`base is None`), as the arrays Dask's TCP comm reads into are: Dask's tools
    /// that look for the buffer an array lies in (its P2P rechunk's tests walk `.base`) stop
    /// at it. The frame stays alive until the array is collected (a `weakref.finalize` holds
    /// it, out of the application's reach). Only a writable frame has one, and only one: a
    /// read-only frame, or a second call (a body may name one frame twice, and two writable
    /// arrays over the same bytes would see each other's writes), is refused with
    /// `BufferError`.
    fn host_array<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let frame = slf.get();
        if !frame.writable {
            return Err(PyBufferError::new_err(
                "a read-only frame (a shared view of a peer's segment) has no host array of its own",
            ));
        }
        if frame.host_array_made.swap(true, Ordering::AcqRel) {
            return Err(PyBufferError::new_err(
                "this frame has its host array already: a second would alias its bytes",
            ));
        }
        let array = host_array_over(py, frame.bytes.as_ptr(), frame.bytes.len())?;
        static FINALIZE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let finalize = FINALIZE.get_or_try_init(py, || py.import("weakref")?.getattr("finalize").map(Bound::unbind))?;
        // The bound method holds the frame until the array is gone, and nothing else can reach
        // it to let it go sooner. (Not the array's `base`: Dask's tools stop only at a
        // base-less array.) An ndarray is not tracked by the cyclic collector, so the
        // callback runs at its deallocation, never while a finalizer of a cycle holding
        // it could still read its bytes.
        let keeper = finalize.bind(py).call1((&array, slf.getattr("__len__")?))?;
        keeper.setattr("atexit", false)?;
        Ok(array)
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len, writable) = {
            let frame = slf.get();
            (frame.bytes.as_ptr(), frame.bytes.len(), frame.writable)
        };
        if !writable && flags & pyo3::ffi::PyBUF_WRITABLE == pyo3::ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a received frame is read-only"));
        }
        // SAFETY: the view keeps the frame (and so its bytes, which never move) alive until
        // it is released: `obj` takes a reference to it. A writable frame's bytes are its
        // own (`Frame::received`: copied off the socket) or a private mapping made for it
        // alone (`Frame::into_writable`), so a write through the view changes memory no
        // other frame and no other process sees.
        let readonly = c_int::from(!writable);
        let r =
            unsafe { pyo3::ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr as *mut _, len as isize, readonly, flags) };
        if r == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(slf.py()))
        }
    }
}

/// A Python buffer held as the owner of a `Bytes`: its memory stays put and alive until the
/// last clone is dropped.
struct Exported(PyUntypedBuffer);

impl AsRef<[u8]> for Exported {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: checked C-contiguous when taken; the exporter keeps the memory while the
        // buffer is held.
        unsafe { std::slice::from_raw_parts(self.0.buf_ptr() as *const u8, self.0.len_bytes()) }
    }
}

/// Bytes a send may carry only as an on-demand ticket (spec §7.5, `lazy`): a fallback the
/// receiver pulls only when it uses it. A receiver that takes no tickets gets the bytes.
#[pyclass(frozen, module = "handoff._native")]
pub struct OnDemand {
    pub(crate) bytes: Bytes,
    /// The bytes' BLAKE3, when the caller knows it (the owner then does not hash them).
    pub(crate) digest: Option<[u8; 32]>,
}

#[pymethods]
impl OnDemand {
    /// `data` (any C-contiguous buffer, held without a copy) to send on demand; `digest`,
    /// if given, is its BLAKE3 (32 bytes).
    #[new]
    #[pyo3(signature = (data, digest=None))]
    fn new(data: &Bound<'_, PyAny>, digest: Option<Vec<u8>>) -> PyResult<OnDemand> {
        let digest = match digest {
            None => None,
            Some(d) => Some(<[u8; 32]>::try_from(d.as_slice()).map_err(|_| {
                PyValueError::new_err(format!("an on-demand digest is a BLAKE3 of 32 bytes, not {}", d.len()))
            })?),
        };
        Ok(OnDemand {
            bytes: bytes_of(data)?,
            digest,
        })
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }
}

/// A segment the application filled in place (a frozen `ShmBuffer`: `handoff.shm.SharedFrame`
/// or `PooledFrame`), to send to a same-host peer as it is, whatever its size (as any frame
/// already in a segment): the peer maps the same pages and no byte is copied. Over TCP, or
/// past the descriptors one message may carry, its bytes go.
#[pyclass(frozen, module = "handoff._native")]
pub struct SegmentFrame {
    pub(crate) buffer: handoff_wire::Buffer,
}

#[pymethods]
impl SegmentFrame {
    /// `view` (this process's mapping of the segment, from its first byte) of the segment
    /// behind descriptor `fd` (duplicated: the caller keeps its own), `sealed` if it is
    /// sealed against writes. `ended(reusable)` runs when the last lease a send took on it
    /// ends: `reusable` is false when a receiver that may still map it outlived its lease
    /// (then it must not be written again). A segment without the seals receivers require
    /// (spec §7.2) is refused with `ValueError`.
    #[new]
    #[pyo3(signature = (view, fd, sealed=false, ended=None))]
    fn new(view: &Bound<'_, PyAny>, fd: i32, sealed: bool, ended: Option<Py<PyAny>>) -> PyResult<SegmentFrame> {
        use std::os::fd::BorrowedFd;
        if fd < 0 {
            return Err(PyValueError::new_err(format!("not a descriptor: {fd}")));
        }
        let bytes = bytes_of(view)?;
        // SAFETY: the caller's descriptor, open for this call; we take a copy of our own.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let own = rustix::io::fcntl_dupfd_cloexec(borrowed, 0)
            .map_err(|e| PyValueError::new_err(format!("duplicating the segment's descriptor: {e}")))?;
        let ended = ended.map(|f| -> handoff_proto::shm::buffers::SegmentEnded {
            Box::new(move |reusable| {
                // Not while the interpreter shuts down (then the callback, and the pool it
                // would give the segment back to, are going anyway); the callback is let go
                // with the GIL held.
                let _ = Python::try_attach(move |py| {
                    if let Err(e) = f.call1(py, (reusable,)) {
                        e.write_unraisable(py, None);
                    }
                    drop(f);
                });
            })
        });
        let segment =
            handoff_proto::shm::buffers::AppSegment::new(own, &bytes, sealed, ended).map_err(PyValueError::new_err)?;
        // Every slice of these bytes keeps the segment (and its lease on the application's
        // pool) too: a frame queued inline (TCP, or past the descriptors one message may
        // carry) holds it until written, even after the send that queued it was cancelled.
        let kept = Bytes::from_owner(InSegment {
            bytes,
            _segment: segment.clone(),
        });
        let buffer = handoff_proto::shm::buffers::app_buffer(kept, segment)
            .expect("the view is the segment's mapping, checked by AppSegment::new");
        Ok(SegmentFrame { buffer })
    }

    fn __len__(&self) -> usize {
        self.buffer.len()
    }
}

/// Bytes of an application's segment, owning the segment too (see [`SegmentFrame::new`]).
struct InSegment {
    bytes: Bytes,
    _segment: std::sync::Arc<handoff_proto::shm::buffers::AppSegment>,
}

impl AsRef<[u8]> for InSegment {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The bytes of any C-contiguous buffer-protocol object, without a copy.
pub(crate) fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(frame) = obj.cast::<Frame>() {
        return Ok(frame.get().bytes.clone());
    }
    let buffer = PyUntypedBuffer::get(obj)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("a frame must be C-contiguous"));
    }
    if buffer.len_bytes() == 0 {
        return Ok(Bytes::new());
    }
    Ok(Bytes::from_owner(Exported(buffer)))
}

/// NumPy's type number of `uint8` (`NPY_UBYTE`).
const NPY_UBYTE: c_int = 2;
/// `NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE` (`NPY_ARRAY_CARRAY`).
const NPY_ARRAY_CARRAY: c_int = 0x0001 | 0x0100 | 0x0400;

type DescrFromType = unsafe extern "C" fn(c_int) -> *mut pyo3::ffi::PyObject;
type NewFromDescr = unsafe extern "C" fn(
    *mut pyo3::ffi::PyTypeObject,
    *mut pyo3::ffi::PyObject,
    c_int,
    *const isize,
    *const isize,
    *mut std::ffi::c_void,
    c_int,
    *mut pyo3::ffi::PyObject,
) -> *mut pyo3::ffi::PyObject;

/// A writable `uint8` array of `len` bytes at `ptr`, owning nothing and with no base: the
/// caller keeps the memory alive for as long as the array lives.
fn host_array_over(py: Python<'_>, ptr: *const u8, len: usize) -> PyResult<Bound<'_, PyAny>> {
    use crate::numpy_api::{entry, slot};
    let array_type = entry(py, slot::ARRAY_TYPE)? as *mut pyo3::ffi::PyTypeObject;
    // SAFETY: those slots' signatures (NumPy's `__multiarray_api.h`).
    let (descr_from_type, new_from_descr) = unsafe {
        (
            std::mem::transmute::<*const std::ffi::c_void, DescrFromType>(entry(py, slot::DESCR_FROM_TYPE)?),
            std::mem::transmute::<*const std::ffi::c_void, NewFromDescr>(entry(py, slot::NEW_FROM_DESCR)?),
        )
    };
    // SAFETY: a new reference to a builtin descriptor, or null with an exception set.
    let descr = unsafe { descr_from_type(NPY_UBYTE) };
    if descr.is_null() {
        return Err(PyErr::fetch(py));
    }
    let dims = [len as isize];
    // SAFETY: `descr` is stolen; `dims` outlives the call; NumPy keeps `ptr` as the data of
    // an array that does not own it (no OWNDATA), so it never frees or reallocates it.
    let array = unsafe {
        new_from_descr(
            array_type,
            descr,
            1,
            dims.as_ptr(),
            std::ptr::null(),
            ptr as *mut std::ffi::c_void,
            NPY_ARRAY_CARRAY,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference, or null with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, array) }
}

//! Arrays born in shared memory: a NumPy data-memory handler (NEP 49) whose allocations of at
//! least a threshold come from handoff's memfd arenas (`handoff_arena`), so a same-host send
//! passes the arena's descriptor instead of copying the array. Below the threshold, or when
//! no arena can serve (a descriptor bound, an address-space or memory limit), it is
//! `malloc`: it never fails an allocation that `malloc` would serve.
//!
//! NumPy keeps the handler in a context variable (`PyDataMem_SetHandler`, slot 304 of its C
//! API table since NumPy 1.22); an array keeps the handler that allocated it, so it is freed
//! here whichever context frees it.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use handoff_arena::arenas;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// NumPy's `PyDataMemAllocator` (version 1).
#[repr(C)]
struct Allocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

/// NumPy's `PyDataMem_Handler`.
#[repr(C)]
struct Handler {
    name: [u8; 127],
    version: u8,
    allocator: Allocator,
}

// SAFETY: the handler is immutable, and its context pointer is null.
unsafe impl Sync for Handler {}

const fn name() -> [u8; 127] {
    let text = HANDLER_NAME.as_bytes();
    let mut out = [0u8; 127];
    let mut i = 0;
    while i < text.len() {
        out[i] = text[i];
        i += 1;
    }
    out
}

static HANDLER: Handler = Handler {
    name: name(),
    version: 1,
    allocator: Allocator {
        ctx: std::ptr::null_mut(),
        malloc: shared_malloc,
        calloc: shared_calloc,
        realloc: shared_realloc,
        free: shared_free,
    },
};

/// From an arena when it serves `size` bytes, else `malloc`. A panic never crosses into C.
fn from_arena(size: usize, zeroed: bool) -> Option<*mut c_void> {
    catch_unwind(AssertUnwindSafe(|| arenas().allocate(size, zeroed)))
        .ok()
        .flatten()
        .map(|p| p.cast())
}

unsafe extern "C" fn shared_malloc(_ctx: *mut c_void, size: usize) -> *mut c_void {
    match from_arena(size, false) {
        Some(p) => p,
        // SAFETY: plain malloc.
        None => unsafe { libc::malloc(size) },
    }
}

unsafe extern "C" fn shared_calloc(_ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    let Some(size) = nelem.checked_mul(elsize) else {
        return std::ptr::null_mut();
    };
    match from_arena(size, true) {
        Some(p) => p,
        // SAFETY: plain calloc.
        None => unsafe { libc::calloc(nelem, elsize) },
    }
}

unsafe extern "C" fn shared_realloc(ctx: *mut c_void, ptr: *mut c_void, new_size: usize) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: as malloc.
        return unsafe { shared_malloc(ctx, new_size) };
    }
    let old = catch_unwind(AssertUnwindSafe(|| arenas().len_of(ptr.cast())))
        .ok()
        .flatten();
    match old {
        // A range in an arena never grows in place (a peer may map it): a new allocation,
        // the bytes copied, the old range freed (reused once every loan on it ended). A
        // forked child's copies go the same way.
        Some(old_len) => {
            // SAFETY: as malloc.
            let new = unsafe { shared_malloc(ctx, new_size) };
            if !new.is_null() {
                // SAFETY: both are live and at least this long; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), new.cast::<u8>(), old_len.min(new_size)) };
                let _ = catch_unwind(AssertUnwindSafe(|| arenas().free(ptr.cast())));
            }
            new
        }
        // SAFETY: the pointer came from malloc (not an arena's).
        None => unsafe { libc::realloc(ptr, new_size) },
    }
}

unsafe extern "C" fn shared_free(_ctx: *mut c_void, ptr: *mut c_void, _size: usize) {
    if ptr.is_null() {
        return;
    }
    let ours = catch_unwind(AssertUnwindSafe(|| arenas().free(ptr.cast()))).unwrap_or(true);
    if !ours {
        // SAFETY: the pointer came from malloc.
        unsafe { libc::free(ptr) };
    }
}

/// The handler's capsule, made once: arrays keep a reference to it.
fn capsule(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    static CAPSULE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CAPSULE.get_or_try_init(py, || {
        // SAFETY: a capsule around a static that lives as long as the process.
        let raw = unsafe {
            pyo3::ffi::PyCapsule_New(
                std::ptr::addr_of!(HANDLER) as *mut c_void,
                c"mem_handler".as_ptr(),
                None,
            )
        };
        // SAFETY: a new reference, or null with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, raw) }.map(Bound::unbind)
    })
}

type SetHandler = unsafe extern "C" fn(*mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject;

/// NumPy's `PyDataMem_SetHandler`, from its C API table.
fn set_handler_fn(py: Python<'_>) -> PyResult<SetHandler> {
    let entry = crate::numpy_api::entry(py, crate::numpy_api::slot::SET_HANDLER)
        .map_err(|e| PyRuntimeError::new_err(format!("shared arrays: {e}")))?;
    // SAFETY: that slot's signature.
    Ok(unsafe { std::mem::transmute::<*const c_void, SetHandler>(entry) })
}

/// Makes `handler` (our handler when None) NumPy's allocator in the current context;
/// returns the handler it replaces, to give back to this function later.
#[pyfunction]
#[pyo3(signature = (handler=None))]
pub fn shared_arrays_set_handler(py: Python<'_>, handler: Option<Py<PyAny>>) -> PyResult<Py<PyAny>> {
    let set = set_handler_fn(py)?;
    let handler = match handler {
        Some(h) => h,
        None => capsule(py)?.clone_ref(py),
    };
    // SAFETY: NumPy's function, with a handler capsule; it returns a new reference to the
    // previous handler, or null with an exception set.
    let old = unsafe { set(handler.as_ptr()) };
    // SAFETY: as above.
    unsafe { Bound::from_owned_ptr_or_err(py, old) }.map(Bound::unbind)
}

/// Where a buffer's bytes lie in this process's arenas: a dict (`inode`, `offset`, `len`,
/// `private`, `loans`), or None when they are not in one.
#[pyfunction]
pub fn arena_locate<'py>(py: Python<'py>, buffer: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let bytes = crate::frames::bytes_of(buffer)?;
    let Some(at) = arenas().locate(bytes.as_ptr()) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("inode", (at.inode.0, at.inode.1))?;
    d.set_item("offset", at.offset)?;
    d.set_item("len", at.len)?;
    d.set_item("private", at.private)?;
    d.set_item("loans", at.loans)?;
    Ok(Some(d))
}

/// The figures of this process's arenas (see `handoff_arena::Stats`).
#[pyfunction]
pub fn arena_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = arenas().stats();
    let d = PyDict::new(py);
    d.set_item("arenas", s.arenas)?;
    d.set_item("arena_bytes", s.arena_bytes)?;
    d.set_item("live_bytes", s.live_bytes)?;
    d.set_item("lent_ranges", s.lent_ranges)?;
    d.set_item("lent_bytes", s.lent_bytes)?;
    d.set_item("retired_bytes", s.retired_bytes)?;
    d.set_item("private_ranges", s.private_ranges)?;
    d.set_item("freed_lent_bytes", s.freed_lent_bytes)?;
    d.set_item("idle_populated_bytes", s.idle_populated_bytes)?;
    d.set_item("free_bytes", s.free_bytes)?;
    d.set_item("lends", s.lends)?;
    d.set_item("copies", s.copies)?;
    d.set_item("write_backs", s.write_backs)?;
    d.set_item("refused", s.refused)?;
    d.set_item("last_refusal", s.last_refusal)?;
    d.set_item("min_bytes", arenas().min_bytes())?;
    Ok(d)
}

/// Sets the arenas' threshold (`min_bytes`), bound on arenas (`max_arenas`, descriptors)
/// and the freed bytes kept populated for reuse (`idle_bytes`); None leaves one as it is.
#[pyfunction]
#[pyo3(signature = (min_bytes=None, max_arenas=None, idle_bytes=None))]
pub fn arena_configure(min_bytes: Option<usize>, max_arenas: Option<usize>, idle_bytes: Option<usize>) -> PyResult<()> {
    if min_bytes == Some(0) {
        return Err(PyValueError::new_err("min_bytes must be at least 1"));
    }
    if let Some(n) = min_bytes {
        arenas().set_min_bytes(n);
    }
    if let Some(n) = max_arenas {
        arenas().set_max_arenas(n);
    }
    if let Some(n) = idle_bytes {
        arenas().set_idle_bytes(n);
    }
    Ok(())
}

/// Gives the pages of freed ranges back to the system now; returns the bytes.
#[pyfunction]
pub fn arena_trim(py: Python<'_>) -> usize {
    py.detach(|| arenas().trim())
}

/// As `arena_trim`, once no array was allocated or freed for `seconds`; returns the bytes.
#[pyfunction]
pub fn arena_trim_idle(py: Python<'_>, seconds: f64) -> PyResult<usize> {
    let idle = std::time::Duration::try_from_secs_f64(seconds)
        .map_err(|_| PyValueError::new_err(format!("seconds must be 0 or more, not {seconds}")))?;
    Ok(py.detach(|| arenas().trim_if_idle(idle)))
}

/// The name of the handler, as NumPy reports it (`numpy.core.multiarray.get_handler_name`).
pub const HANDLER_NAME: &str = "handoff_shared_arrays";

//! NumPy's C API table (the `_ARRAY_API` capsule of `numpy._core._multiarray_umath`), for
//! the few functions the extension calls without building against NumPy's headers: the
//! data-memory handler of shared arrays and the arrays a received frame becomes.

use std::ffi::c_void;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The slots this crate reads (their numbers are NumPy's ABI, fixed since they were added).
pub(crate) mod slot {
    /// `PyArray_Type`.
    pub const ARRAY_TYPE: usize = 2;
    /// `PyArray_DescrFromType(int)`.
    pub const DESCR_FROM_TYPE: usize = 45;
    /// `PyArray_NewFromDescr(subtype, descr, nd, dims, strides, data, flags, obj)`.
    pub const NEW_FROM_DESCR: usize = 94;
    /// `PyDataMem_SetHandler` (NumPy 1.22 on).
    pub const SET_HANDLER: usize = 304;
}

/// The table's address, found once per process; NumPy 1.22 or later is required (the
/// allocator API, NEP 49, is the newest slot read).
pub(crate) fn table(py: Python<'_>) -> PyResult<*const *const c_void> {
    static TABLE: PyOnceLock<usize> = PyOnceLock::new();
    TABLE
        .get_or_try_init(py, || {
            let numpy = py
                .import("numpy._core._multiarray_umath")
                .or_else(|_| py.import("numpy.core._multiarray_umath"))
                .map_err(|e| PyRuntimeError::new_err(format!("NumPy 1.22 or later is needed: {e}")))?;
            let version: String = py.import("numpy")?.getattr("__version__")?.extract()?;
            let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            if (major, minor) < (1, 22) {
                return Err(PyRuntimeError::new_err(format!(
                    "NumPy 1.22 or later is needed (its allocator API, NEP 49); this is {version}"
                )));
            }
            let api = numpy.getattr("_ARRAY_API")?;
            // SAFETY: NumPy's C API capsule (unnamed), which lives as long as NumPy.
            let table = unsafe { pyo3::ffi::PyCapsule_GetPointer(api.as_ptr(), std::ptr::null()) };
            if table.is_null() {
                return Err(
                    PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err("NumPy's C API table is missing"))
                );
            }
            Ok(table as usize)
        })
        .map(|t| *t as *const *const c_void)
}

/// The function (or object) in slot `n`, refused when NumPy left it empty.
pub(crate) fn entry(py: Python<'_>, n: usize) -> PyResult<*const c_void> {
    // SAFETY: every slot named in `slot` lies inside the table of NumPy 1.22 and later.
    let entry = unsafe { *table(py)?.add(n) };
    if entry.is_null() {
        return Err(PyRuntimeError::new_err(format!("NumPy's C API has no entry {n}")));
    }
    Ok(entry)
}

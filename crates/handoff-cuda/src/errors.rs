//! The words of failure: why the driver cannot be used, a driver call that failed, and how a
//! device is named.

use std::ffi::CStr;

use cudarc::driver::sys;

/// A device's UUID (`cuDeviceGetUuid`): how a peer names a device, whatever its ordinal
/// in either process (`CUDA_VISIBLE_DEVICES` may order them differently).
pub type DeviceId = [u8; 16];

/// Why this process cannot use the CUDA driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA cannot be used here: {0}")]
pub struct Unavailable(pub String);

/// A driver call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} (CUDA error {code})")]
pub struct CudaError {
    /// The driver function.
    pub call: &'static str,
    /// `CUresult` as a number.
    pub code: i32,
    /// Its name (`CUDA_ERROR_…`).
    pub name: String,
}

/// Turns a `CUresult` into a `Result`.
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<(), CudaError> {
    if result == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null.
    let known = unsafe { sys::cuGetErrorName(result, &mut name) } == sys::CUresult::CUDA_SUCCESS;
    let name = if known && !name.is_null() {
        // SAFETY: a NUL-terminated static string of the driver's.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        "an unknown error".to_string()
    };
    Err(CudaError {
        call,
        code: result as i32,
        name,
    })
}

/// A failure that is not the driver's own code.
pub(crate) fn refused(call: &'static str, why: String) -> CudaError {
    CudaError {
        call,
        code: -1,
        name: why,
    }
}

//! Device memory this process allocates, and copies between the device and the host.

use cudarc::driver::sys;

use crate::driver::Driver;
use crate::errors::{check, CudaError};

/// Device memory allocated here (`cuMemAlloc`), freed on drop.
pub struct DeviceAlloc {
    ptr: u64,
    len: u64,
    ordinal: usize,
    driver: &'static Driver,
}

impl DeviceAlloc {
    /// The device pointer of its first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ordinal of the device it lies on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // (In a forked child `enter` refuses: the memory is the parent's.)
        if self.ptr == 0 || !self.driver.usable_here() {
            return;
        }
        if let Some(e) = &self.driver.emulator {
            e.free(self.ptr);
        } else if let Ok(_entered) = self.driver.enter(self.ordinal) {
            // SAFETY: allocated by cuMemAlloc in `alloc`, freed once, here.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

impl Driver {
    /// `len` bytes of device `ordinal`'s memory.
    pub fn alloc(&'static self, ordinal: usize, len: u64) -> Result<DeviceAlloc, CudaError> {
        let _entered = self.enter(ordinal)?;
        let mut ptr = 0u64;
        if let Some(e) = &self.emulator {
            ptr = e.alloc(len)?;
        } else if len > 0 {
            // SAFETY: an out-pointer to a local.
            check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len as usize) })?;
        }
        Ok(DeviceAlloc {
            ptr,
            len,
            ordinal,
            driver: self,
        })
    }

    /// A copy of `bytes` in new memory of device `ordinal`, there when this returns (a copy
    /// from pageable memory may return before it lands: the device is synchronised).
    pub fn upload(&'static self, ordinal: usize, bytes: &[u8]) -> Result<DeviceAlloc, CudaError> {
        let alloc = self.alloc(ordinal, bytes.len() as u64)?;
        if let Some(e) = &self.emulator {
            e.copy_from_host(alloc.ptr, bytes)?;
        } else if !bytes.is_empty() {
            let _entered = self.enter(ordinal)?;
            // SAFETY: the allocation holds `bytes.len()` bytes.
            unsafe {
                check(
                    "cuMemcpyHtoD",
                    sys::cuMemcpyHtoD_v2(alloc.ptr, bytes.as_ptr().cast(), bytes.len()),
                )?;
                check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
            }
        }
        Ok(alloc)
    }

    /// Copies `out.len()` bytes from device pointer `ptr` of this process, after the work
    /// queued on its device.
    pub fn copy_to_host(&self, ptr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        if out.is_empty() {
            return Ok(());
        }
        if let Some(e) = &self.emulator {
            return e.copy_to_host(ptr, out);
        }
        let ordinal = self.device_of(ptr)?;
        let _entered = self.enter(ordinal)?;
        // SAFETY: `out` holds the bytes asked for; the driver checks the device range.
        unsafe {
            check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
            check(
                "cuMemcpyDtoH",
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, out.len()),
            )
        }
    }
}

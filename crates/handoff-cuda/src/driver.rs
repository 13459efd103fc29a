//! Loading the driver, the devices by UUID, their primary contexts, and errors.

use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::emulated::{Emulator, EMULATED_DEVICE};
use crate::errors::{check, refused, CudaError, DeviceId, Unavailable};

/// The oldest driver whose API this crate calls: CUDA 11.4 (`cuDeviceGetUuid_v2`).
const OLDEST_DRIVER: i32 = 11040;

/// A device's primary context, retained the first time this process works on the device
/// (never on devices it does not use: each costs device memory), and kept.
struct Context(sys::CUcontext);

// The driver's handle, valid in every thread of the process that retained it.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

/// One device: its handle, its UUID and its primary context once retained.
struct Device {
    handle: sys::CUdevice,
    uuid: DeviceId,
    context: OnceLock<Result<Context, CudaError>>,
}

/// The loaded driver and this process's devices.
pub struct Driver {
    devices: Vec<Device>,
    pub(crate) pid: u32,
    /// The stand-in for tests (`HANDOFF_CUDA_EMULATE=1`), in place of the driver.
    pub(crate) emulator: Option<Emulator>,
}

/// A host copy of `len` bytes of this process's device memory at `ptr`, after the work
/// queued on its device. It blocks for as long as the bus takes. The error says whether the
/// driver could not be used or the copy failed.
pub fn host_copy(ptr: u64, len: usize) -> Result<Vec<u8>, String> {
    let d = driver().map_err(|e| e.to_string())?;
    let mut out = vec![0u8; len];
    d.copy_to_host(ptr, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The driver, loaded and initialised once per process; or why it cannot be used.
///
/// `HANDOFF_CUDA=0` turns it off. A process forked after the driver was initialised
/// cannot use it (CUDA does not survive `fork`), and is told so.
pub fn driver() -> Result<&'static Driver, Unavailable> {
    static DRIVER: OnceLock<Result<Driver, Unavailable>> = OnceLock::new();
    let loaded = DRIVER
        .get_or_init(|| {
            // cudarc panics on a symbol the driver lacks: an old driver is refused first,
            // and anything left is caught here, never passed to the caller.
            std::panic::catch_unwind(load)
                .unwrap_or_else(|_| Err(Unavailable("the CUDA driver lacks a function handoff calls".into())))
        })
        .as_ref()
        .map_err(Clone::clone)?;
    if loaded.pid != std::process::id() {
        return Err(Unavailable(format!(
            "this process was forked from {} after it initialised CUDA, which does not survive a fork",
            loaded.pid
        )));
    }
    Ok(loaded)
}

fn load() -> Result<Driver, Unavailable> {
    if std::env::var("HANDOFF_CUDA").is_ok_and(|v| v == "0") {
        return Err(Unavailable("HANDOFF_CUDA=0 turns it off".into()));
    }
    if std::env::var("HANDOFF_CUDA_EMULATE").is_ok_and(|v| v == "1") {
        return Ok(Driver {
            devices: vec![Device {
                handle: 0,
                uuid: EMULATED_DEVICE,
                context: OnceLock::new(),
            }],
            pid: std::process::id(),
            emulator: Some(Emulator::from_env()),
        });
    }
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(Unavailable("no CUDA driver (libcuda.so) was found".into()));
    }
    let failed = |e: CudaError| Unavailable(e.to_string());
    // SAFETY: plain driver calls with out-pointers to locals.
    unsafe {
        let mut version = 0;
        check("cuDriverGetVersion", sys::cuDriverGetVersion(&mut version)).map_err(failed)?;
        if version < OLDEST_DRIVER {
            return Err(Unavailable(format!(
                "the CUDA driver is version {}.{}; handoff needs 11.4 or later",
                version / 1000,
                version % 1000 / 10
            )));
        }
        check("cuInit", sys::cuInit(0)).map_err(failed)?;
        let mut count = 0;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count)).map_err(failed)?;
        if count <= 0 {
            return Err(Unavailable("the CUDA driver sees no device".into()));
        }
        let mut devices = Vec::with_capacity(count as usize);
        for ordinal in 0..count {
            let mut handle = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut handle, ordinal)).map_err(failed)?;
            let mut uuid = std::mem::zeroed::<sys::CUuuid>();
            check("cuDeviceGetUuid", sys::cuDeviceGetUuid_v2(&mut uuid, handle)).map_err(failed)?;
            devices.push(Device {
                handle,
                uuid: uuid.bytes.map(|b| b as u8),
                context: OnceLock::new(),
            });
        }
        Ok(Driver {
            devices,
            pid: std::process::id(),
            emulator: None,
        })
    }
}

/// Device `ordinal`'s primary context made current on this thread until dropped; the
/// thread's own context (CuPy's, PyTorch's current device) is current again after.
pub(crate) struct Entered {
    pushed: bool,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops what `enter` pushed on this thread.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

impl Driver {
    /// The UUIDs of this process's devices, by ordinal.
    pub fn devices(&self) -> Vec<DeviceId> {
        self.devices.iter().map(|d| d.uuid).collect()
    }

    /// The ordinal of the device with this UUID, if this process sees it.
    pub fn ordinal_of(&self, uuid: &DeviceId) -> Option<usize> {
        self.devices.iter().position(|d| &d.uuid == uuid)
    }

    /// Whether this is the emulated driver of `HANDOFF_CUDA_EMULATE=1` (tests only).
    pub fn is_emulated(&self) -> bool {
        self.emulator.is_some()
    }

    /// Whether this is the process that loaded the driver (not a forked child of it).
    pub(crate) fn usable_here(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Makes device `ordinal`'s primary context current on this thread while the guard
    /// lives (retained on first use).
    pub(crate) fn enter(&self, ordinal: usize) -> Result<Entered, CudaError> {
        if !self.usable_here() {
            return Err(refused("cuCtxPushCurrent", "CUDA does not survive a fork".into()));
        }
        let device = self
            .devices
            .get(ordinal)
            .ok_or_else(|| refused("cuCtxPushCurrent", format!("no device {ordinal}")))?;
        if self.emulator.is_some() {
            return Ok(Entered { pushed: false });
        }
        let context = device.context.get_or_init(|| {
            let mut context = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; the context is kept for the process's life.
            check("cuDevicePrimaryCtxRetain", unsafe {
                sys::cuDevicePrimaryCtxRetain(&mut context, device.handle)
            })
            .map(|()| Context(context))
        });
        let context = context.as_ref().map_err(Clone::clone)?;
        // SAFETY: a retained context, popped by the guard.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(context.0) })?;
        Ok(Entered { pushed: true })
    }

    /// The ordinal of the device that holds `ptr`, a device pointer of this process.
    pub(crate) fn device_of(&self, ptr: u64) -> Result<usize, CudaError> {
        if let Some(e) = &self.emulator {
            return match e.contains(ptr) {
                true => Ok(0),
                false => Err(refused(
                    "cuPointerGetAttribute",
                    format!("{ptr:#x} is not emulated device memory"),
                )),
            };
        }
        // The query needs a current context (any, with unified addressing): device 0's.
        let _entered = self.enter(0)?;
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: the attribute is an int written to a local.
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut std::ffi::c_int).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        })?;
        usize::try_from(ordinal)
            .ok()
            .filter(|o| *o < self.devices.len())
            .ok_or_else(|| {
                refused(
                    "cuPointerGetAttribute",
                    format!("device {ordinal} is not one of this process's"),
                )
            })
    }

    /// The UUID of device `ordinal`.
    pub fn uuid(&self, ordinal: usize) -> DeviceId {
        self.devices[ordinal].uuid
    }

    /// Waits for the work queued on device `ordinal` (every stream of its primary context).
    pub fn synchronize(&self, ordinal: usize) -> Result<(), CudaError> {
        let _entered = self.enter(ordinal)?;
        if self.emulator.is_some() {
            return Ok(());
        }
        // SAFETY: no arguments.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// Free and total bytes of device `ordinal`'s memory.
    pub fn memory_info(&self, ordinal: usize) -> Result<(u64, u64), CudaError> {
        let _entered = self.enter(ordinal)?;
        if let Some(e) = &self.emulator {
            const TOTAL: u64 = 1 << 40;
            return Ok((TOTAL.saturating_sub(e.bytes()), TOTAL));
        }
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_cuda_says_why() {
        // Here either the driver loads or it says why not; it never panics.
        match driver() {
            Ok(d) => assert!(!d.devices().is_empty()),
            Err(Unavailable(why)) => assert!(!why.is_empty()),
        }
    }
}

//! CUDA IPC: naming a range of device memory for a same-host peer, and mapping a peer's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys;

use crate::driver::Driver;
use crate::errors::{check, refused, CudaError, DeviceId};

/// Bytes of a CUDA IPC memory handle (`CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// A range of this process's device memory, as a peer on the same host can open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The IPC handle of the allocation the range lies in.
    pub ipc: [u8; IPC_HANDLE_BYTES],
    /// The device it lies on.
    pub device: DeviceId,
    /// Where the range starts in the allocation.
    pub offset: u64,
}

/// A peer's allocation, mapped in this process until the last [`Opened`] range of it goes.
struct Mapping {
    /// What `cuIpcOpenMemHandle` returned: the allocation's first byte here.
    opened: u64,
    /// Bytes from `opened` to the end of the allocation.
    size: u64,
    ordinal: usize,
    driver: &'static Driver,
    handle: [u8; IPC_HANDLE_BYTES],
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // A forked child inherited the mapping's record, not the mapping: nothing to close
        // (and no lock that another thread may have held at the fork).
        if !self.driver.usable_here() {
            return;
        }
        // Under the lock, so that the handle is closed before anyone opens it again.
        let mut open = OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = &self.driver.emulator {
            e.free(self.opened);
        } else if let Ok(_entered) = self.driver.enter(self.ordinal) {
            // Nothing to report to: a failed close leaves the mapping to the process's end.
            // SAFETY: `opened` came from cuIpcOpenMemHandle and is closed once, here.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.opened) };
        }
        if open.get(&self.handle).is_some_and(|w| w.strong_count() == 0) {
            open.remove(&self.handle);
        }
    }
}

/// The peers' allocations mapped now, by handle: each is opened once per process and
/// shared by every frame that names it.
static OPEN: Mutex<BTreeMap<[u8; IPC_HANDLE_BYTES], Weak<Mapping>>> = Mutex::new(BTreeMap::new());

/// A range of a peer's device memory, mapped here. Dropping the last range of an
/// allocation unmaps it.
pub struct Opened {
    mapping: Arc<Mapping>,
    offset: u64,
    len: u64,
}

impl Opened {
    /// The device pointer of the range's first byte, valid in this process while `self` lives.
    pub fn ptr(&self) -> u64 {
        self.mapping.opened + self.offset
    }

    /// The range's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ordinal, in this process, of the device it lies on.
    pub fn ordinal(&self) -> usize {
        self.mapping.ordinal
    }
}

impl Driver {
    /// Names `len` bytes at device pointer `ptr` for a same-host peer: the IPC handle of
    /// the allocation they lie in, and where in it. Work queued on the device is finished
    /// first, so that the peer reads what was written.
    ///
    /// Fails for memory that has no IPC handle (managed memory, stream-ordered pools,
    /// virtual-memory mappings such as PyTorch's expandable segments, memory this process
    /// opened from a peer): send a copy then.
    pub fn export(&'static self, ptr: u64, len: u64) -> Result<Exported, CudaError> {
        if let Some(e) = &self.emulator {
            let (ipc, offset) = e.export(ptr, len)?;
            return Ok(Exported {
                ipc,
                device: self.uuid(0),
                offset,
            });
        }
        let ordinal = self.device_of(ptr)?;
        let _entered = self.enter(ordinal)?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: a zeroed plain struct, written by the driver.
        let mut handle = unsafe { std::mem::zeroed::<sys::CUipcMemHandle>() };
        // SAFETY: out-pointers to locals; the pointer is checked by the driver.
        unsafe {
            check(
                "cuMemGetAddressRange",
                sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr),
            )?;
            check("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(&mut handle, base))?;
            check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
        }
        let offset = ptr - base;
        if offset.checked_add(len).is_none_or(|end| end > size as u64) {
            return Err(refused(
                "cuMemGetAddressRange",
                format!("{len} bytes at offset {offset} run past the allocation of {size} bytes"),
            ));
        }
        Ok(Exported {
            ipc: handle.reserved.map(|b| b as u8),
            device: self.uuid(ordinal),
            offset,
        })
    }

    /// Maps `len` bytes at `offset` of the allocation a peer named by `ipc` on device
    /// `device`. Fails when this process does not see that device, when the driver refuses
    /// the handle (another container, another host), or when the range runs past the
    /// allocation.
    ///
    /// `HANDOFF_CUDA_IPC=0` refuses every handle, as a container without IPC would: the
    /// receiver then pulls the bytes.
    pub fn open(
        &'static self,
        ipc: &[u8; IPC_HANDLE_BYTES],
        device: &DeviceId,
        offset: u64,
        len: u64,
    ) -> Result<Opened, OpenError> {
        if std::env::var("HANDOFF_CUDA_IPC").is_ok_and(|v| v == "0") {
            return Err(OpenError::TurnedOff);
        }
        let ordinal = self.ordinal_of(device).ok_or(OpenError::NoSuchDevice)?;
        let mut open = OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mapping = match open.get(ipc).and_then(Weak::upgrade) {
            Some(m) => m,
            None => {
                let m = Arc::new(self.map(ipc, ordinal)?);
                open.insert(*ipc, Arc::downgrade(&m));
                m
            }
        };
        drop(open);
        if offset.checked_add(len).is_none_or(|end| end > mapping.size) {
            return Err(OpenError::OutOfRange {
                offset,
                len,
                size: mapping.size,
            });
        }
        Ok(Opened { mapping, offset, len })
    }

    /// Opens a peer's handle on device `ordinal` (the caller holds the `OPEN` lock).
    fn map(&'static self, ipc: &[u8; IPC_HANDLE_BYTES], ordinal: usize) -> Result<Mapping, CudaError> {
        if let Some(e) = &self.emulator {
            let (opened, size) = e.open(ipc)?;
            return Ok(Mapping {
                opened,
                size,
                ordinal,
                driver: self,
                handle: *ipc,
            });
        }
        let _entered = self.enter(ordinal)?;
        // SAFETY: a zeroed plain struct, filled with the peer's bytes.
        let mut handle = unsafe { std::mem::zeroed::<sys::CUipcMemHandle>() };
        handle.reserved = ipc.map(|b| b as std::ffi::c_char);
        let mut opened = 0u64;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: an out-pointer to a local; the driver checks the handle.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut opened, handle, flags)
        })?;
        // Where the allocation ends: a small one may lie inside a larger block the driver
        // shares whole, so the range is measured from what was opened, not from its base.
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers to locals.
        let measured = check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, opened)
        });
        if let Err(e) = measured {
            // SAFETY: opened above, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(opened) };
            return Err(e);
        }
        Ok(Mapping {
            opened,
            size: base + size as u64 - opened,
            ordinal,
            driver: self,
            handle: *ipc,
        })
    }
}

/// Why a peer's range could not be mapped here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// `HANDOFF_CUDA_IPC=0`.
    #[error("HANDOFF_CUDA_IPC=0 turns mapping off")]
    TurnedOff,
    /// This process does not see the device the memory lies on.
    #[error("this process sees no device with the sender's UUID")]
    NoSuchDevice,
    /// The driver refused.
    #[error(transparent)]
    Driver(#[from] CudaError),
    /// The range runs past the allocation the handle names.
    #[error("{len} bytes at offset {offset} run past the peer's allocation of {size} bytes")]
    OutOfRange {
        /// Where the range starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The allocation's size.
        size: u64,
    },
}

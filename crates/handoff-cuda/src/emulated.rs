//! A stand-in for the CUDA driver, for tests on machines without a GPU
//! (`HANDOFF_CUDA_EMULATE=1`): "device memory" is host memory in memfds, and an "IPC
//! handle" names a memfd by the owner's pid and descriptor, which a peer of the same user
//! opens through `/proc`. What it checks is handoff's side of spec §7.10 (which frames are
//! named, mapped, pulled, released, and when the owner frees them), never CUDA's: a CUDA
//! library cannot read this memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use memmap2::MmapMut;

use crate::errors::{refused, CudaError, DeviceId};

/// The one emulated device's UUID.
pub(crate) const EMULATED_DEVICE: DeviceId = *b"handoff-emulated";

/// The first bytes of an emulated handle.
const MAGIC: &[u8; 8] = b"HOFFEMU1";

/// A region of emulated device memory: one of ours (with its memfd), or a peer's we mapped.
struct Region {
    map: MmapMut,
    /// Our own allocation's memfd (what a peer opens); none for a peer's mapping.
    fd: Option<File>,
}

/// The emulated memory of this process, by the address of each region's first byte.
#[derive(Default)]
pub(crate) struct Emulator {
    regions: Mutex<BTreeMap<u64, Region>>,
    /// How long a copy to the host takes per MiB, beyond the memcpy: a slow bus, for tests
    /// of what a long copy holds up (`HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB`; none by default).
    dtoh_per_mib: Option<std::time::Duration>,
}

impl Emulator {
    /// The emulator, with the copy delay of `HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB` if set.
    pub(crate) fn from_env() -> Emulator {
        let per_mib = std::env::var("HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms <= 1000.0)
            .map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0));
        Emulator {
            dtoh_per_mib: per_mib,
            ..Emulator::default()
        }
    }
}

fn failed(call: &'static str, e: impl std::fmt::Display) -> CudaError {
    refused(call, format!("(emulated) {e}"))
}

impl Emulator {
    fn regions(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Region>> {
        self.regions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `len` bytes of new, zeroed emulated device memory: its address.
    pub(crate) fn alloc(&self, len: u64) -> Result<u64, CudaError> {
        let fd: OwnedFd = rustix::fs::memfd_create("handoff-emulated-gpu", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| failed("cuMemAlloc", e))?;
        let file = File::from(fd);
        file.set_len(len.max(1)).map_err(|e| failed("cuMemAlloc", e))?;
        // SAFETY: a fresh memfd of ours, mapped shared: peers write nothing to it (they map
        // it to read), and it lives until `free`.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| failed("cuMemAlloc", e))?;
        let ptr = map.as_mut_ptr() as u64;
        self.regions().insert(ptr, Region { map, fd: Some(file) });
        Ok(ptr)
    }

    /// Frees an allocation of ours (or unmaps a peer's region).
    pub(crate) fn free(&self, ptr: u64) {
        self.regions().remove(&ptr);
    }

    /// The region holding `[ptr, ptr + len)`: (its first byte's address, its length).
    fn region_of(&self, ptr: u64, len: u64) -> Option<(u64, u64)> {
        let regions = self.regions();
        let (base, r) = regions.range(..=ptr).next_back()?;
        let size = r.map.len() as u64;
        (ptr.checked_add(len)? <= base + size).then_some((*base, size))
    }

    /// Whether `ptr` lies in emulated memory of this process.
    pub(crate) fn contains(&self, ptr: u64) -> bool {
        self.region_of(ptr, 0).is_some()
    }

    /// The handle of the allocation of ours that holds `[ptr, ptr + len)`, and where in it.
    pub(crate) fn export(&self, ptr: u64, len: u64) -> Result<([u8; 64], u64), CudaError> {
        let regions = self.regions();
        let Some((base, r)) = regions.range(..=ptr).next_back() else {
            return Err(failed(
                "cuIpcGetMemHandle",
                "not emulated device memory of this process",
            ));
        };
        let Some(fd) = &r.fd else {
            return Err(failed(
                "cuIpcGetMemHandle",
                "memory mapped from a peer has no handle of ours",
            ));
        };
        let offset = ptr - base;
        if offset.checked_add(len).is_none_or(|end| end > r.map.len() as u64) {
            return Err(failed("cuIpcGetMemHandle", "the range runs past its allocation"));
        }
        let mut handle = [0u8; 64];
        handle[..8].copy_from_slice(MAGIC);
        handle[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        handle[12..16].copy_from_slice(&fd.as_raw_fd().to_le_bytes());
        handle[16..24].copy_from_slice(&(r.map.len() as u64).to_le_bytes());
        Ok((handle, offset))
    }

    /// Maps a peer's allocation from its handle: (its address here, its length).
    pub(crate) fn open(&self, handle: &[u8; 64]) -> Result<(u64, u64), CudaError> {
        if &handle[..8] != MAGIC {
            return Err(failed("cuIpcOpenMemHandle", "not a handle of an emulated allocation"));
        }
        let word = |at: usize| u32::from_le_bytes(handle[at..at + 4].try_into().expect("4 bytes"));
        let (pid, fd) = (word(8), word(12) as i32);
        let len = u64::from_le_bytes(handle[16..24].try_into().expect("8 bytes"));
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = File::open(&path).map_err(|e| failed("cuIpcOpenMemHandle", format!("{path}: {e}")))?;
        let size = file.metadata().map_err(|e| failed("cuIpcOpenMemHandle", e))?.len();
        if size < len || len == 0 {
            return Err(failed(
                "cuIpcOpenMemHandle",
                format!("{path} holds {size} bytes, not {len}"),
            ));
        }
        // SAFETY: the peer's memfd, mapped copy-on-write: its later writes may show, ours
        // never reach it (as a real receiver, this one must not write to it).
        let mut map = unsafe { memmap2::MmapOptions::new().len(len as usize).map_copy(&file) }
            .map_err(|e| failed("cuIpcOpenMemHandle", e))?;
        let ptr = map.as_mut_ptr() as u64;
        self.regions().insert(ptr, Region { map, fd: None });
        Ok((ptr, len))
    }

    /// Copies `out.len()` bytes from `ptr`, which must lie in emulated memory.
    pub(crate) fn copy_to_host(&self, ptr: u64, out: &mut [u8]) -> Result<(), CudaError> {
        if self.region_of(ptr, out.len() as u64).is_none() {
            return Err(failed(
                "cuMemcpyDtoH",
                format!("{:#x}+{} is not emulated device memory", ptr, out.len()),
            ));
        }
        // SAFETY: the range lies in a region mapped while the registry holds it, and the
        // caller holds what keeps the region (its allocation or its mapping) alive.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), out.len()) };
        if let Some(per_mib) = self.dtoh_per_mib {
            std::thread::sleep(per_mib.mul_f64(out.len() as f64 / (1 << 20) as f64));
        }
        Ok(())
    }

    /// Copies `bytes` to `ptr`, which must lie in emulated memory of ours.
    pub(crate) fn copy_from_host(&self, ptr: u64, bytes: &[u8]) -> Result<(), CudaError> {
        if self.region_of(ptr, bytes.len() as u64).is_none() {
            return Err(failed("cuMemcpyHtoD", "not emulated device memory"));
        }
        // SAFETY: as in `copy_to_host`, and the region is ours.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len()) };
        Ok(())
    }

    /// Bytes of emulated memory this process holds (its own and mapped).
    pub(crate) fn bytes(&self) -> u64 {
        self.regions().values().map(|r| r.map.len() as u64).sum()
    }
}

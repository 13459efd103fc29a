//! GPU memory in messages (spec §7.10). A [`DeviceBuffer`] goes in a message as a [`Buffer`]
//! (`Buffer::from(device_buffer)`): to a same-host peer that maps GPU memory (it announced
//! `cuda`) by its CUDA IPC handle, with no byte copied, the node keeping it under a lease
//! until the peer lets it go; to any other peer as a host copy. A received one is the
//! sender's memory mapped here, or, where the handle cannot be opened, a claim whose bytes
//! [`DeviceBuffer::on_device`] pulls and puts on a device of this process.

use std::sync::Arc;

use bytes::Bytes;
use handoff_cuda::{driver, host_copy, DeviceAlloc, Opened};
use handoff_proto::ticket_leases::DeviceBytes;
use handoff_wire::{Buffer, DeviceClaim};

use crate::tickets::holder::{Ticket, TicketHandle};
use crate::{Error, Result};

/// Where a device buffer's bytes are.
enum Memory {
    /// This process's device memory.
    Ours(DeviceAlloc),
    /// A peer's, mapped here; the hold on its lease ends with the last handle.
    Mapped { opened: Opened, _hold: Arc<TicketHandle> },
    /// A peer's that could not be mapped here (on the device with this UUID at the sender):
    /// what [`DeviceBuffer::on_device`] pulls, one pull at a time (its owner makes a host
    /// copy for each, and refuses a holder that has too many in flight, spec §9.1).
    Unmapped(Arc<TicketHandle>, handoff_cuda::DeviceId, tokio::sync::Mutex<()>),
}

impl Drop for Memory {
    fn drop(&mut self) {
        // Work of ours may still read the sender's memory: it finishes before the hold ends
        // (after this, with the fields) and the sender may use the memory again.
        if let (Memory::Mapped { opened, .. }, Ok(d)) = (&*self, driver()) {
            let _ = d.synchronize(opened.ordinal());
        }
    }
}

/// Device memory that travels in messages (see the module's text). Cheap to clone.
#[derive(Clone)]
pub struct DeviceBuffer(Arc<Memory>);

/// The origin of the placeholder `Buffer` that carries a device buffer in a message.
struct DeviceOrigin(DeviceBuffer);

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::io(what.to_string(), std::io::Error::other(e.to_string()))
}

impl DeviceBuffer {
    /// Device memory of this process's, to send.
    pub fn new(memory: DeviceAlloc) -> DeviceBuffer {
        DeviceBuffer(Arc::new(Memory::Ours(memory)))
    }

    /// A copy of `bytes` on device `ordinal` (see [`handoff_cuda::driver`] for why a
    /// process may have none).
    pub fn upload(ordinal: usize, bytes: &[u8]) -> Result<DeviceBuffer> {
        let d = driver().map_err(|e| unavailable("uploading to a GPU", e))?;
        let alloc = d
            .upload(ordinal, bytes)
            .map_err(|e| unavailable("uploading to a GPU", e))?;
        Ok(DeviceBuffer::new(alloc))
    }

    /// The device buffer a message's `Buffer` carries, if it carries one.
    pub fn of(buffer: &Buffer) -> Option<DeviceBuffer> {
        buffer
            .origin()
            .and_then(|o| o.downcast_ref::<DeviceOrigin>())
            .map(|d| d.0.clone())
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match &*self.0 {
            Memory::Ours(a) => a.len(),
            Memory::Mapped { opened, .. } => opened.len(),
            Memory::Unmapped(h, ..) => h.claim.len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its device pointer in this process, where its bytes are on a device here (not for a
    /// peer's memory that could not be mapped: [`on_device`](Self::on_device) first).
    pub fn ptr(&self) -> Option<u64> {
        match &*self.0 {
            Memory::Ours(a) => Some(a.ptr()),
            Memory::Mapped { opened, .. } => Some(opened.ptr()),
            Memory::Unmapped(..) => None,
        }
    }

    /// How it came: `"local"` (made here), `"ipc"` (the sender's memory, mapped), or
    /// `"unmapped"` (to be pulled).
    pub fn via(&self) -> &'static str {
        match &*self.0 {
            Memory::Ours(_) => "local",
            Memory::Mapped { .. } => "ipc",
            Memory::Unmapped(..) => "unmapped",
        }
    }

    /// Its bytes on a device of this process: itself, or for a peer's memory that could not
    /// be mapped, its bytes pulled from the sender and put on this process's device with
    /// the sender's UUID if it sees one, else device 0.
    pub async fn on_device(&self) -> Result<DeviceBuffer> {
        let Memory::Unmapped(hold, device, pulling) = &*self.0 else {
            return Ok(self.clone());
        };
        let bytes = {
            let _one_at_a_time = pulling.lock().await;
            Ticket(hold.clone()).read(0..hold.claim.len).await?
        };
        let ordinal = driver().ok().and_then(|d| d.ordinal_of(device)).unwrap_or(0);
        DeviceBuffer::upload(ordinal, &bytes)
    }

    /// A host copy of its bytes (pulled from the sender where they could not be mapped).
    pub async fn to_host(&self) -> Result<Bytes> {
        if let Memory::Unmapped(hold, _, pulling) = &*self.0 {
            let _one_at_a_time = pulling.lock().await;
            return Ticket(hold.clone()).read(0..hold.claim.len).await;
        }
        let ptr = self.ptr().expect("on a device here");
        let out = host_copy(ptr, self.len() as usize).map_err(|e| unavailable("copying from a GPU", e))?;
        Ok(Bytes::from(out))
    }

    /// A received `cuda` frame (spec §7.10), held by this node through `hold` (made by the
    /// caller from `handoff_proto::received::device_hold`): mapped if it can be.
    pub(crate) fn received(claim: &DeviceClaim, hold: Arc<TicketHandle>) -> DeviceBuffer {
        let opened = driver()
            .ok()
            .and_then(|d| d.open(&claim.ipc, &claim.device, claim.offset, claim.len).ok());
        DeviceBuffer(Arc::new(match opened {
            Some(opened) => Memory::Mapped { opened, _hold: hold },
            None => Memory::Unmapped(hold, claim.device, tokio::sync::Mutex::new(())),
        }))
    }

    /// What the owner keeps under a lease for a peer that maps it: memory of ours only.
    pub(crate) fn leasable(&self) -> Option<(u64, Arc<dyn DeviceBytes>)> {
        match &*self.0 {
            Memory::Ours(a) => Some((a.ptr(), Arc::new(Leased(self.clone())))),
            _ => None,
        }
    }
}

impl From<DeviceBuffer> for Buffer {
    fn from(d: DeviceBuffer) -> Buffer {
        Buffer::with_origin(Bytes::new(), Arc::new(DeviceOrigin(d)))
    }
}

/// A device buffer of ours under a lease: what a peer that cannot map it pulls.
struct Leased(DeviceBuffer);

impl DeviceBytes for Leased {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn copy_out(&self, offset: u64, len: u64) -> std::result::Result<Buffer, String> {
        let ptr = self.0.ptr().ok_or("not on a device here")?;
        Ok(Buffer::from(host_copy(ptr + offset, len as usize)?))
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes, {})", self.len(), self.via())
    }
}

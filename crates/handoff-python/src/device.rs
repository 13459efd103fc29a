//! GPU memory in messages (spec §7.10): what a sender's CUDA arrays become, and what a
//! receiver gets for a `cuda` frame.
//!
//! - A frame object with `__cuda_array_interface__` (CuPy, PyTorch, Numba) is named by its
//!   IPC handle to a same-host peer that announced `cuda` ([`DeviceSource`], leased until
//!   the peer releases it), and copied to the host for any other.
//! - A received `cuda` frame is a [`DeviceClaim`]: the peer's memory mapped here
//!   ([`DeviceClaim::open`]), or, where that fails, its bytes pulled and put on a device of
//!   ours ([`DeviceClaim::upload`]). Either way the application gets a [`DeviceFrame`], a
//!   CUDA array of bytes on its device.

use std::sync::Arc;

use handoff_cuda::{driver, host_copy, DeviceAlloc, Opened};
use handoff_proto::ticket_leases::DeviceBytes;
use handoff_wire::Buffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::frames::bytes_of;
use crate::tickets::Ticket;

/// Whether this process can use CUDA, and if not why: `(True, "")` or `(False, reason)`.
#[pyfunction]
pub fn cuda_status() -> (bool, String) {
    match driver() {
        Ok(_) => (true, String::new()),
        Err(e) => (false, e.0),
    }
}

/// Whether GPU memory goes to a receiver with these capabilities, on this channel (`"shm"`
/// or `"tcp"`), by its IPC handle rather than as a host copy: the engine's send policy
/// (`handoff_proto::send_policy`, spec §7.10), which route-aware encoders ask too.
#[pyfunction]
pub fn shares_device_memory(channel: &str, capabilities: Vec<String>) -> bool {
    use handoff_proto::send_policy::{Frame, FramePlan, TicketPolicy};
    let receiver = handoff_wire::Endpoint {
        node_id: String::new(),
        name: String::new(),
        host_id: String::new(),
        process_id: String::new(),
        language: String::new(),
        capabilities,
    };
    let channel = if channel == "shm" {
        handoff_wire::Channel::Shm
    } else {
        handoff_wire::Channel::Tcp
    };
    let policy = TicketPolicy {
        receiver: &receiver,
        channel,
        threshold: None,
        by_ticket: false,
    };
    policy.plan(Frame::Device) == FramePlan::ShareDevice
}

/// Free and total bytes of device `ordinal`'s memory.
#[pyfunction]
#[pyo3(signature = (ordinal=0))]
pub fn cuda_memory_info(ordinal: usize) -> PyResult<(u64, u64)> {
    let d = driver().map_err(|e| PyOSError::new_err(e.to_string()))?;
    if ordinal >= d.devices().len() {
        return Err(PyValueError::new_err(format!("no CUDA device {ordinal}")));
    }
    d.memory_info(ordinal).map_err(|e| PyOSError::new_err(e.to_string()))
}

/// A host copy of the bytes of `obj`, an object with `__cuda_array_interface__`.
#[pyfunction]
pub fn cuda_to_host<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let src = DeviceSource::of(obj)?.ok_or_else(|| PyValueError::new_err("not a CUDA array"))?;
    let bytes = src.to_host(py)?;
    Ok(PyBytes::new(py, &bytes))
}

/// A copy of `data` (any bytes-like object) in new memory of device `ordinal`.
#[pyfunction]
#[pyo3(signature = (data, ordinal=0))]
pub fn cuda_upload(py: Python<'_>, data: &Bound<'_, PyAny>, ordinal: usize) -> PyResult<DeviceFrame> {
    let bytes = bytes_of(data)?;
    let d = driver().map_err(|e| PyOSError::new_err(e.to_string()))?;
    if ordinal >= d.devices().len() {
        return Err(PyValueError::new_err(format!("no CUDA device {ordinal}")));
    }
    let alloc = py
        .detach(|| d.upload(ordinal, &bytes))
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    Ok(DeviceFrame {
        memory: Memory::Alloc(alloc),
        hold: None,
    })
}

/// A frame of this node's device memory: the pointer and length of a C-contiguous CUDA
/// array, and the array itself, kept alive while the frame is sent or leased.
pub(crate) struct DeviceSource {
    ptr: u64,
    len: u64,
    /// The array: its memory lives as long as it does.
    #[allow(dead_code)]
    keep: Py<PyAny>,
}

/// The bytes of one element of a `typestr` (`"<f8"`, `"|u1"`, …).
fn item_size(typestr: &str) -> Option<u64> {
    typestr.get(2..)?.parse().ok().filter(|n| *n > 0)
}

impl DeviceSource {
    /// The device memory of `obj`, if it has `__cuda_array_interface__`; an error for one
    /// that handoff cannot send (not contiguous, masked).
    pub(crate) fn of(obj: &Bound<'_, PyAny>) -> PyResult<Option<DeviceSource>> {
        let Ok(cai) = obj.getattr("__cuda_array_interface__") else {
            return Ok(None);
        };
        let cai = cai.cast_into::<PyDict>()?;
        let item = |key: &str| cai.get_item(key).ok().flatten();
        if item("mask").is_some_and(|m| !m.is_none()) {
            return Err(PyValueError::new_err("a masked CUDA array cannot be sent"));
        }
        let (ptr, _read_only): (u64, bool) = item("data")
            .ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ has no data"))?
            .extract()?;
        let shape: Vec<u64> = item("shape")
            .ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ has no shape"))?
            .extract()?;
        let typestr: String = item("typestr")
            .ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ has no typestr"))?
            .extract()?;
        let size = item_size(&typestr)
            .ok_or_else(|| PyValueError::new_err(format!("a CUDA array of unknown item type {typestr:?}")))?;
        let count = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
        let len = count
            .and_then(|n| n.checked_mul(size))
            .ok_or_else(|| PyValueError::new_err("a CUDA array's size overflows"))?;
        if let Some(strides) = item("strides").filter(|s| !s.is_none() && len > 0) {
            let strides: Vec<i64> = strides.extract()?;
            if strides.len() != shape.len() {
                return Err(PyValueError::new_err(format!(
                    "a CUDA array with {} strides for {} dimensions",
                    strides.len(),
                    shape.len()
                )));
            }
            let mut want = size as i64;
            for (dim, stride) in shape.iter().zip(&strides).rev() {
                if *dim > 1 && *stride != want {
                    return Err(PyValueError::new_err(
                        "a CUDA array that is not C-contiguous cannot be sent: make a contiguous copy first",
                    ));
                }
                want = want.saturating_mul(*dim as i64);
            }
        }
        Ok(Some(DeviceSource {
            ptr,
            len,
            keep: obj.clone().unbind(),
        }))
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Names it for a same-host peer: `(ipc, device, offset)`, or why it cannot be.
    pub(crate) fn export(&self) -> Result<handoff_cuda::Exported, String> {
        let d = driver().map_err(|e| e.to_string())?;
        d.export(self.ptr, self.len).map_err(|e| e.to_string())
    }

    /// A host copy of its bytes, made with the GIL released.
    pub(crate) fn to_host(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let (ptr, len) = (self.ptr, self.len as usize);
        py.detach(|| host_copy(ptr, len))
            .map_err(|e| PyOSError::new_err(format!("cannot copy a CUDA array to the host: {e}")))
    }
}

impl DeviceBytes for DeviceSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn copy_out(&self, offset: u64, len: u64) -> Result<Buffer, String> {
        Ok(Buffer::from(host_copy(self.ptr + offset, len as usize)?))
    }
}

/// Shares a source for a lease (the lease table keeps it alive until the peer releases it).
pub(crate) fn leased(src: DeviceSource) -> Arc<dyn DeviceBytes> {
    Arc::new(src)
}

enum Memory {
    /// A peer's memory, mapped here.
    Opened(Opened),
    /// Memory of ours.
    Alloc(DeviceAlloc),
}

/// A received frame of GPU memory: `len(frame)` bytes on one of this process's devices,
/// exported as a CUDA array of `uint8` (`__cuda_array_interface__`), so that
/// `cupy.asarray(frame)` or `torch.as_tensor(frame, device="cuda")` are views of it.
///
/// Memory mapped from the sender stays the sender's: it is released (`unlease`) when the
/// last view of the frame is gone. Neither side may write to it while the other uses it.
#[pyclass(frozen, module = "handoff._native")]
pub struct DeviceFrame {
    memory: Memory,
    /// This node's hold on the sender's lease (mapped memory only): ends on drop.
    #[allow(dead_code)]
    hold: Option<Py<Ticket>>,
}

#[pymethods]
impl DeviceFrame {
    /// The CUDA array interface (version 3): a 1-D array of `uint8`.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, [self.len()])?)?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        // Synchronised already: the sender finished its work before it named the memory,
        // and an upload is synchronous.
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.len() as usize
    }

    /// The device pointer of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        match &self.memory {
            Memory::Opened(o) => o.ptr(),
            Memory::Alloc(a) => a.ptr(),
        }
    }

    /// The ordinal of the device it lies on (in this process).
    #[getter]
    fn device(&self) -> usize {
        match &self.memory {
            Memory::Opened(o) => o.ordinal(),
            Memory::Alloc(a) => a.ordinal(),
        }
    }

    /// `"ipc"`: the sender's memory, mapped; `"copy"`: a copy of ours.
    #[getter]
    fn via(&self) -> &'static str {
        match &self.memory {
            Memory::Opened(_) => "ipc",
            Memory::Alloc(_) => "copy",
        }
    }

    /// A host copy of its bytes.
    fn to_host<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let (ptr, len) = (self.ptr(), self.len() as usize);
        let out = py.detach(|| host_copy(ptr, len)).map_err(PyOSError::new_err)?;
        Ok(PyBytes::new(py, &out))
    }

    fn __repr__(&self) -> String {
        format!(
            "<DeviceFrame {} bytes on device {} via {}>",
            self.len(),
            self.device(),
            self.via()
        )
    }
}

impl Drop for DeviceFrame {
    fn drop(&mut self) {
        // Kernels of ours may still read the sender's memory: they finish before the hold
        // ends (after this, with the fields) and the sender may use the memory again.
        if let (Memory::Opened(o), Ok(d)) = (&self.memory, driver()) {
            let _ = d.synchronize(o.ordinal());
        }
    }
}

impl DeviceFrame {
    fn len(&self) -> u64 {
        match &self.memory {
            Memory::Opened(o) => o.len(),
            Memory::Alloc(a) => a.len(),
        }
    }
}

/// A received `cuda` frame before the application sees it: the sender's claim, and this
/// node's hold on its lease (ended when the claim and every frame opened from it are gone).
#[pyclass(frozen, module = "handoff._native")]
pub struct DeviceClaim {
    claim: handoff_wire::DeviceClaim,
    hold: Py<Ticket>,
}

impl DeviceClaim {
    /// The claim `claim` received from node `owner` (the sender), held by this node.
    pub(crate) fn held(
        py: Python<'_>,
        claim: handoff_wire::DeviceClaim,
        owner: &str,
        shared: &Arc<crate::engine::Shared>,
    ) -> PyResult<DeviceClaim> {
        // The hold is a ticket hold on the sender's lease (pulled, released, like any).
        let ticket = handoff_proto::received::device_hold(&claim, owner);
        Ok(DeviceClaim {
            claim,
            hold: Py::new(py, Ticket::held(ticket, shared))?,
        })
    }
}

#[pymethods]
impl DeviceClaim {
    fn __len__(&self) -> usize {
        self.claim.len as usize
    }

    /// The hold on the sender's lease, as a ticket to pull the bytes with (`Driver.read`).
    #[getter]
    fn ticket(&self, py: Python<'_>) -> Py<Ticket> {
        self.hold.clone_ref(py)
    }

    /// Maps the sender's memory here: a [`DeviceFrame`] that keeps the hold until its last
    /// view is gone. Raises `OSError` saying why it cannot (no driver, no such device, the
    /// driver refused the handle).
    fn open(&self, py: Python<'_>) -> PyResult<DeviceFrame> {
        let d = driver().map_err(|e| PyOSError::new_err(e.to_string()))?;
        let c = &self.claim;
        let opened = py
            .detach(|| d.open(&c.ipc, &c.device, c.offset, c.len))
            .map_err(|e| PyOSError::new_err(format!("cannot map the sender's GPU memory: {e}")))?;
        Ok(DeviceFrame {
            memory: Memory::Opened(opened),
            hold: Some(self.hold.clone_ref(py)),
        })
    }

    /// Puts `data`, the bytes pulled for this frame, on the sender's device if this process
    /// sees it, else on device 0.
    fn upload(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<DeviceFrame> {
        let d = driver().map_err(|e| PyOSError::new_err(e.to_string()))?;
        cuda_upload(py, data, d.ordinal_of(&self.claim.device).unwrap_or(0))
    }

    fn __repr__(&self) -> String {
        format!("<DeviceClaim {} bytes, lease {}>", self.claim.len, self.claim.lease)
    }
}

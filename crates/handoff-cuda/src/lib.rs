//! handoff's access to GPU memory (spec §7.10), with the CUDA driver loaded at run time.
//!
//! Nothing here needs CUDA to build or to test: [`driver`] says why the driver cannot be
//! used (no `libcuda.so`, no device, a forked process, `HANDOFF_CUDA=0`), and callers then
//! move host copies instead. Where it can be used:
//! - [`Driver::export`] names a range of device memory by the CUDA IPC handle of its
//!   allocation, for a peer on the same host;
//! - [`Driver::open`] maps such a range in this process ([`Opened`]), once per allocation
//!   however many frames share it;
//! - [`Driver::copy_to_host`], [`Driver::upload`] and [`DeviceAlloc`] move bytes where no
//!   handle can be opened (another host, another container).
//!
//! `HANDOFF_CUDA_EMULATE=1` stands an emulated driver in for CUDA, for tests on machines
//! without a GPU: host memory plays device memory, so that handoff's side of spec §7.10
//! runs end to end; a CUDA library cannot read what it makes.
//!
//! Every call runs in the primary context of the device it concerns, the context that
//! the CUDA runtime (and so CuPy, PyTorch and Numba) uses, so pointers are valid there.

mod driver;
mod emulated;
mod errors;
mod ipc;
mod memory;

pub use driver::{driver, host_copy, Driver};
pub use errors::{CudaError, DeviceId, Unavailable};
pub use ipc::{Exported, OpenError, Opened, IPC_HANDLE_BYTES};
pub use memory::DeviceAlloc;

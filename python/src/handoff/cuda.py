"""GPU arrays in handoff messages (spec §7.10).

Any object with ``__cuda_array_interface__`` (a CuPy array, a PyTorch CUDA tensor, a Numba
device array) can be put in a message. It travels by where it goes:

- to a **same-host** peer on the Unix socket that announced ``cuda`` (it has a CUDA driver):
  as the CUDA IPC handle of its memory. No byte is copied. The sender keeps the memory,
  under a lease, until the receiver drops its last view of it or its connection ends. The
  receiver maps it (``via == "ipc"``), or, if its driver refuses the handle (another
  container, a device it does not see), pulls the bytes from the sender and puts them on a
  device of its own (``via == "copy"``);
- to **any other** peer (another host, no driver, the pure-Python reference): as a host copy
  of its bytes, which a receiver with CuPy or PyTorch puts back on its device.

The receiver gets an array of the sender's kind (CuPy → CuPy, PyTorch → PyTorch, else a
:class:`DeviceArray`) with the same shape and dtype, on its device, where the framework is
installed; a host ``numpy`` array where it is not. The sender must not change the array
while a receiver holds it: the receiver reads the sender's memory.

:func:`status` says whether this process can use CUDA, and why not.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

from .native import ext as _native
from .route import UNKNOWN, Route, register

__all__ = ["CudaArray", "DeviceArray", "array_nbytes", "is_cuda_array", "register_frameworks", "status"]

#: The route-aware name of a CUDA array in a body (spec §8.1: an ordinary body map).
NAME = "handoff.cuda-array"
#: Its name for a CuPy array registered by type (Dask dispatches by type).
CUPY_NAME = "handoff.cuda-array.cupy"


def status() -> tuple:
    """``(True, "")`` if this process can use CUDA, else ``(False, why)``."""
    if _native is None:
        return False, "the extension handoff._native is not in use"
    return _native.cuda_status()


def is_cuda_array(obj: Any) -> bool:
    """Whether ``obj`` exports device memory (``__cuda_array_interface__``; a PyTorch CPU
    tensor, whose class has the attribute, does not)."""
    try:
        return getattr(obj, "__cuda_array_interface__", None) is not None
    except Exception:  # noqa: BLE001 - a framework's refusal (a CPU tensor, a dtype it cannot name)
        return False


class CudaArray:
    """Marks ``array`` (any object with ``__cuda_array_interface__``) as a GPU array to send.

    A node wraps CUDA arrays it meets in a body itself; this is for code that wants to say so."""

    __slots__ = ("array",)

    def __init__(self, array: Any):
        if not is_cuda_array(array):
            raise TypeError(f"a {type(array).__name__} is not a CUDA array (no __cuda_array_interface__)")
        self.array = array

    def __reduce__(self):
        # Pickled (Dask's tcp://, a spill to disk): as a host copy, which unpickles as the
        # array a receiver decodes from one (on its device where it can).
        header, frames = _encode(self, UNKNOWN)
        return _from_host_copy, (header, bytes(frames[0]))


class DeviceArray:
    """A received GPU array for a receiver without CuPy or PyTorch: its device memory (a
    frame of ``handoff._native.DeviceFrame``) with the sender's shape and dtype, as
    ``__cuda_array_interface__``. Any CUDA framework takes it without a copy."""

    __slots__ = ("frame", "shape", "typestr")

    def __init__(self, frame: Any, shape: tuple, typestr: str):
        self.frame, self.shape, self.typestr = frame, shape, typestr

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = dict(self.frame.__cuda_array_interface__)
        cai["shape"], cai["typestr"] = self.shape, self.typestr
        return cai

    def to_host(self) -> bytes:
        """A host copy of its bytes."""
        return self.frame.to_host()


def _kind(array: Any) -> str:
    module = type(array).__module__.split(".")[0]
    return module if module in ("cupy", "torch") else "array"


def _encode(obj: Any, route: Route) -> tuple:
    array = obj.array if isinstance(obj, CudaArray) else obj
    cai = array.__cuda_array_interface__
    header = {"shape": [int(n) for n in cai["shape"]], "typestr": str(cai["typestr"]), "kind": _kind(array)}
    if header["kind"] == "torch":
        # PyTorch's own name for the dtype: bfloat16 and float8 have no typestr of their own.
        header["dtype"] = str(array.dtype).removeprefix("torch.")
    if shares_device_memory(route):
        return header, [array]  # the engine names its memory by its IPC handle (§7.10)
    return header, [_native.cuda_to_host(array)]


def shares_device_memory(route: Route) -> bool:
    """Whether a GPU array on ``route`` goes by its IPC handle (else as a host copy): the
    engine's send policy decides (spec §7.10)."""
    to = route.recipient
    if to is None or _native is None:
        return False
    return _native.shares_device_memory(route.channel or "tcp", list(to.caps))


def array_nbytes(described: Any) -> int:
    """The bytes of the array that a ``__cuda_array_interface__`` (or a header of ours)
    describes: its ``shape``'s product, times the item size its ``typestr`` says (``'<f8'``: 8)."""
    return math.prod(int(n) for n in described["shape"]) * int(described["typestr"][2:])


def _checked(header: Any, frames: list) -> tuple:
    if not isinstance(header, dict) or len(frames) != 1:
        raise ValueError("a CUDA array is a header map and one frame")
    shape, typestr, kind = header.get("shape"), header.get("typestr"), header.get("kind")
    # (A list in a handoff body; a tuple where Dask's msgpack read it.)
    if not isinstance(shape, (list, tuple)) or len(shape) > 64 or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"a CUDA array's shape is a list of at most 64 sizes, got {shape!r}")
    if not isinstance(typestr, str) or len(typestr) < 3 or not typestr[2:].isdigit() or int(typestr[2:]) == 0:
        raise ValueError(f"a CUDA array's typestr is like '<f8', got {typestr!r}")
    if kind not in ("cupy", "torch", "array"):
        raise ValueError(f"unknown CUDA array kind {kind!r}")
    dtype = header.get("dtype")
    if dtype is not None and (not isinstance(dtype, str) or not dtype.isidentifier()):
        raise ValueError(f"a CUDA array's dtype is a name like 'bfloat16', got {dtype!r}")
    nbytes = array_nbytes(header)
    if len(frames[0]) != nbytes:
        raise ValueError(
            f"a CUDA array of shape {shape} and type {typestr} has {nbytes} bytes, its frame {len(frames[0])}"
        )
    return tuple(shape), typestr, kind


def _torch_dtype(torch: Any, header: dict) -> Any:
    dtype = getattr(torch, header.get("dtype") or "", None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"PyTorch here has no dtype {header.get('dtype')!r}")
    return dtype


def _decode(header: Any, frames: list, route: Route) -> Any:
    shape, typestr, kind = _checked(header, frames)
    frame = frames[0]
    torch = _module("torch") if kind == "torch" else None
    on_device = is_cuda_array(frame)
    if torch is not None and (on_device or torch.cuda.is_available()):
        # As bytes, then PyTorch's own dtype (bfloat16 has no typestr of its own).
        dtype = _torch_dtype(torch, header)
        if on_device:
            raw = torch.as_tensor(frame, device=f"cuda:{frame.device}")
        else:
            raw = torch.frombuffer(bytearray(frame), dtype=torch.uint8).to("cuda")
        return raw.view(dtype).reshape(shape)
    import numpy

    if not on_device:
        # A host copy: on a device of ours if CuPy is here, else the host array.
        host = numpy.frombuffer(frame, dtype=typestr).reshape(shape)
        cupy = _module("cupy")
        return cupy.asarray(host) if cupy is not None and status()[0] else host
    view = DeviceArray(frame, shape, typestr)
    cupy = _module("cupy")
    if kind in ("cupy", "array") and cupy is not None:
        with cupy.cuda.Device(frame.device):
            return cupy.asarray(view)
    return view


def _from_host_copy(header: dict, data: bytes) -> Any:
    return _decode(header, [data], UNKNOWN)


def _module(name: str) -> Optional[Any]:
    """``name`` if it can be imported (a framework the application uses is imported already)."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    try:
        return __import__(name)
    except ImportError:
        return None


register(CudaArray, _encode, _decode, name=NAME)


def register_frameworks() -> None:
    """Registers CuPy's array type, if CuPy is installed, so that code that dispatches by
    type (Dask's serialization) sends it as above. A node needs no call: it wraps any
    CUDA array it meets."""
    cupy = _module("cupy")
    if cupy is not None:
        register(cupy.ndarray, _encode, _decode, name=CUPY_NAME)

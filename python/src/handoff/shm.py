"""Shared-memory segments (spec §7.2–§7.4): memfds to send, read-only mappings of received ones.

Sending: a buffer of at least the threshold is copied into a fresh memfd that is then
sealed (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: the reference's
"sealed mode", §7.4), or a :class:`ShmBuffer` that the application filled in place is
sent as it is, with no copy at all.

Receiving: each ``shm`` frame's descriptor is checked (size, seals) and mapped
read-only and shared; the frame is a ``memoryview`` of that mapping (no byte copied).
Each frame gets a mapping of its own, so that the mapping's lifetime is the frame's:
when the last view of it is gone, the mapping is freed and the frame's lease released.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any, Optional

from .wire import WireError

__all__ = ["ShmBuffer", "SharedFrame", "sealed_copy", "map_received", "segment_info", "SEALS_REQUIRED"]

F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x0001)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)
F_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 0x0008)
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
#: What a segment announced as ``sealed`` must carry (§7.2).
SEALS_REQUIRED = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW
SEALS_ALL = SEALS_REQUIRED | F_SEAL_SEAL


def _memfd(size: int, name: str = "handoff-segment") -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


class SharedFrame:
    """A read-only shared segment ready to send (a sealed memfd, or a frozen :class:`ShmBuffer`).

    It is bytes-like through :attr:`view` (a read-only mapping, made on first use), and a
    node sends it to a same-host peer by passing its descriptor: the peer maps the same pages.
    """

    def __init__(self, fd: int, size: int, sealed: bool, mapping: Optional[mmap.mmap] = None):
        self.fd = fd
        self.size = size
        self.sealed = sealed
        self._map = mapping

    @property
    def view(self) -> memoryview:
        if self._map is None:
            if self.size == 0:
                return memoryview(b"")
            self._map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        return memoryview(self._map)

    def __len__(self) -> int:
        return self.size

    def dup_fd(self) -> int:
        """A descriptor of the segment that a lease keeps (closed when the lease ends)."""
        return os.dup(self.fd)

    def inode(self) -> tuple:
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def close(self) -> None:
        """Closes this handle (mappings and descriptors held by leases stay valid)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"SharedFrame({self.size} bytes, sealed={self.sealed})"


class ShmBuffer:
    """A writable buffer in a fresh shared segment: fill it in place, then :meth:`freeze` it
    and send it to same-host peers with no copy (like the reference's ``SharedBufMut``)."""

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError("a shared buffer needs at least one byte")
        self.size = size
        self.fd = _memfd(size)
        self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        #: The writable bytes; fill them in place before :meth:`freeze`.
        self.view = memoryview(self._map)

    def freeze(self, seal: bool = True) -> SharedFrame:
        """Ends writing; with ``seal`` the segment is sealed against any change (§7.4)."""
        self.view.release()
        self._map.close()
        fd, self.fd = self.fd, -1
        if seal:
            fcntl.fcntl(fd, F_ADD_SEALS, SEALS_ALL)
        return SharedFrame(fd, self.size, seal)

    def __len__(self) -> int:
        return self.size


def sealed_copy(data: Any) -> SharedFrame:
    """Copies a bytes-like object into a fresh memfd and seals it."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    fd = _memfd(n)
    try:
        pos = 0
        while pos < n:
            pos += os.pwrite(fd, view[pos : pos + (1 << 30)], pos)
        fcntl.fcntl(fd, F_ADD_SEALS, SEALS_ALL)
    except OSError:
        os.close(fd)
        raise
    return SharedFrame(fd, n, True)


def map_received(fd: int, size: int, sealed: bool) -> tuple[mmap.mmap, dict]:
    """Checks a received segment against its descriptor and maps it read-only (§7.2).

    Closes ``fd`` in every case. Raises ``bad-shm`` if the size differs from ``size`` or a
    segment said to be sealed lacks a seal. Returns the mapping and its segment info.
    """
    try:
        st = os.fstat(fd)
        if st.st_size != size:
            raise WireError(
                "bad-shm",
                f"bad shared-memory descriptor: the descriptor says the segment has {size} bytes, "
                f"the received file has {st.st_size}",
            )
        if sealed:
            seals = fcntl.fcntl(fd, F_GET_SEALS)
            if seals & SEALS_REQUIRED != SEALS_REQUIRED:
                raise WireError(
                    "bad-shm",
                    "bad shared-memory descriptor: the descriptor claims a sealed segment, "
                    f"but its seals are {seals:#x}",
                )
        if size == 0:
            raise WireError("bad-shm", "bad shared-memory descriptor: an empty shared segment")
        try:
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            raise WireError("bad-shm", f"bad shared-memory descriptor: cannot map the received segment: {e}") from None
        info = {"device": st.st_dev, "inode": st.st_ino, "size": size, "sealed": sealed}
        return mapping, info
    except OSError as e:
        raise WireError("bad-shm", f"bad shared-memory descriptor: cannot check the received segment: {e}") from None
    finally:
        os.close(fd)


def segment_info(info: dict, offset: int) -> dict:
    """The ``segment`` map of ``handoff.demo.Held`` (Appendix A) for a received frame."""
    return {
        "device": info["device"],
        "inode": info["inode"],
        "offset": offset,
        "size": info["size"],
        "pool_id": None,
        "sealed": info["sealed"],
    }

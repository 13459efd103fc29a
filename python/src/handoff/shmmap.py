"""Mappings of memfds that keep no descriptor: :class:`Region` (Linux, through libc).

Python's ``mmap.mmap`` duplicates the descriptor it maps and keeps the copy open for
the mapping's lifetime, so every received frame a program holds, and every segment a
sender keeps, cost one descriptor: with ``ulimit -n 1024`` a worker that holds a few
thousand received arrays runs out of them (issue 25, item 1). A :class:`Region` is made
by calling libc's ``mmap`` itself; the caller closes the descriptor right after, and the
pages stay mapped (the mapping holds the file, not a descriptor).

The mapping's lifetime is the :class:`Region`'s: it is unmapped (``munmap``) when the
region and every buffer made from it are gone (a large one by a thread of its own, so that
the thread that let it go does not wait for it: :data:`UNMAP_ELSEWHERE`). A buffer is a fresh numpy array over the
region (:meth:`Region.array`, whose ``base`` is the region, through its
``__array_interface__``), or without numpy a ctypes array that refers to the region;
:meth:`Region.view` is a memoryview of one, read-only for a read-only mapping (a write
through a writable view of a read-only mapping would crash the process, not raise).

A mapping is inherited by a forked child like any other memory (no ``MADV_DONTFORK``):
the child reads what its parent received, as it would on TCP.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

__all__ = ["Region", "UNMAP_ELSEWHERE", "PROT_READ", "PROT_WRITE", "MAP_SHARED"]

PROT_READ = 0x1
PROT_WRITE = 0x2
MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

# The C library as the interpreter loaded it (dlopen(NULL)): ctypes.util.find_library would
# run `ldconfig -p` in a subprocess at every import of handoff (each Dask worker's start).
_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


#: Mappings at least this large are unmapped by a short-lived thread of their own, a piece
#: at a time (:data:`UNMAP_PIECE`): tearing down the page tables of a touched mapping costs
#: about 20-50 ms a GiB here, which on the thread that dropped it would be an event loop's
#: (a pooled segment going idle as its receiver releases it: in bench/peers a 1 GiB
#: same-host payload waited 20-30 ms for the one before it to be unmapped).
UNMAP_ELSEWHERE = 64 << 20


_THREAD_NAME = "handoff-munmap"


def _elsewhere(work, length: int) -> bool:
    """Runs ``work`` on a short-lived thread of its own if ``length`` is large enough (it
    ends when the work is done, so no thread outlives it); ``False``: do it here (small,
    already on such a thread, or at interpreter shutdown)."""
    if length < UNMAP_ELSEWHERE or threading.current_thread().name == _THREAD_NAME:
        return False
    try:
        threading.Thread(target=work, name=_THREAD_NAME, daemon=True).start()
    except RuntimeError:  # interpreter shutdown: no new threads
        return False
    return True


#: A large mapping is unmapped this much at a time: ``munmap`` holds the process's lock on
#: its address space while it tears down page tables, and every other thread that maps
#: memory (a thread's stack, an allocation) waits for it; a piece of 32 MiB holds it for
#: about a millisecond.
UNMAP_PIECE = 32 << 20


def _munmap_pieces(addr: int, length: int) -> None:
    for off in range(0, length, UNMAP_PIECE):
        _munmap(addr + off, min(UNMAP_PIECE, length - off))


def _unmap(addr: int, length: int) -> None:
    """Unmaps ``addr .. addr + length``, a large mapping off this thread, piece by piece."""
    if not _elsewhere(lambda: _munmap_pieces(addr, length), length):
        _munmap_pieces(addr, length)


class Region:
    """One mapping of a file (``fd`` may be closed once it is made); see the module.

    ``len(region)`` is its length, ``region.addr`` its address. Only :meth:`map` makes one."""

    __slots__ = ("addr", "length", "readonly", "__weakref__")

    def __init__(self, addr: int, length: int, readonly: bool):
        self.addr = addr
        self.length = length
        self.readonly = readonly

    @classmethod
    def map(cls, fd: int, length: int, *, write: bool = False) -> "Region":
        """Maps the first ``length`` bytes of ``fd`` shared (``MAP_SHARED``), writable with
        ``write``. Raises ``OSError``."""
        if length <= 0:
            raise ValueError("a mapping needs at least one byte")
        addr = _mmap(None, length, PROT_READ | (PROT_WRITE if write else 0), MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            raise _error(f"mmap of {length} bytes")
        return cls(addr, length, not write)

    def __len__(self) -> int:
        return self.length

    @property
    def __array_interface__(self) -> dict:
        return {"data": (self.addr, self.readonly), "shape": (self.length,), "typestr": "|u1", "version": 3}

    def array(self) -> Any:
        """A fresh numpy ``uint8`` array over the whole mapping (read-only for a read-only
        mapping); its views keep the mapping. Needs numpy."""
        return sys.modules["numpy"].asarray(self)

    def exporter(self) -> Any:
        """A fresh object exporting the whole mapping through the buffer protocol: a numpy
        array (:meth:`array`) if numpy is loaded, else a ctypes array that refers to this region."""
        if "numpy" in sys.modules:
            return self.array()
        buf = (ctypes.c_ubyte * self.length).from_address(self.addr)
        buf._region = self  # the ctypes array keeps the mapping alive
        return buf

    def view(self) -> memoryview:
        """A memoryview of the whole mapping (read-only for a read-only mapping)."""
        mv = memoryview(self.exporter()).cast("B")
        return mv.toreadonly() if self.readonly else mv

    def __del__(self) -> None:
        addr, self.addr = getattr(self, "addr", 0), 0
        if addr:
            _unmap(addr, self.length)

    def __repr__(self) -> str:
        return f"Region({self.length} bytes at {self.addr:#x}{', read-only' if self.readonly else ''})"

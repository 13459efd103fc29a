"""The reference's mappings of segments: :class:`handoff.shmmap.Region` (a mapping that
keeps no descriptor) with what only the reference asks of one: a private (copy-on-write)
mapping, a window from an offset, page tables filled at once, ``madvise``, indexing; and
:func:`release`, which lets go of a pooled segment off the thread.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

from handoff import shmmap

__all__ = ["Region", "release", "MAP_PRIVATE", "MAP_POPULATE", "MADV_DONTNEED"]

MAP_PRIVATE = 0x02
#: Fill the page tables at once: for a memfd whose pages exist (a pooled segment used
#: before), far faster than a fault per page on the first write.
MAP_POPULATE = 0x8000
MADV_DONTNEED = 4

_madvise = shmmap._libc.madvise
_madvise.restype = ctypes.c_int
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class Region(shmmap.Region):
    """A :class:`handoff.shmmap.Region` that the reference maps and advises (see the module)."""

    __slots__ = ()

    @classmethod
    def map(
        cls,
        fd: int,
        length: int,
        *,
        write: bool = False,
        private: bool = False,
        offset: int = 0,
        populate: bool = False,
    ) -> "Region":
        """Maps ``length`` bytes of ``fd`` from ``offset`` (a multiple of the page size):
        shared (``MAP_SHARED``) or ``private`` (copy-on-write), writable with ``write``,
        its page tables filled at once with ``populate``. Raises ``OSError``."""
        if length <= 0:
            raise ValueError("a mapping needs at least one byte")
        if offset < 0:
            raise ValueError("a negative offset")
        prot = shmmap.PROT_READ | (shmmap.PROT_WRITE if write else 0)
        flags = (MAP_PRIVATE if private else shmmap.MAP_SHARED) | (MAP_POPULATE if populate else 0)
        addr = shmmap._mmap(None, length, prot, flags, fd, offset)
        if addr is None or addr == shmmap._MAP_FAILED:
            raise shmmap._error(f"mmap of {length} bytes")
        return cls(addr, length, not write)

    def __getitem__(self, key: Any) -> Any:
        """``region[i]`` or ``region[a:b]``: through a fresh :meth:`view`."""
        return self.view()[key]

    def advise(self, advice: int, off: int = 0, n: Optional[int] = None) -> None:
        """``madvise`` over ``off .. off + n`` (page-aligned ``off``); raises ``OSError``."""
        n = self.length - off if n is None else n
        if off < 0 or n < 0 or off + n > self.length:
            raise ValueError("the range is not inside the mapping")
        if n and _madvise(self.addr + off, n, advice) != 0:
            raise shmmap._error("madvise")


def release(held: list, fd: int, length: int) -> None:
    """Lets go of a segment of ``length`` bytes: its mapping (``held``, a list the caller
    gives up, holding the caller's last reference to the :class:`Region`), then its
    descriptor. Closing the last descriptor of a memfd no mapping holds frees its pages,
    about as slow as tearing down a mapping: a large segment is let go of off this thread,
    both in that order."""

    def work() -> None:
        held.clear()  # the mapping (unmapped here if this was its last reference)
        if fd >= 0:
            os.close(fd)

    if not shmmap._elsewhere(work, length):
        work()

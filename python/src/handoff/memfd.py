"""Memfds and their seals (spec §7.2, §7.4): the bottom of shared memory.

:mod:`handoff.shm` (segments sent once, mappings of received ones) and the reference's
pool (``handoff_pure.pool``, segments reused across sends) both create memfds and seal
them; the seal bits and the creation live here, below both.
"""

from __future__ import annotations

import fcntl
import os

__all__ = [
    "F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE", "F_ADD_SEALS", "SEALS_ALL", "SEALS_FIXED", "memfd",
]  # fmt: skip

F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x0001)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)
F_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 0x0008)
F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
#: What every segment carries at least (§7.2 rule 1 needs the first), and what an unsealed
#: segment of a fixed size is given before it is passed (§7.4).
SEALS_FIXED = F_SEAL_SHRINK | F_SEAL_GROW
#: A sealed segment's: it can change no more (§7.4, the reference's "sealed mode").
SEALS_ALL = SEALS_FIXED | F_SEAL_WRITE | F_SEAL_SEAL


def memfd(size: int, name: str = "handoff-segment") -> int:
    """A new memfd of ``size`` bytes that may be sealed (close-on-exec); its descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd

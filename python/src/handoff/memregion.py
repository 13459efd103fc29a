"""Which file backs the memory of a buffer, from ``/proc/self/maps`` (Linux).

For checks that a value arrived without a copy: a received shared segment lies in a
``/memfd:handoff-segment`` mapping, a file read in place in a mapping of that file, and
a copy on the heap or in an anonymous mapping (named ``''``). Used by the demo and the
tests; needs numpy to find the address of a read-only buffer.
"""

from __future__ import annotations

from typing import Any

__all__ = ["region_of", "from_peer"]


def region_of(buf: Any) -> str:
    """The name of the mapping that holds the first byte of ``buf`` (any buffer, a numpy
    array included): a path, ``/memfd:NAME (deleted)``, ``''`` for anonymous memory or
    the heap, ``'?'`` if no mapping holds it; ``''`` for an empty buffer."""
    import numpy as np

    view = memoryview(buf)
    if view.nbytes == 0:
        return ""
    addr = np.frombuffer(view.cast("B") if view.c_contiguous else view, dtype=np.uint8).__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return " ".join(fields[5:])
    return "?"


def from_peer(buf: Any) -> bool:
    """Whether ``buf`` lies in shared memory a peer sent: a received segment of its pool
    (``/memfd:handoff-segment``) or a window of its arena (``/memfd:handoff-arena``, but
    not one of this process's own arenas, where an array it made itself lies)."""
    region = region_of(buf)
    if region.startswith("/memfd:handoff-segment"):
        return True
    if not region.startswith("/memfd:handoff-arena"):
        return False
    from .shared import locate

    return locate(buf) is None

"""The reference node's shared memory (spec §7.2–§7.4): sealed copies to send, and the
checks and mappings of received segments.

Sending: a buffer of at least the threshold is copied into a fresh memfd that is then
sealed (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: the reference's
"sealed mode", §7.4); an application's :class:`handoff.shm.ShmBuffer` goes as it is.

Receiving: each ``shm`` frame's descriptor is checked — seals first (``F_SEAL_SHRINK``
always, so that the segment can never be cut short under the mapping and a read can
never fault; the write and grow seals too if it claims ``sealed``), then its size —
and mapped read-only and shared; the frame is a ``memoryview`` of that mapping (no
byte copied). With ``private=True`` the mapping is private and writable instead
(``MAP_PRIVATE``, copy-on-write): still no byte copied, but the receiver may write into
the frame — its writes stay its own, the sender never sees them — which is what a
consumer that expects writable buffers (Dask's deserializers copy a read-only frame
whose header says writeable) needs to stay zero copy. A small window of a large segment
maps only the pages that hold it.

Mappings keep no descriptor (:mod:`handoff.shmmap`): the received descriptor is closed
as soon as it is mapped, so a held frame costs no descriptor. Each frame gets a mapping
of its own, so that the mapping's lifetime is the frame's, except that a receiver's
connection may keep the mapping of a whole segment for the next frame in it
(:mod:`handoff_pure.mapcache`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import TYPE_CHECKING, Any, Optional

from handoff.memfd import F_ADD_SEALS, F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_WRITE, SEALS_ALL
from handoff.memfd import memfd as _memfd
from handoff.shm import SharedFrame
from .regions import Region
from .wire import WireError

if TYPE_CHECKING:  # pragma: no cover
    from .mapcache import MapCache

__all__ = ["sealed_copy", "map_received", "read_received", "COPY_BELOW", "segment_info"]

F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
#: What a segment announced as ``sealed`` must carry (§7.2).
SEALS_REQUIRED = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW

#: A received shm frame smaller than this is read into the receiver's own memory (one
#: ``pread``, the lease released at once) instead of mapped: as cheap as the mapping's own
#: system calls and page faults, and the frame is then a buffer of its own, as Dask's TCP
#: comm reads each frame into one (a consumer that keeps some small frames and drops
#: others frees what it drops; Dask's P2P relies on it), costing the sender no lease.
COPY_BELOW = 1 << 20
#: A segment this much larger than its window (beyond twice the window) is mapped only
#: around the window (the reference's rule, §7.2 step 4).
_WHOLE_SEGMENT_SLACK = 1 << 20


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


def _bad(message: str) -> WireError:
    return WireError("bad-shm", f"bad shared-memory descriptor: {message}")


def _check(fd: int, size: int, sealed: bool) -> os.stat_result:
    """The checks of §7.2 on a received descriptor: its seals, then its size (``bad-shm``)."""
    try:
        seals = fcntl.fcntl(fd, F_GET_SEALS)
    except OSError as e:
        raise _bad(
            f"the received file descriptor is not a shared-memory segment that supports seals "
            f"(a memfd), so it could shrink under the mapping: {e.strerror or e}"
        ) from None
    if not seals & F_SEAL_SHRINK:
        raise _bad(
            f"the segment is not sealed against shrinking (its seals are {seals:#x}); every segment "
            "must carry F_SEAL_SHRINK before it is passed"
        )
    if sealed and seals & SEALS_REQUIRED != SEALS_REQUIRED:
        raise _bad(f"the descriptor claims a sealed segment, but its seals are {seals:#x}")
    st = os.fstat(fd)
    if st.st_size != size:
        raise _bad(f"the descriptor says the segment has {size} bytes, the received file has {st.st_size}")
    return st


def read_received(fd: int, size: int, sealed: bool, off: int, into: memoryview) -> dict:
    """Checks a received segment as :func:`map_received` does, then reads its window
    ``off .. off + len(into)`` into ``into`` (one ``pread``: no mapping, no descriptor
    kept). Closes ``fd`` in every case; returns the segment's info."""
    try:
        st = _check(fd, size, sealed)
        n = into.nbytes
        if off < 0 or off + n > size:
            raise _bad(f"the window {off}+{n} is not inside the segment of {size} bytes")
        pos = 0
        while pos < n:
            got = os.preadv(fd, [into[pos:]], off + pos)
            if got <= 0:
                raise _bad(f"the segment ended after {pos} of {n} bytes")
            pos += got
        return {"device": st.st_dev, "inode": st.st_ino, "size": size, "sealed": sealed}
    except OSError as e:
        raise _bad(f"cannot read the received segment: {e}") from None
    finally:
        os.close(fd)


def map_received(
    fd: int,
    size: int,
    sealed: bool,
    off: int = 0,
    n: Optional[int] = None,
    private: bool = False,
    keep: Optional["MapCache"] = None,
):
    """Checks a received segment against its descriptor and maps its window read-only (§7.2),
    or, with ``private``, private and writable (copy-on-write).

    Closes ``fd`` in every case. In order: the seals (``F_SEAL_SHRINK`` required — a file
    that has no seals, such as a regular file or a pipe, is refused; with ``sealed``
    also ``F_SEAL_WRITE`` and ``F_SEAL_GROW``), then the size (must equal ``size``);
    any failure is ``bad-shm``. The whole segment is mapped when ``size <= 2 * n + 1 MiB``,
    else only the pages around the window ``off .. off + n``.

    Returns ``(mapping, start, info)``: the window is ``mapping.view()[start : start + n]``
    (``mapping`` a :class:`~handoff.shmmap.Region`, which keeps no descriptor);
    ``mapping`` is ``None`` for an empty window (nothing to map). With ``keep`` (a
    connection's :class:`~handoff.mapcache.MapCache`), a whole-segment
    mapping comes from it or goes to it: ``mapping`` is then a
    :class:`~handoff.mapcache.Kept` (see :mod:`handoff.mapcache`).
    """
    if n is None:
        n = size - off
    try:
        st = _check(fd, size, sealed)
        info = {"device": st.st_dev, "inode": st.st_ino, "size": size, "sealed": sealed}
        if n == 0:
            return None, 0, info
        if size <= 2 * n + _WHOLE_SEGMENT_SLACK:
            start, length = 0, size
        else:
            start = off - off % mmap.ALLOCATIONGRANULARITY
            length = off + n - start
        # A whole segment's mapping is kept for the next frame in it: a private one always
        # (as before), a shared one if the segment is not sealed (a pooled one, which its
        # sender writes again; a sealed segment is never sent with new bytes).
        keep = keep if start == 0 and length == size and (private or not sealed) else None
        key = (st.st_dev, st.st_ino, private)
        if keep is not None:
            kept = keep.take(key, size)
            if kept is not None:
                return kept, off, info
        try:
            mapping = Region.map(fd, length, write=private, private=private, offset=start)
        except (OSError, ValueError, OverflowError) as e:
            raise _bad(f"cannot map the received segment: {e}") from None
        if keep is not None:
            kept = keep.add(key, mapping, size, private)
            if kept is not None:
                return kept, off, info
        return mapping, off - start, info
    except OSError as e:
        raise _bad(f"cannot check the received segment: {e}") from None
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

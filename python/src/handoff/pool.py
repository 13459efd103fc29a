"""The process's pool of shared-memory segments to send from (spec §7.4, "pooled segments").

Fresh memfd pages fault at 0.4–1.6 GB/s on these machines, against 7–20 GB/s for a copy
into a segment the process has written before, so a node with ``shm_pool=True`` copies
a large buffer into a pooled segment instead of a fresh sealed memfd. Each segment is a
memfd sealed ``F_SEAL_SHRINK | F_SEAL_GROW`` as soon as its size is set (receivers
refuse any segment that could shrink, §7.2), kept mapped read-write by this process,
and sized by powers of two from 64 KiB (as the Rust reference's ``shm::segment``).

A segment is *busy* from :meth:`SegmentPool.take` until every lease sent on it has
ended, then *idle* and reused by the next send of its size class. When a lease ends
matters: a segment goes back to the pool only when the receiver said it dropped its last
view (``release``), or when the receiving process is known to have exited. A lease that
ended because its connection closed while the receiver lives (it may still hold views:
a Dask worker keeps what it received long after the comm closed) *retires* the segment
instead: this process closes its descriptor and mapping and never writes to it again,
and the memory is freed when the receiver unmaps it. So a receiver never sees the bytes
of a view change, whatever the order in which connections close.

The pool keeps at most ``HANDOFF_SHM_POOL_BYTES`` (default 4 GiB) of idle segments;
returning one beyond that retires it. A forked child starts with an empty pool.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import sys
import threading
from typing import Any, Optional

from .memfd import F_ADD_SEALS, SEALS_FIXED, memfd

__all__ = ["Segment", "SegmentPool", "pool", "MIN_SEGMENT", "DEFAULT_MAX_IDLE_BYTES"]

#: Smallest segment the pool creates (as the reference).
MIN_SEGMENT = 64 * 1024
#: Idle bytes a pool keeps unless ``HANDOFF_SHM_POOL_BYTES`` says otherwise.
DEFAULT_MAX_IDLE_BYTES = 4 << 30
#: Copies at least this large release the GIL (numpy) so the caller may run them in a thread.
_BIG_COPY = 1 << 20


def _size_class(n: int) -> int:
    return 1 << (max(n, MIN_SEGMENT) - 1).bit_length()


class Segment:
    """One pooled memfd: its descriptor, its read-write mapping, and how many leases hold it."""

    __slots__ = ("id", "fd", "size", "map", "holders", "inode", "_pool", "__weakref__")

    def __init__(self, pool: "SegmentPool", seg_id: int, size: int):
        fd = memfd(size)
        try:
            fcntl.fcntl(fd, F_ADD_SEALS, SEALS_FIXED)
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self.id = seg_id
        self.fd = fd
        self.size = size
        self.inode = (st.st_dev, st.st_ino)
        #: Leases (and the sender's own planning) that hold the segment busy.
        self.holders = 0
        self._pool = pool

    def write(self, data: Any) -> None:
        """Copies a flat byte view to the start of the segment (numpy releases the GIL for it)."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        np = sys.modules.get("numpy")
        if np is not None and n >= _BIG_COPY:
            dst = np.frombuffer(self.map, dtype=np.uint8, count=n)
            np.copyto(dst, np.frombuffer(view, dtype=np.uint8))
            del dst
        else:
            self.map[:n] = view

    def hold(self) -> None:
        """One more lease (or planned send) keeps the segment busy."""
        with self._pool._lock:
            self.holders += 1

    def let_go(self, reusable: bool) -> None:
        """A lease on the segment ended: by ``release`` or the receiver's exit (``reusable``),
        or by its connection closing while the receiver may still map it (not reusable: the
        segment is retired once nothing holds it, never written again)."""
        self._pool._let_go(self, reusable)

    def _close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # pragma: no cover - nothing of ours exports it after a send
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"Segment(#{self.id}, {self.size} bytes, {self.holders} holders)"


class SegmentPool:
    """Pooled segments of one process; thread-safe (nodes on several event loops share it)."""

    def __init__(self, max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES):
        self.max_idle_bytes = max_idle_bytes
        self._lock = threading.Lock()
        self._idle: dict = {}  # size class -> [Segment], most recently returned last
        self._next_id = 1
        self._tainted: set = set()  # ids of busy segments that must not come back
        self.segments = 0  # segments this process keeps (busy and idle)
        self.bytes = 0
        self.idle_segments = 0
        self.idle_bytes = 0
        self.created = 0
        self.reused = 0
        self.retired = 0

    def take(self, n: int) -> Segment:
        """A segment of at least ``n`` bytes (an idle one of its size class, else a new one),
        held once for the caller: the caller's lease, or :meth:`Segment.let_go` if unused."""
        size = _size_class(n)
        with self._lock:
            free = self._idle.get(size)
            if free:
                seg = free.pop()
                self.idle_segments -= 1
                self.idle_bytes -= size
                self.reused += 1
                seg.holders = 1
                return seg
            seg_id = self._next_id
            self._next_id += 1
        seg = Segment(self, seg_id, size)
        with self._lock:
            self.segments += 1
            self.bytes += size
            self.created += 1
            seg.holders = 1
        return seg

    def _let_go(self, seg: Segment, reusable: bool) -> None:
        with self._lock:
            seg.holders -= 1
            if not reusable:
                self._tainted.add(seg.id)
            if seg.holders > 0:
                return
            keep = seg.id not in self._tainted and self.idle_bytes + seg.size <= self.max_idle_bytes
            self._tainted.discard(seg.id)
            if keep:
                self._idle.setdefault(seg.size, []).append(seg)
                self.idle_segments += 1
                self.idle_bytes += seg.size
                return
            self.segments -= 1
            self.bytes -= seg.size
            self.retired += 1
        seg._close()

    def clear(self) -> None:
        """Closes every idle segment (busy ones stay with their leases)."""
        with self._lock:
            idle = [s for segs in self._idle.values() for s in segs]
            self._idle.clear()
            self.segments -= len(idle)
            self.bytes -= sum(s.size for s in idle)
            self.idle_segments = 0
            self.idle_bytes = 0
        for s in idle:
            s._close()

    def stats(self) -> dict:
        """``{segments, bytes, idle_segments, idle_bytes, busy_segments, created, reused, retired}``."""
        with self._lock:
            return {
                "segments": self.segments,
                "bytes": self.bytes,
                "idle_segments": self.idle_segments,
                "idle_bytes": self.idle_bytes,
                "busy_segments": self.segments - self.idle_segments,
                "created": self.created,
                "reused": self.reused,
                "retired": self.retired,
            }


_POOL: Optional[SegmentPool] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def pool() -> SegmentPool:
    """The process's pool (idle cap from ``HANDOFF_SHM_POOL_BYTES``, default 4 GiB)."""
    global _POOL, _POOL_PID
    pid = os.getpid()
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != pid:
            cap = os.environ.get("HANDOFF_SHM_POOL_BYTES")
            _POOL = SegmentPool(int(cap) if cap else DEFAULT_MAX_IDLE_BYTES)
            _POOL_PID = pid
        return _POOL

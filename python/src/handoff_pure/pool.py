"""The process's pool of shared-memory segments to send from (spec §7.4, "pooled segments").

Fresh memfd pages fault at 0.4–1.6 GB/s on these machines; a segment whose pages exist
(written before) and that is mapped with ``MAP_POPULATE`` takes a copy at about 8 GB/s.
So a node with ``shm_pool=True`` copies a large buffer into a pooled segment instead of
a fresh sealed memfd. Each segment is a memfd sealed ``F_SEAL_SHRINK | F_SEAL_GROW`` as
soon as its size is set (receivers refuse any segment that could shrink, §7.2), sized
to the frame rounded up to a page (not to a power of two: a 65 MiB frame takes 65 MiB).

**Memory: who counts it.** A copy to send is written with ``pwrite`` (:meth:`Segment.write`),
so this process maps a segment only while an application's :class:`~handoff.shm.ShmBuffer`
uses it (and unmaps it once that is sent, :meth:`Segment.detach`): the receiver
maps the pages and counts them, this process keeps its own copy of the data and not a
second one (on TCP the sender keeps only its own copy too). An idle segment is not
mapped either: its pages are in the host's shared memory, in no process's RSS, and are
reported by :meth:`SegmentPool.stats` (``idle_bytes``) and by the Dask backend's metric.

**Descriptors.** A segment keeps its descriptor while the pool holds fewer than
``max_fds`` of them (``HANDOFF_SHM_POOL_FDS``; default an eighth of the soft
``RLIMIT_NOFILE``, at most 256): the descriptor is what a later send passes, since a
memfd cannot be reopened once its last descriptor is closed. A segment sent beyond that
closes its descriptor right after the send and is never reused; its memory lives as long
as the receiver's mapping. So a sender holds at most ``max_fds`` descriptors for the
pool, however many segments receivers hold.

**Busy and idle.** A segment is *busy* from :meth:`SegmentPool.take` until every lease
sent on it has ended, then *idle* and reused by the next send that fits it (a frame of
at least 80 % of its size). When a lease ends matters: a segment goes back to the pool
only when the receiver said it dropped its last view (``release``), or when the
receiving process is known to have exited. A lease that ended because its connection
closed while the receiver lives (it may still hold views: a Dask worker keeps what it
received long after the comm closed) *retires* the segment instead: this process closes
its descriptor and never writes to it again, and the memory is freed when the receiver
unmaps it. So a receiver never sees the bytes of a view change.

**Bounds on what waits for reuse.** At most ``max_idle_bytes`` (``HANDOFF_SHM_POOL_BYTES``,
default :data:`DEFAULT_MAX_IDLE_BYTES`) and :data:`MAX_IDLE_SEGMENTS` idle segments, none
idle longer than ``idle_seconds`` (``HANDOFF_SHM_POOL_IDLE_SECONDS``, default
:data:`IDLE_SECONDS`: a timer retires them), and :meth:`SegmentPool.trim` retires every
idle one at once (the Dask backend calls it when a worker's memory nears Dask's
thresholds). A forked child starts with an empty pool.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import resource
import sys
import threading
import time
from typing import Any, Optional

from .idletimer import IdleTimer
from handoff.memfd import F_ADD_SEALS, SEALS_FIXED, memfd
from .regions import Region, release

__all__ = [
    "Segment",
    "SegmentPool",
    "pool",
    "MIN_SEGMENT",
    "DEFAULT_MAX_IDLE_BYTES",
    "MAX_IDLE_SEGMENTS",
    "IDLE_SECONDS",
    "default_max_fds",
]

#: Smallest segment the pool creates.
MIN_SEGMENT = 64 * 1024
#: Idle bytes a pool keeps unless ``HANDOFF_SHM_POOL_BYTES`` says otherwise.
DEFAULT_MAX_IDLE_BYTES = 1 << 30
#: Idle segments a pool keeps at most.
MAX_IDLE_SEGMENTS = 64
#: An idle segment is retired after this many seconds unless ``HANDOFF_SHM_POOL_IDLE_SECONDS`` says otherwise.
IDLE_SECONDS = 10.0
#: Copies at least this large release the GIL (numpy) so the caller may run them in a thread.
_BIG_COPY = 1 << 20
_PAGE = mmap.PAGESIZE


def _size_for(n: int) -> int:
    n = max(n, MIN_SEGMENT)
    return -(-n // _PAGE) * _PAGE


def default_max_fds() -> int:
    """Descriptors the pool may keep: ``HANDOFF_SHM_POOL_FDS``, else an eighth of the soft
    ``RLIMIT_NOFILE`` (at least 8, at most 256)."""
    raw = os.environ.get("HANDOFF_SHM_POOL_FDS")
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 256
    return max(8, min(256, soft // 8))


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Segment:
    """One pooled memfd: its descriptor (``-1`` once closed), its mapping while this process
    writes it, and how many leases hold it."""

    __slots__ = ("id", "fd", "size", "region", "holders", "inode", "used", "idle_since", "turn", "_pool", "__weakref__")

    def __init__(self, pool: "SegmentPool", seg_id: int, size: int):
        fd = memfd(size)
        try:
            fcntl.fcntl(fd, F_ADD_SEALS, SEALS_FIXED)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self.id = seg_id
        self.fd = fd
        self.size = size
        self.region: Optional[Region] = None
        self.inode = (st.st_dev, st.st_ino)
        #: Whether its pages were written before (then mapped with their page tables filled).
        self.used = False
        self.idle_since = 0.0
        #: How many times it was taken from the pool (a :meth:`detach` for an earlier turn does nothing).
        self.turn = 1
        #: Leases (and the sender's own planning) that hold the segment busy.
        self.holders = 0
        self._pool = pool

    @property
    def map(self) -> Region:
        """The segment's read-write mapping (made now if it has none)."""
        if self.region is None:
            if self.fd < 0:
                raise ValueError("the segment is closed")
            self.region = Region.map(self.fd, self.size, write=True, populate=self.used)
            self.used = True
        return self.region

    def write(self, data: Any) -> None:
        """Copies a flat byte view to the start of the segment (the GIL is released for
        large copies, so the caller may run them in a thread).

        A segment that is not mapped now (a copy to send) is written with ``pwrite``: no
        mapping is made, so the sender's RSS does not grow by the frame, and no page table
        is filled and torn down again (at 1 MiB that was half the cost of the copy). A
        segment an application maps (a :class:`~handoff.shm.ShmBuffer`) is copied into
        through its mapping."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self.region is None:
            if self.fd < 0:
                raise ValueError("the segment is closed")
            if n > self.size:
                raise ValueError(f"{n} bytes do not fit a segment of {self.size}")
            done = 0
            while done < n:
                wrote = os.pwritev(self.fd, [view[done:]], done)
                if wrote <= 0:
                    raise OSError(f"writing the segment stopped after {done} of {n} bytes")
                done += wrote
            self.used = True
            return
        region = self.region
        np = sys.modules.get("numpy")
        if np is not None and n >= _BIG_COPY:
            dst = region.array()[:n]
            np.copyto(dst, np.frombuffer(view, dtype=np.uint8))
            del dst
        else:
            region.view()[:n] = view

    def detach(self, turn: int) -> None:
        """The copy made in it on ``turn`` (:attr:`turn` when it was taken) was sent: unmap
        it (the receiver maps it now), and close its descriptor if the pool holds too many
        (the segment is then never reused). Nothing if it came back to the pool since."""
        self._pool._detached(self, turn)

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
        held, self.region = [self.region], None  # (no other reference of ours: see release)
        fd, self.fd = self.fd, -1
        release(held, fd, self.size)

    def __repr__(self) -> str:
        return f"Segment(#{self.id}, {self.size} bytes, {self.holders} holders)"


class SegmentPool:
    """Pooled segments of one process; thread-safe (nodes on several event loops share it)."""

    def __init__(
        self,
        max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES,
        idle_seconds: float = IDLE_SECONDS,
        max_fds: Optional[int] = None,
    ):
        self.max_idle_bytes = max_idle_bytes
        self.idle_seconds = idle_seconds
        self.max_fds = default_max_fds() if max_fds is None else max_fds
        self._lock = threading.Lock()
        self._idle: list = []  # idle segments, least recently returned first
        self._next_id = 1
        self._tainted: set = set()  # ids of busy segments that must not come back
        self._timer = IdleTimer(self._expire)  # on the event loop that last took a segment
        self.segments = 0  # segments this process keeps (busy and idle)
        self.bytes = 0
        self.idle_segments = 0
        self.idle_bytes = 0
        self.fds = 0  # descriptors the segments keep
        self.created = 0
        self.reused = 0
        self.retired = 0

    def take(self, n: int) -> Segment:
        """A segment of at least ``n`` bytes (an idle one that fits, else a new one), held
        once for the caller: the caller's lease, or :meth:`Segment.let_go` if unused."""
        size = _size_for(n)
        most = size + size // 4
        self._timer.seen()
        self._expire_old()
        with self._lock:
            best = -1
            for i, s in enumerate(self._idle):
                if size <= s.size <= most and (best < 0 or s.size < self._idle[best].size):
                    best = i
            if best >= 0:
                seg = self._idle.pop(best)
                self.idle_segments -= 1
                self.idle_bytes -= seg.size
                self.reused += 1
                seg.holders = 1
                seg.turn += 1
                return seg
            seg_id = self._next_id
            self._next_id += 1
        seg = Segment(self, seg_id, size)
        with self._lock:
            self.segments += 1
            self.bytes += size
            self.fds += 1
            self.created += 1
            seg.holders = 1
        return seg

    def _detached(self, seg: Segment, turn: int) -> None:
        with self._lock:
            if seg.turn != turn or seg.holders <= 0:
                return  # back in the pool (or taken again) since: not this send's to touch
            seg.region = None
            if seg.fd < 0 or self.fds <= self.max_fds:
                return
            self.fds -= 1
            self._tainted.add(seg.id)  # no descriptor: it can never be sent again
            fd, seg.fd = seg.fd, -1
        os.close(fd)

    def _let_go(self, seg: Segment, reusable: bool) -> None:
        arm = False
        drop = []
        with self._lock:
            seg.holders -= 1
            if not reusable:
                self._tainted.add(seg.id)
            if seg.holders > 0:
                return
            keep = (
                seg.id not in self._tainted
                and seg.fd >= 0
                and self.fds <= self.max_fds
                and self.idle_seconds > 0
                and seg.size <= self.max_idle_bytes
            )
            self._tainted.discard(seg.id)
            if keep:
                seg.region = None  # idle: in no process's RSS
                seg.idle_since = time.monotonic()
                self._idle.append(seg)
                self.idle_segments += 1
                self.idle_bytes += seg.size
                while self._idle and (self.idle_bytes > self.max_idle_bytes or self.idle_segments > MAX_IDLE_SEGMENTS):
                    drop.append(self._forget_idle(0))
                arm = True
            else:
                self._forget(seg)
                drop.append(seg)
        for s in drop:
            s._close()
        if arm:
            self._timer.arm(self.idle_seconds)

    def _forget(self, seg: Segment) -> None:
        """Counts a segment out (lock held); the caller closes it."""
        self.segments -= 1
        self.bytes -= seg.size
        if seg.fd >= 0:
            self.fds -= 1
        self.retired += 1

    def _forget_idle(self, i: int) -> Segment:
        seg = self._idle.pop(i)
        self.idle_segments -= 1
        self.idle_bytes -= seg.size
        self._forget(seg)
        return seg

    def _expire_old(self) -> float:
        """Retires segments idle for ``idle_seconds``; returns how long until the next one is
        due (0 if none is idle)."""
        now = time.monotonic()
        drop = []
        with self._lock:
            i = 0
            while i < len(self._idle):
                if now - self._idle[i].idle_since >= self.idle_seconds:
                    drop.append(self._forget_idle(i))
                else:
                    i += 1
            due = max(0.05, self.idle_seconds - (now - self._idle[0].idle_since)) if self._idle else 0.0
        for s in drop:
            s._close()
        return due

    def _expire(self) -> None:
        """The timer: retires what is due, and runs again while some segments stay idle."""
        due = self._expire_old()
        if due:
            self._timer.arm(due)

    def trim(self) -> int:
        """Retires every idle segment now (memory pressure); returns the bytes given back."""
        with self._lock:
            drop = [self._forget_idle(0) for _ in range(len(self._idle))]
        for s in drop:
            s._close()
        return sum(s.size for s in drop)

    def clear(self) -> None:
        """Closes every idle segment (busy ones stay with their leases)."""
        self.trim()

    def stats(self) -> dict:
        """``{segments, bytes, idle_segments, idle_bytes, busy_segments, fds, created, reused, retired}``."""
        with self._lock:
            return {
                "segments": self.segments,
                "bytes": self.bytes,
                "idle_segments": self.idle_segments,
                "idle_bytes": self.idle_bytes,
                "busy_segments": self.segments - self.idle_segments,
                "fds": self.fds,
                "created": self.created,
                "reused": self.reused,
                "retired": self.retired,
            }


_POOL: Optional[SegmentPool] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def pool() -> SegmentPool:
    """The process's pool (bounds from ``HANDOFF_SHM_POOL_BYTES``, ``HANDOFF_SHM_POOL_IDLE_SECONDS``
    and ``HANDOFF_SHM_POOL_FDS``)."""
    global _POOL, _POOL_PID
    pid = os.getpid()
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != pid:
            cap = os.environ.get("HANDOFF_SHM_POOL_BYTES")
            try:
                idle = int(cap) if cap else DEFAULT_MAX_IDLE_BYTES
            except ValueError:
                idle = DEFAULT_MAX_IDLE_BYTES
            _POOL = SegmentPool(idle, _env_float("HANDOFF_SHM_POOL_IDLE_SECONDS", IDLE_SECONDS))
            _POOL_PID = pid
        return _POOL

"""Received segments kept mapped between frames (shared read-only, or private copy-on-write).

A sender's pool (§7.4, :mod:`handoff_pure.pool`; the Rust reference's ``SharedBufMut`` comes
from one too) sends the same segments again and again. A receiver that maps each
received frame anew faults every page in again on its first read of it — on these
machines that costs about as much as reading the bytes (a 1 GiB frame: about 130 ms of
faults, then 130 ms to sum it with numpy). So a connection keeps the mapping of a whole
segment after the frame's last view is gone, and maps the next frame that comes in the
same segment (the same file: device and inode, checked like any received descriptor,
§7.2) through it, with its pages still mapped — as the Rust receiver keeps one mapping
per segment.

A shared read-only mapping (the default) shows the segment's bytes and nothing else, so
it is kept as it is — for segments that are not sealed (pooled ones; a sealed segment
never carries new bytes, and keeping its mapping would only hold its memory). A node that maps received frames private (``shm_private``, as the
Dask backend does) needs more care: what the receiver wrote into a private mapping are its own copies of those pages; they
must not show through the next frame. So when the last view of a frame is gone, before
its lease is released (so before the sender may write the segment again), the mapping is
*scrubbed*: the pages that are the receiver's own (anonymous, from ``/proc/self/pagemap``)
are dropped with ``MADV_DONTNEED``, and the mapping shows the segment's bytes again, as a
fresh one would. Whether this kernel does that is checked once per process on a segment
of its own (a page written, scrubbed and read back); where it does not, or without numpy
or ``/proc/self/pagemap``, no private mapping is kept and every frame is mapped anew.
Shared mappings need numpy only (the exporter of a frame is a numpy array).

Bounds: a connection keeps at most :data:`MAX_KEPT` idle mappings; the process at most
``HANDOFF_SHM_KEEP_BYTES`` bytes of them (default :data:`DEFAULT_KEEP_BYTES`; or
:func:`set_keep_bytes`, which the Dask backend calls with ``kept-map-bytes``), the least
recently used going first; none idle longer than ``HANDOFF_SHM_KEEP_SECONDS`` (default
:data:`KEEP_SECONDS`: a timer on the connection's event loop unmaps it); a connection's
are unmapped when it closes, and :func:`trim_all` unmaps every idle one of the process
(the Dask backend calls it when a worker's memory nears Dask's thresholds). A kept
mapping holds the segment's memory even if the sender has let go of it, and its pages
count in this process's RSS. Mappings keep no descriptor (:mod:`handoff.shmmap`).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Optional

from .regions import MADV_DONTNEED, Region

__all__ = [
    "MapCache",
    "Kept",
    "available",
    "set_keep_bytes",
    "trim_all",
    "idle_bytes",
    "MAX_KEPT",
    "DEFAULT_KEEP_BYTES",
    "KEEP_SECONDS",
]

#: Idle mappings one connection keeps.
MAX_KEPT = 4
#: Idle mapped bytes a process keeps unless ``HANDOFF_SHM_KEEP_BYTES`` says otherwise.
DEFAULT_KEEP_BYTES = 1 << 30
#: An idle kept mapping is unmapped after this many seconds (``HANDOFF_SHM_KEEP_SECONDS``).
KEEP_SECONDS = 10.0

_PAGE = mmap.PAGESIZE
_PM_PRESENT = 1 << 63
_PM_SWAP = 1 << 62
_PM_FILE = 1 << 61  # a page of the file (or shared anonymous), not one of our own copies

_lock = threading.Lock()
_state: dict = {"checked": False, "ok": False, "pagemap": -1, "idle_bytes": 0, "keep_bytes": None, "keep_seconds": None}


def set_keep_bytes(n: int) -> None:
    """How many idle mapped bytes this process keeps from now on (0: none; overrides
    ``HANDOFF_SHM_KEEP_BYTES``). What is kept beyond it goes as connections use their
    mappings again."""
    _state["keep_bytes"] = max(0, int(n))


def _keep_bytes() -> int:
    if _state["keep_bytes"] is not None:
        return _state["keep_bytes"]
    try:
        return int(os.environ.get("HANDOFF_SHM_KEEP_BYTES", DEFAULT_KEEP_BYTES))
    except ValueError:
        return DEFAULT_KEEP_BYTES


def set_keep_seconds(seconds: float) -> None:
    """How long an idle mapping stays mapped from now on (overrides
    ``HANDOFF_SHM_KEEP_SECONDS``; timers armed before keep their time)."""
    _state["keep_seconds"] = max(0.0, float(seconds))


def _keep_seconds() -> float:
    if _state["keep_seconds"] is not None:
        return _state["keep_seconds"]
    try:
        return float(os.environ.get("HANDOFF_SHM_KEEP_SECONDS", KEEP_SECONDS))
    except ValueError:
        return KEEP_SECONDS


#: Every connection's cache in this process (for :func:`trim_all`).
_caches: "weakref.WeakSet[MapCache]" = weakref.WeakSet()


def idle_bytes() -> int:
    """Bytes of idle kept mappings in this process."""
    return _state["idle_bytes"]


def trim_all() -> None:
    """Unmaps every idle kept mapping of the process (each on its connection's event loop;
    from any thread)."""
    for cache in list(_caches):
        loop = cache.loop
        if loop is None:
            continue
        try:
            loop.call_soon_threadsafe(cache.trim)
        except RuntimeError:  # the loop is closed
            pass


def _scrub(mapping: Region, addr: int, length: int) -> None:
    """Drops the pages of ``mapping`` that are this process's own copies (see the module)."""
    np = sys.modules["numpy"]
    pages = length // _PAGE
    raw = os.pread(_state["pagemap"], pages * 8, (addr // _PAGE) * 8)
    if len(raw) != pages * 8:
        raise OSError(f"/proc/self/pagemap gave {len(raw)} bytes for {pages} pages")
    entries = np.frombuffer(raw, dtype=np.uint64)
    own = ((entries & np.uint64(_PM_PRESENT | _PM_SWAP)) != 0) & ((entries & np.uint64(_PM_FILE)) == 0)
    idx = np.flatnonzero(own)
    if not len(idx):
        return
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate((idx[:1], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], idx[-1:])) + 1
    for s, e in zip(starts.tolist(), ends.tolist()):
        mapping.advise(MADV_DONTNEED, s * _PAGE, (e - s) * _PAGE)


def _self_test() -> bool:
    """Whether a scrubbed private mapping shows the file's bytes again, on this kernel."""
    fd = os.memfd_create("handoff-mapcache-check", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 4 * _PAGE)
        os.pwrite(fd, b"f" * (4 * _PAGE), 0)
        m = Region.map(fd, 4 * _PAGE, write=True, private=True)
        a = m.array()
        _ = a[0], a[_PAGE], a[3 * _PAGE]  # file pages, mapped
        a[_PAGE : _PAGE + 3] = memoryview(b"own")  # one page becomes ours
        _scrub(m, m.addr, 4 * _PAGE)
        os.pwrite(fd, b"new", _PAGE)  # the "sender" writes it again
        return a.tobytes() == b"f" * _PAGE + b"new" + b"f" * (3 * _PAGE - 3)
    finally:
        os.close(fd)


def available() -> bool:
    """Whether kept mappings can be scrubbed here (checked once per process)."""
    if _state["checked"]:
        return _state["ok"]
    with _lock:
        if not _state["checked"]:
            ok = False
            if "numpy" in sys.modules or _import_numpy():
                try:
                    _state["pagemap"] = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
                    ok = _self_test()
                except (OSError, ValueError):
                    ok = False
            _state["ok"] = ok
            _state["checked"] = True
    return _state["ok"]


def _import_numpy() -> bool:
    try:
        import numpy  # noqa: F401

        return True
    except ImportError:  # pragma: no cover - numpy is optional
        return False


class Kept:
    """A whole-segment mapping a connection keeps, busy while a frame uses it."""

    __slots__ = ("key", "mapping", "size", "addr", "private", "busy", "idle_since", "__weakref__")

    def __init__(self, key: tuple, mapping: Region, size: int, private: bool = True):
        self.key = key
        self.mapping: Optional[Region] = mapping
        self.size = size
        self.private = private
        #: Where it is mapped (for scrubbing a private mapping).
        self.addr = mapping.addr
        self.busy = True
        self.idle_since = 0.0

    def exporter(self) -> Any:
        """A fresh object exporting the whole mapping (a numpy array, read-only for a shared
        mapping): its lifetime is one frame's views'."""
        return self.mapping.array()


class MapCache:
    """One connection's kept mappings (used from its event loop's thread only)."""

    def __init__(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        self._idle: "OrderedDict[tuple, Kept]" = OrderedDict()
        self._busy: dict = {}
        self.closed = False
        #: The connection's event loop (its timer and :func:`trim_all` run there).
        self.loop = loop
        self._timer: Optional[asyncio.TimerHandle] = None
        #: Frames mapped through a kept mapping (for tests and stats).
        self.hits = 0
        _caches.add(self)

    def take(self, key: tuple, size: int) -> Optional[Kept]:
        """The idle kept mapping of this segment, now busy; ``None`` if there is none."""
        kept = self._idle.pop(key, None)
        if kept is None:
            return None
        with _lock:
            _state["idle_bytes"] -= kept.size
        if kept.size != size:  # cannot happen for one file (its size is sealed); be safe
            self._unmap(kept)
            return None
        kept.busy = True
        self._busy[key] = kept
        self.hits += 1
        return kept

    def add(self, key: tuple, mapping: Region, size: int, private: bool = True) -> Optional[Kept]:
        """Keeps a new whole-segment mapping (busy; ``private``: copy-on-write, scrubbed when
        done); ``None`` if this segment is busy already (a sender that sends a segment again
        before its release: it gets a mapping of its own)."""
        if self.closed or key in self._busy or size > _keep_bytes():
            return None
        if not (available() if private else "numpy" in sys.modules or _import_numpy()):
            return None
        old = self._idle.pop(key, None)
        if old is not None:
            with _lock:
                _state["idle_bytes"] -= old.size
            self._unmap(old)
        kept = Kept(key, mapping, size, private)
        self._busy[key] = kept
        return kept

    def done(self, kept: Kept) -> None:
        """The last view of the frame that used ``kept`` is gone: scrub it and keep it idle
        (or unmap it, over the bounds or once the connection closed)."""
        if self._busy.get(kept.key) is kept:
            del self._busy[kept.key]
        kept.busy = False
        limit = _keep_bytes()
        if self.closed or kept.size > limit:
            self._unmap(kept)
            return
        if kept.private:  # a shared read-only mapping has no pages of its own to drop
            try:
                _scrub(kept.mapping, kept.addr, kept.size)
            except (OSError, ValueError):
                self._unmap(kept)
                return
        with _lock:
            _state["idle_bytes"] += kept.size
        kept.idle_since = time.monotonic()
        self._idle[kept.key] = kept
        while len(self._idle) > MAX_KEPT or (self._idle and _state["idle_bytes"] > limit):
            _, oldest = self._idle.popitem(last=False)
            with _lock:
                _state["idle_bytes"] -= oldest.size
            self._unmap(oldest)
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None or not self._idle or self.loop is None:
            return
        first = next(iter(self._idle.values()))
        wait = max(0.05, _keep_seconds() - (time.monotonic() - first.idle_since))
        try:
            self._timer = self.loop.call_later(wait, self._expire)
        except RuntimeError:  # pragma: no cover - the loop is closed
            self._timer = None

    def _expire(self) -> None:
        """Unmaps the mappings idle for ``HANDOFF_SHM_KEEP_SECONDS``; runs again while some stay."""
        self._timer = None
        now = time.monotonic()
        seconds = _keep_seconds()
        for key in [k for k, kept in self._idle.items() if now - kept.idle_since >= seconds]:
            kept = self._idle.pop(key)
            with _lock:
                _state["idle_bytes"] -= kept.size
            self._unmap(kept)
        self._arm()

    def trim(self) -> None:
        """Unmaps every idle mapping of this connection now (memory pressure)."""
        while self._idle:
            _, kept = self._idle.popitem()
            with _lock:
                _state["idle_bytes"] -= kept.size
            self._unmap(kept)

    def close(self) -> None:
        """The connection closed: idle mappings are unmapped now, busy ones when done."""
        self.closed = True
        self._busy.clear()  # done() unmaps each when its frame's views are gone
        self.trim()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @staticmethod
    def _unmap(kept: Kept) -> None:
        # The region is unmapped when nothing else refers to it (an exporter still held
        # goes on showing it until it is gone).
        kept.mapping = None

    def stats(self) -> dict:
        return {"idle": len(self._idle), "busy": len(self._busy), "hits": self.hits}

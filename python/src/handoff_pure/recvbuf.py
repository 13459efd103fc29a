"""Warm buffers for large received frames (inline frames and pulled ticket bytes).

A frame of 64 MiB or more read into fresh memory costs the kernel a fault and a zeroed
page for every page before the first byte is copied in: on these machines that took as
long as the copy from the socket itself, and a fresh 1 GiB allocation that asked for
huge pages sometimes stalled for seconds in compaction (the "cliff" of issue 14).
glibc's ``malloc`` gives such sizes back to the kernel when they are freed, so the next
frame pays all of it again.

So the process keeps the buffers of large received frames once their last view is gone
and reads the next frame of a fitting size into one of them, with its pages in place:

- A buffer is a private anonymous mapping (advised to use huge pages); a frame gets a fresh
  numpy array over its first ``n`` bytes as its *exporter*: every view of the frame
  holds it, and when the last is gone the buffer comes back to the pool. A frame never
  shows more than its own ``n`` bytes, and it is filled completely before anything
  sees it (a frame that is cut short fails its connection and is never delivered).
- Only a buffer whose frame was filled (:meth:`RecvPool.filled`) comes back to the pool.
  The buffer of a frame cut short — a peer that announced a large frame and stalled —
  is unmapped when its last view is gone, so what a stalled peer made the node touch is
  not kept after its connection failed.
- A buffer is reused for a frame of ``n`` bytes if it holds at least ``n`` and at most
  ``n + n / 4`` bytes (or ``n`` rounded up to 2 MiB): the bytes the frame is charged
  for (§9.1), and a little more.
- Bounds: at most ``HANDOFF_RECV_POOL_BYTES`` idle bytes in the process (default
  :data:`DEFAULT_IDLE_BYTES`; 0 keeps none), the least recently returned going first,
  and none idle longer than :data:`IDLE_SECONDS` (a timer frees them). Busy buffers are
  the frames the application holds: what the buffered-bytes bounds admitted.
- Without numpy (the exporter is a numpy array) nothing is pooled.
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
import threading
import time
import weakref
from typing import Optional

from .idletimer import IdleTimer

__all__ = ["RecvPool", "recv_pool", "MIN_POOLED", "DEFAULT_IDLE_BYTES", "IDLE_SECONDS"]

#: Frames at least this large come from the pool (smaller ones: ``malloc`` reuses its memory).
MIN_POOLED = 16 << 20
#: Idle bytes the pool keeps unless ``HANDOFF_RECV_POOL_BYTES`` says otherwise.
DEFAULT_IDLE_BYTES = 1 << 30
#: An idle buffer is freed after this many seconds.
IDLE_SECONDS = 10.0
#: Buffers are sized in steps of this (a huge page).
_STEP = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _numpy():
    np = sys.modules.get("numpy")
    if np is None and not _NO_NUMPY:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy is optional
            _NO_NUMPY.append(True)
            return None
    return np


_NO_NUMPY: list = []


def _capacity(n: int) -> int:
    return -(-n // _STEP) * _STEP


class RecvPool:
    """Idle receive buffers of one process; thread-safe (a frame's last view may go in any thread)."""

    def __init__(self, max_idle_bytes: int = DEFAULT_IDLE_BYTES, idle_seconds: float = IDLE_SECONDS):
        self.max_idle_bytes = max(0, max_idle_bytes)
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        #: Idle buffers, least recently returned first: (mapping, returned at).
        self._idle: list = []
        self.idle_bytes = 0
        self._timer = IdleTimer(self._expire)  # on the event loop that last took a buffer
        #: Whether each busy buffer's frame was filled, by the id of its exporter.
        self._filled: dict = {}
        self.created = 0
        self.reused = 0
        self.freed = 0

    def take(self, n: int) -> Optional[memoryview]:
        """A writable view of exactly ``n`` bytes in a pooled buffer (an idle one that fits,
        else a new one); ``None`` if pooling is off (no numpy, or no idle bytes allowed)."""
        if self.max_idle_bytes == 0 or n <= 0:
            return None
        np = _numpy()
        if np is None:
            return None
        self._timer.seen()
        self._expire_old()
        buf = None
        with self._lock:
            best = -1
            most = max(_capacity(n), n + n // 4)
            for i, (m, _) in enumerate(self._idle):
                size = len(m)
                if n <= size <= most and (best < 0 or size < len(self._idle[best][0])):
                    best = i
            if best >= 0:
                buf, _ = self._idle.pop(best)
                self.idle_bytes -= len(buf)
                self.reused += 1
        if buf is None:
            buf = mmap.mmap(-1, _capacity(n), flags=mmap.MAP_PRIVATE)
            if _MADV_HUGEPAGE is not None:
                try:
                    buf.madvise(_MADV_HUGEPAGE)
                except OSError:  # pragma: no cover - advice only
                    pass
            with self._lock:
                self.created += 1
        exporter = np.frombuffer(buf, dtype=np.uint8, count=n)
        filled = [False]
        with self._lock:
            self._filled[id(exporter)] = filled
        fin = weakref.finalize(exporter, self._give_back, buf, id(exporter), filled)
        fin.atexit = False
        return memoryview(exporter)

    def filled(self, view: memoryview) -> None:
        """Says that the frame of ``view`` (from :meth:`take`) was read whole: its buffer may
        come back to the pool. Any other view is left alone."""
        with self._lock:
            flag = self._filled.get(id(view.obj))
        if flag is not None:
            flag[0] = True

    def _give_back(self, buf: mmap.mmap, key: int, filled: list) -> None:
        """The last view of a frame in ``buf`` is gone: keep it idle if its frame was
        filled, else free it."""
        with self._lock:
            if self._filled.get(key) is filled:
                del self._filled[key]
        if not filled[0]:
            self._free(buf)
            return
        now = time.monotonic()
        drop = []
        with self._lock:
            self._idle.append((buf, now))
            self.idle_bytes += len(buf)
            while self._idle and self.idle_bytes > self.max_idle_bytes:
                m, _ = self._idle.pop(0)
                self.idle_bytes -= len(m)
                drop.append(m)
            arm = bool(self._idle)
        for m in drop:
            self._free(m)
        if arm:
            self._timer.arm(self.idle_seconds)

    def _expire_old(self) -> float:
        """Frees buffers idle for ``idle_seconds``; returns how long until the next is due (0: none idle)."""
        now = time.monotonic()
        drop = []
        with self._lock:
            keep = []
            for m, at in self._idle:
                if now - at >= self.idle_seconds:
                    self.idle_bytes -= len(m)
                    drop.append(m)
                else:
                    keep.append((m, at))
            self._idle = keep
            due = max(0.05, self.idle_seconds - (now - keep[0][1])) if keep else 0.0
        for m in drop:
            self._free(m)
        return due

    def _expire(self) -> None:
        """The timer: frees what is due, and runs again while some buffers stay idle."""
        due = self._expire_old()
        if due:
            self._timer.arm(due)

    def _free(self, m: mmap.mmap) -> None:
        self.freed += 1
        try:
            m.close()
        except (BufferError, ValueError):  # pragma: no cover - nothing exports an idle buffer
            pass

    def clear(self) -> None:
        """Frees every idle buffer."""
        with self._lock:
            idle, self._idle = self._idle, []
            self.idle_bytes = 0
        for m, _ in idle:
            self._free(m)

    def stats(self) -> dict:
        """``{idle_buffers, idle_bytes, created, reused, freed}``."""
        with self._lock:
            return {
                "idle_buffers": len(self._idle),
                "idle_bytes": self.idle_bytes,
                "created": self.created,
                "reused": self.reused,
                "freed": self.freed,
            }


_POOL: Optional[RecvPool] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def recv_pool() -> RecvPool:
    """The process's pool (idle cap from ``HANDOFF_RECV_POOL_BYTES``, default 1 GiB)."""
    global _POOL, _POOL_PID
    pid = os.getpid()
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != pid:
            raw = os.environ.get("HANDOFF_RECV_POOL_BYTES")
            try:
                cap = DEFAULT_IDLE_BYTES if raw is None else int(raw)
            except ValueError:
                # A receive must not fail for it: say what was wrong, once, and keep the default.
                logging.getLogger("handoff").warning(
                    "HANDOFF_RECV_POOL_BYTES=%r is not a whole number of bytes; keeping %d idle bytes",
                    raw,
                    DEFAULT_IDLE_BYTES,
                )
                cap = DEFAULT_IDLE_BYTES
            _POOL = RecvPool(cap)
            _POOL_PID = pid
        return _POOL

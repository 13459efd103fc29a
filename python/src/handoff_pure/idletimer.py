"""A timer for memory held for reuse, run by an event loop of the process (no thread).

The process-wide pools (:mod:`handoff_pure.pool`, ``handoff_pure.recvbuf``) give back what has
been idle too long. A thread of their own would outlive the code that used them (Dask's
tests fail on any thread a test leaves behind), so the expiry runs on the event loop
that last used the pool instead, and is also checked whenever the pool is used. A pool
that no running loop has used (a program without asyncio) gets a timer thread instead,
as before.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional

__all__ = ["IdleTimer"]


class IdleTimer:
    """Calls ``fn()`` once, ``delay`` seconds after :meth:`arm`, on the loop last :meth:`seen`."""

    def __init__(self, fn: Callable[[], None]):
        self._fn = fn
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._handle: Optional[asyncio.TimerHandle] = None
        self._thread: Optional[threading.Timer] = None
        self._lock = threading.Lock()

    def seen(self) -> None:
        """Remembers the running loop of the caller, if it has one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._loop = loop

    def arm(self, delay: float) -> None:
        """Schedules ``fn`` in ``delay`` seconds (unless it is scheduled already); from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._schedule, loop, delay)
                return
            except RuntimeError:  # the loop closed meanwhile
                pass
        if loop is None:  # no event loop ever used the pool: a thread, once at a time
            with self._lock:
                if self._thread is not None:
                    return
                self._thread = threading.Timer(delay, self._fire_thread)
                self._thread.daemon = True
                self._thread.start()

    def _schedule(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        with self._lock:
            if self._handle is not None:
                return
            self._handle = loop.call_later(delay, self._fire)

    def _fire_thread(self) -> None:
        with self._lock:
            self._thread = None
        self._fn()

    def _fire(self) -> None:
        with self._lock:
            self._handle = None
        self._fn()

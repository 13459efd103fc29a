"""The extension that :mod:`handoff.datasets` runs on: ``handoff-data``, the Rust data layer
the CLI runs too, so that both languages read catalogs, specs and the cache one way. There is
no pure-Python data layer: ``HANDOFF_NATIVE=0`` does not change this one.

A read runs on the extension's own threads, which never call into Python: :func:`call` gives
it an id and a future, and the running event loop, which watches the extension's wake pipe,
collects what finished (``data_completions``) and completes the futures on its own thread."""

from __future__ import annotations

import asyncio
import itertools
import os
import weakref
from typing import Any, Callable

from ..native import required

native = required("handoff.datasets")

__all__ = ["native", "call"]


class _Reads:
    """The reads under way in this process, by id, and the loops that watch for them."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.ids = itertools.count(1)
        self.futures: dict = {}
        self.watching: weakref.WeakSet = weakref.WeakSet()  # loops go when they are closed and dropped

    def call(self, start: Callable[..., None], *args: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if loop not in self.watching:
            loop.add_reader(native.data_wake_fd(), self.collect)
            self.watching.add(loop)
        fut = loop.create_future()
        rid = next(self.ids)
        self.futures[rid] = fut
        start(*args, rid)
        fut.add_done_callback(lambda f: self._forget(rid, f))
        return fut

    def _forget(self, rid: int, fut: asyncio.Future) -> None:
        if self.futures.pop(rid, None) is not None and fut.cancelled():
            native.data_cancel(rid)  # stops the read

    def collect(self) -> None:
        """Completes the futures of the reads that finished (on the loop that awaits each)."""
        here = asyncio.get_running_loop()
        for rid, ok, value in native.data_completions():
            fut = self.futures.pop(rid, None)
            if fut is None or fut.done():
                continue
            done = fut.set_result if ok else fut.set_exception
            loop = fut.get_loop()
            if loop is here:
                done(value)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(lambda d=done, v=value, f=fut: f.done() or d(v))


_reads = _Reads()


def call(start: Callable[..., None], *args: Any) -> asyncio.Future:
    """Starts ``start(*args, id)``, one of the extension's reads, and returns the future of
    its result (cancelling it stops the read)."""
    global _reads
    if _reads.pid != os.getpid():  # a forked child: the extension's state is new too
        _reads = _Reads()
    return _reads.call(start, *args)

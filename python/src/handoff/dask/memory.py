"""What shared memory a Dask process holds, reported to Dask, and given back under pressure.

Dask's memory manager decides from the process's RSS (``SystemMonitor`` reads
``memory_info().rss``; the nanny's terminate threshold reads the same): spilling at
``distributed.worker.memory.spill``, pausing at ``pause``, a restart at ``terminate``.
RSS counts the pages of shared mappings a process touched (Dask issues #4304 and #5868
are users asking Dask to see that). So the backend keeps its own part of it honest:

- a sender unmaps a segment once it is sent (:mod:`handoff.pool`): the receiver counts
  the pages, not both;
- a node on the Rust engine writes its copies into segments with ``pwrite`` and never
  maps them (``CopyInto::Write`` in ``handoff-proto``), for the same reason;
- what is held only for reuse is given back on a timer (the idle segments of the pool,
  the mappings kept by connections, the warm receive buffers: :mod:`handoff.pool`,
  :mod:`handoff.held` (the pure-Python reference's mappings and receive buffers), and the engine's own, which
  ``handoff._native.held_for_reuse`` reports), and at once when a worker's RSS
  comes within :data:`TRIM_MARGIN` of the lowest of Dask's spill, pause and terminate
  thresholds (a watcher on the event loop of the process's first comm, :func:`start`,
  checks every :data:`INTERVAL` seconds; no thread: Dask's tests fail on any thread a
  test leaves behind);
- :func:`shared_bytes` is reported with every heartbeat as the worker metric
  ``handoff`` (``distributed.worker.DEFAULT_METRICS``, the way Dask's GPU metrics are
  added), so the scheduler and the dashboard's metrics see what the backend holds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from .. import held as held_for_reuse
from .. import native
from ..pool import pool

__all__ = ["shared_bytes", "trim", "start", "TRIM_MARGIN", "INTERVAL"]

logger = logging.getLogger("distributed.comm.handoff")

#: Memory held for reuse is given back when RSS is within this fraction of the memory
#: limit below Dask's lowest process-memory threshold.
TRIM_MARGIN = 0.1
#: Seconds between two checks of the watcher.
INTERVAL = 0.5

_watching: Optional[asyncio.AbstractEventLoop] = None


def shared_bytes() -> dict:
    """What this process holds for handoff, in bytes: ``pool-busy`` (segments receivers
    hold, in the host's shared memory and the receivers' RSS, not this process's),
    ``pool-idle`` (idle segments, in no RSS), ``kept-idle`` (received segments kept
    mapped, in this RSS), ``recv-idle`` (warm receive buffers, in this RSS)."""
    p = pool().stats()
    held = {
        "pool-busy": p["bytes"] - p["idle_bytes"],
        "pool-idle": p["idle_bytes"],
        "pool-fds": p["fds"],
        "kept-idle": 0,
        "recv-idle": 0,
    }
    # The Rust engine's pool, mappings and receive buffers (nodes on the engine), and what
    # other implementations registered (the pure-Python reference's, in tests).
    for key, n in held_for_reuse.held().items():
        held[key] += n
    if native.ENABLED:
        for key, n in native.ext.held_for_reuse().items():
            held[key] += n
    return held


def trim() -> None:
    """Gives back everything held only for reuse, now (from any thread)."""
    pool().trim()
    held_for_reuse.give_back()
    if native.ENABLED:
        native.ext.give_back_held()


def _worker_metric(worker: Any) -> dict:
    return shared_bytes()


def _threshold(worker: Any) -> Optional[float]:
    """The RSS (bytes) from which this worker's memory held for reuse is given back."""
    mm = getattr(worker, "memory_manager", None)
    limit = getattr(mm, "memory_limit", None)
    if not limit:
        return None
    import dask

    fractions = [
        getattr(mm, "memory_spill_fraction", False),
        getattr(mm, "memory_pause_fraction", False),
        dask.config.get("distributed.worker.memory.terminate", False),
    ]
    fractions = [f for f in fractions if f]
    if not fractions:
        return None
    return max(0.0, min(fractions) - TRIM_MARGIN) * limit


def _check() -> None:
    from distributed.worker import Worker

    workers = list(Worker._instances)
    if not workers:
        return
    limits = [t for t in (_threshold(w) for w in workers) if t is not None]
    if not limits:
        return
    held = shared_bytes()
    if not (held["pool-idle"] or held["kept-idle"] or held["recv-idle"]):
        return
    import psutil

    rss = psutil.Process().memory_info().rss
    if rss >= min(limits):
        logger.debug("RSS %d near Dask's thresholds: giving back %s", rss, held)
        trim()


def _tick(loop: asyncio.AbstractEventLoop) -> None:
    global _watching
    if _watching is not loop:
        return
    try:
        _check()
    except Exception:  # the watcher must not stop
        logger.debug("handoff memory watcher", exc_info=True)
    if loop.is_closed():
        _watching = None
        return
    loop.call_later(INTERVAL, _tick, loop)


def start() -> None:
    """Adds the ``handoff`` worker metric, and starts the watcher on the running event loop
    unless one runs on an open loop already (a later comm on another loop takes over once
    that loop is closed)."""
    global _watching
    try:
        from distributed.worker import DEFAULT_METRICS, Worker

        DEFAULT_METRICS.setdefault("handoff", _worker_metric)
        for w in list(Worker._instances):  # made before the backend was loaded
            w.metrics.setdefault("handoff", _worker_metric)
    except ImportError:  # pragma: no cover - distributed is what loads this
        pass
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if _watching is not None and not _watching.is_closed():
        return
    _watching = loop
    loop.call_later(INTERVAL, _tick, loop)

"""What shared memory a Dask process holds, reported to Dask, and given back under pressure.

Dask's memory manager decides from the process's RSS (``SystemMonitor`` reads
``memory_info().rss``; the nanny's terminate threshold reads the same): spilling at
``distributed.worker.memory.spill``, pausing at ``pause``, a restart at ``terminate``.
RSS counts the pages of shared mappings a process touched (Dask issues #4304 and #5868
are users asking Dask to see that). So the backend keeps its own part of it honest:

- a node on the Rust engine writes its copies into segments with ``pwrite`` and never
  maps them (``CopyInto::Write`` in ``handoff-proto``): the receiver counts the pages,
  not both;
- what is held only for reuse is given back on a timer (the idle segments of the pool,
  the mappings kept by connections, the warm receive buffers: the engine's own, which
  ``handoff._native.held_for_reuse`` reports, and what another implementation put in
  :mod:`handoff.held`, the pure-Python reference's in tests), and at once when a worker's RSS
  comes within :data:`TRIM_MARGIN` of the lowest of Dask's spill, pause and terminate
  thresholds (a watcher on the event loop of the process's first comm, :func:`start`,
  checks every :data:`INTERVAL` seconds; no thread: Dask's tests fail on any thread a
  test leaves behind);
- :func:`shared_bytes` is reported with every heartbeat as the worker metric
  ``handoff`` (``distributed.worker.DEFAULT_METRICS``, the way Dask's GPU metrics are
  added), so the scheduler and the dashboard's metrics see what the backend holds.

Arrays born in shared memory (``shared-arrays``, :mod:`handoff.shared`) are mapped by every
worker that holds them, and RSS counts a mapped page in each. Where they are on, the
memory Dask decides from is :func:`process_memory`: the process's private memory (RSS
less its shared pages, ``RssShmem``) plus the shared memory it made and still holds
(:func:`owned_shared`: its arenas' live and retired ranges and the freed pages they keep
for reuse, and the pooled segments its peers hold). Every shared byte is charged to exactly one process, the one that made
it, so the host's memory for an array held by several workers counts once. Bytes of an
array its maker freed while a peer still maps them (``arena-lent-freed``) count in no
process until the peer drops them: were they charged to the maker, spilling the array
would free nothing there, and Dask's spill loop would go on to evict more. The worker's
monitor reads it (:func:`install`), so spilling and pausing go by it. The nanny's
terminate check keeps reading RSS, the guard against the host running out of memory: a
worker that maps a peer's array has it in its RSS, as a worker on ``tcp://`` has its copy.
Shared memory that is not handoff's (``MAP_SHARED`` anonymous maps, ``/dev/shm`` files,
PyTorch's shared tensors) is subtracted with the rest of ``RssShmem`` and counted by no
worker's reading. The worker also rewrites its :func:`owned_shared` into a small file at
each reading (:func:`published`), for the benchmarks to read from outside.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

import os
import struct
from pathlib import Path

from .. import held as held_for_reuse
from .. import native
from ..identity import runtime_dir

__all__ = [
    "shared_bytes",
    "trim",
    "start",
    "owned_shared",
    "process_memory",
    "install",
    "published",
    "TRIM_MARGIN",
    "INTERVAL",
]

logger = logging.getLogger("distributed.comm.handoff")

#: Memory held for reuse is given back when RSS is within this fraction of the memory
#: limit below Dask's lowest process-memory threshold.
TRIM_MARGIN = 0.1
#: Seconds between two checks of the watcher.
INTERVAL = 0.5
#: Freed arena ranges kept for reuse go back to the system once no array was allocated or
#: freed for this long (as the pool's idle segments after ``pool-idle-seconds``).
ARENA_IDLE_SECONDS = 10.0

_watching: Optional[asyncio.AbstractEventLoop] = None


def shared_bytes() -> dict:
    """What this process holds for handoff, in bytes: ``pool-busy`` (segments receivers
    hold, in the host's shared memory and the receivers' RSS, not this process's),
    ``pool-idle`` (idle segments, in no RSS), ``kept-idle`` (received segments kept
    mapped, in this RSS), ``recv-idle`` (warm receive buffers, in this RSS)."""
    held = {"pool-busy": 0, "pool-idle": 0, "pool-fds": 0, "kept-idle": 0, "recv-idle": 0}
    # The Rust engine's pool, mappings and receive buffers (nodes on the engine), and what
    # another implementation holds (the pure-Python reference's, in tests).
    for key, n in held_for_reuse.holder.held().items():
        held[key] += n
    if native.ENABLED:
        for key, n in native.ext.held_for_reuse().items():
            held[key] += n
        arenas = native.ext.arena_stats()
        held["arena-live"] = arenas["live_bytes"]
        held["arena-idle"] = arenas["idle_populated_bytes"]
        held["arena-retired"] = arenas["retired_bytes"]
        held["arena-lent-freed"] = arenas["freed_lent_bytes"]
    return held


def trim() -> None:
    """Gives back everything held only for reuse, now (from any thread)."""
    held_for_reuse.holder.give_back()
    if native.ENABLED:
        native.ext.give_back_held()
        native.ext.arena_trim()


def owned_shared(held: Optional[dict] = None) -> int:
    """The shared memory this process made and still holds, in bytes: its arenas' live and
    retired ranges, their freed pages kept for reuse (``arena-idle``: mapped here, so in the
    RSS the nanny reads; 64 MiB at most, given back after 10 s idle or under pressure), and
    the segments of its pool that peers hold."""
    held = shared_bytes() if held is None else held
    return held.get("arena-live", 0) + held.get("arena-idle", 0) + held.get("arena-retired", 0) + held["pool-busy"]


def _status(pid: int) -> tuple[int, int]:
    """``(VmRSS, RssShmem)`` of process ``pid``, in bytes."""
    rss = shmem = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("RssShmem:"):
                shmem = int(line.split()[1]) * 1024
    return rss, shmem


def _publication(pid: int) -> Optional[Path]:
    """The file where worker ``pid`` publishes :func:`owned_shared` (for readers outside it), named by
    the pid and the process's start time (a reused pid names another file)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return runtime_dir() / f"memory-{pid}-{started}"


_published_fd: Optional[int] = None


def _publish(owned: int) -> None:
    global _published_fd
    if _published_fd is None:
        path = _publication(os.getpid())
        if path is None:
            return
        _published_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        import atexit

        atexit.register(lambda: path.unlink(missing_ok=True))
    os.pwrite(_published_fd, struct.pack("<Q", owned), 0)


def published(pid: int) -> Optional[int]:
    """What worker ``pid`` last published of :func:`owned_shared`, or ``None``."""
    path = _publication(pid)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return struct.unpack("<Q", data)[0] if len(data) == 8 else None


def process_memory(pid: Optional[int] = None) -> int:
    """The memory Dask's spilling and pausing decide from, for this process (or worker
    ``pid``, read from outside it): RSS less the shared pages it maps, plus the shared
    memory it made and holds."""
    if pid is None:
        rss, shmem = _status(os.getpid())
        owned = owned_shared()
        _publish(owned)
        return max(0, rss - shmem) + owned
    rss, shmem = _status(pid)
    owned = published(pid)
    return rss if owned is None else max(0, rss - shmem) + owned


_INSTALLED: list = []


def install() -> None:
    """Makes the worker's memory reading in this process :func:`process_memory`
    (``SystemMonitor.get_process_memory``, which Dask's spilling and pausing read). The
    nanny's terminate check keeps reading RSS: it is the guard against running out of
    memory, and RSS never counts less than a worker maps."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    from distributed.system_monitor import SystemMonitor

    def get_process_memory(self) -> int:
        try:
            return process_memory()
        except OSError:
            return self.proc.memory_info().rss

    SystemMonitor.get_process_memory = get_process_memory  # type: ignore[method-assign]


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

    if native.ENABLED:
        native.ext.arena_trim_idle(ARENA_IDLE_SECONDS)
    workers = list(Worker._instances)
    if not workers:
        return
    limits = [t for t in (_threshold(w) for w in workers) if t is not None]
    if not limits:
        return
    held = shared_bytes()
    if not (held["pool-idle"] or held["kept-idle"] or held["recv-idle"] or held.get("arena-idle")):
        return
    import psutil

    rss = process_memory() if _INSTALLED else psutil.Process().memory_info().rss
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

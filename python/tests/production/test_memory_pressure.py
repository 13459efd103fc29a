"""Issue 25, item 2: memory held only for reuse is given back when a worker's RSS nears
Dask's thresholds, and the shared bytes are reported with the worker's metrics.

The watcher's check (``handoff.dask.memory``) is run here against a stand-in worker
whose memory limit puts this process over its spill threshold: the idle segments of the
pool must be gone after one check. Without the stand-in (no worker near a threshold) a
check keeps them."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

pytest.importorskip("distributed")
from distributed.worker import DEFAULT_METRICS, Worker  # noqa: E402

from handoff import Node, native  # noqa: E402
from handoff.dask import memory  # noqa: E402
from handoff_pure.pool import pool  # noqa: E402
from helpers import eventually  # noqa: E402


class _Manager:
    def __init__(self, limit: int):
        self.memory_limit = limit
        self.memory_spill_fraction = 0.7
        self.memory_pause_fraction = 0.8


class _Worker:
    def __init__(self, limit: int):
        self.memory_manager = _Manager(limit)
        self.metrics = {}


def _idle_segment() -> int:
    seg = pool().take(4 << 20)
    seg.write(np.ones(4 << 20, dtype=np.uint8))
    seg.region = None
    seg.let_go(True)
    return pool().stats()["idle_bytes"]


def test_idle_segments_are_given_back_near_the_spill_threshold(monkeypatch):
    pool().clear()
    assert _idle_segment() >= 4 << 20
    far = _Worker(1 << 50)  # RSS far below its thresholds: nothing given back
    monkeypatch.setattr(Worker, "_instances", weakref.WeakSet([far]))
    memory._check()
    assert pool().stats()["idle_bytes"] >= 4 << 20
    near = _Worker(1 << 20)  # this process is over 60 % of 1 MiB: give back
    monkeypatch.setattr(Worker, "_instances", weakref.WeakSet([near]))
    memory._check()
    assert pool().stats()["idle_bytes"] == 0


def test_the_shared_bytes_are_a_worker_metric():
    memory.start()
    assert "handoff" in DEFAULT_METRICS
    got = DEFAULT_METRICS["handoff"](None)
    assert set(got) == {"pool-busy", "pool-idle", "pool-fds", "kept-idle", "recv-idle"} | {
        "arena-live",
        "arena-idle",
        "arena-retired",
        "arena-lent-freed",
    }
    assert all(isinstance(v, int) and v >= 0 for v in got.values())


@pytest.mark.skipif(not native.ENABLED, reason=f"the Rust engine needs the extension: {native.REASON}")
async def test_what_the_engine_holds_for_reuse_is_reported_and_given_back_near_the_spill_threshold(monkeypatch):
    """Nodes on the Rust engine hold their own pool, kept mappings and receive buffers: the
    metric counts them and the watcher gives them back, as the Python implementation's."""
    native.ext.give_back_held()
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", engine=True) as rx,
        Node("tx", secret="k", engine=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        await p.send("t.A", {"x": np.ones(8 << 20, dtype=np.uint8)})
        env = await rx.recv(10)
        assert int(np.asarray(env.body["x"]).sum()) == 8 << 20
        del env
        gc.collect()
        # The lease ends with the last view: the segment is idle in the pool, and the
        # receiver keeps its mapping for the next frame in it.
        assert await eventually(lambda: memory.shared_bytes()["pool-idle"] >= 8 << 20)
        assert memory.shared_bytes()["kept-idle"] >= 8 << 20
        far = _Worker(1 << 50)
        monkeypatch.setattr(Worker, "_instances", weakref.WeakSet([far]))
        memory._check()
        assert memory.shared_bytes()["pool-idle"] >= 8 << 20, "far from a threshold nothing goes"
        near = _Worker(1 << 20)
        monkeypatch.setattr(Worker, "_instances", weakref.WeakSet([near]))
        memory._check()
        held = memory.shared_bytes()
        assert held["pool-idle"] == held["kept-idle"] == held["recv-idle"] == 0, held
        # What is given back is only what waited for reuse: the next message goes as well.
        await p.send("t.A", {"x": np.full(8 << 20, 2, dtype=np.uint8)})
        env = await rx.recv(10)
        assert int(np.asarray(env.body["x"])[-1]) == 2

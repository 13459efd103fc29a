"""Issue 25, item 1: with ``ulimit -n 1024``, a task on worker B that depends on 3000
arrays of 80 KB made on worker A finishes on ``handoff://`` as it does on ``tcp://``.

Before the fix each pooled segment held a descriptor on the sender, and each received
frame still held one on the receiver (Python's ``mmap`` duplicates the descriptor it
maps): the workers ran out of descriptors and the task timed out."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("distributed")

PROGRAM = """
import json, os, resource, sys, time

resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # soft and hard: as `ulimit -n 1024`

import numpy as np
from distributed import Client, LocalCluster, wait

N = 3000


def make(i):
    return np.full(10_000, i, dtype=np.float64)  # 80 KB


def total(*xs):
    return float(sum(float(x.sum()) for x in xs)), len(xs)


def fds():
    return len(os.listdir("/proc/self/fd")), resource.getrlimit(resource.RLIMIT_NOFILE)[0]


if __name__ == "__main__":
    scheme = sys.argv[1]
    with LocalCluster(
        protocol=scheme, n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        a, b = sorted(c.run(os.getpid))  # from the scheduler now, not the client's cached view
        futs = [c.submit(make, i, workers=[a], pure=False) for i in range(N)]
        wait(futs, timeout=60)
        t = time.monotonic()
        hold = c.submit(total, *futs, workers=[b], pure=False)
        result = hold.result(timeout=60)
        seconds = time.monotonic() - t
        after = c.run(fds)
        print(json.dumps({"result": result, "seconds": seconds, "fds": after}))
"""


def test_3000_small_dependencies_under_ulimit_1024_finish_as_on_tcp(run_program):
    got = {scheme: run_program(PROGRAM, scheme, timeout=150) for scheme in ("tcp", "handoff")}
    expect = [float(10_000 * sum(range(3000))), 3000]
    assert got["tcp"]["result"] == expect
    assert got["handoff"]["result"] == got["tcp"]["result"]
    for scheme, r in got.items():
        for worker, (n, limit) in r["fds"].items():
            assert limit == 1024, (scheme, worker, limit)  # nobody raised the limit
            assert n < limit, (scheme, worker, n)


def _fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_held_received_mappings_keep_no_descriptor():
    # 2000 received segments mapped and held (frames of 1 MiB and more are mapped, not
    # read): no descriptor stays with any of them.
    from handoff_pure.shm import map_received, sealed_copy

    gc.collect()  # (what earlier tests left for the collector closes now, not during the count)
    before = _fds()
    held = []
    for i in range(2000):
        frame = sealed_copy(bytes([i % 251]) * 4096)
        fd, frame.fd = frame.fd, -1
        mapping, start, _ = map_received(fd, frame.size, True)
        whole = mapping.view() if hasattr(mapping, "view") else memoryview(mapping)  # (an mmap before)
        held.append(whole[start : start + 4096])
    assert _fds() <= before
    assert all(bytes(v[:1]) == bytes([i % 251]) for i, v in enumerate(held))


def test_the_senders_pool_keeps_at_most_max_fds_descriptors():
    from handoff_pure.pool import SegmentPool

    p = SegmentPool(max_fds=4)
    before = _fds()
    segs = [p.take(64 << 10) for _ in range(20)]
    for s in segs:
        s.write(b"x" * (64 << 10))
        s.region = None
        s.detach(s.turn)  # sent; the receivers hold all 20
    assert p.stats()["fds"] <= 4 and _fds() <= before + 4
    for s in segs:
        s.let_go(True)
    assert p.stats()["fds"] <= 4 and p.stats()["idle_segments"] <= 4
    p.trim()
    assert _fds() == before

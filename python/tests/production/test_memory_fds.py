"""Issue 25, item 1: with ``ulimit -n 1024``, a task on worker B that depends on 3000
arrays of 80 KB made on worker A finishes on ``handoff://`` as it does on ``tcp://``.

Before the fix each pooled segment held a descriptor on the sender, and each received
frame still held one on the receiver (Python's ``mmap`` duplicates the descriptor it
maps): the workers ran out of descriptors and the task timed out."""

from __future__ import annotations

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
        a, b = sorted(c.scheduler_info()["workers"])
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

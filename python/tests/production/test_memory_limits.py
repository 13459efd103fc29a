"""Issue 25, item 2: workers with a memory limit that neither pause nor restart on
``tcp://`` neither pause nor restart on ``handoff://``, and what they hold at rest and
at their peak is close to what they hold on ``tcp://``.

Worker A makes 10 arrays of 40 MiB, a task on worker B reads them all, twice, under a
1 GiB limit per worker. Before the fix the sender kept every segment a receiver held
mapped in its own RSS, beside its own copy of the data (A went past Dask's pause
threshold, 80 %), and after the work the idle pool and the kept mappings stayed resident.
On the Rust engine the sender mapped its copies too (A peaked at 828 MB against 486 MB on
``tcp://``) until it wrote them with ``pwrite`` (``CopyInto::Write``).
The idle timers are set to 1 s here (``HANDOFF_SHM_POOL_IDLE_SECONDS``,
``HANDOFF_SHM_KEEP_SECONDS``; 10 s by default) so that the run is short."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed")

MIB = 1 << 20

PROGRAM = """
import json, os, sys, time

import numpy as np
import psutil
from distributed import Client, LocalCluster, wait

MIB = 1 << 20


def make(i):
    return np.full(40 * MIB, i % 251, dtype=np.uint8)


def total(*xs):
    return int(sum(int(x[::4096].sum()) for x in xs))


def rss():
    return psutil.Process().memory_info().rss


def peak():
    # The kernel's high-water mark of this process's RSS (shared pages it mapped included).
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


if __name__ == "__main__":
    scheme = sys.argv[1]
    with LocalCluster(
        protocol=scheme, n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GiB",
        dashboard_address=None,
    ) as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        workers = sorted(c.run(os.getpid))  # from the scheduler now, not the client's cached view
        a, b = workers
        results = []
        for round in range(2):
            futs = [c.submit(make, 100 * round + i, workers=[a], pure=False) for i in range(10)]
            wait(futs, timeout=60)
            results.append(c.submit(total, *futs, workers=[b], pure=False).result(timeout=60))
            del futs
            time.sleep(0.5)
        time.sleep(4)  # what is idle is given back after 1 s here
        at_rest = c.run(rss)
        peaks = c.run(peak)
        logs = c.get_worker_logs()
        nanny_logs = c.get_worker_logs(nanny=True)
        paused = sorted({w for w, lines in logs.items() for _, line in lines if "Pausing worker" in line})
        restarts = sorted({w for w, lines in nanny_logs.items() for _, line in lines
                           if "Restarting" in line or "memory budget" in line})
        metric = c.scheduler_info()["workers"][a]["metrics"].get("handoff", {})
        print(json.dumps({
            "metric": sorted(metric),
            "results": results, "paused": paused, "restarts": restarts,
            "same_workers": sorted(c.run(os.getpid)) == workers,
            "at_rest": [at_rest[a], at_rest[b]], "peaks": [peaks[a], peaks[b]],
        }))
"""


def test_memory_limited_workers_neither_pause_nor_restart_and_hold_what_tcp_holds(run_program):
    env = {"HANDOFF_SHM_POOL_IDLE_SECONDS": "1", "HANDOFF_SHM_KEEP_SECONDS": "1"}
    got = {scheme: run_program(PROGRAM, scheme, env=env, timeout=150) for scheme in ("tcp", "handoff")}
    print(got)  # the figures, for -s
    tcp, ho = got["tcp"], got["handoff"]
    # The program is one that tcp:// runs without pausing or restarting a worker.
    assert tcp["paused"] == [] and tcp["restarts"] == [] and tcp["same_workers"], tcp
    assert ho["results"] == tcp["results"]
    assert ho["paused"] == [] and ho["restarts"] == [] and ho["same_workers"], ho
    # The shared bytes reach the scheduler with each heartbeat (handoff.dask.memory).
    assert ho["metric"] == [
        "arena-idle",
        "arena-lent-freed",
        "arena-live",
        "arena-retired",
        "kept-idle",
        "pool-busy",
        "pool-fds",
        "pool-idle",
        "recv-idle",
    ]
    for i, worker in enumerate("AB"):
        # The done-when of issue 25: a worker's peak within 10 % of its tcp:// peak.
        assert ho["peaks"][i] <= 1.1 * tcp["peaks"][i], (worker, ho["peaks"], tcp["peaks"])
        # At rest, nothing held for reuse: within 10 % (or 32 MiB) of the tcp:// worker.
        assert ho["at_rest"][i] <= max(1.1 * tcp["at_rest"][i], tcp["at_rest"][i] + 32 * MIB), (
            worker,
            ho["at_rest"],
            tcp["at_rest"],
        )

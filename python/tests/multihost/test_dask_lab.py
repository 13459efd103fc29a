"""Dask on handoff:// across the hosts of a network-namespace lab: the scheduler and the
client on host 1, a worker on each of hosts 2 and 3, and the same result as on one host."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import handoff.dask
import numpy as np
from distributed import Client, Scheduler

DASK_SECRET = "multi-host dask secret"


def _start_worker(lab, host: int, scheduler: str, log: Path) -> subprocess.Popen:
    dask_bin = Path(sys.executable).with_name("dask")
    cmd = ["ip", "netns", "exec", lab.namespace(host), str(dask_bin), "worker", scheduler]
    cmd += ["--host", lab.hosts[host], "--nthreads", "2", "--no-dashboard", "--no-nanny", "--name", f"h{host}"]
    env = os.environ | {"DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": DASK_SECRET}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), stdin=subprocess.DEVNULL)


async def test_a_computation_across_three_hosts_gives_the_one_host_result(lab, tmp_path):
    x = da.random.RandomState(5).random_sample((1200, 1200), chunks=300)
    result = (x @ x.T).sum(axis=0)
    expected = result.compute(scheduler="sync")  # on one host: this process alone
    procs = []
    with dask.config.set({"distributed.comm.handoff.secret": DASK_SECRET}):
        async with Scheduler(protocol="handoff", host=lab.hosts[1], port=0, dashboard_address=":0") as s:
            assert s.address.startswith(f"handoff://{lab.hosts[1]}:")
            try:
                for host in (2, 3):
                    procs.append(_start_worker(lab, host, s.address, tmp_path / f"w{host}.log"))
                async with Client(s.address, asynchronous=True) as c:
                    try:
                        await c.wait_for_workers(2, timeout=120)
                    except (asyncio.TimeoutError, TimeoutError):
                        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("w*.log")}
                        raise AssertionError(f"workers did not join: {logs}") from None
                    workers = sorted(s.workers)
                    assert {w.split("//")[1].split(":")[0] for w in workers} == {lab.hosts[2], lab.hosts[3]}
                    got = await c.compute(result)
                    np.testing.assert_allclose(got, expected, rtol=1e-12)
                    # The workers exchanged their chunks over TCP, across the bridge; no
                    # shared memory between hosts.
                    stats = await c.run(handoff.dask.stats)  # a module function: the workers import it
                    for w in workers:
                        counters = stats[w]["counters"]
                        assert counters.get("comms-tcp", 0) >= 1 and "comms-shm" not in counters, counters
            finally:
                for p in procs:
                    p.terminate()
                deadline = time.monotonic() + 30
                for p in procs:
                    try:
                        p.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()

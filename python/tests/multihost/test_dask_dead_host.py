"""Issue 25, item 7: a worker's host cut off from the network (its link down: to the
scheduler it is a host that lost power) is detected within Dask's TCP timeout, on
``handoff://`` as on ``tcp://``.

The same program runs on both schemes: a scheduler on host 1 (this process) and a worker
on host 2, both with ``distributed.comm.timeouts.tcp`` short; the worker's link goes
down while the cluster is idle, so that only keepalive can tell (nothing waits for an
acknowledgement); the scheduler must drop the worker within that timeout and a few
seconds (its comms to the worker fail with ``ETIMEDOUT``), long before the worker TTL.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
from distributed import Client, Scheduler

DASK_SECRET = "multi-host dask secret"
#: Dask's TCP timeout for this test (Dask's least: one second per keepalive probe, and one).
TCP_TIMEOUT = 12
#: What the scheduler may take beyond it (its reader wakes, the worker is removed).
SLACK = 6


def _start_worker(lab, scheme: str, scheduler: str, log: Path, env: dict) -> subprocess.Popen:
    dask_bin = Path(sys.executable).with_name("dask")
    cmd = ["ip", "netns", "exec", lab.namespace(2), str(dask_bin), "worker", scheduler]
    cmd += ["--host", lab.hosts[2], "--nthreads", "1", "--no-dashboard", "--no-nanny", "--name", f"h2-{scheme}"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), stdin=subprocess.DEVNULL)


async def _time_to_notice(lab, scheme: str, tmp_path: Path) -> float:
    config = {
        "distributed.comm.handoff.secret": DASK_SECRET,
        "distributed.comm.timeouts.tcp": f"{TCP_TIMEOUT}s",
        "distributed.scheduler.worker-ttl": "10 minutes",
    }
    env = os.environ | {
        "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": DASK_SECRET,
        "DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": f"{TCP_TIMEOUT}s",
    }
    with dask.config.set(config):
        async with Scheduler(protocol=scheme, host=lab.hosts[1], port=0, dashboard_address=":0") as s:
            proc = _start_worker(lab, scheme, s.address, tmp_path / f"w-{scheme}.log", env)
            try:
                async with Client(s.address, asynchronous=True) as c:
                    await c.wait_for_workers(1, timeout=60)
                    assert await c.submit(sum, [1, 2, 3]) == 6  # the worker works
                lab.link(2, "down")
                cut = time.monotonic()
                try:
                    while s.workers and time.monotonic() - cut < 3 * TCP_TIMEOUT:
                        await asyncio.sleep(0.1)
                    return time.monotonic() - cut
                finally:
                    lab.link(2, "up")
            finally:
                proc.kill()
                proc.wait()


async def test_a_host_cut_off_is_noticed_within_dasks_tcp_timeout(lab, tmp_path):
    tcp = await _time_to_notice(lab, "tcp", tmp_path)
    handoff = await _time_to_notice(lab, "handoff", tmp_path)
    assert tcp <= TCP_TIMEOUT + SLACK, f"tcp:// took {tcp:.1f} s"
    assert handoff <= TCP_TIMEOUT + SLACK, f"handoff:// took {handoff:.1f} s (tcp:// {tcp:.1f} s)"

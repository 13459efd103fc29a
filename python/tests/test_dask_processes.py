"""The handoff:// Dask comm backend between real worker processes: LocalCluster with processes,
a worker killed while it holds another's shared segments, workers with different host ids,
and the ``dask scheduler`` / ``dask worker`` command lines."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import dask
import handoff.native
import numpy as np
from distributed import Client, LocalCluster, Nanny, Scheduler
from distributed.utils_test import gen_test
from helpers import dask_cli, start_dask_scheduler, stop_processes

SECRET = {"distributed.comm.handoff.secret": "dask test secret"}
MIB = 1 << 20


def _stats() -> dict:
    import handoff.dask

    return handoff.dask.stats()


def _where_it_lies(arr) -> tuple:
    """Inside a task: the sum, whether the array is writable, and the file of the memory
    region that holds it (``/proc/self/maps``): a received shared segment is a memfd."""
    addr = arr.__array_interface__["data"][0]
    path = None
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                path = " ".join(fields[5:]) if len(fields) > 5 else ""
                break
    return float(arr.sum()), bool(arr.flags.writeable), path


def _from_peer(arr) -> bool:
    from handoff.memregion import from_peer

    return from_peer(arr)


async def _until(check, timeout: float = 30.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def _two_workers():
    """A ``LocalCluster`` of two worker processes on handoff://, its client, and the two
    worker addresses."""
    async with (
        LocalCluster(
            protocol="handoff",
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            asynchronous=True,
        ) as cluster,
        Client(cluster, asynchronous=True) as c,
    ):
        await c.wait_for_workers(2)
        a, b = sorted(await c.run(os.getpid))
        yield c, a, b


@gen_test(timeout=240)
async def test_local_cluster_with_processes_zero_copy_and_a_killed_worker_gives_segments_back():
    # Arrays made in the workers' heap (not born in arenas: test_dask_shared_arrays.py) go
    # through the sender's pool of segments.
    with dask.config.set({**SECRET, "distributed.comm.handoff.shared-arrays": False}):
        async with _two_workers() as (c, a, b):
            assert a.startswith("handoff://") and b.startswith("handoff://")
            x = c.submit(np.full, 8 * MIB, 1.5, workers=[a], pure=False)  # 64 MiB on a
            total, writable, region = await c.submit(_where_it_lies, x, workers=[b], pure=False)
            assert total == 1.5 * 8 * MIB and writable
            assert region.startswith("/memfd:handoff-segment"), region  # b reads a's segment, no copy
            stats = await c.run(_stats)
            assert stats[b]["counters"]["bytes-read-shm"] >= 64 * MIB
            assert stats[a]["pool"]["busy_segments"] >= 1  # b keeps x, so a's segment stays leased
            # The worker processes run the path this process runs (HANDOFF_NATIVE is inherited).
            assert {stats[w]["native"] for w in (a, b)} == {handoff.native.ENABLED}
            before = stats[a]["pool"]

            # b dies holding it: a's segment comes back to a's pool (not retired).
            pid = (await c.run(os.getpid, workers=[b]))[b]
            os.kill(pid, signal.SIGKILL)

            async def given_back():
                pool = (await c.run(_stats, workers=[a]))[a]["pool"]
                return pool if pool["idle_segments"] > before["idle_segments"] else None

            after = await _until(given_back)
            assert after, f"a's pool never got its segment back: {before}"
            assert after["retired"] == before["retired"]
            assert after["busy_segments"] == before["busy_segments"] - 1


@gen_test(timeout=240)
async def test_workers_with_different_host_ids_talk_tcp():
    with dask.config.set(SECRET):
        async with Scheduler(protocol="handoff", host="127.0.0.1", dashboard_address=":0") as s:
            async with (
                Nanny(s.address, nthreads=1, env={"HANDOFF_HOST_ID": "host-one"}) as n1,
                Nanny(s.address, nthreads=1, env={"HANDOFF_HOST_ID": "host-two"}) as n2,
            ):
                async with Client(s.address, asynchronous=True) as c:
                    await c.wait_for_workers(2)
                    a, b = n1.worker_address, n2.worker_address
                    x = c.submit(np.arange, 4 * MIB, workers=[a], pure=False)
                    total, writable, region = await c.submit(_where_it_lies, x, workers=[b], pure=False)
                    assert total == float(np.arange(4 * MIB).sum()) and writable
                    # In b's own memory (its heap, or an arena of its own), not a's.
                    assert not await c.submit(_from_peer, x, workers=[b], pure=False), region
                    stats = await c.run(_stats)
                    for w in (a, b):
                        counters = stats[w]["counters"]
                        assert counters.get("comms-tcp", 0) >= 1 and "comms-shm" not in counters, counters
                    assert stats[b]["counters"]["bytes-read-tcp"] >= 32 * MIB


@gen_test(timeout=240)
async def test_dask_scheduler_and_dask_worker_command_lines(tmp_path):
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": SECRET["distributed.comm.handoff.secret"]}
    scheduler, address = await start_dask_scheduler(tmp_path, env)
    procs = [scheduler]
    try:
        assert address.startswith("handoff://127.0.0.1:")
        # One worker given the handoff:// address, one given a bare host:port with handoff as
        # the default scheme (DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME).
        worker_args = ("--nthreads", "1", "--no-dashboard", "--no-nanny")
        procs.append(dask_cli("worker", address, *worker_args, env=env, log=tmp_path / "w1.log"))
        procs.append(
            dask_cli(
                "worker",
                address[len("handoff://") :],
                *worker_args,
                env={**env, "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "handoff"},
                log=tmp_path / "w2.log",
            )
        )
        with dask.config.set(SECRET):
            async with Client(address, asynchronous=True) as c:
                await c.wait_for_workers(2, timeout=120)
                workers = sorted(await c.run(os.getpid))
                assert all(w.startswith("handoff://") for w in workers), workers
                x = c.submit(np.ones, MIB, workers=[workers[0]], pure=False)
                assert await c.submit(lambda v: float(v.sum()), x, workers=[workers[1]], pure=False) == MIB
    finally:
        stop_processes(procs)


@gen_test(timeout=240)
async def test_the_demo_verifies_the_channel_it_claims():
    """handoff.dask.demo's checks: a same-host transfer is verified as shm, and refused as tcp."""
    from handoff.dask import demo

    with dask.config.set({**SECRET, "distributed.comm.compression": None}):
        async with _two_workers() as (c, a, b):
            seconds, ok, why = await demo._transfer(c, a, b, 2 * MIB, 1, "handoff", "shm")
            assert ok and seconds > 0, why
            seconds, ok, why = await demo._transfer(c, a, b, 2 * MIB, 2, "handoff", "tcp")
            assert not ok and "over tcp" in why and "lies in" in why, why

"""Arrays born in shared memory on Dask (issue 41): one program, run on ``tcp://`` and on
``handoff://`` with real worker processes, gives equal results; on ``handoff://`` a
same-host worker maps the array its peer made (one copy), and neither sees the other's
writes, through forks, kills and spills."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import dask
import numpy as np
import pytest
from conftest import ON_ENGINE
from distributed import Client, LocalCluster
from distributed.utils_test import gen_test

pytestmark = pytest.mark.skipif(not ON_ENGINE, reason="arrays are born in arenas on the engine")

N = 1 << 20  # 8 MiB of int64
CONFIG = {
    "distributed.comm.handoff.secret": "dask test secret",
    "distributed.scheduler.active-memory-manager.start": False,
    "distributed.scheduler.work-stealing": False,
}


def make(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % 251


def total(x) -> int:
    return int(x.sum())


def bump(x, by: int) -> int:
    x += by  # in place, as users do
    return int(x.sum())


def same(x):
    return x


def where(x) -> str:
    """The file of the memory region that holds ``x`` in this process ("" if anonymous)."""
    from handoff.memregion import region_of

    return region_of(x)


def fork_and_write(x) -> int:
    pid = os.fork()
    if pid == 0:
        x[:] = -1
        os._exit(0)
    os.waitpid(pid, 0)
    return int(x.sum())


def arena_stats() -> dict:
    import handoff

    return handoff.shared.stats()


def in_arena(x) -> bool:
    import handoff

    return handoff.shared.locate(x) is not None


def lent(x) -> int:
    """How many peers map ``x``'s range of its arena (0 when it is in none)."""
    import handoff

    at = handoff.shared.locate(x)
    return at["loans"] if at else 0


@contextlib.asynccontextmanager
async def cluster(scheme: str, **worker_options):
    with dask.config.set(CONFIG):
        async with (
            LocalCluster(
                protocol=scheme,
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=":0",
                asynchronous=True,
                **worker_options,
            ) as c,
            Client(c, asynchronous=True) as client,
        ):
            await client.wait_for_workers(2)
            a, b = sorted(await client.run(os.getpid))
            yield client, a, b


async def mutations(scheme: str) -> dict:
    async with cluster(scheme) as (c, a, b):
        x = c.submit(make, N, workers=[a])
        out = {"made": await c.submit(total, x, workers=[a])}
        out["where b holds it"] = await c.submit(where, x, workers=[b])
        out["b holds, then writes its copy"] = await c.submit(bump, x, 1, workers=[b])
        out["a after b wrote"] = await c.submit(total, x, workers=[a], pure=False)
        out["a writes"] = await c.submit(bump, x, 10, workers=[a], pure=False)
        out["b's old copy"] = await c.submit(total, x, workers=[b], pure=False)
        y = c.submit(same, x, workers=[a])  # a new key for a's written array: sent again
        out["b gets the written array"] = await c.submit(total, y, workers=[b])
        out["a forks a writer"] = await c.submit(fork_and_write, x, workers=[a], pure=False)
        out["b after the fork"] = await c.submit(total, y, workers=[b], pure=False)
        out["born in an arena"] = await c.submit(in_arena, x, workers=[a])
        return out


@gen_test(timeout=240)
async def test_writes_before_and_after_a_send_a_resend_and_a_fork_give_what_tcp_gives():
    tcp = await mutations("tcp")
    shared = await mutations("handoff")
    where_tcp, where_shared = tcp.pop("where b holds it"), shared.pop("where b holds it")
    arena_tcp, arena_shared = tcp.pop("born in an arena"), shared.pop("born in an arena")
    assert shared == tcp
    s0 = tcp["made"]
    assert tcp["b holds, then writes its copy"] == s0 + N and tcp["a after b wrote"] == s0
    assert tcp["b's old copy"] == s0 + N and tcp["b gets the written array"] == s0 + 10 * N
    assert tcp["a forks a writer"] == s0 + 10 * N
    assert "handoff-arena" in where_shared and "handoff-arena" not in where_tcp
    assert arena_shared and not arena_tcp, "tcp:// workers have no arenas (no handoff listener)"


async def killed(scheme: str, victim: str) -> dict:
    async with cluster(scheme) as (c, a, b):
        x = c.submit(make, N, workers=[a])
        out = {"b holds": await c.submit(total, x, workers=[b])}
        pids = await c.run(os.getpid)
        os.kill(pids[a if victim == "producer" else b], signal.SIGKILL)
        if victim == "producer":
            out["b reads after a died"] = await c.submit(total, x, workers=[b], pure=False)
        else:
            out["a reads after b died"] = await c.submit(total, x, workers=[a], pure=False)
            if scheme == "handoff":
                for _ in range(100):  # b's connection ends, and with it the loan
                    stats = await c.run(arena_stats, workers=[a])
                    if stats[a]["lent_ranges"] == 0:
                        break
                    await asyncio.sleep(0.1)
                out["lent after b died"] = stats[a]["lent_ranges"]
                out["retired"] = stats[a]["retired_bytes"]
        return out


@pytest.mark.parametrize("victim", ["producer", "receiver"])
@gen_test(timeout=240)
async def test_a_killed_producer_or_receiver_leaves_the_other_whole(victim):
    tcp = await killed("tcp", victim)
    shared = await killed("handoff", victim)
    lent, retired = shared.pop("lent after b died", 0), shared.pop("retired", 0)
    assert shared == tcp
    assert lent == 0, "a dead receiver's loans end"
    assert retired == 0, "a receiver that died maps nothing any more: its range is reusable"


async def spilled(scheme: str) -> dict:
    async with cluster(scheme, memory_limit="2GiB") as (c, a, b):
        x = c.submit(make, N, workers=[a])
        out = {"b holds": await c.submit(total, x, workers=[b])}

        def spill_all(dask_worker):
            data = dask_worker.data
            while data.fast:
                data.evict()
            return len(data.slow)

        out["spilled on a"] = (await c.run(spill_all, workers=[a]))[a] > 0
        out["a reads it back"] = await c.submit(total, x, workers=[a], pure=False)
        # Read back into memory of its own: not the range b still maps.
        out["peers map what was read back"] = await c.submit(lent, x, workers=[a], pure=False)
        out["b's copy"] = await c.submit(total, x, workers=[b], pure=False)
        return out


@gen_test(timeout=240)
async def test_a_spilled_array_comes_back_in_memory_of_its_own_and_its_peer_keeps_reading():
    tcp = await spilled("tcp")
    shared = await spilled("handoff")
    assert shared == tcp
    assert tcp["spilled on a"] and shared["peers map what was read back"] == 0


MB = 1 << 20


def churn() -> int:
    """Makes and frees arrays: their arena ranges stay populated for reuse (on handoff)."""
    xs = [np.ones(96 * MB, dtype=np.uint8) for _ in range(3)]
    n = sum(int(x[-1]) for x in xs)
    del xs
    return n


def sevens(n: int) -> np.ndarray:
    """``n`` int64 sevens, in one allocation (no temporary beside it near the limit)."""
    x = np.empty(n, dtype=np.int64)
    x.fill(7)
    return x


def reading(dask_worker) -> dict:
    """What Dask's memory manager sees in this worker now."""
    return {
        "memory": dask_worker.monitor.get_process_memory(),
        "paused": dask_worker.status.name == "paused",
        "spilled": len(dask_worker.data.slow) if hasattr(dask_worker.data, "slow") else 0,
    }


async def under_a_limit(scheme: str) -> dict:
    async with cluster(scheme, memory_limit="1GiB") as (c, a, b):
        pids = await c.run(os.getpid)
        out = {"churn": await c.submit(churn, workers=[a], pure=False)}
        x = c.submit(sevens, 50 * MB, workers=[a])  # 400 MiB
        out["b reads it"] = await c.submit(total, x, workers=[b])
        out["a reads it again"] = await c.submit(total, x, workers=[a], pure=False)  # both map its pages
        worst = {a: {"memory": 0, "paused": False, "spilled": 0}, b: {"memory": 0, "paused": False, "spilled": 0}}
        for _ in range(15):  # Dask's monitor reads every 100 ms
            for w, r in (await c.run(reading)).items():
                worst[w] = {k: max(worst[w][k], r[k]) for k in r}
            await asyncio.sleep(0.1)
        out["paused"] = [worst[a]["paused"], worst[b]["paused"]]
        out["spilled"] = [worst[a]["spilled"], worst[b]["spilled"]]
        out["restarted"] = (await c.run(os.getpid)) != pids
        out["memory"] = [worst[a]["memory"], worst[b]["memory"]]
        return out


@gen_test(timeout=240)
async def test_a_memory_limited_worker_neither_pauses_nor_spills_nor_restarts_where_tcp_does_not():
    tcp = await under_a_limit("tcp")
    shared = await under_a_limit("handoff")
    tcp_memory, shared_memory = tcp.pop("memory"), shared.pop("memory")
    assert shared == tcp
    assert tcp["paused"] == [False, False] and tcp["spilled"] == [0, 0] and not tcp["restarted"]
    # The array counts once on handoff (in a, which made it), twice on tcp; a's freed arena
    # ranges, kept for reuse, count in neither.
    assert sum(shared_memory) < sum(tcp_memory) - 300 * MB, (shared_memory, tcp_memory)
    assert shared_memory[0] < tcp_memory[0] + 64 * MB, (shared_memory, tcp_memory)


def small_array(i: int) -> np.ndarray:
    return np.full(8 * 1024, i % 251, dtype=np.int64)  # 64 KiB


def total_of_all(*arrays) -> int:
    return sum(int(a.sum()) for a in arrays)


async def many_arrays(scheme: str) -> dict:
    with dask.config.set({"distributed.comm.handoff.shared-arrays-min-bytes": "64KiB"}):
        async with cluster(scheme) as (c, a, b):
            arrays = c.map(small_array, range(3000), workers=[a], pure=False)
            out = {"b sums them all": await c.submit(total_of_all, *arrays, workers=[b], pure=False)}
            out["lent"] = (await c.run(arena_stats, workers=[a]))[a]["lends"] if scheme == "handoff" else 0
            out["b's descriptors"] = (await c.run(lambda: len(os.listdir("/proc/self/fd")), workers=[b]))[b]
            return out


@gen_test(timeout=240)
async def test_3000_arrays_between_workers_limited_to_1024_descriptors():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # the workers inherit it
    try:
        tcp = await many_arrays("tcp")
        shared = await many_arrays("handoff")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert shared["b sums them all"] == tcp["b sums them all"] == sum((i % 251) * 8 * 1024 for i in range(3000))
    assert shared["lent"] >= 3000, "every array went to b as a window of a's arena"
    assert shared["b's descriptors"] < 300, shared

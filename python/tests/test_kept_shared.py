"""handoff_pure.mapcache for shared read-only receivers: a pooled segment's mapping is kept, and
the next frame in that segment comes through it (its pages already mapped), read-only,
with the sender's new bytes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import ON_ENGINE
from handoff import Node
from handoff_pure.pool import pool
from helpers import eventually

MIB = 1 << 20


@pytest.mark.pure_only("counts the Python peer's mapping cache (handoff_pure.mapcache)")
async def test_a_shared_receiver_keeps_the_mapping_of_a_pooled_segment():
    accepted: list = []
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", per_connection=True, on_accept=accepted.append) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        first = np.arange(MIB, dtype=np.int32)  # 4 MiB
        await p.send("t.A", {"x": first})
        assert await eventually(lambda: accepted)
        conn = accepted[0]
        env = await conn.recv(5)
        x = env.body["x"]
        assert x.readonly and env.frames[0].kind == "shm"
        got = np.frombuffer(x, dtype=np.int32)
        assert np.array_equal(got, first)
        where = got.__array_interface__["data"][0]
        del got, x, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        assert conn._maps.stats() == {"idle": 1, "busy": 0, "hits": 0}
        second = np.arange(MIB, dtype=np.int32)[::-1].copy()
        await p.send("t.A", {"x": second})
        env = await conn.recv(5)
        got = np.frombuffer(env.body["x"], dtype=np.int32)
        assert conn._maps.stats()["hits"] == 1 and got.__array_interface__["data"][0] == where
        assert np.array_equal(got, second) and not got.flags.writeable
        # The frame shows its own window only.
        assert len(env.body["x"]) == 4 * MIB
        del got, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        await p.close()
        assert await eventually(lambda: conn._maps.stats()["idle"] == 0)
    pool().clear()  # other tests count the segments they create


async def test_a_pooled_shm_buffer_is_sent_from_a_warm_segment_and_mapped_through_the_kept_mapping():
    from handoff import ShmBuffer

    accepted: list = []
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", per_connection=True, on_accept=accepted.append) as rx,
        Node("tx", secret="k", per_connection=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        if ON_ENGINE:  # the process's pool, which earlier tests left warm: none idle to start
            import handoff._native

            handoff._native.give_back_held()
        before = tx.segment_pool_stats()
        for i in range(3):
            buf = ShmBuffer(3 * MIB, pooled=True)
            buf.view[:] = bytes([i]) * (3 * MIB)
            frozen = buf.freeze()
            await p.send("t.A", {"x": frozen})
            del buf, frozen
            assert await eventually(lambda: accepted)
            env = await accepted[0].recv(5)
            x = env.body["x"]
            assert len(x) == 3 * MIB and x.readonly and bytes(x[-3:]) == bytes([i]) * 3
            # The reference's pool rounds to a page; the engine's to a power of two.
            size = 4 * MIB if ON_ENGINE else 3 * MIB
            assert env.segment_of(x)["sealed"] is False and env.segment_of(x)["size"] == size
            del x, env
            gc.collect()
            assert await eventually(lambda: tx.shm_leases()["count"] == 0)
            assert await eventually(lambda: tx.segment_pool_stats()["busy_segments"] == before["busy_segments"])
        stats = tx.segment_pool_stats()
        assert stats["created"] == before["created"] + 1 and stats["reused"] == before["reused"] + 2
        await p.close()
    if not ON_ENGINE:
        pool().clear()

"""Issue 25, item 5: a write cancelled while its frame is copied into a pooled segment (in
a thread, from 8 MiB) must not hand that segment to the next send while the thread still
writes into it, at the peer level and through a Dask comm.

The copy thread is made slow on purpose (it sleeps before its first copy), so that the
cancellation lands during the copy every time. Before the fix the cancelled send gave
the segment back to the pool at once; the next send of that size got the same segment,
and the late copy then overwrote the bytes the receiver had been sent."""

from __future__ import annotations

import asyncio
import gc
import time

import numpy as np
import pytest

from handoff import Node
from handoff_pure.pool import Segment, pool

MIB = 1 << 20
SIZE = 16 * MIB


@pytest.fixture
def slow_first_copy(monkeypatch):
    """The first copy into a pooled segment sleeps 0.5 s in its thread before it writes."""
    original = Segment.write
    calls: list = []

    def write(self, data):
        calls.append(self.id)
        if len(calls) == 1:
            time.sleep(0.5)
        original(self, data)

    monkeypatch.setattr(Segment, "write", write)
    pool().clear()
    yield calls
    pool().clear()


@pytest.mark.pure_only(
    "slows the Python implementation's copy thread (handoff_pure.pool.Segment.write); the engine copies inside "
    "its send, where no cancellation lands"
)
async def test_a_send_cancelled_during_its_copy_does_not_overwrite_the_next_one(slow_first_copy):
    accepted: list = []
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", per_connection=True, on_accept=accepted.append) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        assert p.channel == "shm"
        first = np.full(SIZE, 1, dtype=np.uint8)
        second = np.full(SIZE, 2, dtype=np.uint8)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(p.send("t.A", {"x": first}), 0.1)
        await p.send("t.A", {"x": second})
        while not accepted:
            await asyncio.sleep(0.01)
        env = await accepted[0].recv(5)
        await asyncio.sleep(0.8)  # the cancelled copy's thread is done by now
        got = np.frombuffer(env.body["x"], dtype=np.uint8)
        assert got.nbytes == SIZE and int(got.min()) == int(got.max()) == 2
        assert len(slow_first_copy) == 2 and slow_first_copy[0] != slow_first_copy[1]
        del got, env
        gc.collect()


@pytest.mark.pure_only(
    "slows the Python implementation's copy thread (handoff_pure.pool.Segment.write); the engine copies inside "
    "its send, where no cancellation lands"
)
async def test_a_dask_write_cancelled_during_its_copy_does_not_overwrite_the_next_one(slow_first_copy):
    dask = pytest.importorskip("dask")
    from distributed.comm import connect, listen
    from distributed.protocol import to_serialize

    secret = {"distributed.comm.handoff.secret": "production test secret"}

    async def pair():
        q: asyncio.Queue = asyncio.Queue()

        async def handle(comm):
            await q.put(comm)

        with dask.config.set(secret):
            listener = listen("handoff://127.0.0.1", handle)
            await listener.start()
            a = await connect(listener.contact_address, timeout=10)
        b = await asyncio.wait_for(q.get(), 10)
        listener.stop()
        return a, b

    a, b = await pair()
    c, d = await pair()
    try:
        assert a.channel == "shm"
        first = np.full(SIZE, 1, dtype=np.uint8)
        second = np.full(SIZE, 2, dtype=np.uint8)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a.write({"x": to_serialize(first)}), 0.1)
        assert a.closed()  # a write cut short aborts its comm, as Dask's TCP comm does
        await c.write({"x": to_serialize(second)})
        got = (await d.read())["x"]
        await asyncio.sleep(0.8)
        assert got.nbytes == SIZE and int(got.min()) == int(got.max()) == 2
        assert len(slow_first_copy) == 2 and slow_first_copy[0] != slow_first_copy[1]
    finally:
        for comm in (a, b, c, d):
            comm.abort()

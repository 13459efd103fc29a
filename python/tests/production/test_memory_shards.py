"""Issue 25, item 8 (last bullet): small arrays received in one Dask message each lie in
a buffer of their own, on ``handoff://`` as on ``tcp://``, so that dropping some of them
frees their memory whatever the receiver keeps of the others.

Dask's P2P rechunk keeps some shards and lets others go
(``test_rechunk.py::test_rechunk_in_memory_shards_dont_share_buffer``, run from Dask's
suites); before the fix a same-host receiver got them as views of shared mappings that
Dask could not even recognise as their owner. Here the owner of each received array
must be what Dask's own TCP comm gives: a numpy array of its own (``base`` is ``None``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

dask = pytest.importorskip("dask")
from distributed.comm import connect, listen  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402

SECRET = {"distributed.comm.handoff.secret": "production test secret"}


def owner(x):
    """What finally holds an array's memory (as Dask's ``get_host_array`` walks it)."""
    while True:
        if isinstance(x, memoryview):
            x = x.obj
        elif isinstance(x, np.ndarray) and x.base is not None:
            x = x.base
        else:
            return x


async def _pair(scheme: str):
    q: asyncio.Queue = asyncio.Queue()

    async def handle(comm):
        await q.put(comm)

    with dask.config.set(SECRET):
        listener = listen(f"{scheme}://127.0.0.1", handle)
        await listener.start()
        a = await connect(listener.contact_address, timeout=10)
    b = await asyncio.wait_for(q.get(), 10)
    listener.stop()
    return a, b


@pytest.mark.parametrize("size", [8 << 10, 256 << 10])  # inline, and from the shm threshold
async def test_small_arrays_of_one_message_each_have_a_buffer_of_their_own(size):
    rng = np.random.default_rng(1)
    shards = [rng.random(size // 8) for _ in range(32)]
    seen = {}
    for scheme in ("tcp", "handoff"):
        a, b = await _pair(scheme)
        try:
            await a.write({"shards": [to_serialize(s) for s in shards]})
            got = (await b.read())["shards"]
            assert all(np.array_equal(x, y) for x, y in zip(got, shards))
            owners = [owner(x) for x in got]
            seen[scheme] = (
                len({id(o) for o in owners}),
                all(isinstance(o, (np.ndarray, bytes, bytearray)) for o in owners),
            )
            if scheme == "handoff":
                assert a.channel == "shm"
        finally:
            a.abort()
            b.abort()
    assert seen["tcp"] == (32, True)
    assert seen["handoff"] == seen["tcp"]

"""Issue 25, item 8: a single Dask frame larger than a handoff frame may be (4 GiB on the
wire; here a smaller configured ``max-frame-bytes``, not 4 GiB of memory) travels in
pieces and arrives whole, joined in Dask's offload thread rather than on the event loop,
as on ``tcp://``. The same program on both schemes: one message with one buffer of
several frame limits, from a comm to a listener in this process."""

from __future__ import annotations

import asyncio
import hashlib
import os

import dask
from distributed.protocol import to_serialize

from .one_message import send_one

SECRET = {"distributed.comm.handoff.secret": "production comm test secret"}
MIB = 1 << 20


async def _received(scheme: str, payload: bytes, shm: bool) -> tuple:
    config = {**SECRET, "distributed.comm.handoff.max-frame-bytes": "1 MiB", "distributed.comm.handoff.shm": shm}
    with dask.config.set(config):
        got, _, _ = await send_one(f"{scheme}://127.0.0.1:0", {"op": "data", "x": to_serialize(bytearray(payload))})
    data = got["x"]
    return len(data), hashlib.sha256(data).hexdigest()


async def test_a_frame_over_the_frame_limit_arrives_whole():
    payload = os.urandom(24 * MIB + 12345)
    tcp = await asyncio.wait_for(_received("tcp", payload, True), 60)
    for shm in (True, False):
        assert await asyncio.wait_for(_received("handoff", payload, shm), 60) == tcp
    assert tcp == (len(payload), hashlib.sha256(payload).hexdigest())

"""Issue 25, item 8: how a comm ends.

- ``close()`` right after a ``BatchedSend`` began writing its last message: the message
  arrives whole (Dask's TCP comm flushes its stream before it shuts it).
- ``connect()`` cancelled at any point, the handshake done or not: no connection is left
  open at either end (the process's sockets go back to what they were at once, not
  after the listener's wait for the comm's first message).

The same program runs on ``tcp://`` and ``handoff://`` (a same-host comm: a Unix socket
with shared memory), listener and connector in this process.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import dask
import psutil
from distributed.batched import BatchedSend
from distributed.comm import connect, listen
from distributed.comm.registry import get_backend

SECRET = {"distributed.comm.handoff.secret": "production comm test secret"}
MIB = 1 << 20


async def _last_message_arrives(scheme: str) -> tuple:
    got: list = []
    done = asyncio.Event()

    async def handler(comm):
        try:
            while True:
                got.append(await comm.read())
        except OSError:
            pass
        finally:
            done.set()

    payload = os.urandom(9 * MIB)  # under Dask's offload threshold: serialized at once
    with dask.config.set(SECRET):
        listener = listen(f"{scheme}://127.0.0.1:0", handler)
        await listener.start()
        try:
            comm = await connect(listener.contact_address)
            bs = BatchedSend(interval="1ms")
            bs.start(comm)
            bs.send({"op": "first"})
            bs.send({"op": "last", "data": payload})
            while bs.batch_count == 0:  # its write is under way
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            await comm.close()
            await asyncio.wait_for(done.wait(), 30)
        finally:
            listener.stop()
    ops = [m.get("op") for batch in got for m in batch]
    last = [m for batch in got for m in batch if m.get("op") == "last"]
    digest = hashlib.sha256(last[0]["data"]).hexdigest() if last else None
    return ops, digest == hashlib.sha256(payload).hexdigest()


async def test_close_lets_a_batched_sends_last_message_arrive():
    tcp = await asyncio.wait_for(_last_message_arrives("tcp"), 60)
    handoff = await asyncio.wait_for(_last_message_arrives("handoff"), 60)
    assert tcp == (["first", "last"], True)
    assert handoff == tcp


def _open_sockets() -> int:
    return sum(1 for c in psutil.Process().net_connections(kind="all") if c.status != psutil.CONN_LISTEN)


async def _left_open_after_cancelled_connects(scheme: str) -> list:
    async def handler(comm):
        try:
            await comm.read()
        except OSError:
            pass

    left = []
    tries = 60
    with dask.config.set(SECRET):
        # A listener per try: each connect is the first to its address (for handoff, a
        # handshake over TCP, then the switch to the listener's Unix socket).
        listeners = [listen(f"{scheme}://127.0.0.1:0", handler) for _ in range(tries)]
        for listener in listeners:
            await listener.start()
        connector = get_backend(scheme).get_connector()
        # A comm that stays open: the process's connections stay up (handoff: its connector
        # node), as in a worker, whose pools keep comms open.
        keep = await connector.connect(listeners[0].contact_address.split("://", 1)[1])
        try:
            before = _open_sockets()
            # Cancelled after 0, 1, 2, ... turns of the loop: every step of the connect.
            for turns, listener in enumerate(listeners):
                task = asyncio.ensure_future(connector.connect(listener.contact_address.split("://", 1)[1]))
                for _ in range(turns):
                    await asyncio.sleep(0)
                if task.done():
                    (await task).abort()
                    continue
                task.cancel()
                try:
                    (await task).abort()
                except asyncio.CancelledError:
                    pass
            deadline = time.monotonic() + 3
            while _open_sockets() > before and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            left.append(_open_sockets() - before)
        finally:
            keep.abort()
            for listener in listeners:
                listener.stop()
    return left


async def test_a_cancelled_connect_leaves_no_connection():
    tcp = await asyncio.wait_for(_left_open_after_cancelled_connects("tcp"), 60)
    handoff = await asyncio.wait_for(_left_open_after_cancelled_connects("handoff"), 60)
    # (tcp:// may itself leave a socket or two of a cancelled Tornado connect to the GC.)
    assert handoff <= tcp

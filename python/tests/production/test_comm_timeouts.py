"""Issue 25, item 7 (the part one host can show): a TCP comm gets keepalive and
``TCP_USER_TIMEOUT`` from ``distributed.comm.timeouts.tcp``, as Dask's TCP comm sets them,
so that a read from a host that lost power ends within that timeout; and the backend's
own timeouts come from Dask's configuration. (The lab test
``multihost/test_dask_dead_host.py`` cuts a host off for real.)

The same program runs on ``tcp://`` and ``handoff://`` (shared memory off: a TCP
connection, as between hosts): it opens a comm under a given ``timeouts.tcp`` and reads
the options of the sockets at both ends.
"""

from __future__ import annotations

import asyncio
import os
import socket

import dask
from distributed.comm import connect, listen

SECRET = "production comm test secret"
_OPTIONS = {
    "keepalive": (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    "idle": (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
    "interval": (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
    "probes": (socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    "user timeout (ms)": (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", 18)),
}


def _options(comm) -> dict:
    stream = getattr(comm, "stream", None)
    # (handoff's connection: a look at its descriptor, through a duplicate of our own.)
    s = stream.socket if stream is not None else socket.socket(fileno=os.dup(comm.peer.fileno()))
    try:
        assert s.family in (socket.AF_INET, socket.AF_INET6), s
        return {name: s.getsockopt(level, opt) for name, (level, opt) in _OPTIONS.items()}
    finally:
        if stream is None:
            s.close()


async def _socket_options(scheme: str, timeout: str) -> dict:
    accepted: list = []

    async def handler(comm):
        accepted.append(comm)
        try:
            await comm.read()
        except OSError:
            pass

    config = {
        "distributed.comm.timeouts.tcp": timeout,
        "distributed.comm.handoff.shm": False,
        "distributed.comm.handoff.secret": SECRET,
    }
    with dask.config.set(config):
        listener = listen(f"{scheme}://127.0.0.1:0", handler)
        await listener.start()
        try:
            comm = await connect(listener.contact_address)
            try:
                await comm.write({"op": "hello"})  # the accepting side's handler runs by then
                for _ in range(500):
                    if accepted:
                        break
                    await asyncio.sleep(0.01)
                return {"connecting": _options(comm), "accepting": _options(accepted[0])}
            finally:
                await comm.close()
        finally:
            listener.stop()


async def test_keepalive_and_user_timeout_follow_dasks_tcp_timeout():
    for timeout in ("30s", "97s"):
        # Each in a task of its own, bounded (a comm's end must not hang the test).
        tcp = await asyncio.wait_for(_socket_options("tcp", timeout), 30)
        handoff = await asyncio.wait_for(_socket_options("handoff", timeout), 30)
        seconds = int(timeout[:-1])
        assert tcp["connecting"]["user timeout (ms)"] == seconds * 1000, tcp
        assert tcp["connecting"]["idle"] + tcp["connecting"]["interval"] * tcp["connecting"]["probes"] == seconds
        assert handoff == tcp


async def test_the_backends_own_timeouts_come_from_dask_config():
    async def handler(comm):
        try:
            await comm.read()
        except OSError:
            pass

    config = {
        "distributed.comm.handoff.secret": SECRET,
        "distributed.comm.handoff.progress-timeout": "7s",
        "distributed.comm.handoff.write-timeout": "45 seconds",
    }
    with dask.config.set(config):
        listener = listen("handoff://127.0.0.1:0", handler)
        await listener.start()
        try:
            comm = await connect(listener.contact_address)
            try:
                for node in (comm.peer.node, listener.node):
                    assert (node.bounds.progress_timeout, node.bounds.write_timeout) == (7.0, 45.0)
            finally:
                await comm.close()
        finally:
            listener.stop()

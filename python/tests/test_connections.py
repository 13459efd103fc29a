"""Several connections to one node, each its own stream (``per_connection``), and the pool of
shared segments they send from (``shm_pool``), received as private writable mappings."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from handoff import Buffer, Node, PeerClosed, held, native
from helpers import eventually, mapping_of

MIB = 1 << 20


def _accepting(name: str, accepted: list, **kw) -> Node:
    return Node(name, secret="k", listen="127.0.0.1:0", per_connection=True, on_accept=accepted.append, **kw)


async def test_each_connection_is_its_own_stream():
    accepted: list = []
    async with _accepting("server", accepted) as server, Node("client", secret="k", per_connection=True) as client:
        first = await client.connect(server.listen_addr)
        second = await client.connect(server.listen_addr, channel="tcp")
        third = await client.connect(server.listen_addr)
        assert (first.channel, second.channel, third.channel) == ("shm", "tcp", "shm")
        for i, p in enumerate((first, second, third)):
            for seq in range(3):
                await p.send("t.Seq", {"conn": i, "seq": seq})
        assert await eventually(lambda: len(accepted) == 3)
        # The TCP connections the shm ones started on carried no message: never accepted.
        assert sorted(p.channel for p in accepted) == ["shm", "shm", "tcp"]
        for p in accepted:
            got = [(await p.recv(5)).body for _ in range(3)]
            conn = got[0]["conn"]
            assert got == [{"conn": conn, "seq": s} for s in range(3)]
        # Replies go back on the connection they answer.
        await accepted[0].send("t.Reply", {"to": "first"})
        replies = {}
        for p in (first, second, third):
            try:
                replies[p] = (await p.recv(0.5)).body
            except asyncio.TimeoutError:
                pass
        assert list(replies.values()) == [{"to": "first"}]
        # Node-id bookkeeping (§5.1): the node is reachable while any connection is open.
        assert server.peer_by_id(client.node_id) is not None
        assert len(server.connections_to(client.node_id)) == 3
        await third.close()
        assert await eventually(lambda: len(server.connections_to(client.node_id)) == 2)
        assert client.peer_by_id(server.node_id) in (first, second)
        await first.close()
        await second.close()
        assert await eventually(lambda: server.peer_by_id(client.node_id) is None)
        # What arrived before the end stays readable; then the stream says it is closed.
        for p in accepted:
            with pytest.raises(PeerClosed):
                await p.recv(5)


async def test_an_accepted_connection_that_sends_nothing_is_closed_after_the_handshake_timeout():
    """A connection that never sends never reaches ``on_accept`` (its first message does):
    the node closes it ``handshake_timeout`` after its handshake, so that silent
    connections cannot hold a ``per_connection`` node's places (a Dask listener's) for
    good. One that sends is the application's, however long it then stays quiet."""
    from handoff.bounds import Bounds

    accepted: list = []
    async with (
        _accepting("server", accepted, bounds=Bounds(handshake_timeout=0.5)) as server,
        Node("client", secret="k", per_connection=True) as client,
    ):
        silent = await client.connect(server.listen_addr, channel="tcp")
        talking = await client.connect(server.listen_addr, channel="tcp")
        await talking.send("t.Hello", {})
        assert await eventually(lambda: len(accepted) == 1)
        assert await eventually(lambda: silent.closed, timeout=5)
        await asyncio.sleep(0.6)
        assert not talking.closed and len(accepted) == 1
        assert (await accepted[0].recv(5)).type_name == "t.Hello"


async def test_a_node_without_on_accept_closes_connections_that_send(caplog):
    async with (
        Node("quiet", secret="k", listen="127.0.0.1:0", per_connection=True) as quiet,
        Node("talker", secret="k") as talker,
    ):
        p = await talker.connect(quiet.listen_addr, channel="tcp")
        await p.send("t.X", {"a": 1})
        assert await eventually(lambda: p.closed)


async def test_pooled_segments_are_reused_and_received_writable():
    accepted: list = []
    async with (
        _accepting("rx", accepted, shm_private=True) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        # The process's pool, which earlier tests may have left warm: none idle to start, so
        # that this send makes a segment and the next reuses it.
        if native.ext is not None:
            native.ext.give_back_held()
        held.holder.give_back()
        before = tx.segment_pool_stats()
        arr = np.arange(MIB, dtype=np.int32)  # 4 MiB
        await p.send("t.A", {"x": arr})
        assert await eventually(lambda: accepted)
        env = await accepted[0].recv(5)
        x = env.body["x"]
        # A private (copy-on-write) mapping of the sender's pooled segment, writable.
        assert not x.readonly
        assert env.frames[0].kind == "shm" and env.segment_of(x)["sealed"] is False
        got = np.frombuffer(x, dtype=np.int32)
        assert np.array_equal(got, arr)
        got[:4] = -1  # copy-on-write: the receiver's own pages, the sender's segment is untouched
        stats = tx.segment_pool_stats()
        assert stats["created"] == before["created"] + 1 and stats["busy_segments"] >= 1
        assert tx.shm_leases()["count"] == 1
        del got, x, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        assert await eventually(lambda: tx.segment_pool_stats()["idle_segments"] >= 1)
        # The next send of that size reuses the warm segment, with the sender's bytes.
        await p.send("t.A", {"x": arr})
        env = await accepted[0].recv(5)
        assert np.array_equal(np.frombuffer(env.body["x"], dtype=np.int32), arr)
        assert tx.segment_pool_stats()["reused"] == before["reused"] + 1
        del env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)


async def test_a_reused_segment_shows_the_senders_new_bytes_not_the_receivers_writes():
    """The receiver writes into its (private) view of a pooled segment and lets it go; the
    next frame the sender puts in that segment shows the sender's new bytes everywhere,
    and the sender's segment never saw the receiver's writes."""
    accepted: list = []
    async with (
        _accepting("rx", accepted, shm_private=True) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        first = np.arange(MIB, dtype=np.int32)  # 4 MiB
        await p.send("t.A", {"x": first})
        assert await eventually(lambda: accepted)
        conn = accepted[0]
        env = await conn.recv(5)
        segment = env.segment_of(env.body["x"])
        got = np.frombuffer(env.body["x"], dtype=np.int32)
        assert np.array_equal(got, first)
        got[:4] = -1  # pages of the receiver's own, in the first and a later page
        got[300_000] = -2
        del got, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        assert await eventually(lambda: tx.segment_pool_stats()["idle_segments"] >= 1)
        second = np.arange(MIB, dtype=np.int32)[::-1].copy()
        before = tx.segment_pool_stats()
        await p.send("t.A", {"x": second})
        env = await conn.recv(5)
        assert tx.segment_pool_stats()["reused"] == before["reused"] + 1, "a warm segment again"
        again = env.segment_of(env.body["x"])
        assert (again["device"], again["inode"]) == (segment["device"], segment["inode"]), "the same one"
        got = np.frombuffer(env.body["x"], dtype=np.int32)
        assert np.array_equal(got, second)  # the written pages show the sender's bytes again
        assert got.flags.writeable
        del got, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)


@pytest.mark.pure_only("counts the Python peer's mapping cache (handoff_pure.mapcache)")
async def test_a_kept_mapping_serves_the_next_frame_in_its_segment_without_the_receivers_writes():
    """handoff_pure.mapcache: the receiver keeps the mapping of a pooled segment; the next frame in
    that segment comes through it, with the sender's new bytes where the receiver wrote."""
    from handoff_pure import mapcache

    assert mapcache.available()
    accepted: list = []
    async with (
        _accepting("rx", accepted, shm_private=True) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        first = np.arange(MIB, dtype=np.int32)  # 4 MiB
        await p.send("t.A", {"x": first})
        assert await eventually(lambda: accepted)
        conn = accepted[0]
        env = await conn.recv(5)
        got = np.frombuffer(env.body["x"], dtype=np.int32)
        assert np.array_equal(got, first)
        where = got.__array_interface__["data"][0]
        got[:4] = -1  # pages of the receiver's own, in the first and a later page
        got[300_000] = -2
        del got, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        assert conn._maps.stats() == {"idle": 1, "busy": 0, "hits": 0}
        second = np.arange(MIB, dtype=np.int32)[::-1].copy()
        await p.send("t.A", {"x": second})
        env = await conn.recv(5)
        got = np.frombuffer(env.body["x"], dtype=np.int32)
        assert conn._maps.stats()["hits"] == 1 and got.__array_interface__["data"][0] == where
        assert np.array_equal(got, second)  # the scrubbed pages show the sender's bytes again
        assert got.flags.writeable
        del got, env
        gc.collect()
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        await p.close()
        assert await eventually(lambda: conn._maps.stats()["idle"] == 0)


@pytest.mark.pure_only("sets and counts the Python peer's mapping cache (handoff_pure.mapcache)")
async def test_with_no_bytes_to_keep_every_frame_is_mapped_anew():
    from handoff_pure import mapcache

    accepted: list = []
    mapcache.set_keep_bytes(0)
    try:
        async with (
            _accepting("rx", accepted, shm_private=True) as rx,
            Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
        ):
            p = await tx.connect(rx.listen_addr)
            for i in range(2):
                await p.send("t.A", {"x": np.full(MIB, i, dtype=np.int32)})
                assert await eventually(lambda: accepted)
                env = await accepted[0].recv(5)
                assert mapping_of(env.body["x"]) is not None  # a mapping of its own
                assert np.frombuffer(env.body["x"], dtype=np.int32)[-1] == i
                del env
                gc.collect()
                assert await eventually(lambda: tx.shm_leases()["count"] == 0)
            assert accepted[0]._maps.stats() == {"idle": 0, "busy": 0, "hits": 0}
    finally:
        mapcache._state["keep_bytes"] = None


async def test_a_segment_whose_connection_closed_under_a_live_view_is_never_reused():
    accepted: list = []
    async with (
        _accepting("rx", accepted, shm_private=True) as rx,
        Node("tx", secret="k", per_connection=True, shm_pool=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        await p.send("t.A", {"x": Buffer(b"\x01" * MIB)})
        assert await eventually(lambda: accepted)
        kept = (await accepted[0].recv(5)).body["x"]  # the receiver keeps its view...
        before = tx.segment_pool_stats()
        await p.close()  # ...and the connection ends under it
        assert await eventually(lambda: tx.shm_leases()["count"] == 0)
        await asyncio.sleep(0.3)  # (past the sender's sweeps of ended leases)
        # The segment does not come back to the pool while the receiver's process lives
        # (the Python peer retires it; the engine keeps it until that process exits).
        assert tx.segment_pool_stats()["idle_segments"] == before["idle_segments"]
        # A new send of that size gets another segment; the kept view never changes.
        q = await tx.connect(rx.listen_addr)
        await q.send("t.A", {"x": Buffer(b"\x02" * MIB)})
        assert await eventually(lambda: len(accepted) == 2)
        other = (await accepted[1].recv(5)).body["x"]
        assert tx.segment_pool_stats()["created"] == before["created"] + 1
        assert bytes(other[:4]) == b"\x02" * 4
        assert bytes(kept) == b"\x01" * MIB


_CHILD = """
import asyncio, sys
from handoff import Node

async def main():
    async with Node("child", secret="k", per_connection=True, shm_private=True) as node:
        peer = await node.connect(sys.argv[1])
        await peer.send("t.Hello", {})
        env = await peer.recv(10)
        held = env.body["x"]  # held until the process is killed
        print("holding", len(held), flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_segments_held_by_a_killed_process_come_back_to_the_pool():
    accepted: list = []
    async with _accepting("owner", accepted, shm_pool=True) as owner:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, owner.listen_addr], stdout=subprocess.PIPE, env=dict(os.environ)
        )
        try:
            assert await eventually(lambda: accepted, timeout=20)
            peer = accepted[0]
            await peer.recv(5)
            assert peer.channel == "shm" and peer.ident.pid == child.pid
            await peer.send("t.A", {"x": Buffer(b"\x07" * (2 * MIB))})
            line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
            assert line.startswith(b"holding")
            assert owner.shm_leases()["count"] == 1
            before = owner.segment_pool_stats()
            child.send_signal(signal.SIGKILL)
            assert await eventually(lambda: owner.segment_pool_stats()["idle_segments"] == before["idle_segments"] + 1)
            assert owner.segment_pool_stats()["retired"] == before["retired"]
            assert owner.shm_leases()["count"] == 0
        finally:
            child.kill()
            child.wait()

"""Messages handled in the loop's readable callback (``Peer._on_messages``): a message
without frames that arrives while the reader waits between messages is admitted and
delivered there, without waking the reader. Each test breaks one thing that path could
get wrong — order, the buffered bounds, errors — the way a peer would."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest
from handoff import Node
from handoff_pure import wire
from handoff.bounds import Bounds
from helpers import RawPeer, eventually

SECRET = b"k"


def msg(t: str, value, frames=()) -> bytes:
    """A whole ``msg`` (header and inline frames) as a raw peer sends it."""
    header = wire.Msg(t, msgpack.packb(value), [wire.Inline(len(f)) for f in frames])
    return wire.encode_message(header, frames)


async def raw_peer(node: Node, via: str = "tcp") -> RawPeer:
    raw = RawPeer(node.listen_addr if via == "tcp" else node.unix_addr)
    await asyncio.to_thread(raw.handshake, SECRET)
    return raw


@pytest.mark.parametrize("via", ["tcp", "unix"])
async def test_a_burst_of_frameless_and_framed_messages_arrives_in_order(via):
    async with Node("a", secret=SECRET, listen="127.0.0.1:0") as a:
        raw = await raw_peer(a, via)
        burst = [msg("t.Seq", i) for i in range(20)]
        burst.append(msg("t.Seq", 20, [b"frame bytes"]))
        burst += [msg("t.Seq", i) for i in range(21, 41)]
        raw.send(b"".join(burst))
        for i in range(41):
            env = await a.recv(5)
            assert env.body == i
            assert [bytes(f.view) for f in env.frames] == ([b"frame bytes"] if i == 20 else [])
            env.release()
        raw.close()


@pytest.mark.parametrize("via", ["tcp", "unix"])
async def test_a_bad_header_after_good_ones_fails_the_connection_with_its_error(via):
    async with Node("a", secret=SECRET, listen="127.0.0.1:0") as a:
        raw = await raw_peer(a, via)
        bad = b"\x81\xa1k"  # a map whose one value is missing
        raw.send(b"".join(msg("t.Seq", i) for i in range(5)) + struct.pack(">I", len(bad)) + bad)
        for i in range(5):
            env = await a.recv(5)
            assert env.body == i
            env.release()
        error = await asyncio.to_thread(raw.expect_error)
        assert error.code == "malformed-header"
        raw.close()


async def test_an_unknown_type_in_a_burst_fails_only_after_what_came_before():
    async with Node("a", secret=SECRET, listen="127.0.0.1:0", types=["t.Known"]) as a:
        raw = await raw_peer(a)
        raw.send(msg("t.Known", 1) + msg("t.Known", 2) + msg("t.Other", 3) + msg("t.Known", 4))
        assert [(await a.recv(5)).body for _ in range(2)] == [1, 2]
        error = await asyncio.to_thread(raw.expect_error)
        assert error.code == "unknown-type" and "t.Other" in error.msg
        raw.close()


async def test_the_buffered_bounds_hold_for_a_burst_the_application_does_not_take():
    bounds = Bounds(max_buffered_messages_per_peer=8)
    async with Node("a", secret=SECRET, listen="127.0.0.1:0", bounds=bounds) as a:
        raw = await raw_peer(a)
        raw.send(b"".join(msg("t.Seq", i) for i in range(100)))
        assert await eventually(lambda: len(a.peers) == 1)
        (peer,) = a.peers
        assert await eventually(lambda: peer.messages == 8)
        await asyncio.sleep(0.2)  # nothing more is admitted while the application takes nothing
        assert peer.messages == 8
        for i in range(100):
            env = await a.recv(5)
            assert env.body == i
            env.release()
            assert peer.messages <= 8
        raw.close()


@pytest.mark.pure_only("counts the Python peer's reader waits (Transport.read_waits)")
async def test_small_messages_do_not_wake_the_reader():
    """The point of the path: 50 round trips of frameless messages, and the echoing node's
    reader waits for the socket no more than a few times (without the path: once each)."""
    async with (
        Node("a", secret=SECRET, listen="127.0.0.1:0") as a,
        Node("b", secret=SECRET, host_id="other-host") as b,
    ):
        to_a = await b.connect(a.listen_addr, channel="tcp")
        await to_a.send("t.Ping", 0)
        env = await a.recv(5)
        from_b = env.sender
        env.release()
        waits = from_b.transport.read_waits
        for i in range(1, 51):
            await to_a.send("t.Ping", i)
            env = await a.recv(5)
            assert env.body == i
            env.release()
            await from_b.send("t.Pong", i)
            back = await b.recv(5)
            assert back.body == i
            back.release()
        assert from_b.transport.read_waits - waits < 5


@pytest.mark.pure_only("wraps the Python peer's readable callback (Transport.on_messages)")
async def test_a_burst_longer_than_one_slice_is_finished_by_the_reader_in_order():
    """The callback handles one slice of work (100 µs) and hands the rest of what it
    received to the reader: a burst of 3000 messages (64 KiB and more per receive, far
    more than a slice's worth) is cut, and nothing is lost, doubled or reordered. (The
    buffered bounds are raised so that only the slice can stop the callback.)"""
    bounds = Bounds(max_buffered_messages_per_peer=1 << 20)
    async with Node("a", secret=SECRET, listen="127.0.0.1:0", bounds=bounds) as a:
        raw = await raw_peer(a)
        assert await eventually(lambda: len(a.peers) == 1 and a.peers[0].transport.on_messages is not None)
        transport = a.peers[0].transport
        handled, calls = transport.on_messages, []

        def recorded(data):
            used = handled(data)
            calls.append((len(data), used))
            return used

        transport.on_messages = recorded
        raw.send(b"".join(msg("t.Seq", i) for i in range(3000)))
        for i in range(3000):
            env = await a.recv(5)
            assert env.body == i
            env.release()
        assert calls and all(used < n // 2 for n, used in calls if n > 32 << 10), calls
        raw.close()


async def test_an_application_callback_that_raises_closes_the_connection_in_order():
    """``on_accept`` runs where the first message is delivered, here in the readable
    callback: when it raises, the connection is closed (as the reader closes it), and no
    message after it is lost or delivered out of order on a connection that carries on."""
    peers = []

    def on_accept(peer):
        peers.append(peer)
        raise RuntimeError("a bug in on_accept")

    async with Node("a", secret=SECRET, listen="127.0.0.1:0", per_connection=True, on_accept=on_accept) as a:
        raw = await raw_peer(a)
        await asyncio.sleep(0.1)
        raw.send(msg("t.Seq", 1) + msg("t.Seq", 2))
        assert await eventually(lambda: peers and peers[0].closed)
        got = []
        while True:
            try:
                env = await peers[0].recv(1)
            except Exception as e:
                got.append(type(e).__name__)
                break
            got.append(env.body)
        assert got in ([1, "PeerClosed"], ["PeerClosed"]), got
        assert await asyncio.to_thread(raw.sock.recv, 100) == b""
        raw.close()

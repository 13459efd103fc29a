"""Protocol versions (spec §3, §5.4, §5.7) in the Python peer and against the Rust binary.

Version 3 by default, on TCP and after the switch to a Unix socket, between Python nodes
and with the Rust node both ways; versions 2 and 1 only between nodes that accept them
(the Python node's ``accept_v2``/``accept_v1``, the Python worker's and ``handoff node``'s
``--accept-v2``/``--accept-v1``); a v2-only or v1-only peer refused by a default node
with ``unsupported-version``; and a peer that has proven nothing learns nothing about a
node but a nonce.
"""

from __future__ import annotations

import asyncio
import os
import struct

import pytest
from conftest import SECRET
from handoff import HandoffError, Node
from handoff_pure import wire
from handoff.bounds import Bounds
from helpers import PeerError, RawPeer, eventually


def py_node(name: str, **kw) -> Node:
    return Node(name, secret=SECRET, listen="127.0.0.1:0", **kw)


async def exchange(a: Node, b: Node, peer) -> None:
    """``a`` sends ``b`` a message over ``peer`` and ``b`` answers over its own peer of ``a``."""
    await peer.send("t.Note", {"text": "a to b"})
    env = await b.recv(10)
    assert env.body == {"text": "a to b"}
    back = b.peer(a.name)
    assert back is not None and back.protocol_version == peer.protocol_version
    await back.send("t.Note", {"text": "b to a"})
    assert (await a.recv(10)).body == {"text": "b to a"}


def code_of(err: BaseException) -> str:
    return getattr(err, "code", None) or str(err)


# ---------------------------------------------------------------- Python ↔ Python


async def test_python_nodes_speak_v3_on_tcp_and_after_the_switch_to_shm():
    async with py_node("a") as a, py_node("b") as b:
        tcp = await a.connect(b.listen_addr, channel="tcp")
        assert (tcp.channel, tcp.protocol_version) == ("tcp", 3)
        await exchange(a, b, tcp)
    async with py_node("c") as c, py_node("d") as d:
        shm = await c.connect(d.listen_addr)
        assert (shm.channel, shm.protocol_version) == ("shm", 3)
        await exchange(c, d, shm)


async def test_version_2_between_python_nodes_that_accept_it():
    async with py_node("old", preamble=wire.V2_DEFAULT) as old, py_node("new", accept_v2=True) as new:
        tcp = await old.connect(new.listen_addr, channel="tcp")
        assert (tcp.channel, tcp.protocol_version) == ("tcp", 2)
        await exchange(old, new, tcp)
        shm = await new.connect(old.listen_addr)
        assert (shm.channel, shm.protocol_version) == ("shm", 2)
        await exchange(new, old, shm)
    async with py_node("x", accept_v2=True) as x, py_node("y", accept_v1=True) as y:
        assert (await x.connect(y.listen_addr)).protocol_version == 3  # the highest both speak


async def test_version_1_between_python_nodes_that_accept_it():
    async with py_node("old", preamble=wire.V1_ONLY) as old, py_node("new", accept_v1=True) as new:
        tcp = await old.connect(new.listen_addr, channel="tcp")
        assert (tcp.channel, tcp.protocol_version) == ("tcp", 1)
        await exchange(old, new, tcp)
        shm = await new.connect(old.listen_addr)
        assert (shm.channel, shm.protocol_version) == ("shm", 1)
        await exchange(new, old, shm)
    async with py_node("x", accept_v1=True) as x, py_node("y", accept_v1=True) as y:
        assert (await x.connect(y.listen_addr)).protocol_version == 3  # the highest both speak
    # Accepting v1 accepts v2 as well (a range has no holes).
    async with py_node("v2", preamble=wire.V2_DEFAULT) as v2, py_node("z", accept_v1=True) as z:
        assert (await v2.connect(z.listen_addr)).protocol_version == 2


@pytest.mark.parametrize("older", [wire.V1_ONLY, wire.V2_DEFAULT, wire.V2_ACCEPTING_V1], ids=str)
async def test_a_default_python_node_refuses_an_older_peer(older):
    async with py_node("old", preamble=older) as old, py_node("new") as new:
        for a, b in ((old, new), (new, old)):
            with pytest.raises((wire.WireError, HandoffError)) as e:
                await a.connect(b.listen_addr)
            assert code_of(e.value) == "unsupported-version", e.value
        assert old.peers == [] and new.peers == []


async def test_accepting_v2_refuses_a_v1_only_peer():
    async with py_node("old", preamble=wire.V1_ONLY) as old, py_node("new", accept_v2=True) as new:
        with pytest.raises((wire.WireError, HandoffError)) as e:
            await old.connect(new.listen_addr)
        assert code_of(e.value) == "unsupported-version", e.value


# ---------------------------------------------------------------- with the Rust binary


async def test_rust_and_python_speak_v3_both_ways_on_tcp_and_shm(spawn_rust):
    rust = await spawn_rust("rs-v3")
    async with Node("py-v3-tcp", secret=SECRET, host_id="py-host") as node:
        peer = await node.connect(rust.listen)
        assert (peer.channel, peer.protocol_version) == ("tcp", 3)
        await peer.send("handoff.bench.Ping", {"seq": 1, "data": b"v3"})
        assert (await node.recv(10)).body == {"seq": 1, "data": b"v3"}
    async with Node("py-v3-shm", secret=SECRET) as node:
        peer = await node.connect(rust.listen)
        assert (peer.channel, peer.protocol_version) == ("shm", 3)
        await peer.send("handoff.bench.Ping", {"seq": 2, "data": b"v3"})
        assert (await node.recv(10)).body == {"seq": 2, "data": b"v3"}
    # Rust connects to Python: over TCP (other host ids), and switching to the Unix socket.
    for host, channel in (("py-host", "tcp"), (None, "shm")):
        async with Node(f"py-v3-in-{channel}", secret=SECRET, listen="127.0.0.1:0", host_id=host) as node:
            await spawn_rust(f"rs-v3-to-{channel}", "--connect", node.listen_addr)
            peer = await node.wait_for_peer(f"rs-v3-to-{channel}", channel=channel)
            assert peer.protocol_version == 3
            await peer.send("handoff.bench.Ping", {"seq": 3, "data": b"in"})
            assert (await node.recv(10)).body == {"seq": 3, "data": b"in"}


async def test_rust_accept_v2_runs_version_2_with_a_v2_only_python_peer(spawn_rust):
    rust = await spawn_rust("rs-v2", "--accept-v2")
    async with Node("py-v2", secret=SECRET, preamble=wire.V2_DEFAULT) as node:
        peer = await node.connect(rust.listen)  # TCP, then the switch to the Unix socket
        assert (peer.channel, peer.protocol_version) == ("shm", 2)
        await peer.send("handoff.bench.Ping", {"seq": 7, "data": b"v2"})
        assert (await node.recv(10)).body == {"seq": 7, "data": b"v2"}
    async with Node("py-v2-in", secret=SECRET, listen="127.0.0.1:0", preamble=wire.V2_DEFAULT) as node:
        await spawn_rust("rs-v2-out", "--accept-v2", "--connect", node.listen_addr)
        peer = await node.wait_for_peer("rs-v2-out", channel="shm")
        assert peer.protocol_version == 2
        await peer.send("handoff.bench.Ping", {"seq": 8, "data": b"v2"})
        assert (await node.recv(10)).body == {"seq": 8, "data": b"v2"}


async def test_rust_accept_v1_runs_version_1_with_a_v1_only_python_peer(spawn_rust):
    rust = await spawn_rust("rs-v1", "--accept-v1")
    async with Node("py-v1", secret=SECRET, preamble=wire.V1_ONLY) as node:
        peer = await node.connect(rust.listen)  # TCP, then the switch to the Unix socket
        assert (peer.channel, peer.protocol_version) == ("shm", 1)
        await peer.send("handoff.bench.Ping", {"seq": 4, "data": b"v1"})
        assert (await node.recv(10)).body == {"seq": 4, "data": b"v1"}
    # And the Rust node as the connector, over version 1 too.
    async with Node("py-v1-in", secret=SECRET, listen="127.0.0.1:0", preamble=wire.V1_ONLY) as node:
        await spawn_rust("rs-v1-out", "--accept-v1", "--connect", node.listen_addr)
        peer = await node.wait_for_peer("rs-v1-out", channel="shm")
        assert peer.protocol_version == 1
        await peer.send("handoff.bench.Ping", {"seq": 5, "data": b"v1"})
        assert (await node.recv(10)).body == {"seq": 5, "data": b"v1"}


async def test_a_default_rust_node_refuses_older_python_peers(spawn_rust):
    rust = await spawn_rust("rs-refuses-old")
    for older in (wire.V1_ONLY, wire.V2_DEFAULT):
        async with Node("py-old-refused", secret=SECRET, preamble=older) as node:
            with pytest.raises((wire.WireError, HandoffError)) as e:
                await node.connect(rust.listen)
            assert code_of(e.value) == "unsupported-version", (older, e.value)


@pytest.mark.parametrize(
    "flag, older, version", [("--accept-v1", wire.V1_ONLY, 1), ("--accept-v2", wire.V2_DEFAULT, 2)]
)
async def test_python_worker_accepts_an_older_version_only_when_asked(spawn_py_worker, flag, older, version):
    strict = await spawn_py_worker("py-w-strict", "--host-id", "w-host")
    lenient = await spawn_py_worker(f"py-w-{flag}", "--host-id", "w-host", flag)
    async with Node("py-old-client", secret=SECRET, host_id="c-host", preamble=older) as node:
        with pytest.raises((wire.WireError, HandoffError)) as e:
            await node.connect(strict.listen)
        assert code_of(e.value) == "unsupported-version", e.value
        peer = await node.connect(lenient.listen)
        assert peer.protocol_version == version
        await peer.send("handoff.bench.Ping", {"seq": 6, "data": b"old"})
        assert (await node.recv(10)).body == {"seq": 6, "data": b"old"}
    async with Node("py-new-client", secret=SECRET, host_id="c-host") as node:
        assert (await node.connect(lenient.listen)).protocol_version == 3  # still v3 with a v3 peer


# ---------------------------------------------------------------- what a node reveals before proof


def identity_of(node: Node) -> list:
    """What identifies ``node``: none of it may reach a peer that has proven nothing."""
    out = [node.node_id, node.name, node.host_id, node.process_id, node.listen_addr, str(os.getpid())]
    out += [node.listen_addr[len("tcp://") :]] + ([node.unix_addr] if node.unix_addr else [])
    needles = [x.encode() for x in out]
    # The keys of a hello or ident as msgpack strs: no identity went out at all.
    needles += [bytes([0xA0 | len(k)]) + k.encode() for k in ("node", "host", "pid", "proc", "listen", "unix")]
    return needles


def unproven(addr: str, how: str) -> tuple:
    """A peer without the secret ends a handshake ``how``; returns the error code and every byte it got."""
    raw = RawPeer(addr)
    if how == "v1-only":
        raw.send(wire.V1_ONLY.encode())
    elif how == "v2-only":
        raw.send(wire.V2_DEFAULT.encode())
    else:
        raw.send(wire.OUR_PREAMBLE.encode())
    raw.read_exact(16)
    if how == "wrong-proof":
        own = raw.challenge()
        raw.send(wire.frame_header(own))
        raw.read_header()  # its challenge
        raw.send(wire.encode_message(wire.Auth(bytes(32))))
    elif how == "hello-on-v2":
        raw.send(wire.frame_header(raw.hello()))
    elif how == "garbage":
        raw.send(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    elif how == "silence":
        raw.send(wire.frame_header(raw.challenge()))
    err = raw.expect_error()
    return err.code, raw.received


CASES = [
    ("wrong-proof", "auth-failed"),
    ("v1-only", "unsupported-version"),
    ("v2-only", "unsupported-version"),
    ("hello-on-v2", "handshake"),
    ("garbage", "malformed-header"),
    ("silence", "timeout"),
]


@pytest.mark.parametrize("how, code", CASES)
async def test_a_peer_that_proved_nothing_learns_nothing_but_a_nonce(how, code):
    async with py_node("quiet", bounds=Bounds(handshake_timeout=0.5)) as node:
        needles = identity_of(node)
        for addr in (node.listen_addr, node.unix_addr):
            got_code, received = await asyncio.to_thread(unproven, addr, how)
            assert got_code == code, (addr, how)
            leaked = [n for n in needles if n in received]
            assert not leaked, f"{how} on {addr}: {leaked}"


async def test_a_full_node_refuses_without_naming_itself():
    async with py_node("full", bounds=Bounds(max_connections=1)) as node:
        member = RawPeer(node.listen_addr)
        await asyncio.to_thread(member.handshake, SECRET)
        await eventually(lambda: len(node.peers) == 1)

        def refused():
            raw = RawPeer(node.listen_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_exact(16)
            return raw.expect_error().code, raw.received

        code, received = await asyncio.to_thread(refused)
        assert code == "overloaded"
        assert not [n for n in identity_of(node) if n in received]
        member.close()


async def test_the_check_would_see_a_v1_hello():
    """The detector is sound: a node that accepts v1 peers does say who it is to one."""
    async with py_node("open", accept_v1=True) as node:

        def v1_peer():
            raw = RawPeer(node.listen_addr)
            raw.send(wire.V1_ONLY.encode())
            raw.read_exact(16)
            raw.read_header()  # its hello
            return raw.received

        received = await asyncio.to_thread(v1_peer)
        assert node.node_id.encode() in received


async def test_a_peer_that_proves_the_secret_learns_the_ident():
    async with py_node("open-to-members") as node:
        ident = await asyncio.to_thread(lambda: RawPeer(node.listen_addr).handshake(SECRET))
        assert (ident.node, ident.name, ident.listen) == (node.node_id, node.name, node.listen_addr)
        await eventually(lambda: len(node.peers) == 1)
        # A wrong secret: the node's proof does not verify here, nor ours there.
        with pytest.raises((PeerError, wire.WireError)) as e:
            await asyncio.to_thread(lambda: RawPeer(node.listen_addr).handshake(b"wrong secret"))
        assert e.value.code == "auth-failed"

"""The Rust engine driven from asyncio (``handoff.engine``), against real Rust nodes.

Each test runs the handshake, messages, frames and shared memory through the engine that
the tokio driver runs too, with a ``handoff node`` process on the other side: over TCP
(different host ids), over its Unix socket (shared memory), with a wrong secret, and with
a peer that sends what the engine must refuse.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import numpy as np
import pytest
from conftest import SECRET
from handoff import AuthenticationError
from handoff.codec import decode_body, encode_body
from handoff.engine import ConnectionFailed, Driver, Engine, Frame, Ticket
from handoff.errors import CapReached, MessageTooLarge, OwnerLost, PeerClosed, PeerRefused, TicketRefused, TlsError
from handoff.identity import host_id
from handoff.tickets import digest
from helpers import eventually, inode_of

MIB = 1 << 20


def engine(name: str, **kw) -> Engine:
    kw.setdefault("capabilities", ["inline", "shm"])
    return Engine(name, SECRET, **kw)


def encoded(value) -> tuple:
    """``value``'s body and frames (tickets travel as frames, as themselves)."""
    enc = encode_body(value, is_frame=lambda o: isinstance(o, Ticket))
    return enc.body, [src if f is None else f for f, src in zip(enc.frames, enc.sources)]


async def request(conn, type_name: str, value) -> None:
    await conn.send(type_name, *encoded(value))


async def expect(conn, type_name: str, timeout: float = 30):
    got = await conn.recv(timeout)
    assert got.type_name == type_name, got.type_name
    return got, decode_body(got.body, got.frames, got.type_name)


async def unix_of(driver: Driver, rust) -> str:
    """The Unix socket a same-host Rust node announces in its handshake."""
    first = await driver.connect(rust.listen)
    assert first.peer["unix"], first.peer
    first.close()
    return first.peer["unix"]


def stats(driver: Driver, max_peers: int = 64) -> dict:
    """What a node's ``handoff.admin.Stats`` carries (spec Appendix A), for ``driver``'s
    node: its ticket and shared-memory leases and its peers (at most ``max_peers``, oldest
    first, and how many in all); plus what the engine holds for peers now: received bytes
    not yet taken and peers' segments mapped."""
    ready = [c for c in driver.connections if c.peer is not None and not c._ended]
    count, held = driver.engine.ticket_leases
    shm = [c.conn.shm_leases for c in ready]
    return {
        "node": driver.engine.name,
        "ticket_leases": {"count": count, "bytes": held},
        "shm_leases": {"count": sum(n for n, _ in shm), "bytes": sum(b for _, b in shm)},
        "peers": [[c.peer["name"], "shm" if c.conn.unix else "tcp"] for c in ready[:max_peers]],
        "peers_total": len(ready),
        "buffered_bytes": driver.engine.buffered_bytes,
        "mapped_bytes": driver.engine.mapped_bytes,
    }


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_tcp_handshake_echo_and_a_large_frame(spawn_rust):
    rust = await spawn_rust("rs-eng-tcp", "--host-id", "rust-host")
    driver = Driver(engine("py-eng-tcp", host_id="py-host"))
    try:
        conn = await driver.connect(rust.listen)
        assert conn.peer["name"] == "rs-eng-tcp" and conn.peer["version"] == 3
        assert conn.peer["language"] == "rust"

        await request(conn, "handoff.bench.Ping", {"seq": 1, "data": b"ping"})
        _, body = await expect(conn, "handoff.bench.Ping")
        assert body == {"seq": 1, "data": b"ping"}

        # 16 MiB from Rust: one inline frame, read into Rust memory and handed over as it is.
        await request(conn, "handoff.demo.SendRequest", {"id": 2, "bytes": 16 * MIB})
        got, body = await expect(conn, "handoff.demo.Payload")
        assert [f.kind for f in got.frames] == ["inline", "inline"]
        data = np.frombuffer(body["data"], dtype=np.uint8)
        assert len(data) == 16 * MIB and digest(data) == bytes(body["digest"])
        # Read off the socket into memory of its own: writable, as a Python socket's buffer is.
        assert got.frames[1].writable and data.flags.writeable
        # A view, not a copy: the array's memory is the frame's.
        assert np.shares_memory(data, np.frombuffer(got.frames[1], dtype=np.uint8))
        # A write reaches that frame and no other (the body, and the first frame, keep theirs).
        first = bytes(got.frames[0])
        data[:4] = 0xEE
        assert bytes(memoryview(got.frames[1])[:4]) == b"\xee" * 4 and bytes(got.frames[0]) == first
        assert memoryview(got.body).readonly  # the body stays the engine's to decode

        # 16 MiB to Rust, sent from the array's memory; the Rust node checks its digest.
        out = np.random.default_rng(3).integers(0, 256, 16 * MIB, dtype=np.uint8)
        await request(
            conn, "handoff.demo.Payload", {"id": 3, "digest": digest(out), "data": out, "prepare_seconds": 0.0}
        )
        _, receipt = await expect(conn, "handoff.demo.Receipt")
        assert receipt["verified"] is True and receipt["bytes"] == 16 * MIB
    finally:
        driver.close()


async def test_shm_frames_are_views_of_the_peers_segments_and_released(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-eng-shm")
    assert rust.ready["host_id"] == host_id()
    eng = engine("py-eng-shm")
    driver = Driver(eng)
    try:
        conn = await driver.connect(await unix_of(driver, rust))
        assert conn.peer["name"] == "rs-eng-shm"
        await request(conn, "handoff.demo.SendRequest", {"id": 5, "bytes": 8 * MIB})
        got, body = await expect(conn, "handoff.demo.Payload")
        assert "shm" in [f.kind for f in got.frames]
        assert digest(np.frombuffer(body["data"], dtype=np.uint8)) == bytes(body["digest"])
        assert eng.mapped_bytes >= 8 * MIB
        # The Rust node keeps the segment under a lease until our last view is gone.
        assert (await rust_stats(rust.listen))["shm_leases"]["count"] >= 1
        view = np.frombuffer(body["data"], dtype=np.uint8)
        del got, body
        # The numpy view still holds the frame, and so the lease.
        await asyncio.sleep(0.1)
        assert (await rust_stats(rust.listen))["shm_leases"]["count"] >= 1
        del view

        async def released() -> bool:
            return (await rust_stats(rust.listen))["shm_leases"]["count"] == 0

        for _ in range(100):
            if await released():
                break
            await asyncio.sleep(0.05)
        assert await released(), "the release reached the Rust node"
    finally:
        driver.close()


async def test_held_shm_frames_hold_no_descriptor(spawn_rust):
    rust = await spawn_rust("rs-eng-fds")
    driver = Driver(engine("py-eng-fds"))
    try:
        conn = await driver.connect(await unix_of(driver, rust))
        before = open_fds()
        held = []
        for i in range(300):
            await request(conn, "handoff.demo.SendRequest", {"id": i, "bytes": 256 * 1024})
            got, body = await expect(conn, "handoff.demo.Payload")
            held.append(got)
        assert all("shm" in [f.kind for f in g.frames] for g in held)
        # Mapped and cached by segment identity: no descriptor is kept per mapping, only
        # those of the 64 segments received last (handoff-proto's FORWARDABLE), so that
        # they can be passed on with no copy.
        assert open_fds() - before <= 64 + 2, (before, open_fds())
    finally:
        driver.close()


async def test_a_wrong_secret_fails_the_handshake(spawn_rust):
    rust = await spawn_rust("rs-eng-auth")
    driver = Driver(Engine("py-eng-auth", b"not the secret"))
    try:
        with pytest.raises((AuthenticationError, PeerRefused)) as caught:
            await driver.connect(rust.listen, timeout=10)
        assert "auth" in str(caught.value)
        assert not driver.connections
    finally:
        driver.close()


async def test_admit_refuses_a_peer_identity(spawn_rust):
    rust = await spawn_rust("rs-eng-admit")
    driver = Driver(engine("py-eng-admit"))
    try:
        with pytest.raises(ConnectionFailed) as caught:
            await driver.connect(rust.listen, admit=lambda peer: f"{peer['name']} is already connected", timeout=10)
        assert caught.value.code == "handshake" and "rs-eng-admit is already connected" in caught.value.message
    finally:
        driver.close()


async def test_unknown_types_are_refused_and_the_peer_told(spawn_rust):
    rust = await spawn_rust("rs-eng-types")
    eng = engine("py-eng-types")
    eng.register(["handoff.demo.Receipt"])
    driver = Driver(eng)
    try:
        conn = await driver.connect(rust.listen)
        await request(conn, "handoff.bench.Ping", {"seq": 1, "data": b"x"})
        with pytest.raises(ConnectionFailed) as caught:
            await conn.recv(10)
        assert caught.value.code == "unknown-type" and not caught.value.by_peer
        # The Rust node read our error before the end of the stream.
        text = await rust.wait_stderr("unknown-type")
        assert "unknown-type" in text
    finally:
        driver.close()


async def test_a_peer_that_is_not_a_node_is_refused_by_the_engine():
    """A listener that answers garbage: the engine refuses it with `bad-magic`."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    loop = asyncio.get_running_loop()

    async def garbage():
        server.setblocking(False)
        s, _ = await loop.sock_accept(server)
        await loop.sock_sendall(s, b"GET / HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.5)
        s.close()

    task = asyncio.create_task(garbage())
    driver = Driver(engine("py-eng-garbage"))
    try:
        with pytest.raises(ConnectionFailed) as caught:
            await driver.connect(f"tcp://127.0.0.1:{port}", timeout=10)
        assert caught.value.code == "bad-magic"
    finally:
        driver.close()
        await task
        server.close()


async def test_a_silent_peer_times_out_the_handshake():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    driver = Driver(engine("py-eng-silent", handshake_timeout=0.5))
    try:
        with pytest.raises((ConnectionFailed, PeerClosed)) as caught:
            await driver.connect(f"tcp://127.0.0.1:{port}", timeout=10)
        assert "timeout" in str(caught.value)
    finally:
        driver.close()
        server.close()


async def test_an_address_the_driver_cannot_use_is_refused_by_name_and_keeps_no_descriptor(tmp_path):
    driver = Driver(engine("py-eng-addresses"))
    before = open_fds()
    try:
        for bad in ("tcp://127.0.0.1:65536", "tcp://127.0.0.1:99999", "tcp://::1:80", "tcp://host", "tcp://h:x"):
            with pytest.raises(ValueError, match="not an address") as caught:
                await driver.connect(bad, timeout=5)
            assert repr(bad) in str(caught.value)
            with pytest.raises(ValueError, match="not an address"):
                await driver.listen(bad)
        # A socket path too long to bind: the socket made for it is closed.
        with pytest.raises(OSError):
            await driver.listen("unix://" + str(tmp_path / ("x" * 200)))
        assert open_fds() == before
    finally:
        driver.close()


async def test_the_budget_stops_reading_and_taking_gives_room_back(spawn_rust):
    rust = await spawn_rust("rs-eng-budget", "--host-id", "rust-host")
    # Room for about one 4 MiB message per peer: the rest wait in the socket.
    eng = engine("py-eng-budget", host_id="py-host", max_buffered_bytes_per_peer=5 * MIB)
    driver = Driver(eng)
    try:
        conn = await driver.connect(rust.listen)
        for i in range(4):
            await request(conn, "handoff.demo.SendRequest", {"id": i, "bytes": 4 * MIB})
        assert await eventually(lambda: conn.buffered_bytes > 0)
        await asyncio.sleep(0.3)
        assert conn.buffered_bytes <= 5 * MIB + 64 * 1024, conn.buffered_bytes
        ids = []
        for _ in range(4):
            got, body = await expect(conn, "handoff.demo.Payload")
            ids.append(body["id"])
            assert conn.buffered_bytes <= 5 * MIB + 64 * 1024
        assert ids == [0, 1, 2, 3]
    finally:
        driver.close()


@pytest.mark.parametrize("channel", ["tcp", "unix"])
async def test_python_to_python_both_ways(channel, tmp_path):
    a = Driver(engine("py-eng-a"))
    b = Driver(engine("py-eng-b"))
    addr = f"unix://{tmp_path}/b.sock" if channel == "unix" else "tcp://127.0.0.1:0"
    listener = await b.listen(addr)
    try:
        dialed = await a.connect(listener.address)
        accepted = await listener.accept(10)
        assert dialed.peer["name"] == "py-eng-b" and accepted.peer["name"] == "py-eng-a"
        assert dialed.peer["language"] == "python" and dialed.peer["implementation"].startswith("handoff-py-engine/")
        big = np.arange(8 * MIB, dtype=np.uint8)
        for i in range(20):
            await request(dialed, "t.Work", {"i": i, "data": big if i == 7 else b"small"})
        for i in range(20):
            _, body = await expect(accepted, "t.Work")
            assert body["i"] == i
            if i == 7:
                assert np.array_equal(np.frombuffer(body["data"], dtype=np.uint8), big)
        await request(accepted, "t.Done", {"n": 20})
        _, body = await expect(dialed, "t.Done")
        assert body == {"n": 20}
        # Closing one side: the other sees the end of the stream between messages.
        dialed.close()
        with pytest.raises(PeerClosed, match="closed the connection"):
            await accepted.recv(10)
    finally:
        listener.close()
        a.close()
        b.close()


async def a_dialer_gets_in(listener, name: str) -> None:
    """A genuine dialer handshakes with ``listener``'s node, named ``name``."""
    dialer = Driver(engine("py-eng-dialer"))
    try:
        conn = await dialer.connect(listener.address, timeout=10)
        assert conn.peer["name"] == name
    finally:
        dialer.close()


async def test_the_listener_bounds_handshakes_and_evicts_the_oldest():
    """Silent sockets cannot lock peers out (spec §9.1): past ``max_handshakes`` the oldest
    handshake is evicted, and a genuine dialer still gets in."""
    driver = Driver(engine("py-eng-listen", handshake_timeout=30))
    listener = await driver.listen(max_handshakes=2)
    host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    silent = []
    try:
        for _ in range(5):
            silent.append(socket.create_connection((host, int(port))))
            await asyncio.sleep(0.05)  # accepted in this order
        assert await eventually(lambda: listener.evicted >= 3), listener.evicted

        def ended(s: socket.socket) -> bool:
            """Read our preamble, then the end of the stream (evicted), or nothing (waiting)."""
            s.settimeout(0.5)
            got = b""
            try:
                while chunk := s.recv(64):
                    got += chunk
            except (TimeoutError, socket.timeout):
                return False
            assert got.startswith(b"HANDOFF"), got
            return True

        states = [await loop.run_in_executor(None, ended, s) for s in silent]
        assert states == [True, True, True, False, False], states
        # Two silent sockets hold both places: a real dialer evicts the older and gets in.
        await a_dialer_gets_in(listener, "py-eng-listen")
        assert listener.evicted == 4
    finally:
        for s in silent:
            s.close()
        listener.close()
        driver.close()


async def test_connections_reset_before_they_are_accepted_are_closed_without_an_error(caplog):
    """A peer that connects and resets at once (before the listener took the connection:
    ``getpeername`` fails with ENOTCONN) is closed and counted, with nothing raised into the
    loop and nothing logged per connection; the listener takes the next dialer."""
    import struct

    driver = Driver(engine("py-eng-reset"))
    listener = await driver.listen()
    host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
    before = open_fds()
    try:
        # The loop does not run while this does: every connection is reset in the backlog.
        for _ in range(40):
            s = socket.create_connection((host, int(port)))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert await eventually(lambda: listener.refused >= 40), listener.refused
        assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]
        assert open_fds() <= before, (open_fds(), before)
        await a_dialer_gets_in(listener, "py-eng-reset")
    finally:
        listener.close()
        driver.close()


async def test_a_forked_child_draws_its_own_nonces_ids_and_tokens():
    """Parent and forked child run a handshake with each other after the engine was used
    before the fork: each draws its own nonce, node id and process id (a generator whose
    state the child inherits would give both the same, and the handshake would be refused
    as reflected)."""
    before = engine("py-eng-prefork")
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: answer one handshake and one message, then exit
        try:
            a.close()

            async def child() -> None:
                d = Driver(engine("py-eng-child"))
                c = d.adopt(b, "acceptor", "parent")
                await c.ready(10)
                got = await c.recv(10)
                c.send_now("t.Pid", encode_body({"node_id": d.engine.node_id}).body)
                await asyncio.sleep(0.2)
                d.close()
                del got

            asyncio.run(child())
        finally:
            os._exit(0)
    b.close()
    driver = Driver(engine("py-eng-parent"))
    try:
        conn = driver.adopt(a, "dialer", "child")
        await conn.ready(10)
        conn.send_now("t.Hi", encode_body({}).body)
        _, body = await expect(conn, "t.Pid", timeout=10)
        ours = {before.node_id, driver.engine.node_id}
        assert body["node_id"] not in ours and conn.peer["node_id"] == body["node_id"]
        assert conn.peer["pid"] == pid
        assert conn.peer["process_id"] not in (before.process_id, driver.engine.process_id)
    finally:
        driver.close()
        os.waitpid(pid, 0)


async def test_shm_sends_to_rust_go_as_segments_and_come_back(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-eng-shm-in")
    driver = Driver(engine("py-eng-shm-out"))
    try:
        conn = await driver.connect(await unix_of(driver, rust))
        out = np.random.default_rng(9).integers(0, 256, 16 * MIB, dtype=np.uint8)
        await request(
            conn, "handoff.demo.Payload", {"id": 9, "digest": digest(out), "data": out, "prepare_seconds": 0.0}
        )
        _, receipt = await expect(conn, "handoff.demo.Receipt")
        assert receipt["verified"] is True and receipt["bytes"] == 16 * MIB
        # Sent as a segment under a lease, until the Rust node dropped its last view.
        assert await eventually(lambda: conn.conn.shm_leases == (0, 0)), conn.conn.shm_leases
        assert ["py-eng-shm-out", "shm"] in (await rust_stats(rust.listen))["peers"]
    finally:
        driver.close()


def _region_of(view) -> str:
    """The name of the mapping that holds ``view``'s first byte (``/proc/self/maps``)."""
    import ctypes

    at = ctypes.addressof(ctypes.c_char.from_buffer(view)) if not view.readonly else None
    if at is None:
        at = np.frombuffer(view, dtype=np.uint8).ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            span, rest = line.split(" ", 1)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= at < hi:
                parts = rest.split()
                return parts[4] if len(parts) > 4 else "anonymous memory"
    return "not mapped"


async def test_shm_private_frames_are_writable_views_of_the_segment_and_writes_stay_here(tmp_path):
    """``Engine(shm_private=True)``: a frame of a same-host peer's segment is a private,
    writable mapping of it (no copy: it lies in the peer's memfd), and what the receiver
    writes reaches neither the sender nor the next frame sent from the same segment."""
    a = Driver(engine("py-eng-private-a"))
    b = Driver(engine("py-eng-private-b", shm_private=True))
    listener = await b.listen(f"unix://{tmp_path}/private.sock")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        chunk = np.full(4 * MIB, 7, dtype=np.uint8)
        for round in range(2):
            await request(sender, "t.Big", {"data": chunk})
            got, body = await expect(receiver, "t.Big")
            frame = got.frames[0]
            assert frame.kind == "shm" and frame.writable
            view = memoryview(frame)
            assert not view.readonly
            assert _region_of(view).startswith("/memfd:handoff-segment"), "a copy, not the segment"
            arr = np.frombuffer(view, dtype=np.uint8)
            assert (arr == 7).all(), f"round {round}: a write of the last round came back"
            arr[:] = 9  # our own pages from here on
            del got, body, frame, view, arr  # the lease goes back: round 2 may reuse the segment
            await asyncio.sleep(0.05)
        assert (chunk == 7).all()
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_host_array_keeps_its_frame_and_lease_until_it_goes(tmp_path):
    """``Frame.host_array()``: a base-less array over the frame (what Dask's tools expect of
    a received array), no copy; the frame, and with it the sender's lease, stays alive while
    the array or a view of it lives, whatever else lets go, and goes with the last of them.
    A read-only frame (a shared view) has none."""
    import gc

    a = Driver(engine("py-eng-hostarr-a"))
    b = Driver(engine("py-eng-hostarr-b", shm_private=True))
    listener = await b.listen(f"unix://{tmp_path}/hostarr.sock")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        await request(sender, "t.Big", {"data": np.full(2 * MIB, 5, dtype=np.uint8)})
        got, body = await expect(receiver, "t.Big")
        arr = got.frames[0].host_array()
        assert arr.base is None and arr.flags.writeable and arr.dtype == np.uint8 and len(arr) == 2 * MIB
        # One per frame: a second would alias the first's bytes.
        with pytest.raises(BufferError, match="already"):
            got.frames[0].host_array()
        assert _region_of(memoryview(arr)).startswith("/memfd:handoff-segment"), "a copy, not the segment"
        view = arr[MIB:]
        del got, body, arr
        gc.collect()
        await asyncio.sleep(0.05)
        assert sender.conn.shm_leases[0] == 1, "the frame went while a view of its array lived"
        assert (view == 5).all()
        view[:] = 6  # the receiver's private pages
        del view
        assert await eventually(lambda: sender.conn.shm_leases == (0, 0)), sender.conn.shm_leases
        # A shared (read-only) view of a segment is no buffer of its own.
        shared = Driver(engine("py-eng-hostarr-c"))
        listener2 = await shared.listen(f"unix://{tmp_path}/hostarr2.sock")
        try:
            sender2 = await a.connect(listener2.address)
            receiver2 = await listener2.accept(10)
            await request(sender2, "t.Big", {"data": np.full(2 * MIB, 5, dtype=np.uint8)})
            got, _ = await expect(receiver2, "t.Big")
            assert not got.frames[0].writable
            with pytest.raises(BufferError, match="read-only frame"):
                got.frames[0].host_array()
        finally:
            listener2.close()
            shared.close()
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_dask_body_that_names_a_frame_twice_gets_no_two_writable_arrays_over_it(tmp_path):
    """A peer may name one frame twice in a body (spec §8.2); handoff's own senders never
    do. The Dask comm makes the first a host array and the second a read-only view, which
    Dask's deserializers copy: no two writable arrays share the bytes."""
    pytest.importorskip("distributed")
    from handoff.dask.frames import unpack_part

    a = Driver(engine("py-eng-twice-a", host_id="h-a"))
    b = Driver(engine("py-eng-twice-b", host_id="h-b"))
    listener = await b.listen("127.0.0.1:0")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        await request(sender, "t.Big", {"data": np.full(256 * 1024, 3, dtype=np.uint8)})
        got, _ = await expect(receiver, "t.Big")
        frame = got.frames[0]
        assert frame.kind == "inline" and frame.writable
        out: list = []
        assert unpack_part({"f": [memoryview(frame), memoryview(frame)]}, out) is False
        first, second = out
        assert isinstance(first, np.ndarray) and first.base is None and first.flags.writeable
        assert isinstance(second, memoryview) and second.readonly
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_segment_whose_connection_closed_under_a_live_view_is_never_reused(tmp_path):
    """A receiver that keeps a frame after its connection closed (Dask closes comms and
    keeps the arrays) still maps the sender's segment: the sender must not put that
    segment back in its pool, or the next send would write into what the receiver holds.
    It stays out of the pool while the receiver's process lives (this one)."""
    a = Driver(engine("py-eng-retire-a"))
    b = Driver(engine("py-eng-retire-b"))
    listener = await b.listen(f"unix://{tmp_path}/retire.sock")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        await request(sender, "t.Big", {"data": np.full(4 * MIB, 7, dtype=np.uint8)})
        _, body = await expect(receiver, "t.Big")
        kept = np.frombuffer(body["data"], dtype=np.uint8)
        sender.close()  # the lease is still out: the segment may not go back to the pool
        receiver.close()
        again = await a.connect(listener.address)
        other = await listener.accept(10)
        for _ in range(4):  # sends that would reuse an idle segment of that size
            await request(again, "t.Big", {"data": np.full(4 * MIB, 9, dtype=np.uint8)})
            await expect(other, "t.Big")
        assert (kept == 7).all(), "the next sends wrote into a segment a live receiver maps"
    finally:
        listener.close()
        a.close()
        b.close()


async def test_one_release_wakes_every_send_that_waits_for_room(tmp_path):
    """Two sends wait while the peer holds as much shared memory as it may; the release
    that makes room for both lets both go (the first version kept one waiter, and the
    other waited out its whole timeout)."""
    a = Driver(engine("py-eng-wake-a", max_shm_lease_bytes_per_peer=3 * MIB))
    b = Driver(engine("py-eng-wake-b"))
    listener = await b.listen(f"unix://{tmp_path}/wake.sock")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        await request(sender, "t.Big", {"data": np.full(2 * MIB, 1, dtype=np.uint8)})
        got, body = await expect(receiver, "t.Big")
        half = np.full(MIB + MIB // 2, 2, dtype=np.uint8)
        waiting = [asyncio.create_task(sender.send("t.Half", *encoded({"data": half}), timeout=8)) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in waiting), "both wait for room"
        started = time.monotonic()
        del got, body  # the release makes room for both
        await asyncio.wait_for(asyncio.gather(*waiting), 6)
        assert time.monotonic() - started < 3, "a waiter slept through the release"
    finally:
        listener.close()
        a.close()
        b.close()


async def test_python_to_python_over_shm_with_the_lease_cap(tmp_path):
    a = Driver(engine("py-eng-cap-a", max_shm_lease_bytes_per_peer=3 * MIB))
    b = Driver(engine("py-eng-cap-b"))
    listener = await b.listen(f"unix://{tmp_path}/cap.sock")
    try:
        sender = await a.connect(listener.address)
        receiver = await listener.accept(10)
        chunk = np.full(2 * MIB, 7, dtype=np.uint8)
        await request(sender, "t.Big", {"i": 0, "data": chunk})
        got0, body0 = await expect(receiver, "t.Big")
        assert [f.kind for f in got0.frames] == ["shm"]
        assert sender.conn.shm_leases[0] == 1
        # The receiver holds 2 MiB of the 3 it may: a second 2 MiB frame waits for a release.
        with pytest.raises(CapReached):
            sender.send_now("t.Big", encode_body({"i": 1, "data": chunk}).body, [chunk])
        waiting = asyncio.create_task(request(sender, "t.Big", {"i": 1, "data": chunk}))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "the send waits while the peer holds as much as it may"
        del got0, body0  # the last view: the lease goes back, and the send goes on
        await asyncio.wait_for(waiting, 10)
        _, body1 = await expect(receiver, "t.Big")
        assert body1["i"] == 1 and np.frombuffer(body1["data"], dtype=np.uint8)[0] == 7
    finally:
        listener.close()
        a.close()
        b.close()


async def test_what_the_peer_would_refuse_fails_locally_and_the_connection_goes_on(spawn_rust):
    rust = await spawn_rust("rs-eng-limits", "--host-id", "rust-host")
    driver = Driver(engine("py-eng-limits", host_id="py-host"))
    try:
        conn = await driver.connect(rust.listen)
        with pytest.raises(MessageTooLarge) as caught:
            await conn.send("handoff.bench.Ping", encode_body({"seq": 1}).body, [b"x"] * 1025)
        assert caught.value.code == "too-many-frames" and caught.value.limit == 1024
        await request(conn, "handoff.bench.Ping", {"seq": 2, "data": b"ok"})
        _, body = await expect(conn, "handoff.bench.Ping")
        assert body == {"seq": 2, "data": b"ok"}
    finally:
        driver.close()


# ---------------------------------------------------------------- TLS (spec §3.1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_engine(name: str, pki, which: str = "a", ca=None, **kw) -> Engine:
    c = getattr(pki, which)
    return engine(
        name,
        host_id=f"host-{name}",
        tls_cert_chain=c.cert.read_bytes(),
        tls_key=c.key.read_bytes(),
        tls_ca=(ca or pki.ca).read_bytes(),
        **kw,
    )


async def test_tls_python_to_python_both_ways(pki):
    a = Driver(tls_engine("py-tls-a", pki, "a"))
    b = Driver(tls_engine("py-tls-b", pki, "b"))
    listener = await b.listen()
    try:
        dialed = await a.connect(listener.address)
        accepted = await listener.accept(10)
        big = np.random.default_rng(5).integers(0, 256, 3 * MIB + 17, dtype=np.uint8)
        await request(dialed, "t.X", {"d": big})
        _, body = await expect(accepted, "t.X")
        assert np.array_equal(np.frombuffer(body["d"], dtype=np.uint8), big)
        for i in range(200):
            await request(accepted, "t.N", {"i": i})
        assert [(await expect(dialed, "t.N"))[1]["i"] for _ in range(200)] == list(range(200))
    finally:
        listener.close()
        a.close()
        b.close()


async def test_tls_to_a_rust_node(spawn_rust, pki):
    c = pki.b
    flags = ["--tls-cert", str(c.cert), "--tls-key", str(c.key), "--tls-ca", str(pki.ca)]
    rust = await spawn_rust("rs-eng-tls", "--host-id", "rust-host", *flags)
    driver = Driver(tls_engine("py-eng-tls", pki, "a"))
    try:
        conn = await driver.connect(rust.listen)
        assert conn.peer["name"] == "rs-eng-tls"
        await request(conn, "handoff.demo.SendRequest", {"id": 1, "bytes": 8 * MIB})
        _, body = await expect(conn, "handoff.demo.Payload")
        assert digest(np.frombuffer(body["data"], dtype=np.uint8)) == bytes(body["digest"])
        await request(conn, "handoff.bench.Ping", {"seq": 3, "data": b"over tls"})
        assert (await expect(conn, "handoff.bench.Ping"))[1] == {"seq": 3, "data": b"over tls"}
    finally:
        driver.close()


async def test_tls_refuses_a_certificate_from_another_ca(pki):
    a = Driver(tls_engine("py-tls-foreign", pki, "foreign"))
    b = Driver(tls_engine("py-tls-b2", pki, "b"))
    listener = await b.listen()
    try:
        with pytest.raises((TlsError, PeerClosed)) as caught:
            await a.connect(listener.address, timeout=10)
        assert "TLS" in str(caught.value) or "tls" in str(caught.value), caught.value
        assert await eventually(lambda: listener.failed >= 1)
    finally:
        listener.close()
        a.close()
        b.close()


async def test_tls_checks_the_name_the_dialer_expects(pki):
    a = Driver(tls_engine("py-tls-name-a", pki, "a"))
    b = Driver(tls_engine("py-tls-name-b", pki, "other_name"))
    listener = await b.listen()
    try:
        with pytest.raises(TlsError, match="does not name"):
            await a.connect(listener.address, timeout=10)
    finally:
        listener.close()
        a.close()
        b.close()


async def test_tls_required_a_plain_peer_is_told_so(pki):
    b = Driver(tls_engine("py-tls-required", pki, "b"))
    plain = Driver(engine("py-plain", host_id="host-plain"))
    listener = await b.listen()
    try:
        with pytest.raises(TlsError) as caught:
            await plain.connect(listener.address, timeout=10)
        assert caught.value.code == "tls-required" and "--tls-cert" in str(caught.value)
    finally:
        listener.close()
        b.close()
        plain.close()


async def test_tls_a_plain_node_refuses_a_tls_dialer_with_a_hint(pki):
    a = Driver(tls_engine("py-tls-dialer", pki, "a"))
    plain = Driver(engine("py-plain-listener", host_id="host-plain2"))
    listener = await plain.listen()
    try:
        with pytest.raises((TlsError, PeerClosed)):
            await a.connect(listener.address, timeout=10)
        assert await eventually(lambda: listener.failed >= 1)
    finally:
        listener.close()
        a.close()
        plain.close()


# ---------------------------------------------------------------- tickets (spec §7.5–§7.9)


async def test_a_ticket_from_rust_is_redeemed_checked_and_released(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-eng-owner", "--host-id", "owner-host", "--ticket-threshold", "65536")
    driver = Driver(engine("py-eng-holder", host_id="holder-host", capabilities=["inline", "ticket", "xxh3"]))
    try:
        conn = await driver.connect(rust.listen)
        await request(conn, "handoff.demo.SendRequest", {"id": 1, "bytes": 4 * MIB})
        got, body = await expect(conn, "handoff.demo.Payload")
        ticket = body["data"]
        assert isinstance(ticket, Ticket) and len(ticket) == 4 * MIB and ticket.owner == conn.peer["node_id"]
        assert (await rust_stats(rust.listen))["ticket_leases"]["count"] >= 1
        data = await driver.redeem(ticket)
        assert digest(np.frombuffer(data, dtype=np.uint8)) == bytes(body["digest"])
        part = await driver.read(ticket, 100, 50)
        assert bytes(part) == bytes(data)[100:150]
        # Our last handle gone: the owner hears `unlease` and ends the lease.
        del ticket, body, got
        assert await eventually(lambda: _count(rust_stats(rust.listen), "ticket_leases"), timeout=10) == "zero"
    finally:
        driver.close()


async def _count(stats, key: str) -> str:
    return "zero" if (await stats)[key]["count"] == 0 else ""


async def test_python_sends_tickets_to_rust_and_the_leases_end(spawn_rust):
    rust = await spawn_rust("rs-eng-redeemer", "--host-id", "rust-host")
    eng = engine("py-eng-issuer", host_id="py-host", capabilities=["inline", "ticket"], ticket_threshold=65536)
    driver = Driver(eng)
    try:
        conn = await driver.connect(rust.listen)
        out = np.random.default_rng(11).integers(0, 256, 8 * MIB, dtype=np.uint8)
        await request(
            conn, "handoff.demo.Payload", {"id": 4, "digest": digest(out), "data": out, "prepare_seconds": 0.0}
        )
        assert eng.ticket_leases[0] >= 1, "the frame went as a ticket"
        _, receipt = await expect(conn, "handoff.demo.Receipt")
        assert receipt["verified"] is True and receipt["bytes"] == 8 * MIB
        assert await eventually(lambda: eng.ticket_leases == (0, 0), timeout=10), eng.ticket_leases
    finally:
        driver.close()


async def test_a_send_that_fails_part_way_ends_the_leases_it_issued():
    """A message whose second frame finds no room in the lease table is not sent, and the
    lease its first frame took ends with it (as the tokio driver's send does): a failed
    send leaves no lease alive until its deadline, for the peer or anyone."""
    a, b, ab, ba, listener = await _pair(a_kw={"ticket_threshold": 1024, "max_lease_bytes": 3 * 1024})
    try:
        frame = bytes(2 * 1024)
        with pytest.raises(CapReached, match="ticket leases"):
            ab.send_now("t.T", *encoded({"one": frame, "two": frame}))
        assert a.engine.ticket_leases == (0, 0), "the first frame's lease was withdrawn"
        # The table has room again: one such frame goes, as a ticket.
        ab.send_now("t.T", *encoded({"one": frame}))
        assert a.engine.ticket_leases[0] == 1
    finally:
        listener.close()
        a.close()
        b.close()


async def test_python_tickets_forwarded_to_a_third_node_and_refused_when_expired():
    owner = Driver(engine("py-t-owner", host_id="h-owner", capabilities=["inline", "ticket"], lease_ttl=1.0))
    holder = Driver(engine("py-t-holder", host_id="h-holder", capabilities=["inline", "ticket"]))
    third = Driver(engine("py-t-third", host_id="h-third", capabilities=["inline", "ticket"]))
    owner_l, holder_l, third_l = await owner.listen(), await holder.listen(), await third.listen()
    try:
        to_holder = await owner.connect(holder_l.address)
        data = np.arange(MIB, dtype=np.uint8)
        await to_holder.send("t.T", *encoded({"d": data}), by_ticket=True)
        from_owner = await holder_l.accept(10)
        got, body = await expect(from_owner, "t.T")
        ticket = body["d"]
        assert isinstance(ticket, Ticket) and ticket.holder == holder.engine.node_id
        # The holder passes it on: the owner registers the third node, whose claim travels.
        to_third = await holder.connect(third_l.address)
        assert to_third.conn.plan_held(ticket) == "forward"
        await to_third.send("t.T", *encoded({"d": ticket}))
        from_holder = await third_l.accept(10)
        _, body3 = await expect(from_holder, "t.T")
        forwarded = body3["d"]
        assert forwarded.holder == third.engine.node_id and forwarded.lease == ticket.lease
        # The third node pulls straight from the owner (it is not connected to it: no address
        # in the claim, so through a connection of its own to the owner's listener).
        await third.connect(owner_l.address)
        assert np.array_equal(np.frombuffer(await third.redeem(forwarded), dtype=np.uint8), data)
        # A token is the node's own: the holder's token from the third node is refused.
        stolen = ticket.forwarded(bytes(32), third.engine.node_id)
        with pytest.raises(TicketRefused):
            await third.redeem(stolen)
        # Past the ttl, with nobody renewing, the holds expire and the lease ends.
        del got, body, body3, forwarded, stolen
        await asyncio.sleep(1.5)
        owner._expire()
        with pytest.raises(TicketRefused) as caught:
            await holder.redeem(ticket)
        assert caught.value.code in ("unknown-lease", "expired"), caught.value
    finally:
        for d, lst in ((owner, owner_l), (holder, holder_l), (third, third_l)):
            lst.close()
            d.close()


# ------------------------------------------------- what a hostile or stuck peer can do


async def _pair(a_kw=None, b_kw=None):
    """Two drivers connected over TCP: ``(a, b, a's connection, b's connection, listener)``."""
    a = Driver(engine("py-pair-a", host_id="host-pa", capabilities=["inline", "ticket"], **(a_kw or {})))
    b = Driver(engine("py-pair-b", host_id="host-pb", capabilities=["inline", "ticket"], **(b_kw or {})))
    listener = await b.listen()
    ab = await a.connect(listener.address)
    ba = await listener.accept(10)
    return a, b, ab, ba, listener


async def test_a_peer_that_reads_no_answers_stops_being_read():
    """Pull requests from a peer that reads none of the answers: at most ``max_pull_answers``
    (64) answers are queued, then its requests are no longer read (spec §9.1)."""
    a, b, ab, ba, listener = await _pair()
    try:
        await ba.send("t.T", *encoded({"d": bytes(1 << 20)}), by_ticket=True)
        _, body = await expect(ab, "t.T")
        ticket = body["d"]
        a.loop.remove_reader(ab._fd)  # a reads nothing from now on
        ab._reading = False
        for _ in range(20_000):
            ab.conn.request_pull(ticket, 0, len(ticket))
        ab._after()
        await asyncio.sleep(1.0)
        assert 1 <= ba.conn.queued_answers <= 64, ba.conn.queued_answers
        assert not ba.conn.wants_read and not ba._reading
    finally:
        listener.close()
        a.close()
        b.close()


async def test_waiting_for_room_does_not_spin_the_loop():
    a, b, ab, ba, listener = await _pair(b_kw={"max_buffered_bytes_per_peer": 1 << 20})
    try:
        for _ in range(16):
            ab.send_now("t.T", b"\x90", [bytes(256 << 10)])
        assert await eventually(lambda: not ba.conn.wants_read)
        calls = 0
        original = ba._on_readable

        def counted():
            nonlocal calls
            calls += 1
            original()

        ba._on_readable = counted
        cpu = time.process_time()
        await asyncio.sleep(1.0)
        assert not ba._reading and time.process_time() - cpu < 0.5
        # Taking a message gives room back: the connection reads on, in order.
        for _ in range(16):
            assert (await ba.recv(10)).type_name == "t.T"
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_peer_that_reads_nothing_times_out_and_only_it():
    a, b, ab, ba, listener = await _pair(b_kw={"write_timeout": 0.5})
    other = Driver(engine("py-other", host_id="host-other"))
    try:
        o = await other.connect(listener.address)
        bo = await listener.accept(10)
        a.loop.remove_reader(ab._fd)  # a reads nothing
        ab._reading = False
        ba.send_now("t.Big", b"\x90", [bytes(64 << 20)])
        with pytest.raises(PeerClosed, match="no progress"):
            await ba.recv(10)
        assert ba.conn.fileno() == -1, "the connection was closed"
        # Another peer of the same node is served as before.
        await request(o, "t.Ping", {"n": 1})
        assert (await expect(bo, "t.Ping"))[1] == {"n": 1}
    finally:
        listener.close()
        for d in (a, b, other):
            d.close()


async def test_a_send_to_a_peer_that_reads_nothing_waits_and_the_queue_stays_one_message():
    """``send`` returns once its message is written: to a peer that reads nothing, a sender
    waits (then fails with the write timeout) instead of queueing without end. The first
    version returned at once, and a loop of sends to a deaf peer grew the write queue until
    the process was killed for memory."""
    a, b, ab, ba, listener = await _pair(b_kw={"write_timeout": 0.5})
    try:
        a.loop.remove_reader(ab._fd)  # a reads nothing
        ab._reading = False
        sent = 0
        started = time.monotonic()
        with pytest.raises(PeerClosed, match="no progress"):
            while True:
                await ba.send("t.Big", b"\x90", [bytes(1 << 20)])
                sent += 1
                assert ba.conn.queued - ba.conn.written <= 1 << 20, "more than one message queued"
        # The socket buffers took a few; the rest waited, and the stall failed them.
        assert sent < 64 and time.monotonic() - started < 10
    finally:
        listener.close()
        a.close()
        b.close()


async def test_an_admission_check_that_fails_refuses_the_peer_only():
    driver = Driver(engine("py-admit-raises"))
    listener = await driver.listen(admit=lambda peer: peer["no such key"])
    dialer = Driver(engine("py-admit-dialer"))
    errors = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    try:
        with pytest.raises(PeerRefused, match="admission check failed"):
            await dialer.connect(listener.address, timeout=10)
        assert not errors, errors
    finally:
        listener.close()
        driver.close()
        dialer.close()


async def test_a_second_node_with_a_connected_id_from_another_process_is_refused():
    from handoff.node import Node

    victim = Driver(engine("py-victim"))
    listener = await victim.listen()
    legit = Driver(engine("py-legit"))
    try:
        await legit.connect(listener.address)
        first = await listener.accept(10)
        impostor = Node("impostor", secret=SECRET, shm=False, engine=False)  # (its ids set by hand)
        impostor.node_id, impostor.process_id = legit.engine.node_id, "another-process"
        await impostor.start()
        try:
            with pytest.raises(PeerRefused, match="already connected"):
                await impostor.connect(listener.address)
        finally:
            await impostor.close()
        assert victim.connection_to(legit.engine.node_id) is first
    finally:
        listener.close()
        victim.close()
        legit.close()


async def test_a_ticket_address_this_node_must_not_dial(tmp_path):
    """A peer's ticket naming a Unix socket (or this node's own address) is not dialed."""
    trap = socket.socket(socket.AF_UNIX)
    trap.bind(str(tmp_path / "trap.sock"))
    trap.listen()
    trap.setblocking(False)
    owner = Driver(engine("py-trap-owner", host_id="host-trap", listen=f"unix://{tmp_path}/trap.sock"))
    victim = Driver(engine("py-trap-victim", host_id="host-victim", capabilities=["inline", "ticket"]))
    listener = await victim.listen()
    try:
        c = await owner.connect(listener.address)
        vc = await listener.accept(10)
        await c.send("t.T", b"\x90", [bytes(4096)], by_ticket=True)
        ticket = (await vc.recv(10)).frames[0]
        c.close()
        await asyncio.sleep(0.2)
        with pytest.raises(OwnerLost, match="tcp://"):
            await victim.redeem(ticket)
        with pytest.raises(BlockingIOError):
            trap.accept()
    finally:
        trap.close()
        listener.close()
        owner.close()
        victim.close()


async def test_a_tcp_timeout_sets_keepalive_as_the_engine_plans_it():
    """A peer whose host died is noticed within ``tcp_timeout``: keepalive probes and
    ``TCP_USER_TIMEOUT`` (the plan Dask's TCP comm uses; the kernel does the rest)."""
    with pytest.raises(ValueError, match="at least 11 s"):
        engine("py-keepalive-short", tcp_timeout=5)
    a, b, ab, ba, listener = await _pair(a_kw={"tcp_timeout": 30})
    try:
        s = socket.socket(fileno=os.dup(ab.conn.fileno()))
        try:
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            got = [
                s.getsockopt(socket.IPPROTO_TCP, o)
                for o in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)
            ]
            assert got == [10, 2, 10]
            assert s.getsockopt(socket.IPPROTO_TCP, 18) == 30_000  # TCP_USER_TIMEOUT
        finally:
            s.close()
        other = socket.socket(fileno=os.dup(ba.conn.fileno()))
        try:
            assert other.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0, "only where asked"
        finally:
            other.close()
    finally:
        listener.close()
        a.close()
        b.close()


async def test_eager_redemption_delivers_bytes_in_order_and_ends_the_holds(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-eng-eager", "--host-id", "owner-host2", "--ticket-threshold", "65536")
    eng = engine("py-eng-eager", host_id="holder-host2", capabilities=["inline", "ticket", "xxh3"])
    driver = Driver(eng, redeem="eager")
    try:
        conn = await driver.connect(rust.listen)
        await request(conn, "handoff.demo.SendRequest", {"id": 1, "bytes": 4 * MIB})
        await request(conn, "handoff.bench.Ping", {"seq": 2, "data": b"after"})
        got, body = await expect(conn, "handoff.demo.Payload")
        assert isinstance(body["data"], Frame) and len(body["data"]) == 4 * MIB
        assert digest(np.frombuffer(body["data"], dtype=np.uint8)) == bytes(body["digest"])
        # The message behind it waited for the redemption: order is kept.
        assert (await expect(conn, "handoff.bench.Ping"))[1] == {"seq": 2, "data": b"after"}
        # Redeemed and dropped: the owner's lease ends.
        assert await eventually(lambda: _count(rust_stats(rust.listen), "ticket_leases"), timeout=10) == "zero"
    finally:
        driver.close()


async def test_a_failed_eager_redemption_is_that_message_s_error():
    owner = Driver(engine("py-eager-owner", host_id="h-eo", capabilities=["inline", "ticket"]))
    holder = Driver(engine("py-eager-holder", host_id="h-eh", capabilities=["inline", "ticket"]), redeem="eager")
    listener = await holder.listen()
    try:
        c = await owner.connect(listener.address)
        h = await listener.accept(10)
        await c.send("t.T", b"\x90", [bytes(MIB)], by_ticket=True)
        c.close()  # the owner is gone before the holder pulls (no address in the claim)
        with pytest.raises(OwnerLost):
            await h.recv(10)
    finally:
        listener.close()
        owner.close()
        holder.close()


async def test_a_holder_s_holds_end_with_its_last_connection():
    """Spec §7.7: the owner ends the holds of a holder whose last connection closed (not
    only at their ttl), and a send waiting for room in its lease table goes on."""
    a, b, ab, ba, listener = await _pair(b_kw={"lease_ttl": 60.0})
    try:
        await ba.send("t.T", *encoded({"d": bytes(MIB)}), by_ticket=True)
        _, body = await expect(ab, "t.T")
        kept = body["d"]
        assert b.engine.ticket_leases == (1, MIB)
        ab.close()  # the holder keeps its ticket, and goes
        assert await eventually(lambda: b.engine.ticket_leases == (0, 0), timeout=5), b.engine.ticket_leases
        del kept
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_pull_answered_with_a_token_is_the_owner_s_error():
    a, b, ab, ba, listener = await _pair()
    try:
        await ba.send("t.T", *encoded({"d": bytes(4096)}), by_ticket=True)
        _, body = await expect(ab, "t.T")
        ticket = body["d"]
        pulling = asyncio.create_task(ab._pull(ticket, 0, 4096, False))
        await asyncio.sleep(0)
        (req,) = list(ab._requests)
        # What the engine hands on when the owner answers the pull with a forward's token.
        ab._handle([("answer", req, "token", bytes(32))])
        with pytest.raises(OwnerLost, match="answered a pull with a token"):
            await pulling
    finally:
        listener.close()
        a.close()
        b.close()


async def test_the_driver_reports_what_the_node_holds(tmp_path):
    a = Driver(engine("py-stats-a", max_shm_lease_bytes_per_peer=64 * MIB))
    b = Driver(engine("py-stats-b"))
    listener = await b.listen(f"unix://{tmp_path}/stats.sock")
    try:
        ab = await a.connect(listener.address)
        ba = await listener.accept(10)
        await request(ab, "t.Big", {"d": np.zeros(2 * MIB, dtype=np.uint8)})
        got = await ba.recv(10)
        s = stats(a)
        assert s["node"] == "py-stats-a" and s["peers"] == [["py-stats-b", "shm"]] and s["peers_total"] == 1
        assert s["shm_leases"] == {"count": 1, "bytes": 2 * MIB}, s
        assert stats(b)["mapped_bytes"] >= 2 * MIB
        del got
        assert await eventually(lambda: stats(a)["shm_leases"]["count"] == 0)
    finally:
        listener.close()
        a.close()
        b.close()


async def test_a_relay_that_joins_a_node_to_itself_is_refused():
    """An attacker without the secret relays node A's own dial into A's own listener (two
    connections of one node): A must not take itself for a peer (spec §5.8)."""
    a = Driver(engine("py-relay-self"))
    listener = await a.listen()
    host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
    relay = socket.socket()
    relay.bind(("127.0.0.1", 0))
    relay.listen(1)
    relay.setblocking(False)
    loop = asyncio.get_running_loop()

    async def pipe(src, dst):
        try:
            while data := await loop.sock_recv(src, 65536):
                await loop.sock_sendall(dst, data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    async def run_relay():
        inbound, _ = await loop.sock_accept(relay)
        outbound = socket.create_connection((host, int(port)))
        inbound.setblocking(False)
        outbound.setblocking(False)
        await asyncio.gather(pipe(inbound, outbound), pipe(outbound, inbound))
        inbound.close()
        outbound.close()

    relaying = asyncio.create_task(run_relay())
    try:
        with pytest.raises((ConnectionFailed, PeerRefused, PeerClosed)):
            await a.connect(f"tcp://127.0.0.1:{relay.getsockname()[1]}", timeout=10)
        assert a.connection_to(a.engine.node_id) is None
        assert await eventually(lambda: listener.failed >= 1)
    finally:
        relaying.cancel()
        relay.close()
        listener.close()
        a.close()


async def test_tls_13_only_and_a_bad_minimum_is_refused_by_name(pki):
    """``tls_min_version="1.3"`` (Dask's ``tls.min-version: 1.3``, kept by the engine's
    rustls): such a node still talks to a default one (TLS 1.3); a version it does not know
    is refused at construction, by name."""
    a = Driver(tls_engine("py-tls13-a", pki, "a", tls_min_version="1.3"))
    b = Driver(tls_engine("py-tls13-b", pki, "b"))
    listener = await b.listen()
    try:
        conn = await a.connect(listener.address, timeout=10)
        assert conn.conn.tls
    finally:
        listener.close()
        a.close()
        b.close()
    with pytest.raises(ValueError, match="tls_min_version"):
        tls_engine("py-tls11", pki, "a", tls_min_version="1.1")


@pytest.mark.parametrize("how", ["write", "map"])
async def test_a_frame_copied_into_shared_memory_arrives_whole_either_way(monkeypatch, how):
    """``HANDOFF_SHM_COPY``: ``write`` (the default; the sender never maps its copy) or
    ``map``; a frame copied either way arrives as it was sent."""
    from handoff import Node

    monkeypatch.setenv("HANDOFF_SHM_COPY", how)
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", engine=True) as rx,
        Node("tx", secret="k", engine=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr)
        sent = np.random.default_rng(7).integers(0, 255, 5 * MIB + 3, dtype=np.uint8)
        await p.send("t.A", {"x": sent})
        env = await rx.recv(10)
        assert env.frames[0].kind == "shm"
        assert np.array_equal(np.asarray(env.body["x"]), sent)


def test_an_unknown_way_to_copy_into_shared_memory_is_refused_with_the_ways_there_are(monkeypatch):
    monkeypatch.setenv("HANDOFF_SHM_COPY", "mmap")
    with pytest.raises(ValueError, match=r"HANDOFF_SHM_COPY=\"mmap\": expected `write`.*or `map`"):
        engine("x")


def test_a_segment_without_the_seals_receivers_require_is_not_sent_as_one():
    """Spec §7.2: a receiver refuses a segment that could shrink, so the engine refuses to
    pass one (no node sends what a conforming peer must refuse)."""
    import mmap

    from handoff import _native

    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 20)
        with mmap.mmap(fd, 1 << 20) as m:
            view = memoryview(m)
            with pytest.raises(ValueError, match="lacks the seals a receiver requires"):
                _native.SegmentFrame(view, fd)
            view.release()
    finally:
        os.close(fd)


async def test_a_pooled_shm_buffer_is_a_segment_of_the_engines_pool_and_freezes_only_without_views():
    """``ShmBuffer(pooled=True)`` takes a segment of the engine's pool (the process keeps no
    pool of its own); it will not freeze while a writable view of it is held (a write
    through it would reach the peers the frame goes to), stays writable after that
    refusal, and goes back to the pool once its frame is gone."""
    import gc

    import handoff._native as native
    from handoff import ShmBuffer

    before = native.segment_pool_stats()
    buf = ShmBuffer(3 * MIB, pooled=True)
    assert native.segment_pool_stats()["busy_segments"] == before["busy_segments"] + 1
    held = np.frombuffer(buf.view, dtype=np.uint8)
    held[:4] = 7
    with pytest.raises(BufferError, match="views of it are held"):
        buf.freeze()
    buf.view[4] = 8  # still the application's to write
    del held
    frozen = buf.freeze()
    assert frozen.view.readonly and bytes(frozen.view[:5]) == bytes([7, 7, 7, 7, 8])
    with pytest.raises(TypeError):
        frozen.view[0:1] = b"x"
    with pytest.raises(ValueError, match="frozen already"):
        buf.freeze()
    del frozen, buf
    gc.collect()
    assert native.segment_pool_stats()["busy_segments"] == before["busy_segments"]


@pytest.mark.parametrize("channel", ["shm", "tcp"])
async def test_an_application_segment_goes_as_itself_on_shm_and_as_its_bytes_on_tcp(channel):
    import gc

    from handoff import Node, ShmBuffer

    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", engine=True) as rx,
        Node("tx", secret="k", engine=True) as tx,
    ):
        p = await tx.connect(rx.listen_addr, channel=channel)
        busy = tx.segment_pool_stats()["busy_segments"]
        buf = ShmBuffer(2 * MIB, pooled=True)
        buf.view[:] = bytes(range(256)) * (2 * MIB // 256)
        frozen = buf.freeze()
        inode = inode_of(frozen)
        await p.send("t.A", {"x": frozen})
        env = await rx.recv(10)
        x = env.body["x"]
        assert bytes(x[:256]) == bytes(range(256)) and len(x) == 2 * MIB
        if channel == "shm":
            # The receiver maps the application's own segment: no copy was made.
            seg = env.segment_of(x)
            assert (seg["device"], seg["inode"]) == inode
        else:
            assert env.frames[0].kind == "inline"
        # Every hold the send took on the application's pooled segment ends (the lease, or
        # the bytes queued inline): it goes back to the pool once the application lets go.
        del x, env, frozen, buf
        gc.collect()
        assert await eventually(lambda: tx.segment_pool_stats()["busy_segments"] == busy)


async def test_a_closed_node_gives_its_wake_pipe_back_before_any_collection():
    """Dask makes a connector node whenever the last comm of the previous one closed: each
    closed node's engine gives back its wake pipe at once, not when a garbage collection
    frees the connections and tickets that keep its state alive (with collection off here,
    50 nodes left up to 100 descriptors open before)."""
    import gc

    from handoff import Node

    async with Node("pipes-a", secret=SECRET, listen="127.0.0.1:0") as a:
        before = open_fds()
        gc.disable()
        try:
            for i in range(50):
                b = Node(f"pipes-b{i}", secret=SECRET)
                peer = await b.connect(a.listen_addr)
                await peer.send("t", {"i": i})
                await b.close()
                del b, peer
            await asyncio.sleep(0.3)
            assert open_fds() <= before + 4, f"{open_fds() - before} descriptors more than before"
        finally:
            gc.enable()

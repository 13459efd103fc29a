"""The Python node against itself and against peers that misbehave on purpose."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import socket
import struct

import numpy as np
import pytest
from handoff import (
    AuthenticationError,
    Buffer,
    HandoffError,
    Node,
    OwnerLost,
    ShmBuffer,
    Ticket,
    TicketCorrupt,
    TicketRefused,
    WireError,
    as_numpy,
)
from handoff_pure import wire
from handoff_pure.shm import sealed_copy
from helpers import RawPeer, eventually, inode_of, mapping_of

MIB = 1 << 20


def nodes(*names, **kw):
    return [Node(n, secret=b"s3cret", listen="127.0.0.1:0", **kw) for n in names]


async def test_channels_by_host_id():
    async with (
        Node("a", secret="k", listen="127.0.0.1:0") as a,
        Node("b", secret="k", listen="127.0.0.1:0") as b,
        Node("c", secret="k", host_id="elsewhere") as c,
    ):
        assert (await a.connect(b.listen_addr)).channel == "shm"
        peer = await b.wait_for_peer("a", channel="shm")
        assert peer.locality == "same-process" and peer.lang == "python"
        # A later connection from the same node replaces the earlier one.
        assert (await a.connect(b.listen_addr, channel="tcp")).channel == "tcp"
        assert (await b.wait_for_peer("a", channel="tcp")).locality == "same-process"
        remote = await c.connect(b.listen_addr)
        assert (remote.channel, remote.locality) == ("tcp", "remote")
        with pytest.raises(Exception, match="another host"):
            await c.connect(b.listen_addr, channel="shm")
        direct = await c.connect(b.unix_addr)  # a unix:// address, whatever the host id says
        assert direct.channel == "shm"


@pytest.mark.pure_only("reads the send buffer of the pure peer's transport")
async def test_a_unix_connection_asks_for_a_send_buffer_that_holds_a_large_frame():
    """Linux's default Unix send buffer (about 208 KiB) held less than one frame of a few
    hundred KiB, which then crossed in several turns of both event loops; both ends of a
    Unix connection ask for :data:`UNIX_SEND_BUFFER` (the kernel caps it at wmem_max)."""
    from handoff_pure.transport import UNIX_SEND_BUFFER

    with open("/proc/sys/net/core/wmem_max") as f:
        cap = int(f.read())
    plain = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    default = plain.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    plain.close()
    want = min(UNIX_SEND_BUFFER, cap)
    if want * 2 <= default:
        pytest.skip(f"this kernel's default Unix send buffer ({default}) is already larger")
    a, b = nodes("a", "b")
    async with a, b:
        pa = await a.connect(b.listen_addr)
        pb = await b.wait_for_peer("a", channel="shm")
        for p in (pa, pb):
            assert p.channel == "shm"
            # Linux reports twice what was set (its bookkeeping overhead).
            assert p.transport.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 2 * want > default


@pytest.mark.pure_only("finds the mapping behind a view with the pure peer's mapping table")
async def test_shm_frames_are_zero_copy_and_released():
    a, b = nodes("a", "b")
    async with a, b:
        peer = await a.connect(b.listen_addr)
        arr = np.arange(MIB, dtype=np.float32)  # 4 MiB
        await peer.send("t.Array", {"x": arr, "small": Buffer(b"abc"), "seq": 1})
        env = await b.recv(5)
        x = env.body["x"]
        assert mapping_of(x) is not None and x.readonly
        assert [f.kind for f in env.frames] == ["shm", "inline"]
        assert env.segment_of(x)["sealed"] is True
        got = as_numpy(x, dtype=np.float32)
        assert np.array_equal(got, arr)
        assert a.shm_leases() == {"count": 1, "bytes": 4 * MIB}
        # A numpy view keeps the frame (and the lease) alive after the envelope is released.
        env.release()
        await asyncio.sleep(0.05)
        assert a.shm_leases()["count"] == 1
        del got, x, env
        gc.collect()
        assert await eventually(lambda: a.shm_leases()["count"] == 0)


async def test_shm_buffer_is_sent_without_a_copy():
    a, b = nodes("a", "b")
    async with a, b:
        peer = await a.connect(b.listen_addr)
        buf = ShmBuffer(MIB)
        buf.view[:5] = b"hello"
        frozen = buf.freeze()
        await peer.send("t.Blob", {"data": frozen})
        with await b.recv(5) as env:
            seg = env.segment_of(env.body["data"])
            assert (seg["device"], seg["inode"]) == inode_of(frozen)
            assert bytes(env.body["data"][:5]) == b"hello"
        assert await eventually(lambda: a.shm_leases()["count"] == 0)


async def test_small_buffers_and_tcp_go_inline():
    a, b = nodes("a", "b")
    async with a, b:
        shm = await a.connect(b.listen_addr)
        tcp = await a.connect(b.listen_addr, channel="tcp")
        await shm.send("t.X", {"d": os.urandom(60 * 1024)})  # under the 64 KiB threshold
        await tcp.send("t.X", {"d": os.urandom(MIB), "frozen": sealed_copy(b"abc" * 1000)})
        e1, e2 = await b.recv(5), await b.recv(5)
        assert [f.kind for f in e1.frames] == ["inline"]
        assert [f.kind for f in e2.frames] == ["inline", "inline"]
        assert bytes(e2.body["frozen"]) == b"abc" * 1000


async def test_wrong_secret_between_python_nodes(caplog):
    async with Node("a", secret="one", listen="127.0.0.1:0") as a, Node("b", secret="two") as b:
        with pytest.raises(AuthenticationError, match="secret"):
            await b.connect(a.listen_addr)
        assert await eventually(lambda: "refused connection" in caplog.text and "authentication failed" in caplog.text)
        assert a.peers == [] and b.peers == []


@pytest.mark.parametrize("preamble", [wire.OUR_PREAMBLE, wire.V1_ONLY])
async def test_reflected_challenge_or_hello_is_refused(preamble):
    async with Node("a", secret="k", listen="127.0.0.1:0", accept_v1=True) as a:

        def reflect():
            raw = RawPeer(a.listen_addr)
            raw.send(preamble.encode())
            raw.read_exact(16)
            first_raw, first = raw.read_header()
            assert first.kind == ("hello" if preamble == wire.V1_ONLY else "challenge")
            raw.send(wire.frame_header(first_raw))  # the node's own challenge (or hello), nonce and all
            return raw.expect_error()

        err = await asyncio.to_thread(reflect)
        assert err.code == "handshake" and "nonce" in err.msg


async def test_bad_preamble_gets_an_error_and_the_node_keeps_serving():
    async with Node("a", secret="k", listen="127.0.0.1:0") as a, Node("b", secret="k", host_id="x") as b:

        def http():
            raw = RawPeer(a.listen_addr)
            raw.send(b"GET / HTTP/1.1\r\n\r\n")
            raw.read_exact(16)
            return raw.expect_error()

        assert (await asyncio.to_thread(http)).code == "bad-magic"
        peer = await b.connect(a.listen_addr)
        await peer.send("t.Ping", {"n": 1})
        assert (await a.recv(5)).body == {"n": 1}


@pytest.mark.parametrize("stage", ["challenge", "auth"])
async def test_handshake_headers_are_bounded_by_64_kib(stage):
    """Before the connection is established a header may have 64 KiB, not the general 16 MiB (§5.1)."""
    async with Node("a", secret="k", listen="127.0.0.1:0") as a:

        def oversized(n):
            raw = RawPeer(a.listen_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_exact(16)
            if stage == "auth":
                raw.send(wire.frame_header(raw.challenge()))
                raw.read_header()  # its challenge
            raw.send(struct.pack(">I", n))
            return raw.expect_error()

        err = await asyncio.to_thread(oversized, wire.HANDSHAKE_HEADER_BYTES + 1)
        assert err.code == "header-too-large" and "65536" in err.msg

        # At the limit, the length is accepted (and the header then read as usual).
        def at_limit():
            raw = RawPeer(a.listen_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_exact(16)
            challenge = raw.challenge()
            padded = bytes([challenge[0] + 1]) + challenge[1:] + b"\xa2x-" + b"\xdb" + struct.pack(">I", 0)
            pad = wire.HANDSHAKE_HEADER_BYTES - len(padded)
            padded = padded[:-4] + struct.pack(">I", pad) + b"." * pad
            assert len(padded) == wire.HANDSHAKE_HEADER_BYTES
            raw.send(wire.frame_header(padded))
            theirs, _ = raw.read_header()  # its challenge, sent before it read ours
            # Our proof (version 3, as the dialer) covers the padded challenge as sent: the
            # node's answer shows it read those exact bytes and accepted them.
            preamble = wire.OUR_PREAMBLE.encode()
            transcript = wire.transcript_v3(preamble, preamble, padded, theirs)
            raw.send(wire.encode_message(wire.Auth(wire.dialer_proof(b"k", transcript))))
            _, h = raw.read_header()
            return h

        assert isinstance(await asyncio.to_thread(at_limit), wire.Auth)  # ours was read and accepted


@pytest.mark.parametrize(
    "data, code",
    [
        (b"\x7f\xff\xff\xff", "header-too-large"),
        (b"\x00\x00\x00\x00", "malformed-header"),
        (wire.encode_message(wire.Release([1])), "handshake"),  # no release on TCP
        (wire.encode_message(wire.Hello("n", "a", "h", 1, "p", "l", "i", 1, [], bytes(32))), "handshake"),
        (wire.encode_message(wire.Challenge(2, bytes(32))), "handshake"),  # handshake kinds after it
        (wire.encode_message(wire.Ident("n", "a", "h", 1, "p", "l", "i", ["inline"])), "handshake"),
        (wire.encode_message(wire.Msg("t.Unknown", b"\x80", [])), "unknown-type"),
        (wire.encode_message(wire.Msg("t.Known", b"\x80", [wire.Shm(1, 0, 1, 1)])), "unsupported-descriptor"),
        (wire.encode_message(wire.Msg("t.Known", b"\x80", [wire.Inline(10)])) + b"abc", "truncated"),
    ],
)
async def test_bad_input_closes_that_connection_only(data, code):
    async with (
        Node("a", secret="k", listen="127.0.0.1:0", types=["t.Known"]) as a,
        Node("b", secret="k", host_id="x") as b,
    ):
        good = await b.connect(a.listen_addr)

        def misbehave():
            raw = RawPeer(a.listen_addr)
            raw.handshake(b"k")
            raw.send(data)
            if code == "truncated":
                raw.sock.shutdown(socket.SHUT_WR)
            return raw.expect_error()

        err = await asyncio.to_thread(misbehave)
        assert err.code == code
        await good.send("t.Known", {"still": "served"})
        assert (await a.recv(5)).body == {"still": "served"}


async def test_bad_body_reaches_the_application_and_the_connection_stays():
    async with Node("a", secret="k", listen="127.0.0.1:0") as a:

        def send():
            raw = RawPeer(a.listen_addr)
            raw.handshake(b"k")
            body = b"\x91\xd6\x01\x00\x00\x00\x03"  # refers to frame 3 of 1
            raw.send(wire.encode_message(wire.Msg("t.X", body, [wire.Inline(1)]), [b"z"]))
            raw.send(wire.encode_message(wire.Msg("t.X", b"\x01", [])))
            return raw

        raw = await asyncio.to_thread(send)
        env = await a.recv(5)
        with pytest.raises(WireError) as e:
            _ = env.body
        assert e.value.code == "bad-frame-ref"
        assert (await a.recv(5)).body == 1
        raw.close()


def _memfd(size: int, fixed: bool = True) -> int:
    """A memfd of ``size`` bytes, sealed against shrinking and growing unless ``fixed`` is false."""
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if fixed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


@pytest.mark.parametrize("case", ["missing", "size", "seals", "stray"])
async def test_bad_shm(case):
    async with Node("a", secret="k", listen="127.0.0.1:0") as a:

        def misbehave():
            raw = RawPeer(a.unix_addr)
            raw.handshake(b"k", host=a.host_id)
            if case == "missing":
                raw.send(wire.encode_message(wire.Msg("t", b"\x80", [wire.Shm(4096, 0, 4096, 1)])))
            elif case == "size":
                fd = _memfd(8192)
                raw.send(wire.encode_message(wire.Msg("t", b"\x80", [wire.Shm(4096, 0, 4096, 1)])), [fd])
            elif case == "seals":
                fd = _memfd(4096)
                raw.send(wire.encode_message(wire.Msg("t", b"\x80", [wire.Shm(4096, 0, 4096, 1, sealed=True)])), [fd])
            else:
                fd = _memfd(4096)
                raw.send(wire.encode_message(wire.Msg("t", b"\x80", [])), [fd])
            return raw.expect_error()

        err = await asyncio.to_thread(misbehave)
        assert err.code == "bad-shm", err


async def test_raw_shm_frame_is_received_and_released():
    async with Node("a", secret="k", listen="127.0.0.1:0") as a:
        fd = _memfd(8192)
        os.pwrite(fd, b"window!", 4096)

        def send():
            raw = RawPeer(a.unix_addr)
            raw.handshake(b"k", host=a.host_id)
            raw.send(
                wire.encode_message(wire.Msg("t", b"\xd6\x01\x00\x00\x00\x00", [wire.Shm(7, 4096, 8192, 42)])), [fd]
            )
            return raw

        raw = await asyncio.to_thread(send)
        env = await a.recv(5)
        assert bytes(env.body) == b"window!" and env.frames[0].lease == 42
        env.release()
        del env
        _, release = await asyncio.to_thread(raw.read_header)
        assert release == wire.Release([42])
        raw.close()


# ---------------------------------------------------------------- tickets between Python nodes


async def test_tickets_eager_and_lazy():
    a, b = nodes("a", "b")
    lazy = Node("lazy", secret=b"s3cret", redeem="lazy")
    async with a, b, lazy:
        data = os.urandom(3 * MIB)
        peer = await b.connect(a.listen_addr, channel="tcp")
        await a.wait_for_peer("b")
        await a.peer("b").send("t.X", {"data": data}, by_ticket=True)
        with await b.recv(5) as env:
            assert env.frames[0].kind == "ticket" and bytes(env.body["data"]) == data
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)

        lp = await lazy.connect(a.listen_addr, channel="tcp")
        await a.wait_for_peer("lazy")
        await a.peer("lazy").send("t.X", {"data": data}, by_ticket=True)
        env = await lazy.recv(5)
        ticket = env.body["data"]
        assert isinstance(ticket, Ticket) and ticket.owner == a.node_id
        assert bytes(await ticket.read(100, 10)) == data[100:110]
        with pytest.raises(TicketRefused) as e:
            await ticket.read(len(data) - 1, 2)
        assert e.value.code == "out-of-range" and e.value.lease == ticket.lease and "a" in str(e.value)
        assert bytes(await ticket.redeem()) == data
        await ticket.renew()
        ticket.release()
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)
        # A released ticket cannot be used; a replayed token after its lease ended is refused.
        with pytest.raises(HandoffError, match="released"):
            await ticket.read(0, 1)
        fresh = Ticket(lazy, ticket.desc, "a")
        with pytest.raises(TicketRefused) as e:
            await fresh.read(0, 1)
        assert e.value.code == "unknown-lease"
        del peer, lp


async def test_ticket_hold_expires():
    a = Node("owner", secret=b"s", listen="127.0.0.1:0", lease_ttl=0.2)
    b = Node("holder", secret=b"s", redeem="lazy")
    async with a, b:
        await b.connect(a.listen_addr, channel="tcp")
        await (await a.wait_for_peer("holder")).send("t.X", {"d": Buffer(b"x" * 100)}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        await asyncio.sleep(0.6)
        with pytest.raises(TicketRefused) as e:
            await ticket.redeem()
        assert e.value.code in ("expired", "unknown-lease")
        assert a.ticket_leases()["expired"] == 1


async def test_forwarding_a_ticket_to_a_third_node():
    a, b, c = nodes("a", "b", "c", redeem="lazy")
    async with a, b, c:
        await b.connect(a.listen_addr, channel="tcp")
        to_c = await b.connect(c.listen_addr, channel="tcp")
        data = os.urandom(MIB)
        await (await a.wait_for_peer("b")).send("t.X", {"d": data}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        await to_c.send("t.Y", {"d": ticket})  # b asks a to add c as a holder, then sends c the ticket
        assert a.ticket_leases()["holders"] == 2
        ticket.release()
        got = (await c.recv(5)).body["d"]
        assert isinstance(got, Ticket) and got.owner == a.node_id and got.desc.token != ticket.desc.token
        # Errors name the owner as the Rust node names it: b is connected to it (its name and
        # its address); c is not yet (its id's first 12 characters and its address).
        assert ticket.owner_label == f"a ({ticket.desc.addr})" and ticket.desc.addr
        assert got.owner_label == f"{a.node_id[:12]} ({got.desc.addr})" and got.desc.addr
        assert bytes(await got.redeem()) == data  # c connects to a's address by itself
        # A refusal and a lost owner name it the same way, on either implementation.
        with pytest.raises(TicketRefused) as e:
            await got.read(len(data) - 1, 2)
        assert f"the owner {got.owner_label} refused" in str(e.value), str(e.value)  # as it was at receipt
        got.release()
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)
        await (await a.wait_for_peer("b")).send("t.X", {"d": data}, by_ticket=True)
        late = (await b.recv(5)).body["d"]
        await a.close()
        assert await eventually(lambda: b.peer_by_id(a.node_id) is None)
        with pytest.raises(OwnerLost) as e:
            await late.redeem()
        assert f"owner {late.owner_label}: " in str(e.value) and late.owner_label.startswith("a ("), str(e.value)


async def test_corrupt_and_lost_tickets():
    a = Node("owner", secret=b"s", listen="127.0.0.1:0")
    b = Node("holder", secret=b"s", redeem="lazy")
    async with b:
        await a.start()
        await b.connect(a.listen_addr, channel="tcp")
        await (await a.wait_for_peer("holder")).send("t.X", {"d": Buffer(b"y" * 4096)}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        assert ticket.desc.xxh3 is not None and ticket.desc.digest is None, "both announce xxh3 (§7.5)"
        # A wrong digest of either kind fails the redemption (each is checked by its own hash).
        for wrong in ({"xxh3": bytes(16)}, {"xxh3": None, "digest": bytes(32)}):
            bad = Ticket(b, wire.TicketDesc(**{**ticket.desc.__dict__, **wrong}), "owner")
            with pytest.raises(TicketCorrupt) as e:
                await bad.redeem()
            assert e.value.lease == ticket.lease and "owner" in str(e.value)
        await a.close()
        with pytest.raises(OwnerLost) as e:
            await ticket.redeem()
        assert e.value.lease == ticket.lease and "owner" in str(e.value)


@pytest.mark.pure_only("sets the ttl inside the owner's Python lease table")
async def test_eager_failure_is_reported_in_place_of_the_body():
    a = Node("owner", secret=b"s", listen="127.0.0.1:0", lease_ttl=0.1)
    async with a:
        # A holder that waits too long: its hold expired before the pull.
        b = Node("slow", secret=b"s")
        async with b:
            await b.connect(a.listen_addr, channel="tcp")
            peer = await a.wait_for_peer("slow")
            a.leases.ttl = 0.0
            await peer.send("t.X", {"d": Buffer(b"z" * 10)}, by_ticket=True)
            env = await b.recv(5)
            with pytest.raises(TicketRefused) as e:
                _ = env.body
            assert e.value.code in ("expired", "unknown-lease") and "owner" in str(e.value)


async def test_a_type_name_that_is_not_a_str_is_refused_before_anything_goes_out():
    """Every receiver refuses a header whose ``t`` is not a str (spec §6.4), so no path sends one."""
    async with (
        Node("a", secret="k", listen="127.0.0.1:0") as a,
        Node("b", secret="k", host_id="other-host") as b,
    ):
        peer = await b.connect(a.listen_addr)
        for name in (5, b"t.Bytes", None):
            for send in (
                peer.send(name, {"x": 1}),
                peer.send(name, {"x": b"y" * 5000}),
                peer.send_packed(name, b"\x80"),
            ):
                with pytest.raises(TypeError, match="type name is a str"):
                    await send
            with pytest.raises(TypeError, match="type name is a str"):
                peer.send_now(name, {"x": 1})
        await peer.send("t.Fine", {"x": 1})
        assert (await a.recv(5)).body == {"x": 1}


async def test_a_peer_on_the_unix_socket_that_claims_another_host_is_named_in_a_warning(caplog):
    """Same host by construction (it reached our Unix socket), another host id by its
    word: the node says so (as the Rust node does), and shares memory all the same."""
    async with Node("warn-a", secret="s", host_id="host-a") as a, Node("warn-b", secret="s", host_id="host-b") as b:
        peer = await b.connect(a.unix_addr)
        assert peer.channel == "shm"
        assert await eventually(lambda: "claims another host id (host-b)" in caplog.text)

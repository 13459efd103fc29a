"""The bounds of a node (spec §5.1, §7.2–§7.9, §9.1, §11.3) in one process: each one
reached on purpose by a raw peer or a second node, and the node still serving others."""

from __future__ import annotations

import asyncio
import fcntl
import os
import secrets
import socket
import struct
import time

import pytest
from handoff import Buffer, HandoffError, Node, OwnerLost, Ticket
from handoff_pure import wire
from handoff.bounds import Bounds
from handoff.codec import encode_body
from handoff.errors import CapReached
from handoff_pure.shm import map_received
from handoff_pure.leases import LeaseTable, Refusal
from helpers import PeerError, RawPeer

MIB = 1 << 20
SECRET = b"k"


def node(name: str, **kw) -> Node:
    return Node(name, secret=SECRET, listen="127.0.0.1:0", **kw)


def memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


async def still_served(a: Node, b: Node) -> None:
    """``b`` (connected to ``a``) still gets a message through to ``a``."""
    peer = await b.connect(a.listen_addr, channel="tcp")
    await peer.send("t.Ping", {"ok": 1})
    env = await a.recv(5)
    assert env.body == {"ok": 1}


# ---------------------------------------------------------------- receiving segments (§7.2)


def test_segments_must_be_sealed_against_shrinking(tmp_path):
    with pytest.raises(wire.WireError) as e:
        map_received(memfd(4096, seals=0), 4096, False)
    assert e.value.code == "bad-shm" and "F_SEAL_SHRINK" in e.value.message
    regular = tmp_path / "file"
    regular.write_bytes(b"x" * 4096)
    with pytest.raises(wire.WireError) as e:
        map_received(os.open(regular, os.O_RDONLY), 4096, False)
    assert e.value.code == "bad-shm" and "seals" in e.value.message
    # Seals are checked before the size: a wrong size of an unsealed file is about its seals.
    with pytest.raises(wire.WireError) as e:
        map_received(memfd(100, seals=0), 4096, False)
    assert "F_SEAL_SHRINK" in e.value.message
    mapping, start, info = map_received(memfd(4096), 4096, False, 10, 5)
    assert (len(mapping), start, info["size"]) == (4096, 10, 4096)


def test_a_small_window_of_a_huge_segment_maps_only_its_pages():
    size = 1 << 40  # sparse: costs nothing until touched
    fd = memfd(size)
    os.pwrite(fd, b"hi", (1 << 39) + 5)
    mapping, start, _ = map_received(fd, size, False, (1 << 39) + 5, 2)
    assert len(mapping) < 2 * mmap_granularity() and mapping[start : start + 2] == b"hi"
    # Close to the whole segment: mapped whole.
    mapping, start, _ = map_received(memfd(3 * MIB), 3 * MIB, False, 4096, MIB)
    assert (len(mapping), start) == (3 * MIB, 4096)


def mmap_granularity() -> int:
    import mmap

    return mmap.ALLOCATIONGRANULARITY


@pytest.mark.parametrize("case", ["unsealed", "regular-file"])
async def test_unsealed_or_regular_file_segments_are_refused(case, tmp_path):
    async with node("a") as a, Node("b", secret=SECRET, host_id="x") as b:

        def misbehave():
            raw = RawPeer(a.unix_addr)
            raw.handshake(SECRET, host=a.host_id)
            if case == "unsealed":
                fd = memfd(4096, seals=0)
            else:
                (tmp_path / "f").write_bytes(b"x" * 4096)
                fd = os.open(tmp_path / "f", os.O_RDWR)
            raw.send(
                wire.encode_message(wire.Msg("t", b"\xd6\x01\x00\x00\x00\x00", [wire.Shm(4096, 0, 4096, 1)])), [fd]
            )
            os.ftruncate(fd, 0)  # would fault a reader that mapped it
            return raw.expect_error()

        err = await asyncio.to_thread(misbehave)
        assert err.code == "bad-shm"
        await still_served(a, b)


# ---------------------------------------------------------------- before the handshake (§5.1)


def raw_preambles(addr: str) -> RawPeer:
    raw = RawPeer(addr)
    raw.send(wire.OUR_PREAMBLE.encode())
    raw.read_exact(16)
    return raw


async def test_handshake_headers_are_limited_to_64_kib():
    async with node("a") as a:

        def big_prefix():
            raw = raw_preambles(a.listen_addr)
            raw.read_header()  # its challenge
            raw.send(struct.pack(">I", 65537))
            return raw.expect_error()

        def big_challenge():
            raw = raw_preambles(a.listen_addr)
            raw.read_header()
            h = wire.packer().pack({"k": "challenge", "v": 2, "nonce": bytes(32), "x-pad": "x" * 70000})
            raw.send(wire.frame_header(h))
            return raw.expect_error()

        assert (await asyncio.to_thread(big_prefix)).code == "header-too-large"
        err = await asyncio.to_thread(big_challenge)
        assert err.code == "header-too-large" and "65536" in err.msg


@pytest.mark.parametrize("version", [1, 2])
async def test_a_peer_without_inline_is_refused(version):
    """v2: on its ident, after the proofs (instead of ``ready``); v1: on its hello (instead of ``auth``)."""
    async with node("a", accept_v1=True) as a:

        def without_inline():
            raw = RawPeer(a.listen_addr)
            with pytest.raises(PeerError) as e:
                raw.handshake(SECRET, version=version, caps=["shm"])
            return e.value.header

        err = await asyncio.to_thread(without_inline)
        assert err.code == "handshake" and "inline" in err.msg


def memfds_held(tag: str) -> int:
    """How many descriptors of this process point at a memfd named ``tag``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{tag}"):
                n += 1
        except OSError:
            pass
    return n


def tagged_memfds(tag: str, n: int) -> list:
    fds = []
    for _ in range(n):
        fd = os.memfd_create(tag, os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4096)
        fds.append(fd)
    return fds


async def test_descriptors_before_the_handshake_are_refused():
    """Descriptors before the connection is established are closed on arrival and fail it
    at once (§5.1): with the preamble, silently (the peer has not shown it speaks the
    format, §3); after the preamble, with ``bad-shm``."""
    async with node("a") as a:

        def with_the_preamble(tag):
            raw = RawPeer(a.unix_addr)
            fds = tagged_memfds(tag, 3)
            raw.send(wire.OUR_PREAMBLE.encode(), fds)
            for fd in fds:
                os.close(fd)
            got = raw.read_exact(16)  # the node's preamble went out before it read ours
            try:
                rest = raw.sock.recv(1)
            except ConnectionResetError:
                rest = b""
            return got, rest

        got, rest = await asyncio.to_thread(with_the_preamble, "with-preamble")
        assert got == wire.OUR_PREAMBLE.encode() and rest == b"", "closed, with no error"
        assert memfds_held("with-preamble") == 0, "the node keeps none of them"

        def after_the_preamble(tag):
            raw = RawPeer(a.unix_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_exact(16)
            fds = tagged_memfds(tag, 3)
            raw.send(wire.frame_header(raw.challenge()), fds)
            for fd in fds:
                os.close(fd)
            return raw.expect_error()

        err = await asyncio.to_thread(after_the_preamble, "after-preamble")
        assert err.code == "bad-shm" and "before the connection was established" in err.msg
        assert memfds_held("after-preamble") == 0
        async with Node("b", secret=SECRET) as b:  # and the node still serves a member
            peer = await b.connect(a.listen_addr)
            assert peer.channel == "shm"


async def test_handshake_timeout_sends_timeout():
    async with node("a", bounds=Bounds(handshake_timeout=0.3)) as a:

        def silent():
            raw = raw_preambles(a.listen_addr)
            started = time.monotonic()
            err = raw.expect_error()
            return err, time.monotonic() - started

        err, took = await asyncio.to_thread(silent)
        assert err.code == "timeout" and took < 3


async def test_oldest_handshake_makes_room_and_connections_are_capped():
    async with (
        node("a", bounds=Bounds(max_handshakes=4, max_connections=2)) as a,
        Node("b", secret=SECRET, host_id="x") as b,
        Node("c", secret=SECRET, host_id="y") as c,
        Node("d", secret=SECRET, host_id="z") as d,
    ):

        def crowd():
            raws = [raw_preambles(a.listen_addr) for _ in range(6)]  # each stops after the preambles
            errs = []
            for r in raws[:2]:
                errs.append(r.expect_error().code)
            return raws, errs

        raws, errs = await asyncio.to_thread(crowd)
        assert errs == ["overloaded", "overloaded"]
        await b.connect(a.listen_addr, channel="tcp")  # the oldest gives way again
        await c.connect(a.listen_addr, channel="tcp")
        with pytest.raises(Exception, match="overloaded"):
            await d.connect(a.listen_addr, channel="tcp")
        for r in raws:
            r.close()


async def test_node_ids_are_unique_per_process():
    async with node("a") as a:

        def clash():
            node_id, proc = secrets.token_hex(16), secrets.token_hex(16)
            first = RawPeer(a.listen_addr)
            first.handshake(SECRET, node=node_id, proc=proc)
            other = RawPeer(a.listen_addr)
            with pytest.raises(PeerError) as e:
                other.handshake(SECRET, node=node_id)  # another process
            same = RawPeer(a.listen_addr)
            same.handshake(SECRET, node=node_id, proc=proc)  # the same one: a second connection
            first.send(wire.encode_message(wire.Msg("t.X", b"\x01", [])))
            return e.value, first, same

        err, first, same = await asyncio.to_thread(clash)
        assert err.code == "handshake" and "another process" in err.header.msg
        assert (await a.recv(5)).body == 1, "the established connection carries on"
        first.close()
        same.close()


# ---------------------------------------------------------------- time inside messages, slow readers (§9.1)


async def test_silence_inside_a_message_times_out():
    async with node("a", bounds=Bounds(progress_timeout=0.3)) as a, Node("b", secret=SECRET, host_id="x") as b:

        def stall():
            raw = RawPeer(a.listen_addr)
            raw.handshake(SECRET)
            raw.send(wire.encode_message(wire.Msg("t", b"\x80", [wire.Inline(1000)]))[:-1] + b"")
            raw.send(b"\x00" * 10)  # 10 of its 1000 bytes, then nothing
            return raw.expect_error()

        err = await asyncio.to_thread(stall)
        assert err.code == "timeout" and "in the middle of a message" in err.msg
        await still_served(a, b)


# unix: the frames inline (a threshold above them), behind the 4 MiB send buffer asked for
@pytest.mark.parametrize("channel", ["tcp", "unix"])
async def test_a_peer_that_reads_nothing_fails_only_its_own_sends(channel):
    bounds = Bounds(write_timeout=0.5)
    async with node("a", bounds=bounds, shm_threshold=64 * MIB) as a, Node("b", secret=SECRET, host_id="x") as b:
        addr = a.listen_addr if channel == "tcp" else a.unix_addr
        raw = await asyncio.to_thread(lambda: (r := RawPeer(addr), r.handshake(SECRET))[0])
        deaf = await a.wait_for_peer("raw")
        sent = 0
        started = time.monotonic()
        with pytest.raises(HandoffError, match="no progress"):
            while True:
                await deaf.send("t.X", {"d": Buffer(b"x" * MIB)})
                sent += 1
        assert time.monotonic() - started < 10 and sent < 64
        await still_served(a, b)
        raw.close()


# ---------------------------------------------------------------- buffered bytes and backpressure (§9.1)


async def test_buffered_bytes_stop_reading_until_the_application_takes_messages():
    bounds = Bounds(max_buffered_bytes_per_peer=4 * MIB, max_buffered_bytes=6 * MIB)
    async with node("a", bounds=bounds) as a, Node("b", secret=SECRET, host_id="x") as b:
        peer = await b.connect(a.listen_addr, channel="tcp")

        async def flood():
            for i in range(40):
                await peer.send("t.X", {"i": i, "d": Buffer(b"x" * MIB)})

        sending = asyncio.ensure_future(flood())
        await asyncio.sleep(0.5)
        assert a.buffered()["total"] <= 4 * MIB + 64 * 1024
        assert not sending.done(), "the sender is held back by TCP once the node stops reading"
        # A message larger than the whole budget still gets through, alone.
        for i in range(40):
            env = await a.recv(10)
            assert env.body["i"] == i
            env.release()
        await sending
        await peer.send("t.X", {"i": 99, "d": Buffer(b"y" * (8 * MIB))})
        env = await a.recv(10)
        assert len(env.body["d"]) == 8 * MIB and a.buffered()["total"] == 0


async def test_a_pulled_answer_is_never_stuck_behind_messages_waiting_for_room():
    """The owner sends a ticket, then more than the holder's per-peer bound: the holder's
    eager redemption waits for a `pulled` that comes behind those messages on the same
    connection; its reader may go over the bound while it waits, so nothing is stuck."""
    bounds = Bounds(max_buffered_bytes_per_peer=4 * MIB, max_buffered_bytes=64 * MIB)
    async with node("owner") as a, Node("holder", secret=SECRET, host_id="x", bounds=bounds, pull_timeout=5) as b:
        await b.connect(a.listen_addr, channel="tcp")
        to_b = await a.wait_for_peer("holder")
        data = os.urandom(MIB)
        await to_b.send("t.X", {"i": 0, "d": Buffer(data)}, by_ticket=True)
        for i in range(1, 7):
            await to_b.send("t.X", {"i": i, "d": Buffer(b"x" * MIB)})
        started = time.monotonic()
        env = await b.recv(10)
        assert env.body["i"] == 0 and bytes(env.body["d"]) == data
        assert time.monotonic() - started < 3, "the redemption waited for its pull to time out"
        for i in range(1, 7):
            assert (await b.recv(10)).body["i"] == i


async def test_a_flood_of_eager_tickets_waits_for_room_before_it_is_pulled():
    """§9.1: a redeemed ticket counts in its sender's buffered bytes, admitted before it is
    pulled. A raw owner sends 40 small messages at once, each with a 1 MiB ticket, and
    answers every pull behind them: the holder, whose application takes nothing, pulls
    only what fits its bound instead of all 40 MiB (room charged after each pull would let
    every message already read in), and its reader still gets to the answers (room charged
    as each message is read would stop it in front of them until the pulls time out)."""
    import blake3

    per_peer = 4 * MIB
    bounds = Bounds(max_buffered_bytes_per_peer=per_peer, max_buffered_bytes=64 * MIB)
    count = 40
    datas = [bytes([i]) * MIB for i in range(count)]
    async with Node("holder", secret=SECRET, listen="127.0.0.1:0", bounds=bounds, pull_timeout=10) as a:
        raw = RawPeer(a.listen_addr, timeout=30)
        asked: list = []

        def owner() -> None:
            raw.handshake(SECRET, host="other-host")
            token = secrets.token_bytes(32)
            flood = b""
            for i, data in enumerate(datas):
                desc = wire.TicketDesc(MIB, raw.node_id, i + 1, token, blake3.blake3(data).digest(), 60_000)
                flood += wire.encode_message(wire.Msg("t.X", encode_body({"i": i, "d": Buffer(data)}).body, [desc]))
            raw.send(flood)
            raw.sock.settimeout(None)
            while True:
                try:
                    h, _ = raw.read_message()
                except (EOFError, OSError):
                    return  # the test shut the socket down
                if isinstance(h, wire.Pull):
                    asked.append(h.lease)
                    raw.send(wire.encode_message(wire.Pulled(h.req, h.n)) + datas[h.lease - 1][h.off : h.off + h.n])

        answering = asyncio.get_running_loop().run_in_executor(None, owner)
        try:
            # Until it settles: nothing is taken, so the holder stops where its bound says.
            held = -1
            for _ in range(60):
                await asyncio.sleep(0.25)
                now = a.buffered()["total"]
                if now == held and asked:
                    break
                held = now
            # Each ticket's room is taken before its pull (the messages themselves hold a little).
            most = per_peer + 64 * 1024
            assert 0 < held <= most, f"the holder buffers {held} bytes, over {most}: it pulled before it had room"
            assert len(asked) < count, f"it pulled all {count} tickets while its application took nothing"
            for i in range(count):
                env = await a.recv(10)
                assert env.body["i"] == i and bytes(env.body["d"]) == datas[i], "every ticket redeemed, in order"
                env.release()
            assert sorted(asked) == list(range(1, count + 1))
        finally:
            raw.sock.shutdown(socket.SHUT_RDWR)
            await answering
            raw.close()


async def test_pulled_answers_nobody_asked_for_are_dropped_not_allocated():
    async with node("a") as a:

        def stray():
            raw = RawPeer(a.listen_addr)
            raw.handshake(SECRET)
            raw.send(wire.encode_message(wire.Pulled(7, 3 * MIB)) + b"z" * (3 * MIB))
            raw.send(wire.encode_message(wire.Msg("t.X", b"\x01", [])))
            return raw

        raw = await asyncio.to_thread(stray)
        assert (await a.recv(5)).body == 1, "the connection stays, in step"
        raw.close()


# ---------------------------------------------------------------- tickets (§7.7, §7.9)


async def test_lease_caps_wait_then_fail():
    t = LeaseTable(60, max_bytes=1000, max_bytes_per_peer=80, wait=0.3)
    view = memoryview(b"x" * 60)
    lease, token, _ = await t.issue(view, "b" * 32)
    started = time.monotonic()
    with pytest.raises(CapReached, match="60 of 80 bytes are leased to it"):
        await t.issue(view, "b" * 32, to_name="bee")
    assert 0.25 < time.monotonic() - started < 2
    waiting = asyncio.ensure_future(t.issue(view, "b" * 32))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    t.unlease(lease, "b" * 32, token)
    await waiting
    assert t.stats()["bytes"] == 60


async def test_forward_checks_the_new_holder_and_caps_holders():
    owner, holder = "a" * 32, "b" * 32
    t = LeaseTable(60, max_holders=3)
    lease, token, _ = await t.issue(memoryview(b"x" * 10), holder)
    for bad in ("not-a-node", "A" * 32, owner):
        with pytest.raises(Refusal) as e:
            t.forward(lease, holder, token, bad, owner)
        assert e.value.code == "bad-holder"
    t.forward(lease, holder, token, "c" * 32, owner)
    t.forward(lease, holder, token, "d" * 32, owner)
    with pytest.raises(Refusal) as e:
        t.forward(lease, holder, token, "e" * 32, owner)
    assert e.value.code == "too-many-holders"
    t.forward(lease, holder, token, "d" * 32, owner)  # an existing holder is not counted twice
    # Order of checks: a bad token comes first.
    with pytest.raises(Refusal) as e:
        t.forward(lease, holder, bytes(32), "nope", owner)
    assert e.value.code == "bad-token"


async def test_late_holders_see_expired_while_the_lease_lives():
    t = LeaseTable(0.05)
    view = memoryview(b"x" * 10)
    lease, token, _ = await t.issue(view, "b" * 32)
    other = t.forward(lease, "b" * 32, token, "c" * 32)
    t._leases[lease].ttl = 60
    await asyncio.sleep(0.03)
    t.renew(lease, "c" * 32, other)  # c renews in time (its deadline is now 60 s away), b does not
    await asyncio.sleep(0.03)
    assert t.expire() == 1
    with pytest.raises(Refusal) as e:
        t.pull(lease, "b" * 32, token, 0, 1)
    assert e.value.code == "expired"
    with pytest.raises(Refusal) as e:
        t.pull(lease, "b" * 32, bytes(32), 0, 1)
    assert e.value.code == "bad-token"
    t.unlease(lease, "c" * 32, other)
    with pytest.raises(Refusal) as e:
        t.pull(lease, "b" * 32, token, 0, 1)
    assert e.value.code == "unknown-lease"


@pytest.mark.pure_only("counts the tasks of the pure peer")
async def test_refused_pulls_are_answered_in_order_and_logged_sparingly(caplog):
    async with node("a") as a:

        def flood():
            raw = RawPeer(a.listen_addr)
            raw.handshake(SECRET)
            raw.send(b"".join(wire.encode_message(wire.Pull(i, 12345, bytes(32), 0, 1)) for i in range(500)))
            return [raw.read_header()[1] for _ in range(500)], raw

        answers, raw = await asyncio.to_thread(flood)
        assert [h.req for h in answers] == list(range(500))
        assert {h.code for h in answers} == {"unknown-lease"}
        assert caplog.text.count("refused a pull") <= 10
        assert len(a.peer("raw")._tasks) <= 1
        raw.close()


async def test_holders_dial_no_address_of_their_own():
    async with node("a", redeem="lazy") as a:
        raw_desc = dict(n=10, lease=1, token=bytes(32), digest=bytes(32), ttl=1000)
        cases = {
            "own address": wire.TicketDesc(owner=secrets.token_hex(16), addr=a.listen_addr, **raw_desc),
            "loopback alias": wire.TicketDesc(
                owner=secrets.token_hex(16), addr=a.listen_addr.replace("127.0.0.1", "localhost"), **raw_desc
            ),
            "itself as owner": wire.TicketDesc(owner=a.node_id, addr="tcp://10.255.255.1:1", **raw_desc),
            "not tcp": wire.TicketDesc(owner=secrets.token_hex(16), addr="unix:///tmp/x.sock", **raw_desc),
        }
        for what, desc in cases.items():
            started = time.monotonic()
            with pytest.raises(OwnerLost) as e:
                await Ticket(a, desc, "x").read(0, 1)
            assert time.monotonic() - started < 1, what
            assert "lease 1" in str(e.value), what
        assert a.peers == []


async def test_shm_leases_for_a_peer_that_never_releases_are_capped():
    bounds = Bounds(max_shm_leases_per_peer=3, lease_wait=0.3)
    async with node("a", bounds=bounds) as a:

        def hoarder():
            raw = RawPeer(a.unix_addr)
            raw.handshake(SECRET, host=a.host_id)
            return raw

        raw = await asyncio.to_thread(hoarder)
        peer = await a.wait_for_peer("raw")
        for i in range(3):
            await peer.send("t.X", {"d": Buffer(b"x" * (128 * 1024))})
        with pytest.raises(CapReached, match="3 shared-memory leases"):
            await peer.send("t.X", {"d": Buffer(b"x" * (128 * 1024))})
        assert a.shm_leases()["count"] == 3
        raw.close()


async def test_warnings_about_one_peer_are_rate_limited(caplog):
    import logging

    from handoff.throttle import WarningThrottle

    t = WarningThrottle(logging.getLogger("handoff.test"), limit=3, period=0.2)
    assert sum(t.warn("p", "bad thing %d", i) for i in range(100)) == 3
    assert t.warn("q", "other peer")
    await asyncio.sleep(0.25)
    assert t.warn("p", "bad thing again")
    assert caplog.text.count("bad thing") == 4 and "other peer" in caplog.text
    assert "bad thing again (97 more warnings were not logged before this one)" in caplog.text


def test_warnings_about_all_peers_together_are_rate_limited_too(caplog):
    """A peer that opens many connections (a source each) does not multiply its share: the
    node's total caps them all (the engine's limits, as the Rust node's)."""
    import logging

    from handoff.throttle import WarningThrottle

    t = WarningThrottle(logging.getLogger("handoff.test"), limit=3, period=60, total=5)
    assert sum(t.warn(f"connection {i}", "bad thing") for i in range(10)) == 5
    # Sources are remembered up to a bound: made-up names cannot grow the table.
    for i in range(5000):
        t.warn(f"made-up {i}", "bad thing")
    assert len(t._limits) <= 4096


async def test_errors_are_followed_by_an_orderly_close():
    """After an `error` the node shuts down its side first, so the peer reads the error
    even when it had sent more that the node never read (no reset)."""
    async with node("a") as a:

        def garbage():
            raw = RawPeer(a.listen_addr)
            raw.handshake(SECRET)
            raw.send(b"\x00\x00\x00\x00" + os.urandom(200_000))  # zero-length header, then noise
            return raw.expect_error()

        assert (await asyncio.to_thread(garbage)).code == "malformed-header"


def _inbox_class(which: str):
    """The engine's inbox (``handoff.inbox``, the Rust queues) or the reference's
    (``handoff_pure.inbox``): both serve by one algorithm, and these tests hold them to it."""
    if which == "engine":
        from handoff.inbox import Inbox
    else:
        from handoff_pure.inbox import Inbox
    return Inbox


INBOXES = pytest.mark.parametrize("which", ["engine", "reference"])


@INBOXES
async def test_the_inbox_serves_connections_fairly_by_bytes(which):
    """A flood from one connection delays another by about one message (handoff.inbox)."""
    from types import SimpleNamespace

    inbox = _inbox_class(which)(overhead=1024)
    flooder, quiet, bulk = object(), object(), object()
    for i in range(100):
        inbox.put(SimpleNamespace(sender=flooder, charge=1200, seq=i))
    inbox.put(SimpleNamespace(sender=bulk, charge=8 << 20, seq=0))
    inbox.put(SimpleNamespace(sender=quiet, charge=1200, seq=0))
    order = [await inbox.get() for _ in range(102)]
    assert [e.sender for e in order].index(quiet) <= 2, "the quiet connection is served within a turn"
    assert [e.seq for e in order if e.sender is flooder] == list(range(100)), "in order per connection"
    # The bulk connection gets its share in bytes: after about 8 MiB of the others' turns.
    assert order[-1].sender is bulk, "it waits until the small ones, far fewer bytes, are served"


@INBOXES
async def test_a_sparse_connection_goes_before_the_backlogs_and_closed_ones_go_last(which):
    """A peer with one message out at a time waits for no backlog, however many connections
    have one; a closed connection's messages are all delivered, after the open ones'."""
    from types import SimpleNamespace

    inbox = _inbox_class(which)(overhead=1024)
    flooders = [object() for _ in range(25)]
    for f in flooders:
        for i in range(50):
            inbox.put(SimpleNamespace(sender=f, charge=1100, seq=i))
    for _ in range(30):  # every flooder now has a backlog and is in the round
        await inbox.get()
    quiet = object()
    for seq in range(3):
        inbox.put(SimpleNamespace(sender=quiet, charge=1100, seq=seq))
        assert (await inbox.get()).sender is quiet, "a sparse connection is served next"
        await inbox.get()  # one flooder message between the quiet peer's round trips
    gone = flooders[0]
    inbox.closed(gone)
    left = len(inbox)
    order = [await inbox.get() for _ in range(left)]
    mine = [e.seq for e in order if e.sender is gone]
    assert mine and mine == sorted(mine), "a closed connection's messages all come, in order"
    first_of_gone = next(i for i, e in enumerate(order) if e.sender is gone)
    assert all(e.sender is gone for e in order[first_of_gone:]), "after every open connection's"
    assert len(inbox) == 0


async def test_timed_waits_end_at_their_limits_and_share_one_timer():
    """The inbox's waits with a time limit (``recv(timeout)``) each end at their own limit,
    and a receiver that waits again and again arms the loop's timer once, not per message."""
    from handoff.inbox import Inbox, Signal

    loop = asyncio.get_running_loop()
    signal = Signal()
    started = loop.time()
    assert await signal.wait(0.05) is False
    assert 0.045 <= loop.time() - started < 0.5
    # Woken by set() 100 times, each wait with a 30 s limit: one timer for all of them.
    timers = set()
    for _ in range(100):
        loop.call_later(0.001, signal.set)
        assert await signal.wait(30) is True
        timers.add(id(signal._timer))
    assert len(timers) == 1
    # Two waits with different limits: the shorter ends first, the longer at its own.
    started = loop.time()
    long_wait = asyncio.ensure_future(signal.wait(0.3))
    assert await signal.wait(0.05) is False
    assert loop.time() - started < 0.25 and not long_wait.done()
    assert await long_wait is False and loop.time() - started >= 0.29
    # The inbox's recv with a limit.
    started = loop.time()
    with pytest.raises(asyncio.TimeoutError):
        await Inbox(1024).get(0.03)
    assert 0.025 <= loop.time() - started < 0.5


def _ticket_owner(addr: str, script, answers: dict):
    """A raw owner of tickets: handshakes, then runs ``script(raw, token)`` (which sends
    messages), answering every pull with the bytes of ``answers[lease]`` as it comes."""
    import threading

    raw = RawPeer(addr, timeout=30)
    raw.handshake(SECRET, host="owner-host")
    token = secrets.token_bytes(32)
    pulls: list = []

    def answer() -> None:
        while True:
            try:
                h, _ = raw.read_message()
            except (EOFError, OSError):
                return
            if isinstance(h, wire.Pull):
                pulls.append(h.lease)
                data = answers[h.lease]
                raw.send(wire.encode_message(wire.Pulled(h.req, h.n)) + data[h.off : h.off + h.n])

    reader = threading.Thread(target=answer, daemon=True)
    reader.start()
    script(raw, token, pulls)
    return raw, reader


def _ticket_msg(raw: RawPeer, token: bytes, i: int, lease: int, data: bytes) -> bytes:
    import blake3

    desc = wire.TicketDesc(len(data), raw.node_id, lease, token, blake3.blake3(data).digest(), 60_000)
    return wire.encode_message(wire.Msg("t.X", encode_body({"i": i, "d": Buffer(data)}).body, [desc]))


async def test_a_ticket_larger_than_the_bound_goes_alone_once_the_earlier_messages_are_taken():
    """§9.1: a ticket over the per-peer bound waits until the application takes that
    peer's earlier message, then goes alone ahead of the messages queued behind it: also
    when the one behind it was still arriving when the room came back."""
    bounds = Bounds(max_buffered_bytes_per_peer=MIB, max_buffered_bytes=64 * MIB)
    big = os.urandom(3 * MIB)
    async with Node("holder", secret=SECRET, listen="127.0.0.1:0", bounds=bounds, pull_timeout=10) as a:

        def script(raw, token, pulls):
            tail = wire.encode_message(
                wire.Msg("t.X", encode_body({"i": 2, "d": Buffer(b"z" * (200 << 10))}).body, [wire.Inline(200 << 10)]),
                [b"z" * (200 << 10)],
            )
            raw.send(wire.encode_message(wire.Msg("t.X", encode_body({"i": 0}).body, [])))
            raw.send(_ticket_msg(raw, token, 1, 1, big) + tail[: len(tail) // 2])
            time.sleep(0.4)  # the third message is still arriving when the first is taken
            raw.send(tail[len(tail) // 2 :])

        raw, reader = await asyncio.to_thread(_ticket_owner, a.listen_addr, script, {1: big})
        try:
            first = await a.recv(5)
            assert first.body == {"i": 0}
            await asyncio.sleep(0.15)
            first.release()  # room back while the third message is half read
            second = await a.recv(10)
            assert second.body["i"] == 1 and bytes(second.body["d"]) == big
            assert (await a.recv(5)).body["i"] == 2
        finally:
            raw.sock.shutdown(socket.SHUT_RDWR)
            await asyncio.to_thread(reader.join, 5)
            raw.close()


async def test_a_reserved_ticket_does_not_stop_the_reader_in_front_of_its_answer():
    """§9.1: a ticket admitted alone may be larger than twice the per-peer bound; while its
    pull is out, the reader's bounds are raised by it too, so the owner's next message, and
    the `pulled` behind it, are still read."""
    bounds = Bounds(max_buffered_bytes_per_peer=MIB, max_buffered_bytes=64 * MIB)
    big = os.urandom(3 * MIB)
    async with Node("holder", secret=SECRET, listen="127.0.0.1:0", bounds=bounds, pull_timeout=5) as a:

        def owner() -> RawPeer:
            raw = RawPeer(a.listen_addr, timeout=30)
            raw.handshake(SECRET, host="owner-host")
            raw.send(_ticket_msg(raw, secrets.token_bytes(32), 1, 1, big))
            while True:  # the pull: then a message goes in front of its answer
                h, _ = raw.read_message()
                if isinstance(h, wire.Pull):
                    break
            raw.send(
                wire.encode_message(wire.Msg("t.X", encode_body({"i": 2}).body, []))
                + wire.encode_message(wire.Pulled(h.req, h.n))
                + big[h.off : h.off + h.n]
            )
            return raw

        raw = await asyncio.to_thread(owner)
        try:
            started = time.monotonic()
            env = await a.recv(10)
            assert env.body["i"] == 1 and bytes(env.body["d"]) == big
            assert time.monotonic() - started < 4, "the redemption waited for its pull to time out"
            assert (await a.recv(5)).body == {"i": 2}
        finally:
            raw.close()


def test_the_engine_reads_the_receive_buffer_bound_as_the_reference_does(monkeypatch):
    """``HANDOFF_RECV_POOL_BYTES`` bounds the warm receive buffers of a node on the engine too
    (it did only the reference's); anything but a whole number of bytes is refused, named."""
    from handoff.native import required

    ext = required("the engine")
    monkeypatch.setenv("HANDOFF_RECV_POOL_BYTES", "lots")
    with pytest.raises(ValueError, match='HANDOFF_RECV_POOL_BYTES="lots": expected a whole number of bytes'):
        ext.Engine("n", b"k")
    monkeypatch.setenv("HANDOFF_RECV_POOL_BYTES", "0")
    ext.Engine("n", b"k")


@pytest.mark.parametrize("timeout", [11, 12, 30, 31.9, 300, 86_400])
def test_the_engine_and_the_reference_plan_keepalive_alike(timeout):
    from handoff.native import required
    from handoff_pure.transport import keepalive_plan

    plan = required("the TCP timeout").keepalive_plan(timeout)
    assert plan == keepalive_plan(timeout)
    idle, interval, probes = plan
    assert idle + interval * probes == int(timeout)


def test_a_tcp_timeout_too_short_for_the_probes_is_refused_when_the_node_is_made():
    from handoff import Node

    with pytest.raises(ValueError, match="at least 11 s"):
        Node("too-short", tcp_timeout=10.9)


async def test_a_holder_keeps_so_many_owner_connections_but_never_one_where_it_holds_tickets():
    """§9.1: at most ``max_owner_connections`` connections dialed to reach ticket owners are
    kept; the one unused longest makes room for the next, but never one to an owner where
    this node holds a ticket (closing it would end the hold, §7.7): the new redemption
    fails instead, saying why, until that ticket is let go."""
    import msgpack

    async with (
        node("holder", types=["t"], bounds=Bounds(max_owner_connections=1)) as h,
        node("owner-a", host_id="owner-a-host") as oa,
        node("owner-b", host_id="owner-b-host") as ob,
    ):
        raw = await asyncio.to_thread(lambda: (r := RawPeer(h.listen_addr), r.handshake(SECRET))[0])

        async def send(owner: Node, lazy: bool):
            desc = wire.TicketDesc(
                n=10, owner=owner.node_id, lease=1, token=bytes(32), digest=bytes(32), ttl=30_000,
                addr=owner.listen_addr, lazy=lazy,
            )  # fmt: skip
            body = msgpack.packb({"d": msgpack.ExtType(1, struct.pack(">I", 0))})
            await asyncio.to_thread(raw.send, wire.encode_message(wire.Msg("t", body, [desc]), []))
            return await h.recv(10)

        # A lazy ticket of A, kept: reading it dials A (the pull is refused: no such lease).
        env = await send(oa, lazy=True)
        held = env.body["d"]
        with pytest.raises(HandoffError, match="unknown-lease"):
            await held.read(0, 1)
        assert h.peer_by_id(oa.node_id) is not None
        # B's ticket finds no room: A's connection stays, for the ticket held there.
        await asyncio.sleep(0.15)  # (a connection used in the last 100 ms does not make room)
        with pytest.raises(OwnerLost, match="tickets of its owner held"):
            (await send(ob, lazy=False)).body
        assert h.peer_by_id(oa.node_id) is not None
        # The ticket let go, A's connection makes room for B's.
        env.release()
        del held
        await asyncio.sleep(0.15)
        with pytest.raises(HandoffError, match="unknown-lease"):
            (await send(ob, lazy=False)).body
        deadline = time.monotonic() + 10
        while h.peer_by_id(oa.node_id) is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert h.peer_by_id(oa.node_id) is None and h.peer_by_id(ob.node_id) is not None
        raw.close()


async def test_a_cancelled_ticket_request_is_forgotten_so_its_owner_connection_can_make_room():
    """A redemption cancelled while its owner does not answer (a ``wait_for`` around it, a
    cancelled Dask task) leaves no request behind: the owner's connection stops counting as
    waiting for an answer, so with ``max_owner_connections=1`` it makes room for the next
    owner's (before, every later dial failed: "none can close")."""
    import threading

    from handoff.tickets import Ticket as HeldTicket

    started, box = threading.Event(), {}

    def run_owner() -> None:  # a node in a thread of its own, whose loop the test stalls
        async def main() -> None:
            async with node("stalls", host_id="stalls-host") as o:
                box.update(node=o, loop=asyncio.get_running_loop(), stop=asyncio.Event())
                started.set()
                await box["stop"].wait()

        asyncio.run(main())

    thread = threading.Thread(target=run_owner, daemon=True)
    thread.start()
    assert started.wait(10)
    stalls = box["node"]

    def ticket(holder: Node, owner: Node) -> HeldTicket:
        desc = wire.TicketDesc(
            n=10, owner=owner.node_id, lease=1, token=bytes(32), digest=bytes(32), ttl=30_000,
            addr=owner.listen_addr, lazy=True,
        )  # fmt: skip
        return HeldTicket(holder, desc, owner.name)

    try:
        async with (
            node("holder", pull_timeout=1.0, bounds=Bounds(max_owner_connections=1)) as h,
            node("answers", host_id="answers-host") as answers,
        ):
            first = ticket(h, stalls)
            with pytest.raises(HandoffError, match="unknown-lease"):
                await first.read(0, 1)  # dials the owner (kept): no such lease
            box["loop"].call_soon_threadsafe(time.sleep, 2.5)  # it answers nothing for a while
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(first.read(0, 1), 0.2)
            first.release()
            del first
            await asyncio.sleep(1.2)  # past the pull timeout, and the last use
            with pytest.raises(HandoffError, match="unknown-lease"):
                await ticket(h, answers).read(0, 1)  # the stalled owner's connection made room
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


async def test_a_send_waiting_for_ticket_lease_room_fails_as_soon_as_its_connection_is_aborted():
    """A send waiting for room in the node's ticket leases (§9.1) is told at once when its
    own connection is aborted (what ``HandoffComm.abort()`` does), not after the whole
    ``lease_wait``."""
    bounds = Bounds(max_ticket_bytes=100_000, max_ticket_bytes_per_peer=100_000, lease_wait=10.0)
    async with (
        node("sender", shm=False, ticket_threshold=1, bounds=bounds) as a,
        node("keeps", host_id="keeps-host", shm=False, redeem="lazy", types=["t"]) as keeps,
        node("waits", host_id="waits-host", shm=False, redeem="lazy", types=["t"]) as waits,
    ):
        await (await a.connect(keeps.listen_addr)).send("t", {"x": bytes(90_000)})
        held = await keeps.recv(10)  # its ticket pins 90 kB of the 100 kB
        peer = await a.connect(waits.listen_addr)
        send = asyncio.ensure_future(peer.send("t", {"x": bytes(50_000)}))
        await asyncio.sleep(0.3)
        assert not send.done(), "the send waits for room"
        peer.abort()
        t0 = time.monotonic()
        with pytest.raises(HandoffError):
            await asyncio.wait_for(send, 5)
        assert time.monotonic() - t0 < 2, "told when its connection went, not after lease_wait"
        del held


async def test_the_reference_drops_unleases_past_its_bound_and_keeps_reading():
    """Our ``unlease``s to an owner that reads nothing do not stop the connection's reader
    (they come from our own drops, not from reading the peer): past
    ``MAX_UNLEASES_QUEUED`` unwritten, further ones are dropped and the holds' deadlines
    end them (§9.1)."""
    from handoff_pure.control import MAX_UNLEASES_QUEUED, ControlWriter

    stuck = asyncio.Event()

    async def never_written(header, payload) -> None:
        await stuck.wait()

    writer = ControlWriter(
        never_written, lambda: Bounds(), lambda: False, asyncio.get_running_loop(), lambda: ("n", "p")
    )
    kept = sum(writer.queue_unlease(wire.Unlease(i, bytes(32))) for i in range(MAX_UNLEASES_QUEUED + 10))
    assert kept == MAX_UNLEASES_QUEUED
    assert not writer.full(), "the reader goes on"
    writer.stop()
    writer.cancel()

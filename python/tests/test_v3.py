"""Version 3 in one process (spec §5.2, §5.7, §9, Appendix A): the roles of the handshake,
the dialer nonces, the lengths of the identity fields, what a node refuses to send, and
the options that accept older versions."""

from __future__ import annotations

import asyncio
import secrets
import struct
import time

import pytest
from handoff import Buffer, MessageTooLarge, Node
from handoff_pure import wire
from handoff_pure import nonces
from handoff import node as node_module
from handoff_pure.outgoing import MAX_TEXT
from helpers import RawPeer, eventually

SECRET = b"v3 secret"


def py_node(name: str, **kw) -> Node:
    return Node(name, secret=SECRET, listen="127.0.0.1:0", **kw)


# ---------------------------------------------------------------- the handshake by role (§5.7)


async def test_the_acceptor_proves_only_after_the_dialer_did():
    async with py_node("acceptor") as a:

        def dial():
            raw = RawPeer(a.listen_addr)
            own = wire.OUR_PREAMBLE.encode()
            raw.send(own)
            mine = raw.challenge()
            raw.send(wire.frame_header(mine))
            peer_pre = raw.read_exact(16)
            theirs, _ = raw.read_header()
            raw.sock.settimeout(0.5)
            try:
                raw.read_exact(1)
                early = True
            except TimeoutError:
                early = False
            raw.sock.settimeout(5)
            t = wire.transcript_v3(own, peer_pre, mine, theirs)
            raw.send(wire.encode_message(wire.Auth(wire.dialer_proof(SECRET, t))))
            _, auth = raw.read_header()
            wire.verify_acceptor_proof(SECRET, auth.mac, t, wire.dialer_proof(SECRET, t))
            _, ident = raw.read_header()  # right after its proof, before ours
            return early, ident

        early, ident = await asyncio.to_thread(dial)
        assert not early, "the acceptor sent something before it verified the dialer's proof"
        assert isinstance(ident, wire.Ident) and ident.node == a.node_id


async def test_a_dialer_refuses_its_own_proof_reflected_as_the_acceptors():
    """A listener that answers a dialing node with the node's own challenge and proof."""
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    addr = "tcp://127.0.0.1:%d" % lsock.getsockname()[1]

    def reflect():
        conn, _ = lsock.accept()
        conn.settimeout(5)
        buf = b""
        while len(buf) < 16:
            buf += conn.recv(16 - len(buf))
        conn.sendall(buf)  # its own preamble
        got = b""
        while True:
            got += conn.recv(65536)
            if len(got) >= 4 and len(got) >= 4 + struct.unpack(">I", got[:4])[0]:
                break
        n = struct.unpack(">I", got[:4])[0]
        challenge = got[4 : 4 + n]
        conn.sendall(wire.frame_header(wire.encode_header(wire.Challenge(3, secrets.token_bytes(32)))))
        rest = got[4 + n :]
        while len(rest) < 4 or len(rest) < 4 + struct.unpack(">I", rest[:4])[0]:
            rest += conn.recv(65536)
        conn.sendall(rest[: 4 + struct.unpack(">I", rest[:4])[0]])  # its own dialer proof back
        data = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        conn.close()
        return challenge, data

    task = asyncio.ensure_future(asyncio.to_thread(reflect))
    async with Node("dialer", secret=SECRET) as d:
        with pytest.raises(Exception) as e:
            await d.connect(addr)
        assert "auth" in str(e.value).lower()
    _, data = await task
    h = wire.decode_message(data).header
    assert isinstance(h, wire.Error) and h.code == "auth-failed"
    assert b"ident" not in data, "no ident to a peer whose proof did not verify"
    lsock.close()


def test_dialer_nonces_are_remembered_for_their_window_and_bounded(monkeypatch):
    seen = nonces.DialerNonces(0.2)
    dialed = seen.fresh(True)
    accepted = seen.fresh(False)
    assert seen.sent_as_dialer(dialed) and not seen.sent_as_dialer(accepted)
    assert len(seen) == 1
    time.sleep(0.25)
    assert not seen.sent_as_dialer(dialed), "forgotten after the window"
    monkeypatch.setattr(nonces, "MAX_REMEMBERED", 3)
    many = [seen.fresh(True) for _ in range(5)]
    assert len(seen) == 3 and not seen.sent_as_dialer(many[0]) and seen.sent_as_dialer(many[-1])


@pytest.mark.pure_only("reads the pure node's table of dialer nonces")
async def test_a_nodes_window_is_twice_its_handshake_timeout():
    from handoff.bounds import Bounds

    assert py_node("w", bounds=Bounds(handshake_timeout=3.0)).dialer_nonces.window == 6.0


async def test_two_nodes_of_one_process_connect_both_ways_on_tcp_and_shm():
    """The set is each node's own: one node's dialer nonce is no relay to another (§5.7)."""
    async with py_node("a") as a, py_node("b") as b:
        for x, y in ((a, b), (b, a)):
            for channel in ("tcp", "shm"):
                p = await x.connect(y.listen_addr, channel=channel)
                assert (p.channel, p.protocol_version) == (channel, 3)
        if a.dialer_nonces is not None:  # (a node on the engine keeps them in Rust)
            assert len(a.dialer_nonces) >= 2 and len(b.dialer_nonces) >= 2


@pytest.mark.pure_only("reads the pure node's table of dialer nonces")
async def test_a_nodes_own_dialer_nonce_as_a_challenge_is_refused():
    """What the relay of §5.8 presents on the accepted connection."""
    async with py_node("n") as n:
        nonce = n.dialer_nonces.fresh(True)

        def present():
            raw = RawPeer(n.listen_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.send(wire.frame_header(raw.challenge(nonce)))
            raw.read_exact(16)
            raw.read_header()
            return raw.expect_error()

        err = await asyncio.to_thread(present)
        assert err.code == "handshake" and "dialed" in err.msg


async def test_a_challenge_read_after_the_deadline_gets_no_proof():
    """§5.7: a side acts on nothing it reads after its handshake's deadline (the dialer-nonce
    window relies on it). The node dials; the peer answers with its challenge; the node's
    loop is busy until the deadline has passed; then the node says ``timeout``, not ``auth``."""
    import socket
    import threading

    from handoff.bounds import Bounds

    for _ in range(3):
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]
        ready, go = threading.Event(), threading.Event()
        answer = {}

        def accept():
            conn, _ = server.accept()
            conn.settimeout(5)
            raw = RawPeer.__new__(RawPeer)
            raw.sock, raw.buf, raw.received = conn, b"", b""
            raw.read_exact(16)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_header()  # the node's challenge
            ready.set()
            go.wait(5)
            time.sleep(0.1)  # arrives while the node's loop is busy
            raw.send(wire.frame_header(raw.challenge()))
            try:
                answer["kind"] = type(raw.read_header()[1]).__name__
            except EOFError:
                answer["kind"] = "closed"
            conn.close()

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        async with Node("late", secret=SECRET, bounds=Bounds(handshake_timeout=0.3)) as n:
            dial = asyncio.ensure_future(n.connect(f"tcp://127.0.0.1:{port}"))
            await asyncio.to_thread(ready.wait, 5)
            go.set()
            time.sleep(0.5)  # the loop is busy past the deadline; the challenge comes meanwhile
            with pytest.raises(Exception):
                await dial
        t.join(5)
        server.close()
        assert answer.get("kind") in ("Error", "closed"), f"the node answered a late challenge with {answer}"


# ---------------------------------------------------------------- identity lengths (§5.2)


def ident(**kw) -> wire.Ident:
    fields = dict(node="0" * 32, name="n", host="h", pid=1, proc="1" * 32, lang="python", impl="i", caps=["inline"])
    fields.update(kw)
    return wire.Ident(**fields)


@pytest.mark.parametrize(
    "field, ok, too_long",
    [
        ("node", "a" * 64, "a" * 65),
        ("proc", "a" * 64, "a" * 65),
        ("name", "é" * 128, "é" * 128 + "x"),  # UTF-8 bytes, not characters
        ("host", "h" * 256, "h" * 257),
        ("lang", "l" * 32, "l" * 33),
        ("impl", "i" * 128, "i" * 129),
        ("listen", "t" * 1024, "t" * 1025),
        ("unix", "u" * 1024, "u" * 1025),
        ("caps", ["inline"] + ["c" * 64] * 31, ["inline"] + ["c"] * 32),
        ("caps", ["inline", "c" * 64], ["inline", "c" * 65]),
    ],
)
def test_identity_fields_are_bounded_in_ident_and_hello(field, ok, too_long):
    for make in (lambda i: i, lambda i: wire.hello_of(i, 3, bytes(32))):
        assert wire.decode_header(wire.encode_header(make(ident(**{field: ok})))).kind in ("ident", "hello")
        with pytest.raises(wire.WireError) as e:
            wire.decode_header(wire.encode_header(make(ident(**{field: too_long}))))
        assert e.value.code == "malformed-header" and field in e.value.message


def test_identity_bounds_are_part_of_the_type_whatever_the_kind():
    """As a fixed length is (§6 rule 3): a ``ready`` with a long ``name`` is malformed too."""
    for key, value in (("name", "n" * 257), ("caps", ["c"] * 33), ("unix", "u" * 1025)):
        header = wire.packer().pack({"k": "ready", key: value})
        with pytest.raises(wire.WireError) as e:
            wire.decode_header(header)
        assert e.value.code == "malformed-header" and key in e.value.message
    assert wire.decode_header(wire.packer().pack({"k": "ready", "name": "n" * 256})).kind == "ready"


def test_identity_bounds_are_checked_in_the_order_the_fields_come():
    with pytest.raises(wire.WireError) as e:
        wire.decode_header(wire.encode_header(ident(name="n" * 300, host="h" * 300)))
    assert "name" in e.value.message and "host" not in e.value.message
    h = wire.encode_header(ident(name="n" * 300)).replace(b"\xa4caps", b"\xa4xxxx")  # and no caps: name first
    with pytest.raises(wire.WireError) as e:
        wire.decode_header(h)
    assert "name" in e.value.message


def test_a_node_refuses_an_identity_of_its_own_that_breaks_a_bound():
    with pytest.raises(ValueError) as e:
        Node("n" * 257)
    assert "name" in str(e.value) and "256" in str(e.value)
    with pytest.raises(ValueError) as e:
        Node("ok", host_id="h" * 257)
    assert "host" in str(e.value) and "256" in str(e.value)
    Node("n" * 256, host_id="h" * 256)  # at the bounds


# ---------------------------------------------------------------- what a node sends (§9)


def test_send_limits_are_the_defaults_or_smaller():
    """What a node sends within (the engine's ``Limits::for_sending``, or the reference's own)."""
    big = wire.Limits(max_header_bytes=64 << 20, max_frames=4096, max_frame_bytes=8 << 30, max_message_bytes=1 << 40)
    assert Node("big", limits=big).send_limits == wire.DEFAULT_LIMITS
    small = wire.Limits(max_header_bytes=1024, max_frames=2, max_frame_bytes=100, max_message_bytes=150)
    assert Node("small", limits=small).send_limits == small
    values = wire.Limits(max_header_values=8, max_frames=4096)
    assert Node("values", limits=values).send_limits == wire.Limits(max_header_values=8)


@pytest.mark.parametrize(
    "limits, body, code",
    [
        (wire.Limits(max_header_bytes=4096), {"x": list(range(5000))}, "header-too-large"),
        (wire.Limits(max_frames=2), {"a": Buffer(b"a" * 2000), "b": Buffer(b"b" * 2000), "c": Buffer(b"c" * 2000)},
         "too-many-frames"),
        (wire.Limits(max_frame_bytes=3000), {"a": Buffer(b"a" * 3001)}, "frame-too-large"),
        (wire.Limits(max_message_bytes=5000), {"a": Buffer(b"a" * 3000), "b": Buffer(b"b" * 3000)},
         "message-too-large"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("channel", ["tcp", "shm"])
async def test_a_send_a_receiver_would_refuse_fails_locally_and_the_connection_carries_on(limits, body, code, channel):
    async with py_node("a", limits=limits, shm_threshold=1024) as a, py_node("b") as b:
        peer = await a.connect(b.listen_addr, channel=channel)
        with pytest.raises(MessageTooLarge) as e:
            await peer.send("t.Big", body)
        assert e.value.code == code and str(e.value.limit) in str(e.value)
        assert peer.shm_leases() == {"count": 0, "bytes": 0}, "nothing leased for a send that failed"
        assert a.ticket_leases()["count"] == 0
        await peer.send("t.Small", {"ok": True})
        env = await b.recv(5)
        assert env.type_name == "t.Small"


async def test_the_default_limits_bound_sends_of_a_node_with_larger_ones():
    async with py_node("a", limits=wire.Limits(max_header_bytes=64 << 20)) as a, py_node("b") as b:
        peer = await a.connect(b.listen_addr, channel="tcp")
        with pytest.raises(MessageTooLarge) as e:
            await peer.send_packed("t.Big", b"\xc6" + struct.pack(">I", 17 << 20) + bytes(17 << 20))
        assert e.value.code == "header-too-large" and e.value.limit == 16 << 20


async def test_an_error_that_quotes_the_peer_is_clipped():
    async with py_node("a") as a:

        def long_kind():
            raw = RawPeer(a.listen_addr)
            raw.send(wire.OUR_PREAMBLE.encode())
            raw.read_exact(16)
            raw.read_header()
            header = b"\x81\xa1k\xda" + struct.pack(">H", 60000) + b"k" * 60000
            raw.send(wire.frame_header(header))
            n = struct.unpack(">I", raw.read_exact(4))[0]
            return n, wire.decode_header(raw.read_exact(n), wire.during_handshake(wire.DEFAULT_LIMITS))

        n, err = await asyncio.to_thread(long_kind)
        assert err.code == "unknown-kind" and len(err.msg) <= MAX_TEXT and n < 2 * MAX_TEXT


async def test_stats_list_at_most_so_many_peers_and_count_them_all(monkeypatch):
    monkeypatch.setattr(node_module, "STATS_MAX_PEERS", 2)
    async with py_node("hub") as hub:
        others = [py_node(f"p{i}") for i in range(3)]
        for o in others:
            await o.start()
            await o.connect(hub.listen_addr, channel="tcp")
        await eventually(lambda: len(hub.peers) == 3)
        stats = hub.stats()
        assert len(stats["peers"]) == 2 and stats["peers_total"] == 3
        for o in others:
            await o.close()


# ---------------------------------------------------------------- accepting older versions


def test_the_worker_takes_accept_v2():
    from handoff.worker import parse_args

    assert parse_args(["--name", "w"]).accept_v2 is False
    assert parse_args(["--name", "w", "--accept-v2"]).accept_v2 is True


def test_the_dask_settings_take_accept_v2_and_accept_v1(monkeypatch):
    dask = pytest.importorskip("dask")
    from handoff.dask import config
    from handoff.dask.nodes import make_node

    assert (config.settings().accept_v2, config.settings().accept_v1) == (False, False)
    accepts = lambda n: (n.accept_v2, n.accept_v1)  # noqa: E731  (what the node announces, §3)
    assert accepts(make_node(config.settings(), "t")) == (False, False)
    with dask.config.set({"distributed.comm.handoff.accept-v2": True}):
        s = config.settings()
        assert s.accept_v2 and not s.accept_v1
        assert accepts(make_node(s, "t")) == (True, False)
    with dask.config.set({"distributed.comm.handoff.accept-v1": "true"}):  # as an environment variable gives it
        assert accepts(make_node(config.settings(), "t")) == (True, True)
    with dask.config.set({"distributed.comm.handoff.accept-v2": "maybe"}):
        with pytest.raises(ValueError, match="accept-v2"):
            config.settings()

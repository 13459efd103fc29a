"""Attacks on the handshake by a peer without the cluster secret (spec §5.6–§5.8), against
real victim processes: ``python -m handoff.worker`` and the Rust ``handoff node``.

Version 3 gives such a peer nothing computed with the secret: an acceptor proves only
after it verified the dialer's proof, every proof names its role and covers the whole
transcript, and a challenge that carries a nonce the victim recently sent as a dialer
is refused. Each attack asserts what the attacker got — the victim's preamble, a challenge,
at most an ``error``: never an ``auth``, an ``ident`` or a ``ready`` — and that a
legitimate peer (with the secret) gets a ``handoff.bench.Ping`` answered meanwhile:

(a) two connections to one node, their challenges crossed (the §5.6 attack, adapted);
(b) the same across two nodes of one cluster;
(c) a proof recorded on one connection, replayed on a new one;
(d) a victim that dials the attacker, who dials the victim and relays the victim's own
    challenge into it: refused at the challenge by the dialer-nonce check;
(e) downgrade: a default victim refuses a peer that announces only version 2; with
    ``--accept-v2`` the §5.6 attack across it and a version-2 node of its cluster
    *succeeds* (why accepting v2 is dangerous), while against it alone it fails; with
    ``--accept-v1`` the attack on version 1 across two such nodes succeeds;
(f) 80 Unix connections sending the preamble a byte at a time with 64 descriptors on
    each write: the victim's descriptor count stays where it was;
(g) a peer that never completes its preamble gets no ``error``, only the preamble.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time

import pytest
from attacker import Wire, challenge_of, free_port, opened, relay
from conftest import SECRET
from handoff import Bin, Node
from handoff_pure import wire

PING = "handoff.bench.Ping"
#: Both victims' handshake timeout in these tests (``--handshake-timeout-ms``).
HANDSHAKE_MS = 2000


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Victim:
    """A victim process and a legitimate peer of its cluster (a Node with the secret)."""

    def __init__(self, child, legit: Node, kind: str):
        self.child = child
        self.pid = child.proc.pid
        self.legit = legit
        self.kind = kind
        self.peer = None
        self.seq = 0

    @property
    def listen(self) -> str:
        return self.child.listen

    @property
    def preamble(self) -> bytes:
        """What the victim sends first (its default: version 3 only)."""
        return wire.OUR_PREAMBLE.encode()

    def alive(self) -> bool:
        return self.child.proc.poll() is None

    async def ping(self, timeout: float = 5.0) -> None:
        """A Ping from the legitimate peer, answered within ``timeout``."""
        if self.peer is None or self.peer.closed:
            self.peer = await asyncio.wait_for(self.legit.connect(self.listen, channel="tcp"), timeout)
        self.seq += 1
        await self.peer.send(PING, {"seq": self.seq, "data": Bin(b"legit")})
        deadline = time.monotonic() + timeout
        while True:
            env = await self.legit.recv(max(deadline - time.monotonic(), 0.01))
            with env:
                if env.type_name == PING and env.body["seq"] == self.seq:
                    return

    async def unix_addr(self) -> str:
        async with Node("asker", secret=SECRET) as n:  # same host id: it learns the socket
            peer = await n.connect(self.listen, channel="tcp")
            return peer.unix_addr

    async def served_meanwhile(self, attack, interval: float = 0.1):
        """Runs ``attack`` (blocking) on a thread, pinging the victim until it ends; returns its result."""
        task = asyncio.ensure_future(asyncio.to_thread(attack))
        pings = 0
        while not task.done():
            await self.ping()
            pings += 1
            await asyncio.wait({task}, timeout=interval)
        await self.ping()
        assert self.alive(), f"the victim died; stderr:\n{self.child.stderr()[-3000:]}"
        return task.result()


@pytest.fixture(params=["python", "rust"])
async def victim(request, spawn_py_worker, spawn_rust):
    kind = request.param
    made = []

    async def start(*flags: str, name: str = "victim") -> Victim:
        args = ("--handshake-timeout-ms", str(HANDSHAKE_MS), *flags)
        if kind == "python":
            child = await spawn_py_worker(f"{name}-py", *args, env={"HANDOFF_LOG": "warn"})
        else:
            child = await spawn_rust(f"{name}-rs", *args)
        legit = Node(f"legit-{len(made)}", secret=SECRET, host_id="legit-host")
        await legit.start()
        v = Victim(child, legit, kind)
        made.append(v)
        await v.ping(10)
        return v

    start.kind = kind
    yield start
    for v in made:
        await v.legit.close()


def cross(a: Wire, b: Wire) -> None:
    """Sends on each connection the challenge the victim sent on the other."""
    ca, cb = challenge_of(a), challenge_of(b)
    a.send_header(cb)
    b.send_header(ca)


def finish_without_a_proof(*conns: Wire, what: str) -> None:
    """The acceptor waits for the dialer's proof and sends nothing meanwhile; the attacker
    has none to give: a made-up one is refused. Then nothing was revealed."""
    for w in conns:
        if not w.closed and w.nothing_for(0.3):
            w.send(wire.encode_message(wire.Auth(secrets.token_bytes(32))))
        w.read_to_end()
        w.assert_unproven(what)
        assert w.error_code() in ("handshake", "auth-failed"), (what, w.kinds(), w.error_code())


# ---------------------------------------------------------------- (a) (b) (c): the victim accepts


async def test_a_crossed_challenges_on_two_connections_to_one_node(victim):
    v = await victim()

    def attack():
        a, b = opened(v.listen, v.preamble), opened(v.listen, v.preamble)
        cross(a, b)
        # The victim is the acceptor on both: it writes no proof for a peer that has not
        # proven the secret, so there is nothing to carry from one connection to the other.
        assert a.nothing_for(0.5) and b.nothing_for(0.5), (a.kinds(), b.kinds())
        finish_without_a_proof(a, b, what="crossed challenges, one node")
        return a.error_code(), b.error_code()

    assert await v.served_meanwhile(attack) == ("auth-failed", "auth-failed")


async def test_b_crossed_challenges_across_two_nodes_of_one_cluster(victim):
    v1 = await victim(name="n1")
    v2 = await victim(name="n2")

    def attack():
        a, b = opened(v1.listen, v1.preamble), opened(v2.listen, v2.preamble)
        cross(a, b)
        # Both are acceptors: neither writes a proof for a peer that has not proven the
        # secret, so there is nothing to carry from one to the other.
        assert a.nothing_for(0.5) and b.nothing_for(0.5), (a.kinds(), b.kinds())
        finish_without_a_proof(a, b, what="crossed challenges, two nodes")
        return a.error_code(), b.error_code()

    assert await v1.served_meanwhile(attack) == ("auth-failed", "auth-failed")
    await v2.ping()


async def test_c_a_proof_replayed_on_a_new_connection(victim):
    v = await victim()
    from helpers import RawPeer

    def attack():
        member = RawPeer(v.listen)
        member.handshake(SECRET)  # a connection of a member, recorded
        rec = member.transcript
        got = []
        for mac in (rec["mac"], rec["peer_mac"]):  # its dialer proof; the victim's own acceptor proof
            w = Wire(v.listen)
            w.send(rec["preamble"])
            w.send_header(rec["challenge"])  # the same challenge, so the same transcript but for
            w.read_preamble()  # the victim's fresh nonce
            w.expect("challenge")
            w.send(wire.encode_message(wire.Auth(mac)))
            w.read_to_end()
            w.assert_unproven("replayed proof")
            got.append(w.error_code())
        member.close()
        return got

    assert await v.served_meanwhile(attack) == ["auth-failed", "auth-failed"]


# ---------------------------------------------------------------- (d): the victim dials the attacker


async def test_d_the_victims_own_dial_relayed_into_it_is_refused_at_the_challenge(victim):
    port = free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    attacker_addr = "tcp://127.0.0.1:%d" % listener.getsockname()[1]
    victim_addr = f"tcp://127.0.0.1:{port}"
    result: dict = {}

    async with Node("member", secret=SECRET, listen="127.0.0.1:0", host_id="member-host") as member:

        def attack():
            conn, _ = listener.accept()  # the victim dials us (its --connect)
            x = Wire(sock=conn)
            x.read_preamble()
            x.send(x.preamble)  # our preamble: the victim's own, so that the transcripts could match
            cx_raw, _ = x.expect("challenge")
            # We dial the victim and present its own challenge from X: were it accepted, the
            # victim's dialer proof on X would be the dialer proof it expects on Y. It is a
            # nonce the victim sent as a dialer: refused at the challenge (§5.7 step 3).
            for _ in range(100):
                try:
                    y = Wire(victim_addr)
                    break
                except ConnectionRefusedError:
                    time.sleep(0.05)
            y.send(x.preamble)
            y.send_header(cx_raw)
            y.read_preamble()
            cy_raw, _ = y.expect("challenge")
            result["y"] = y
            if y.nothing_for(0.5):
                # Not refused at the challenge: the relay goes on, and succeeds. Our challenge
                # on X is the victim's from Y; its dialer proof on X is the one Y expects.
                x.send_header(cy_raw)
                _, proof = x.expect("auth")
                y.send(wire.encode_message(proof))
            y.read_to_end()
            # X is left to a byte relay to a member of the cluster, so that the victim comes
            # up (a genuine handshake between the two, through us: the misbinding of §5.8).
            first = x.received
            x.sock.settimeout(None)
            result["relay"] = relay(first, x.sock, member.listen_addr, drop=16)

        thread = threading.Thread(target=attack, daemon=True)
        thread.start()
        try:
            v = await victim("--listen", f"127.0.0.1:{port}", "--connect", attacker_addr)
        finally:
            thread.join(10)
            if "y" in result:  # what the attacker got says more than a victim that did not come up
                result["y"].assert_unproven("the victim's own challenge relayed into it")
        y = result["y"]
        assert y.kinds() == ["challenge", "error"], y.kinds()
        assert y.error_code() == "handshake"
        err = y.headers[-1][1]
        assert "nonce" in err.msg and "dial" in err.msg, err.msg
        await v.ping()  # served
        assert v.alive()
        # The victim connected, through the relay, to the member: identity misbinding,
        # which only TLS prevents (§5.8).
        await member.wait_for_peer(v.child.name, timeout=5)
    listener.close()


# ---------------------------------------------------------------- (e): downgrade


async def test_e_a_default_victim_refuses_a_version_2_peer(victim):
    v = await victim()

    def attack():
        w = Wire(v.listen)
        w.send(wire.V2_DEFAULT.encode())
        w.read_preamble()
        w.read_to_end()
        return w

    w = await v.served_meanwhile(attack)
    assert w.preamble == wire.OUR_PREAMBLE.encode()
    assert w.kinds() == ["error"] and w.error_code() == "unsupported-version"


def v2_cross(c_addr: str, c_pre: bytes, d_addr: str, d_pre: bytes) -> tuple:
    """The §5.6 attack on version 2 across two connections: challenges crossed, each
    node's proof forwarded to the other connection, then our own ident on both."""
    c, d = opened(c_addr, c_pre), opened(d_addr, d_pre)
    cross(c, d)
    out = []
    for w in (c, d):
        _, h = w.read_header()
        out.append(h)
    if not all(isinstance(h, wire.Auth) for h in out):
        return c, d, False
    c.send(wire.encode_message(out[1]))
    d.send(wire.encode_message(out[0]))
    ok = True
    for w in (c, d):
        _, h = w.read_header()
        if not isinstance(h, wire.Ident):
            ok = False
            continue
        me = wire.Ident(secrets.token_hex(16), "intruder", "nowhere", 1, secrets.token_hex(16), "x", "x", ["inline"])
        w.send(wire.encode_message(me))
        w.send(wire.encode_message(wire.Ready()))
        _, r = w.read_header()
        ok = ok and isinstance(r, wire.Ready)
    return c, d, ok


async def test_e_accepting_v2_lets_the_reflection_attack_in_across_a_version_2_node(victim):
    """Documents the danger of ``--accept-v2``: with a version-2 node in the cluster (the
    reason to accept v2 at all), an attacker without the secret crosses the two nodes'
    challenges and proofs and is accepted by the victim, which then serves it."""
    v = await victim("--accept-v2")
    # A node of the cluster that still speaks version 2 only (2..=2), as before the upgrade.
    async with Node("old-v2", secret=SECRET, listen="127.0.0.1:0", preamble=wire.V2_DEFAULT) as old:

        def attack():
            # To the victim (2..=3) we announce 2..=2, to the old node its peer's 2..=3: both
            # negotiate version 2, and each proof covers the same two preambles.
            c, d, ok = v2_cross(v.listen, wire.V2_DEFAULT.encode(), old.listen_addr, wire.ACCEPTING_V2.encode())
            if ok:
                c.send(wire.encode_message(wire.Msg(PING, b"\x82\xa3seq\x07\xa4data\xc4\x02in", [])))
                while True:
                    _, h = c.read_header()
                    if isinstance(h, wire.Msg) and h.t == PING:
                        break
            return c, ok

        c, ok = await v.served_meanwhile(attack)
        assert ok, f"the attack on version 2 failed: {c.kinds()}"
        assert "ident" in c.kinds() and "ready" in c.kinds(), "the victim took the attacker in and answered it"


async def test_e_accepting_v2_alone_the_reflection_attack_fails(victim):
    """Against the victim alone, the attack of §5.6 needs its own preamble on both
    connections; a node that accepts v2 announces 2..=3, which chooses version 3. So the
    attacker announces 2..=2 to get version 2, and then the proofs cover other preambles."""
    v = await victim("--accept-v2")

    def attack():
        p = wire.V2_DEFAULT.encode()
        c, d, ok = v2_cross(v.listen, p, v.listen, p)
        for w in (c, d):
            if not w.closed:
                w.read_to_end()
        return c, d, ok

    c, d, ok = await v.served_meanwhile(attack)
    assert not ok
    for w in (c, d):
        assert "ident" not in w.kinds() and "ready" not in w.kinds(), w.kinds()
        assert w.error_code() in ("auth-failed", "handshake"), w.kinds()


async def test_e_accepting_v1_lets_the_reflection_attack_in_across_two_nodes_that_accept_it(victim):
    """Documents the danger of ``--accept-v1``: version 1's proofs cover only the two hellos,
    so across two nodes that accept it (both announce 1..=3) the attacker crosses their
    hellos and proofs and each takes it for the other (§5.3, §5.6)."""
    v1 = await victim("--accept-v1", name="n1")
    v2 = await victim("--accept-v1", name="n2")

    def attack():
        c, d = Wire(v1.listen), Wire(v2.listen)
        for w in (c, d):
            w.send(wire.V1_ONLY.encode())
            w.read_preamble()
            w.expect("hello")
        h1, h2 = c.headers[0][0], d.headers[0][0]
        c.send_header(h2)  # to each node, the other's hello
        d.send_header(h1)
        _, a1 = c.expect("auth")
        _, a2 = d.expect("auth")
        c.send(wire.encode_message(a2))
        d.send(wire.encode_message(a1))
        for w in (c, d):
            w.expect("ready")
            w.send(wire.encode_message(wire.Ready()))
        c.send(wire.encode_message(wire.Msg(PING, b"\x82\xa3seq\x07\xa4data\xc4\x02in", [])))
        while True:
            _, h = c.read_header()
            if isinstance(h, wire.Msg) and h.t == PING:
                return c

    c = await v1.served_meanwhile(attack)
    assert "ready" in c.kinds(), "a node that accepts v1 took the attacker for its peer and answered it"


# ---------------------------------------------------------------- (f): descriptors before the handshake


async def test_f_descriptors_with_every_byte_of_the_preamble(victim):
    v = await victim()
    unix = (await v.unix_addr())[len("unix://") :]
    fds = [os.memfd_create("flood") for _ in range(64)]
    before = fd_count(v.pid)
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], fd_count(v.pid))
            except OSError:
                pass
            time.sleep(0.005)

    def one_connection() -> bytes:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(unix)
        s.settimeout(5)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(fd.to_bytes(4, "little") for fd in fds))]
        try:
            for byte in wire.OUR_PREAMBLE.encode():
                s.sendmsg([bytes([byte])], anc)
                time.sleep(0.01)
        except OSError:
            pass  # the victim closed it: what it should do
        got = b""
        try:
            while True:
                data = s.recv(4096)
                if not data:
                    break
                got += data
        except OSError:
            pass
        s.close()
        return got

    def attack():
        answers = []
        lock = threading.Lock()

        def worker():
            for _ in range(3):  # each of 80 places dials again when closed
                got = one_connection()
                with lock:
                    answers.append(got)

        threads = [threading.Thread(target=worker) for _ in range(80)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return answers

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        answers = await v.served_meanwhile(attack)
    finally:
        stop.set()
        sampler.join()
        for fd in fds:
            os.close(fd)
    # Held until the next header, each connection's descriptors would pile up to 128 (then
    # fail the connection): 80 connections, ~10 000; closed as each read returns, one read still
    # held 64 for an instant (80 sockets + 64 > 140). Reads before the handshake offer them no
    # room, so the kernel closes them unopened: allow each connection its socket, and a little.
    assert peak[0] - before < 100, f"the victim held {peak[0] - before} more descriptors during the flood"
    assert len(answers) == 240
    # Each connection got the victim's preamble and its end: no challenge (the preamble was
    # never complete), no error (§3).
    assert all(a == v.preamble for a in answers), {a[:40] for a in answers}
    await asyncio.sleep(0.5)
    assert fd_count(v.pid) < before + 16


# ---------------------------------------------------------------- (g): no error before the preamble


@pytest.mark.parametrize("sent", [0, 5, 15])
async def test_g_no_error_to_a_peer_that_never_completes_its_preamble(victim, sent):
    v = await victim()

    def attack():
        w = Wire(v.listen, timeout=HANDSHAKE_MS / 1000 + 5)
        w.send(wire.OUR_PREAMBLE.encode()[:sent])
        started = time.monotonic()
        w.read_to_end(timeout=HANDSHAKE_MS / 1000 + 5)
        return w, time.monotonic() - started

    w, took = await v.served_meanwhile(attack)
    assert w.received == v.preamble, f"after an incomplete preamble, nothing but the victim's: {w.received!r}"
    assert took >= HANDSHAKE_MS / 1000 * 0.8, "closed at the handshake timeout"

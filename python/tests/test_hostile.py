"""Hostile peers against a real victim process (issue 11: no peer can take a node down).
One test per class of attack against one victim: long, but one idea, so one file.

Each test starts ``python -m handoff.worker`` with small bounds as the victim, attacks
it from this process with raw sockets that speak the wire format by hand, and checks,
for that class of attack:

(a) the victim process is still alive;
(b) its resident memory (VmRSS of /proc/PID/status) stays under its idle baseline
    plus ``RSS_SLACK`` (64 MiB) — the attacks would cost hundreds of MiB (or a crash)
    without the bounds;
(c) a legitimate peer (a :class:`handoff.Node` here, with the cluster secret) still
    gets a ``handoff.bench.Ping`` answered while or right after the attack.

The victim's bounds are small so that each attack is cheap (see ``VICTIM``).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import resource
import secrets
import socket
import struct
import threading
import time

import msgpack
import pytest
from conftest import SECRET
from handoff import Bin, Node
from handoff_pure import wire
from helpers import PeerError, RawPeer

MIB = 1 << 20
RSS_SLACK = 64 * MIB

#: The victim's bounds (flags of ``python -m handoff.worker``), small so attacks are cheap.
VICTIM = {
    "--max-buffered-bytes-per-peer": "4MiB",
    "--max-buffered-bytes": "16MiB",
    "--max-request-bytes": "8MiB",
    "--max-preparing-bytes": "16MiB",
    "--max-held": "64",
    "--max-held-bytes": "16MiB",
    "--handshake-timeout-ms": "2000",
    "--progress-timeout-ms": "2000",
    "--write-timeout-ms": "1000",
    "--lease-wait-ms": "300",
    "--max-shm-leases-per-peer": "16",
    "--max-shm-bytes-per-peer": "32MiB",
    "--lease-ttl-ms": "5000",
}

PING = "handoff.bench.Ping"


# ---------------------------------------------------------------- the victim and its observers


def status(pid: int, field: str) -> int:
    text = open(f"/proc/{pid}/status").read()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def cpu_time(pid: int) -> float:
    """Seconds of CPU the process used (user and system)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Victim:
    def __init__(self, child, legit: Node):
        self.child = child
        self.pid = child.proc.pid
        self.legit = legit
        self.peer = None
        self.seq = 0
        self.baseline = 0
        self.peak = 0

    @property
    def listen(self) -> str:
        return self.child.listen

    @property
    def host_id(self) -> str:
        return self.child.ready["host_id"]

    def alive(self) -> bool:
        return self.child.proc.poll() is None

    def rss(self) -> int:
        rss = status(self.pid, "VmRSS")
        self.peak = max(self.peak, rss)
        return rss

    def stderr_size(self) -> int:
        return self.child.err_path.stat().st_size

    async def ping(self, timeout: float = 5.0) -> float:
        """A Ping from the legitimate peer, answered within ``timeout``; returns the seconds it took."""
        started = time.monotonic()
        if self.peer is None or self.peer.closed:
            self.peer = await asyncio.wait_for(self.legit.connect(self.listen), timeout)
        self.seq += 1
        await self.peer.send(PING, {"seq": self.seq, "data": Bin(b"legit")})
        while True:
            left = timeout - (time.monotonic() - started)
            env = await self.legit.recv(max(left, 0.01))
            with env:
                if env.type_name == PING and env.body["seq"] == self.seq:
                    return time.monotonic() - started

    async def ask(self, type_name: str, body: dict, answer: str, timeout: float = 5.0):
        if self.peer is None or self.peer.closed:
            self.peer = await self.legit.connect(self.listen)
        await self.peer.send(type_name, body)
        deadline = time.monotonic() + timeout
        while True:
            env = await self.legit.recv(max(deadline - time.monotonic(), 0.01))
            if env.type_name == answer:
                return env.body

    async def stats(self) -> dict:
        return await self.ask("handoff.admin.StatsRequest", {}, "handoff.admin.Stats")

    async def unix_addr(self) -> str:
        if self.peer is None or self.peer.closed:
            self.peer = await self.legit.connect(self.listen)
        return self.peer.unix_addr

    async def served_meanwhile(self, attack, *, interval: float = 0.2, timeout: float = 5.0):
        """Runs ``attack`` (blocking) on a thread; meanwhile pings and samples memory.
        Returns the attack's result."""
        task = asyncio.ensure_future(asyncio.to_thread(attack))
        pings = 0
        while not task.done():
            self.rss()
            await self.ping(timeout)
            pings += 1
            await asyncio.wait({task}, timeout=interval)
        assert pings, "the attack ended before a single ping"
        return task.result()

    async def check(self, what: str) -> None:
        """(a) alive, (b) memory under the bound, (c) a legitimate peer served."""
        assert self.alive(), f"{what}: the victim died; stderr:\n{self.child.stderr()[-3000:]}"
        self.rss()
        assert self.peak - self.baseline < RSS_SLACK, (
            f"{what}: VmRSS grew by {(self.peak - self.baseline) / MIB:.1f} MiB over its idle baseline"
        )
        await self.ping()


@pytest.fixture
async def victim(spawn_py_worker):
    made = []

    async def start(*extra: str, **flags: str) -> Victim:
        args = dict(VICTIM)
        args.update({f"--{k.replace('_', '-')}": v for k, v in flags.items()})
        argv = [x for kv in args.items() for x in kv] + list(extra)
        child = await spawn_py_worker(f"victim-{len(made)}", *argv, env={"HANDOFF_LOG": "warn"})
        legit = Node("legit", secret=SECRET, host_id="legit-host")
        await legit.start()
        v = Victim(child, legit)
        made.append(v)
        await v.ping(10)  # warm: imports done, first connection made
        v.baseline = v.rss()
        return v

    yield start
    for v in made:
        await v.legit.close()


def raw(addr: str, host: str = "raw-host", **hello) -> RawPeer:
    """A raw peer past the handshake."""
    r = RawPeer(addr)
    r.handshake(SECRET, host=host, **hello)
    return r


def body(**fields) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def ref(i: int) -> msgpack.ExtType:
    """A frame reference (§8.2)."""
    return msgpack.ExtType(1, struct.pack(">I", i))


def memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def read_until(r: RawPeer, want, limit: int = 100_000):
    """Reads messages (closing any descriptors that come) until ``want(header)``; returns it."""
    for _ in range(limit):
        h, frames = r.read_message()
        if want(h):
            return h, frames
    raise AssertionError("not found")


# ---------------------------------------------------------------- the attacks


async def test_bodies_that_do_not_decode(victim):
    v = await victim()
    before = v.stderr_size()

    def attack():
        r = raw(v.listen)
        bad = [
            wire.encode_message(wire.Msg(PING, b"\xc1", [])),  # not msgpack
            wire.encode_message(wire.Msg(PING, body(seq="x", data=1), [])),  # wrong field types
            # Only seq of the wrong type: a bad-body, not echoed (Appendix A field types)
            wire.encode_message(wire.Msg(PING, body(seq="x", data=b"y"), [])),
            wire.encode_message(wire.Msg("handoff.demo.SendRequest", body(id=1), [])),  # a field missing
            wire.encode_message(wire.Msg("handoff.demo.Hold", body(id=1, data=ref(5)), [])),  # no frame 5
            wire.encode_message(wire.Msg("handoff.demo.Payload", b"\x91" * 200 + b"\x90", [])),  # too deep
        ]
        r.send(b"".join(bad) * 400)
        r.send(wire.encode_message(wire.Msg(PING, body(seq=7, data=b"after"), [])))
        h, _ = read_until(r, lambda h: isinstance(h, wire.Msg) and h.t == PING)
        return msgpack.unpackb(h.b)

    assert await v.served_meanwhile(attack) == {"seq": 7, "data": b"after"}, "the connection stays in step"
    await v.check("2,400 bodies that do not decode")
    grown = v.stderr_size() - before
    assert grown < 16 * 1024, f"the log grew by {grown} bytes for 2,400 bad bodies"


@pytest.mark.parametrize("case", ["unsealed-then-truncated", "regular-file", "sealed-claim-without-seals"])
async def test_segments_that_could_fault_the_reader(victim, case, tmp_path):
    # The victim maps a frame as soon as it reads the message and reads its bytes when it
    # handles it, half a second later (--delay-ms): the attacker cuts the file short in between.
    v = await victim(delay_ms="500")
    unix = await v.unix_addr()

    def attack():
        r = raw(unix, host=v.host_id)
        if case == "regular-file":
            (tmp_path / "f").write_bytes(b"x" * MIB)
            fd = os.open(tmp_path / "f", os.O_RDWR)
        elif case == "unsealed-then-truncated":
            fd = memfd(MIB, seals=0)
        else:
            fd = memfd(MIB)
        sealed = case == "sealed-claim-without-seals"
        # A Payload: the victim reads every byte of it (to check its digest).
        msg = wire.Msg(
            "handoff.demo.Payload",
            body(id=1, digest=ref(0), data=ref(1), prepare_seconds=0.0),
            [wire.Inline(32), wire.Shm(MIB, 0, MIB, 1, sealed=sealed)],
        )
        r.send(wire.encode_message(msg, [bytes(32)]), [fd])
        time.sleep(0.2)
        if case != "sealed-claim-without-seals":  # (that one cannot shrink: it only lies about its seals)
            os.ftruncate(fd, 0)  # a reader that mapped it faults (SIGBUS) on its next read
        err = r.expect_error()
        os.close(fd)
        return err

    err = await v.served_meanwhile(attack)
    assert err.code == "bad-shm", err
    await v.check(f"segment: {case}")


async def test_send_requests_for_huge_payloads(victim):
    v = await victim()

    def attack():
        r = raw(v.listen)
        for n in (1 << 40, (8 << 20) + 1, (1 << 64) - 1):
            r.send(wire.encode_message(wire.Msg("handoff.demo.SendRequest", body(id=n & 0xFFFF, bytes=n), [])))
        r.send(wire.encode_message(wire.Msg(PING, body(seq=1, data=b""), [])))
        h, _ = read_until(r, lambda h: isinstance(h, wire.Msg))
        return h.t

    assert await v.served_meanwhile(attack) == PING, "no Payload: refused, no answer"
    await v.check("SendRequest of 1 TiB")
    assert "refusing SendRequest" in v.child.stderr()
    payload = await v.ask("handoff.demo.SendRequest", {"id": 9, "bytes": MIB}, "handoff.demo.Payload")
    assert len(payload["data"]) == MIB, "a request within the bound is still served"


async def test_tiny_windows_of_huge_sparse_segments(victim):
    v = await victim()
    unix = await v.unix_addr()
    vm_before = status(v.pid, "VmSize")
    size, off = 1 << 40, 1 << 39  # 1 TiB, sparse: costs the sender nothing

    def attack():
        fd = memfd(size)
        os.pwrite(fd, b"!", off)
        r = raw(unix, host=v.host_id)
        held = 0
        # In rounds of 20, reading the answers in between: the victim queues at most 64
        # answers for a peer that does not read them (--answer-queue), and drops the rest.
        for first in range(0, 300, 20):
            for i in range(first, first + 20):  # Hold keeps the first 64 (--max-held), Blob none
                kind = "handoff.demo.Hold" if i % 2 else "handoff.bench.Blob"
                b = body(id=i, data=ref(0)) if i % 2 else body(seq=i, data=ref(0))
                r.send(wire.encode_message(wire.Msg(kind, b, [wire.Shm(1, off, size, i + 1)])), [fd])
            for _ in range(20):
                h, _ = read_until(r, lambda h: isinstance(h, wire.Msg))
                if h.t == "handoff.demo.Held":
                    held += msgpack.unpackb(h.b)["bytes"]
        os.close(fd)
        return held, r

    held, r = await v.served_meanwhile(attack)
    assert held == 64, "each kept Hold is one byte; beyond --max-held, not kept"
    grown = status(v.pid, "VmSize") - vm_before
    assert grown < 1 << 30, f"address space grew by {grown >> 20} MiB for 64 kept one-byte windows"
    await v.check("300 one-byte windows of 1 TiB segments")
    r.close()


async def test_oversized_headers_before_the_handshake(victim):
    """What a peer that has proven nothing can send (a challenge and an auth, in version 3)
    is bounded, and it learns nothing about the victim but a nonce (issue 11, item 14)."""
    v = await victim()
    unproven: list = []

    def preambles() -> RawPeer:
        r = RawPeer(v.listen)
        unproven.append(r)
        r.send(wire.OUR_PREAMBLE.encode())
        r.read_exact(16)
        r.read_header()  # the victim's challenge
        return r

    def bomb(header) -> bytes:
        m = wire.to_map(header)
        m["f"] = [{}] * 61_000
        return wire.frame_header(msgpack.packb(m, use_bin_type=True))

    def attack():
        codes = []
        # A challenge of 60+ KiB whose `f` is full of empty maps, before auth: refused by a
        # strict decoder; one that ignores `f` in a challenge answers auth, and then our
        # wrong proof gets its error.
        r = preambles()
        r.send(bomb(wire.Challenge(3, os.urandom(32))))
        r.sock.settimeout(0.5)
        try:
            h = r.expect_error()
        except TimeoutError:
            # A decoder that ignores `f` in a challenge waits for our proof (version 3: the
            # acceptor proves only after us); our wrong one then gets its error.
            r.sock.settimeout(5)
            r.send(wire.encode_message(wire.Auth(bytes(32))))
            h = r.expect_error()
        codes.append(h.code)
        # The same as an auth, after a valid challenge (the victim sends no auth before ours).
        r = preambles()
        r.send(wire.frame_header(r.challenge()))
        r.send(bomb(wire.Auth(bytes(32))))
        codes.append(r.expect_error().code)
        # Over-long length prefixes, before auth: nothing is read or allocated for them.
        for prefix in (65_537, 16 << 20, 0xFFFFFFFF):
            r = preambles()
            r.send(struct.pack(">I", prefix))
            codes.append(r.expect_error().code)
        # A peer that speaks only version 1: refused at the preambles, before any hello.
        r = RawPeer(v.listen)
        unproven.append(r)
        with pytest.raises(PeerError) as e:
            r.handshake(SECRET, version=1)
        codes.append(e.value.code)
        return codes

    codes = await v.served_meanwhile(attack)
    assert codes[0] in ("malformed-header", "auth-failed"), codes
    assert codes[1] in ("malformed-header", "auth-failed"), codes
    assert codes[2:5] == ["header-too-large"] * 3
    assert codes[5] == "unsupported-version"
    # Who the victim is, as a peer that proves the secret learns it: none of it reached the others.
    victim_ident = await asyncio.to_thread(lambda: RawPeer(v.listen).handshake(SECRET))
    secrets_ = [victim_ident.node, victim_ident.name, victim_ident.host, victim_ident.proc, v.listen]
    secrets_ += [a for a in (victim_ident.listen, victim_ident.unix) if a]
    keys = [bytes([0xA0 | len(k)]) + k.encode() for k in ("node", "host", "pid", "proc", "listen", "unix")]
    for r in unproven:
        leaked = [x for x in secrets_ if x.encode() in r.received] + [k for k in keys if k in r.received]
        assert not leaked, f"a peer that proved nothing got {leaked}"
    await v.check("oversized headers before the handshake")


async def test_many_large_messages_while_the_application_is_slow(victim):
    v = await victim(delay_ms="50")  # handles 20 messages a second
    n_messages = 200

    def attack():
        r = raw(v.listen)
        r.sock.settimeout(0.2)
        one = os.urandom(MIB)
        msg = wire.Msg(
            "handoff.demo.Payload",
            body(id=0, digest=ref(0), data=ref(1), prepare_seconds=0.0),
            [wire.Inline(32), wire.Inline(MIB)],
        )
        data = wire.encode_message(msg, [bytes(32), one])
        sent = 0
        deadline = time.monotonic() + 4
        view = memoryview(data)
        while sent < n_messages and time.monotonic() < deadline:
            try:
                pos = 0
                while pos < len(view):
                    pos += r.sock.send(view[pos:])
                sent += 1
            except socket.timeout:
                # Held back: the victim stopped reading. Keep trying until the deadline.
                if pos:
                    while pos < len(view) and time.monotonic() < deadline + 10:
                        try:
                            pos += r.sock.send(view[pos:])
                        except socket.timeout:
                            pass
                    sent += 1
        return sent, r

    sent, r = await v.served_meanwhile(attack, interval=0.1)
    assert sent < n_messages, "the victim read everything: no backpressure"
    await v.check(f"{sent} messages of 1 MiB to a slow application")
    r.close()


async def test_refused_pull_flood(victim):
    v = await victim()
    before = v.stderr_size()
    n = 20_000

    def attack():
        r = raw(v.listen)
        answers = []

        def read():
            for _ in range(n):
                answers.append(r.read_header()[1].code)

        reader = threading.Thread(target=read)
        reader.start()
        batch = b"".join(wire.encode_message(wire.Pull(i, 1_000_000 + i, bytes(32), 0, 1 << 30)) for i in range(1000))
        for _ in range(n // 1000):
            r.send(batch)
        reader.join(30)
        return answers

    answers = await v.served_meanwhile(attack)
    assert len(answers) == n and set(answers) == {"unknown-lease"}
    await v.check(f"{n} refused pulls")
    grown = v.stderr_size() - before
    assert grown < 8 * 1024, f"the log grew by {grown} bytes for {n} refused pulls"


async def test_pulls_read_before_a_backlog_are_answered_once_it_drains(victim):
    """Pulls that arrive in one piece past the answers the victim queues before it stops
    reading (max_pull_answers, 64): the victim stops with the rest read but unanswered,
    and must answer them once its answers drain, although the socket has nothing new to
    say (the attacker sent everything already and only reads)."""
    v = await victim("--ticket-threshold", "1024")
    n = 200

    def attack():
        r = raw(v.listen)
        r.send(wire.encode_message(wire.Msg("handoff.demo.SendRequest", body(id=1, bytes=4096), [])))
        h, _ = read_until(r, lambda h: isinstance(h, wire.Msg))
        ticket = next(d for d in h.f if isinstance(d, wire.TicketDesc))
        r.send(b"".join(wire.encode_message(wire.Pull(i, ticket.lease, ticket.token, i, 1)) for i in range(n)))
        answered = []
        try:
            for _ in range(n):
                h, frames = r.read_message()
                answered.append(h.req if isinstance(h, wire.Pulled) else h)
        except (TimeoutError, EOFError):
            pass
        return answered, r

    answered, r = await v.served_meanwhile(attack)
    assert answered == list(range(n)), f"{len(answered)} of {n} pulls answered"
    await v.check("pulls read before a backlog")
    r.close()


async def test_shared_memory_never_released(victim):
    """The victim's own sends: a same-host peer asks for payloads in shared memory and
    never sends `release`. The victim keeps at most --max-shm-leases-per-peer (16)
    segments for it, waits --lease-wait for releases, then fails those answers."""
    v = await victim()
    unix = await v.unix_addr()

    def attack():
        r = raw(unix, host=v.host_id)
        for i in range(20):
            r.send(wire.encode_message(wire.Msg("handoff.demo.SendRequest", body(id=i, bytes=MIB), [])))
        r.sock.settimeout(3)
        got = 0
        try:
            while True:
                h, _ = r.read_message()
                if isinstance(h, wire.Msg) and h.t == "handoff.demo.Payload":
                    got += 1
        except (socket.timeout, EOFError):
            pass  # (the descriptors that came with them were dropped by plain recv)
        return got, r

    got, r = await v.served_meanwhile(attack)
    assert got == 16, f"{got} payloads in shared memory, the cap is 16"
    stats = await v.stats()
    assert stats["shm_leases"]["count"] == 16 and stats["shm_leases"]["bytes"] == 16 * MIB
    assert "shared-memory leases" in v.child.stderr()
    await v.check("shared memory never released")
    r.close()


async def test_forwards_to_arbitrary_and_too_many_holders(victim):
    v = await victim("--ticket-threshold", "1024")

    def attack():
        r = raw(v.listen)
        victim_id = r.handshake_peer.node
        r.send(wire.encode_message(wire.Msg("handoff.demo.SendRequest", body(id=1, bytes=4096), [])))
        h, _ = read_until(r, lambda h: isinstance(h, wire.Msg))
        ticket = next(d for d in h.f if isinstance(d, wire.TicketDesc))
        tos = ["not-a-node", "A" * 32, victim_id, "0" * 31, "x" * 100] + [secrets.token_hex(16) for _ in range(100)]
        tos.append(tos[5])  # again: an existing holder is never refused for the cap
        for i, to in enumerate(tos):
            r.send(wire.encode_message(wire.Forward(i, ticket.lease, ticket.token, to)))
        codes = []
        for _ in tos:
            _, a = r.read_header()
            codes.append("forwarded" if isinstance(a, wire.Forwarded) else a.code)
        return codes, r

    codes, r = await v.served_meanwhile(attack)
    assert codes[:5] == ["bad-holder"] * 5
    assert codes[5:68] == ["forwarded"] * 63, "63 new holders and the asker: 64"
    assert codes[68:105] == ["too-many-holders"] * 37
    assert codes[105] == "forwarded"
    stats = await v.stats()
    assert stats["ticket_leases"]["holders"] == 64
    await v.check("forwards to arbitrary and too many holders")
    r.close()


async def test_a_peer_that_never_reads(victim):
    v = await victim()
    before = v.stderr_size()

    def attack():
        r = raw(v.listen)
        ping = wire.encode_message(wire.Msg(PING, body(seq=1, data=os.urandom(64 * 1024)), []))
        r.sock.settimeout(10)
        for _ in range(500):  # 32 MiB of answers it will never read
            r.send(ping)
        time.sleep(1.5)  # past the victim's write timeout
        return r

    r = await v.served_meanwhile(attack)
    await v.check("a peer that never reads")
    text = v.child.stderr()
    assert "no progress" in text or "dropping the answer" in text
    assert v.stderr_size() - before < 16 * 1024
    r.close()


async def test_slowloris_and_descriptors_before_the_handshake(victim):
    v = await victim()
    fds_before = fd_count(v.pid)
    unix = await v.unix_addr()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    n = min(2000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 300)
    host, port = v.listen[len("tcp://") :].rsplit(":", 1)

    def attack():
        socks = []
        for _ in range(n):
            s = socket.create_connection((host, int(port)))
            s.send(b"H")  # one byte of a preamble, then nothing
            socks.append(s)
        for _ in range(20):  # descriptors with the preamble, before any handshake
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(unix[len("unix://") :])
            fds = [memfd(4096) for _ in range(8)]
            s.sendmsg([wire.OUR_PREAMBLE.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("8i", *fds))])
            for fd in fds:
                os.close(fd)
            socks.append(s)
        return socks

    socks = await asyncio.to_thread(attack)
    # Let the victim take in the burst (its accept queue holds a legitimate client behind
    # the ones before it): until it has used no CPU for a moment.
    deadline = time.monotonic() + 20
    last = cpu_time(v.pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = cpu_time(v.pid)
        if now - last < 0.01:
            break
        last = now
    v.rss()
    # With the slow connections all open, a legitimate client connects (a fresh connection,
    # its own handshake) and is served within 1 s.
    if v.peer is not None:
        await v.peer.close()
        v.peer = None
    took = await v.ping(timeout=5)
    assert took < 1.0, f"the legitimate peer waited {took:.2f} s behind {n} slow handshakes"
    await v.check(f"{n} slowloris connections")
    for s in socks:
        s.close()
    await asyncio.sleep(0.5)
    assert fd_count(v.pid) < fds_before + 32, "the victim keeps no descriptor of those connections"


async def test_a_node_id_claimed_from_another_process(victim):
    v = await victim()

    def attack():
        node_id, proc = secrets.token_hex(16), secrets.token_hex(16)
        first = raw(v.listen, node=node_id, proc=proc)
        with pytest.raises(PeerError) as e:
            raw(v.listen, node=node_id)  # another process, same node id
        second = raw(v.listen, node=node_id, proc=proc)  # the same process: accepted
        first.send(wire.encode_message(wire.Msg(PING, body(seq=3, data=b"first"), [])))
        h, _ = read_until(first, lambda h: isinstance(h, wire.Msg))
        return e.value, msgpack.unpackb(h.b), first, second

    err, answer, first, second = await v.served_meanwhile(attack)
    assert err.code == "handshake" and "another process" in err.header.msg
    assert answer == {"seq": 3, "data": b"first"}, "the established connection is undisturbed"
    await v.check("a node id from another process")
    first.close()
    second.close()


async def test_tickets_that_point_at_the_victim_itself(victim):
    v = await victim()

    def attack():
        r = raw(v.listen)
        victim_id = r.handshake_peer.node
        for owner in (secrets.token_hex(16), victim_id):
            t = wire.TicketDesc(
                n=MIB, owner=owner, lease=1, token=bytes(32), digest=bytes(32), ttl=30_000, addr=v.listen
            )
            msg = wire.Msg(
                "handoff.demo.Payload",
                body(id=1, digest=ref(0), data=ref(1), prepare_seconds=0.0),
                [wire.Inline(32), t],
            )
            r.send(wire.encode_message(msg, [bytes(32)]))
        return r

    r = await v.served_meanwhile(attack)
    text = await v.child.wait_stderr("own listen address", "names this node itself", timeout=3)
    assert "own listen address" in text and "names this node itself" in text
    stats = await v.stats()
    assert all(name != v.child.name for name, _ in stats["peers"]), stats["peers"]
    await v.check("tickets whose address is the victim's own")
    r.close()


async def test_tickets_that_name_many_owners(victim):
    """Each ticket names another owner (real nodes the attacker runs), so the victim dials
    each to redeem it: it keeps at most ``--max-owner-connections`` of those connections
    (§9.1), closing the one unused longest to dial the next. Without the bound, 1030 such
    tickets left a node at its 1024 connections, refusing every new peer."""
    v = await victim(max_owner_connections="2")
    owners = [
        await Node(f"owner-{i}", secret=SECRET, listen="127.0.0.1:0", host_id=f"owner-host-{i}").start()
        for i in range(5)
    ]
    try:

        def attack():
            r = raw(v.listen)
            for owner in owners:
                t = wire.TicketDesc(
                    n=MIB, owner=owner.node_id, lease=1, token=bytes(32), digest=bytes(32), ttl=30_000,
                    addr=owner.listen_addr,
                )  # fmt: skip
                msg = wire.Msg(
                    "handoff.demo.Payload",
                    body(id=1, digest=ref(0), data=ref(1), prepare_seconds=0.0),
                    [wire.Inline(32), t],
                )
                r.send(wire.encode_message(msg, [bytes(32)]))
                time.sleep(0.15)  # (a connection used in the last 100 ms does not make room)
            return r

        r = await v.served_meanwhile(attack)
        seen: list = []

        async def dialed_all() -> bool:
            names = [name for name, _ in (await v.stats())["peers"]]
            seen.append(names)
            return "owner-4" in names

        deadline = time.monotonic() + 10
        while not await dialed_all() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert all(sum(n.startswith("owner-") for n in names) <= 2 for names in seen), seen
        assert "owner-4" in seen[-1], seen[-1]
        await v.check("tickets that name many owners")
        # The owners saw their connections from the victim closed, all but the last two.
        assert sum(1 for o in owners if o.peers) <= 2, [len(o.peers) for o in owners]
        r.close()
    finally:
        for o in owners:
            await o.close()

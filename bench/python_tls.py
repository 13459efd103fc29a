#!/usr/bin/env python3
"""Python over TLS: handoff Python → Python against a raw Python ``ssl`` stream.

One run starts a receiver process (this script with ``--serve``) that listens, on
127.0.0.1, with:

- a handoff node inside TLS (``handoff-tls``), and one without (``handoff-plain``, for
  scale): each message of ``--count`` back-to-back messages carries one buffer of the
  size; the receiver acknowledges each with a small message once it has it;
- a raw TLS stream on asyncio (``raw-asyncio``): the sender writes the same bytes with
  asyncio streams (``open_connection(ssl=...)``, ``write`` then ``drain``), the receiver
  is a ``BufferedProtocol`` under asyncio's TLS that receives each record into one
  reused buffer and acknowledges it with 8 bytes;
- a raw TLS stream on blocking sockets (``raw-blocking``): ``sendall`` against
  ``recv_into`` one reused buffer, each record acknowledged with 8 bytes, on a thread.

Both sides use the same certificates (a throwaway CA and two node certificates, made
with ``cryptography`` as ``python/tests/tls_certs.py`` makes them) and the same
contexts (:meth:`handoff.TlsConfig.from_files`). At each size the cases run in turn, one
repetition of each, ``--reps`` times after one warm-up round; the figure per case is the
median time per buffer. The ratio that judges handoff is ``raw-asyncio`` ÷ ``handoff-tls``
(handoff's Python peer is asyncio): 1.0 is as fast as the raw stream. ``raw-blocking`` ÷
``handoff-tls`` is printed beside it.

Run it from the repository root with the Python peer installed::

    .venv/bin/python bench/python_tls.py [--sizes 64M,256M] [--reps 5] [--count 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from handoff import Node, TlsConfig

REPO = Path(__file__).resolve().parents[1]
SECRET = b"python-tls bench secret"
ACK = b"\x01" * 8
#: What the raw asyncio sender hands its stream at a time.
RAW_SLICE = 256 << 10
CASES = ("raw-asyncio", "raw-blocking", "handoff-tls", "handoff-plain")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def make_certs(folder: Path) -> dict:
    """A CA and two node certificates for 127.0.0.1 in ``folder`` (the tests' helper)."""
    sys.path.insert(0, str(REPO / "python" / "tests"))
    try:
        from tls_certs import make_pki
    except ImportError as e:  # pragma: no cover - the test extra is not installed
        raise SystemExit(f"making certificates needs `cryptography` (the test extra): {e}") from None
    pki = make_pki(folder)
    return {
        "ca": str(pki.ca),
        "a": [str(pki.a.cert), str(pki.a.key)],
        "b": [str(pki.b.cert), str(pki.b.key)],
    }


def config(certs: dict, which: str) -> TlsConfig:
    cert, key = certs[which]
    return TlsConfig.from_files(cert, key, certs["ca"])


# ---------------------------------------------------------------- the receiver process


class _RawReceiver(asyncio.BufferedProtocol):
    """Receives records of ``record`` bytes into one reused buffer; acknowledges each."""

    def __init__(self, record: int):
        self.buf = memoryview(bytearray(record))
        self.have = 0
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return self.buf[self.have :]

    def buffer_updated(self, nbytes):
        self.have += nbytes
        if self.have == len(self.buf):
            self.have = 0
            self.transport.write(ACK)


def _blocking_server(listener: socket.socket, ctx: ssl.SSLContext, record: int) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                s = ctx.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                continue
            buf = memoryview(bytearray(record))
            try:
                while True:
                    have = 0
                    while have < record:
                        n = s.recv_into(buf[have:])
                        if not n:
                            raise EOFError
                        have += n
                    s.sendall(ACK)
            except (EOFError, OSError):
                pass


async def serve(record: int, certs: dict) -> None:
    tls = config(certs, "a")
    nodes = {
        "handoff-tls": Node("bench-tls-rx", secret=SECRET, listen="127.0.0.1:0", host_id="rx-host", tls=tls),
        "handoff-plain": Node("bench-plain-rx", secret=SECRET, listen="127.0.0.1:0", host_id="rx-host"),
    }
    for n in nodes.values():
        await n.start()
    loop = asyncio.get_running_loop()
    raw = await loop.create_server(lambda: _RawReceiver(record), "127.0.0.1", 0, ssl=tls.server)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_blocking_server, args=(listener, tls.server, record), daemon=True).start()

    async def acknowledge(node: Node) -> None:
        while True:
            env = await node.recv()
            seq = env.body["seq"]
            env.release()
            await env.sender.send("bench.Ack", {"seq": seq})

    for n in nodes.values():
        loop.create_task(acknowledge(n))
    addrs = {name: n.listen_addr for name, n in nodes.items()}
    addrs["raw-asyncio"] = "127.0.0.1:%d" % raw.sockets[0].getsockname()[1]
    addrs["raw-blocking"] = "127.0.0.1:%d" % listener.getsockname()[1]
    print(json.dumps(addrs), flush=True)
    # Until the parent closes our stdin.
    await loop.run_in_executor(None, sys.stdin.read)


# ---------------------------------------------------------------- the sender


def _host_port(addr: str) -> tuple:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


class Sender:
    def __init__(self, addrs: dict, certs: dict, record: int, count: int):
        self.addrs = addrs
        self.certs = certs
        self.data = os.urandom(1 << 20) * (record >> 20) + os.urandom(record & ((1 << 20) - 1))
        self.count = count
        self.ctx = config(certs, "b").client

    async def open(self) -> None:
        self.nodes = {
            "handoff-tls": Node("bench-tls-tx", secret=SECRET, host_id="tx-host", tls=config(self.certs, "b")),
            "handoff-plain": Node("bench-plain-tx", secret=SECRET, host_id="tx-host"),
        }
        self.peers = {}
        for name, n in self.nodes.items():
            await n.start()
            self.peers[name] = await n.connect(self.addrs[name])
            assert self.peers[name].channel == "tcp", self.peers[name].channel
        assert self.peers["handoff-tls"].transport.tls
        host, port = _host_port(self.addrs["raw-asyncio"])
        self.reader, self.writer = await asyncio.open_connection(host, port, ssl=self.ctx)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host, port = _host_port(self.addrs["raw-blocking"])
        plain = socket.create_connection((host, port))
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.blocking = self.ctx.wrap_socket(plain, server_hostname=host)

    async def close(self) -> None:
        self.writer.close()
        self.blocking.close()
        for n in self.nodes.values():
            await n.close()

    async def run(self, case: str) -> float:
        """Seconds per buffer: ``count`` buffers back to back, every acknowledgement back."""
        started = time.perf_counter()
        if case == "raw-asyncio":
            # In slices, each drained: asyncio's TLS encrypts all it is given at once into
            # memory (the whole buffer, written in one go, took 3-5x as long).
            view = memoryview(self.data)
            for _ in range(self.count):
                for at in range(0, len(view), RAW_SLICE):
                    self.writer.write(view[at : at + RAW_SLICE])
                    await self.writer.drain()
            for _ in range(self.count):
                await self.reader.readexactly(len(ACK))
        elif case == "raw-blocking":
            await asyncio.get_running_loop().run_in_executor(None, self._blocking_run)
        else:
            node, peer = self.nodes[case], self.peers[case]
            for seq in range(self.count):
                await peer.send("bench.Blob", {"seq": seq, "data": self.data})
            for _ in range(self.count):
                (await node.recv(120)).release()
        return (time.perf_counter() - started) / self.count

    def _blocking_run(self) -> None:
        ack = bytearray(len(ACK))
        for _ in range(self.count):
            self.blocking.sendall(self.data)
        for _ in range(self.count):
            view, have = memoryview(ack), 0
            while have < len(ack):
                n = self.blocking.recv_into(view[have:])
                if not n:
                    raise EOFError("the raw blocking receiver closed")
                have += n


async def measure(size: int, reps: int, count: int, certs: dict, cases: tuple) -> dict:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(size), "--certs", json.dumps(certs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(os.environ, HANDOFF_LOG="error"),
    )
    try:
        line = await asyncio.get_running_loop().run_in_executor(None, child.stdout.readline)
        if not line:
            raise SystemExit("the receiver process did not start")
        sender = Sender(json.loads(line), certs, size, count)
        await sender.open()
        times = {c: [] for c in cases}
        try:
            for rep in range(reps + 1):  # the first round warms both processes up
                for case in cases:
                    t = await sender.run(case)
                    if rep > 0:
                        times[case].append(t)
        finally:
            await sender.close()
    finally:
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
    med = {c: statistics.median(v) for c, v in times.items()}
    out = {"size": size, "count": count, "reps": reps, "seconds": times, "median_seconds": med}
    if "handoff-tls" in med:
        for raw in ("raw-asyncio", "raw-blocking"):
            if raw in med:
                out[f"ratio_{raw.replace('-', '_')}"] = med[raw] / med["handoff-tls"]
    return out


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64M,256M", help="buffer sizes (default 64M,256M)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per case after a warm-up (default 5)")
    ap.add_argument("--count", type=int, default=2, help="buffers per repetition, back to back (default 2)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"which cases (default {','.join(CASES)})")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--certs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, json.loads(args.certs)))
        return
    cases = tuple(c for c in args.cases.split(",") if c)
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(Path(tmp))
        results = [
            asyncio.run(measure(parse_size(s), args.reps, args.count, certs, cases)) for s in args.sizes.split(",")
        ]
    report = {
        "python": sys.version.split()[0],
        "openssl": ssl.OPENSSL_VERSION,
        "load_average": os.getloadavg(),
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"Python {report['python']}, {report['openssl']}; medians per buffer, ms")
    print("size      " + "".join(f"{c:>15}" for c in cases) + "   raw-asyncio/tls  raw-blocking/tls")
    for r in results:
        row = "".join(f"{r['median_seconds'][c] * 1e3:15.1f}" for c in cases)
        ratios = "".join(
            f"{r[k]:18.2f}" if k in r else f"{'-':>18}" for k in ("ratio_raw_asyncio", "ratio_raw_blocking")
        )
        print(f"{fmt_size(r['size']):<10}{row}{ratios}")


if __name__ == "__main__":
    main()

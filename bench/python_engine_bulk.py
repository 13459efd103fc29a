"""Large frames between two Python processes over loopback TCP on the Rust engine, against
raw TCP measured in the same run (issue 40: 64 MiB and up, at least 0.95 of raw).

- ``raw``: a forked child writes N bytes with ``sendall`` from one buffer; the parent reads
  them with ``recv_into`` into one buffer it reuses: the most a Python receiver can do.
- ``engine``: the child sends one message with an N-byte frame through ``handoff.engine``;
  the parent receives it (read by the engine straight into a pooled receive buffer) and
  holds it as a numpy array, then drops it before the next.

Each size runs ``--reps`` times after a warm-up; the figure is the median in GB/s, and the
ratio is engine over raw.

    .venv/bin/python bench/python_engine_bulk.py [--sizes 64M,256M] [--reps 5] [--ticket]

``--ticket`` adds a third figure: the same bytes sent as a ticket and redeemed whole by the
receiver (the pull, then the XXH3 check both nodes announce), timed from the request to the
checked bytes in hand (issue 40: a 1 GiB redemption at least 0.9 of raw).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from python_rtt_floor import socket_pair  # noqa: E402

SECRET = b"bench secret"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected loopback TCP pair with Nagle off (the floor script's)."""
    return socket_pair("tcp")


def raw(size: int, reps: int) -> list[float]:
    a, b = tcp_pair()
    pid = os.fork()
    if pid == 0:
        a.close()
        data = bytearray(os.urandom(1 << 20)) * (size >> 20)
        for _ in range(reps + 1):
            b.sendall(data)
            b.recv(1)  # the receiver's go for the next
        os._exit(0)
    b.close()
    buf = bytearray(size)
    view = memoryview(buf)
    runs = []
    for rep in range(reps + 1):
        got = 0
        t = time.perf_counter()
        while got < size:
            got += a.recv_into(view[got:], size - got)
        elapsed = time.perf_counter() - t
        if rep:
            runs.append(size / elapsed / 1e9)
        a.send(b"g")
    a.close()
    os.waitpid(pid, 0)
    return runs


def engine(size: int, reps: int) -> list[float]:
    a, b = tcp_pair()
    pid = os.fork()
    if pid == 0:
        a.close()

        async def child() -> None:
            from handoff.engine import Driver, Engine

            d = Driver(Engine("bulk-sender", SECRET, host_id="sender-host"))
            c = d.adopt(b, "acceptor", "receiver")
            await c.ready(10)
            data = bytearray(os.urandom(1 << 20)) * (size >> 20)
            for _ in range(reps + 1):
                await c.send("bench.Bulk", b"\x80", [data])
                await c.recv(60)  # the receiver's go for the next
            d.close()

        asyncio.run(child())
        os._exit(0)
    b.close()

    async def parent() -> list[float]:
        import numpy as np
        from handoff.engine import Driver, Engine

        d = Driver(Engine("bulk-receiver", SECRET, host_id="receiver-host", max_buffered_bytes_per_peer=2 * size))
        c = d.adopt(a, "dialer", "sender")
        await c.ready(10)

        async def take():
            started = time.perf_counter()
            got = await c.recv(60)
            return np.frombuffer(got.frames[0], dtype=np.uint8), started

        runs = await timed_rounds(c, reps, size, take)
        d.close()
        return runs

    runs = asyncio.run(parent())
    os.waitpid(pid, 0)
    return runs


async def timed_rounds(c, reps: int, size: int, take) -> list[float]:
    """`reps` timed rounds after one warm-up: `take()` gives one transfer's bytes and when
    its timing started; each round ends with our go for the next. GB/s per round."""
    runs = []
    for rep in range(reps + 1):
        data, started = await take()
        elapsed = time.perf_counter() - started
        assert len(data) == size
        if rep:
            runs.append(size / elapsed / 1e9)
        del data
        await c.send("bench.Go", b"\x80")
    return runs


def ticket(size: int, reps: int) -> list[float]:
    """A ticket for an N-byte buffer, redeemed whole by the parent from the child that owns
    it: the pull and the digest check (XXH3, which both announce), timed together."""
    a, b = tcp_pair()
    pid = os.fork()
    if pid == 0:
        a.close()

        async def owner() -> None:
            from handoff.engine import Driver, Engine

            caps = ["inline", "ticket", "xxh3"]
            d = Driver(Engine("bulk-owner", SECRET, host_id="owner-host", capabilities=caps))
            c = d.adopt(b, "acceptor", "holder")
            await c.ready(10)
            data = bytearray(os.urandom(1 << 20)) * (size >> 20)
            for _ in range(reps + 1):
                await c.send("bench.Bulk", b"\x80", [data], by_ticket=True)
                await c.recv(120)  # the holder's go for the next
            d.close()

        asyncio.run(owner())
        os._exit(0)
    b.close()

    async def holder() -> list[float]:
        from handoff.engine import Driver, Engine

        caps = ["inline", "ticket", "xxh3"]
        d = Driver(Engine("bulk-holder", SECRET, host_id="holder-host", capabilities=caps))
        c = d.adopt(a, "dialer", "owner")
        await c.ready(10)

        async def take():
            got = await c.recv(60)
            started = time.perf_counter()
            return await d.redeem(got.frames[0]), started

        runs = await timed_rounds(c, reps, size, take)
        d.close()
        return runs

    runs = asyncio.run(holder())
    os.waitpid(pid, 0)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64M,256M", help="comma-separated sizes (K, M, G suffixes; whole MiB)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ticket", action="store_true", help="also a ticket redeemed whole (pull and XXH3 check)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.reps < 1 or any(s < (1 << 20) or s % (1 << 20) for s in sizes):
        parser.error("--reps must be at least 1, and sizes whole MiB")
    print("one N-byte frame, Python to Python over loopback TCP: raw recv_into vs the Rust engine (GB/s, median)")
    for size in sizes:
        r = statistics.median(raw(size, args.reps))
        e = statistics.median(engine(size, args.reps))
        line = f"{size >> 20:6} MiB  raw {r:6.2f}  engine {e:6.2f}  engine / raw {e / r:.2f}"
        if args.ticket:
            t = statistics.median(ticket(size, args.reps))
            line += f"  ticket {t:6.2f}  ticket / raw {t / r:.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

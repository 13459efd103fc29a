"""Where the line between Rust and Python goes (issue 27, item 2): the two prototypes of
``handoff._native`` measured against the raw floors, in one run.

- ``crossing``: a thread of the extension calls ``loop.call_soon_threadsafe`` and the
  loop runs the callback: what option (a) pays per batch of received frames, split into
  taking the GIL and the rest (the self-pipe write, the loop waking, the callback).
- ``rtt``: a 100-byte ping-pong between two processes (the echo is a fresh interpreter,
  given the socket), over a Unix socket and loopback TCP, each side written as:
  - ``block``: blocking ``sendall`` and ``recv_into``, no event loop (the raw floor);
  - ``asyncio``: pure Python on the asyncio loop (``add_reader``, ``recv``, ``send``);
  - ``a``: option (a), ``ThreadChannel``: the extension's tokio thread reads, and sends go
    through its writer task;
  - ``a-now``: option (a), but sends are written from the calling thread (``send_now``);
  - ``b``: option (b), ``LoopChannel``: the loop watches the socket and calls Rust to read,
    frame and write;
  - ``b-off``: option (b), with the body of a frame of 1 MiB and more read by a thread of
    the extension, off the loop.
- ``bulk``: one frame of 64 MiB and up, sent by a blocking ``sendall`` in another process,
  received as ``raw`` (blocking ``recv_into`` into one buffer, reused: the limit),
  ``raw-fresh`` (the same into a new ``bytearray`` each time), ``asyncio``, ``a``, ``b`` and
  ``b-off``.

    .venv/bin/python bench/native_crossing.py [--round-trips N] [--sizes 64,256,1024] [--json PATH]

Each figure is the median of the repetitions after one warm-up; ratios are to the raw row
of the same channel in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

from python_rtt_floor import socket_pair  # a connected pair on unix or loopback TCP

from handoff import _native as native

MESSAGE_BYTES = 100
MIB = 1 << 20


# -- the connections -------------------------------------------------------------------


class _Frames:
    """Received frames waiting for ``recv``, and the end once it came."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()
        self.end: str | None = None
        self.waiter: asyncio.Future | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def recv(self):
        while not self.queue:
            if self.end is not None:
                raise ConnectionError(self.end)
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.queue.popleft()


class ThreadConn(_Frames):
    """Option (a): ``handoff._native.ThreadChannel``."""

    def __init__(self, sock: socket.socket, now: bool) -> None:
        super().__init__()
        loop = asyncio.get_running_loop()
        self.channel = native.ThreadChannel(sock.detach(), loop, self._on_frames)
        self.send = self.channel.send_now if now else self.channel.send

    def _on_frames(self, arg) -> None:
        if isinstance(arg, str):
            self.end = arg
        else:
            self.queue.extend(arg)
        self.wake()

    def close(self) -> None:
        self.channel.close()


class LoopConn(_Frames):
    """Option (b): ``handoff._native.LoopChannel`` on the asyncio loop; with ``off_loop``,
    large bodies are read by a thread of the extension."""

    def __init__(self, sock: socket.socket, off_loop: bool = False) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        if off_loop:
            self.channel = native.LoopChannel(sock.detach(), event_loop=self.loop, on_body=self._on_body)
        else:
            self.channel = native.LoopChannel(sock.detach())
        self.fd = self.channel.fileno()
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            got = self.channel.read_frames()
        except (ConnectionError, ValueError) as e:
            got, self.end = ([], False, False), str(e)
        if got is None:
            self.end = "eof"
        else:
            frames, off_loop, more = got
            self.queue.extend(frames)
            if off_loop:
                self.loop.remove_reader(self.fd)
            elif more:  # whole frames wait in the channel: take them on the next turn
                self.loop.call_soon(self._readable)
        if self.end is not None:
            self.loop.remove_reader(self.fd)
        self.wake()

    def _on_body(self, body) -> None:
        if isinstance(body, str):
            self.end = body
        else:
            self.queue.append(body)
            self.loop.add_reader(self.fd, self._readable)
        self.wake()

    def send(self, data) -> None:
        if not self.channel.send(data):
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        if self.channel.flush():
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        self.channel.close()


class AsyncioConn(_Frames):
    """Pure Python on the asyncio loop: the same frames, read with ``recv_into``."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        sock.setblocking(False)
        self.staged = bytearray()
        self.large: tuple[bytearray, int] | None = None
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            self._read()
        except ConnectionError as e:
            self.end = str(e)
            self.loop.remove_reader(self.sock.fileno())
        self.wake()

    def _read(self) -> None:
        while True:
            if self.large is not None:
                buf, got = self.large
                try:
                    n = self.sock.recv_into(memoryview(buf)[got:])
                except BlockingIOError:
                    self.large = (buf, got)
                    return
                if n == 0:
                    raise ConnectionError("peer closed inside a frame")
                got += n
                if got == len(buf):
                    self.queue.append(buf)
                    self.large = None
                else:
                    self.large = (buf, got)
                continue
            try:
                data = self.sock.recv(256 * 1024)
            except BlockingIOError:
                return
            if not data:
                raise ConnectionError("eof")
            self.staged += data
            while len(self.staged) >= 4:
                n = int.from_bytes(self.staged[:4], "big")
                if n >= 64 * 1024:
                    buf = bytearray(n)
                    head = self.staged[4 : 4 + n]
                    buf[: len(head)] = head
                    del self.staged[: 4 + len(head)]
                    if len(head) == n:
                        self.queue.append(buf)
                    else:
                        self.large = (buf, len(head))
                    break
                if len(self.staged) < 4 + n:
                    break
                self.queue.append(bytes(self.staged[4 : 4 + n]))
                del self.staged[: 4 + n]

    def send(self, data) -> None:
        self.sock.send(len(data).to_bytes(4, "big") + bytes(data))  # small frames only

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


def make_conn(style: str, sock: socket.socket):
    if style == "a":
        return ThreadConn(sock, now=False)
    if style == "a-now":
        return ThreadConn(sock, now=True)
    if style == "b":
        return LoopConn(sock)
    if style == "b-off":
        return LoopConn(sock, off_loop=True)
    if style == "asyncio":
        return AsyncioConn(sock)
    raise ValueError(f"unknown style {style!r}")


# -- processes and sockets ---------------------------------------------------------------


def spawn(role: str, style: str, sock: socket.socket, extra: list[str] = ()) -> subprocess.Popen:
    fd = sock.fileno()
    cmd = [sys.executable, __file__, "--child", role, "--style", style, "--fd", str(fd), *extra]
    child = subprocess.Popen(cmd, pass_fds=[fd])
    sock.close()
    return child


def _child_socket(fd: int) -> socket.socket:
    return socket.socket(fileno=fd)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("eof")
        got += k
    return bytes(buf)


def child_echo(style: str, fd: int) -> None:
    sock = _child_socket(fd)
    if style == "block":  # the frames are echoed as they come (no parsing: the floor)
        while data := sock.recv(65536):
            sock.sendall(data)
        return

    async def main() -> None:
        conn = make_conn(style, sock)
        try:
            while True:
                conn.send(await conn.recv())
        except ConnectionError:
            pass

    asyncio.run(main())


def child_bulk_sender(fd: int, size: int) -> None:
    """Sends one frame of ``size`` bytes per ``g`` it reads, with blocking ``sendall``."""
    sock = _child_socket(fd)
    payload = size.to_bytes(4, "big") + os.urandom(1024) * (size // 1024)
    while sock.recv(1) == b"g":
        sock.sendall(payload)


# -- measurements ------------------------------------------------------------------------


def measure_crossing(count: int) -> dict:
    """Median and percentiles of the thread-to-loop crossing, in µs."""

    async def main() -> dict:
        loop = asyncio.get_running_loop()
        gil, rest, done = [], [], loop.create_future()

        def arrived(ts) -> None:
            t2 = time.monotonic_ns()
            gil.append((ts[1] - ts[0]) / 1000)
            rest.append((t2 - ts[1]) / 1000)
            if len(rest) == count and not done.done():
                done.set_result(None)

        native.post_from_thread(loop, arrived, count, 200)
        await asyncio.wait_for(done, 60)
        total = [g + r for g, r in zip(gil, rest)]
        q = statistics.quantiles(total, n=20)
        return {
            "count": count,
            "median_us": statistics.median(total),
            "p5_us": q[0],
            "p95_us": q[-1],
            "gil_median_us": statistics.median(gil),
            "loop_median_us": statistics.median(rest),
        }

    return asyncio.run(main())


def measure_rtt(channel: str, style: str, n: int, batches: int) -> dict:
    a, b = socket_pair(channel)
    child = spawn("echo", style, b)
    message = os.urandom(MESSAGE_BYTES)
    per: list[float] = []
    try:
        if style == "block":
            framed = MESSAGE_BYTES.to_bytes(4, "big") + message
            buf = memoryview(bytearray(len(framed)))
            for batch in range(batches + 1):
                t = time.perf_counter()
                for _ in range(n):
                    a.sendall(framed)
                    got = 0
                    while got < len(framed):
                        got += a.recv_into(buf[got:])
                if batch:  # the first is the warm-up
                    per.append((time.perf_counter() - t) / n)
        else:

            async def main() -> None:
                conn = make_conn(style, a)
                try:
                    for batch in range(batches + 1):
                        t = time.perf_counter()
                        for _ in range(n):
                            conn.send(message)
                            got = await conn.recv()
                            assert len(got) == MESSAGE_BYTES
                        if batch:
                            per.append((time.perf_counter() - t) / n)
                finally:
                    conn.close()

            asyncio.run(main())
    finally:
        a.close()
        child.wait(10)
    return {"median_us": statistics.median(per) * 1e6, "min_us": min(per) * 1e6}


def measure_bulk(channel: str, style: str, size: int, reps: int) -> dict:
    a, b = socket_pair(channel)
    child = spawn("bulk", "-", b, ["--size", str(size)])
    seconds: list[float] = []
    try:
        if style in ("raw", "raw-fresh"):
            reused = bytearray(size)
            for rep in range(reps + 1):
                buf = reused if style == "raw" else bytearray(size)
                view = memoryview(buf)
                t = time.perf_counter()
                a.sendall(b"g")
                recv_exact(a, 4)
                got = 0
                while got < size:
                    got += a.recv_into(view[got:])
                if rep:
                    seconds.append(time.perf_counter() - t)
                del view
        else:

            async def main() -> None:
                conn = make_conn(style, a)
                try:
                    for rep in range(reps + 1):
                        t = time.perf_counter()
                        os.write(conn_fd(conn), b"g")
                        got = await conn.recv()
                        if rep:
                            seconds.append(time.perf_counter() - t)
                        assert len(got) == size
                        del got
                finally:
                    conn.close()

            asyncio.run(main())
    finally:
        a.close()
        child.wait(30)
    median = statistics.median(seconds)
    return {"seconds": median, "gb_per_s": size / median / 1e9}


def conn_fd(conn) -> int:
    if isinstance(conn, ThreadConn):
        return conn.channel.fileno()
    if isinstance(conn, LoopConn):
        return conn.fd
    return conn.sock.fileno()


def run(args) -> dict:
    out: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "native": native.__version__},
        "options": {"round_trips": args.round_trips, "batches": args.batches, "reps": args.reps},
        "crossing": measure_crossing(args.crossings),
        "rtt": [],
        "bulk": [],
    }
    c = out["crossing"]
    print(
        f"crossing  thread -> loop  median {c['median_us']:7.1f} µs  (GIL {c['gil_median_us']:.1f}, "
        f"loop {c['loop_median_us']:.1f})  p5 {c['p5_us']:.1f}  p95 {c['p95_us']:.1f}",
        flush=True,
    )
    for channel in ("unix", "tcp"):
        raw = None
        for style in ("block", "asyncio", "a", "a-now", "b", "b-off"):
            r = measure_rtt(channel, style, args.round_trips, args.batches)
            raw = raw or r["median_us"]
            r.update(channel=channel, style=style, ratio_to_raw=r["median_us"] / raw)
            out["rtt"].append(r)
            print(
                f"rtt   {channel:4} {style:8} median {r['median_us']:7.1f} µs  min {r['min_us']:7.1f}  "
                f"{r['ratio_to_raw']:.2f}x raw",
                flush=True,
            )
    for channel in ("tcp", "unix"):
        for size_mib in args.sizes:
            raw = None
            for style in ("raw", "raw-fresh", "asyncio", "a", "b", "b-off"):
                r = measure_bulk(channel, style, size_mib * MIB, args.reps)
                raw = raw or r["gb_per_s"]
                r.update(channel=channel, style=style, size=size_mib * MIB, ratio_to_raw=r["gb_per_s"] / raw)
                out["bulk"].append(r)
                print(
                    f"bulk  {channel:4} {size_mib:5} MiB {style:9} {r['gb_per_s']:6.2f} GB/s  "
                    f"{r['ratio_to_raw']:.2f} of raw",
                    flush=True,
                )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round-trips", type=int, default=2000, help="round trips per batch")
    ap.add_argument("--batches", type=int, default=5, help="batches after the warm-up one")
    ap.add_argument("--crossings", type=int, default=2000)
    ap.add_argument("--sizes", default="64,256", help="bulk frame sizes in MiB, comma-separated")
    ap.add_argument("--reps", type=int, default=3, help="bulk repetitions after the warm-up one")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--child", choices=("echo", "bulk"), help=argparse.SUPPRESS)
    ap.add_argument("--style", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child == "echo":
        child_echo(args.style, args.fd)
        return 0
    if args.child == "bulk":
        child_bulk_sender(args.fd, args.size)
        return 0
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    out = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

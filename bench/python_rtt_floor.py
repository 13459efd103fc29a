"""What a 100-byte round trip between two Python processes costs with no handoff at all.

The floor under the Python peer's round trip (issue 14): the same ping-pong written four
ways, each between a parent and a forked child, over a Unix socket and over loopback TCP.

- ``block``: blocking ``sendall`` and ``recv_into`` on both sides (what ``bench/peers``'s
  raw round-trip row does);
- ``add_reader``: an event loop on both sides, waiting for readiness with ``add_reader``
  and reading with ``recv``: the only asyncio style that can also receive file descriptors
  (``recvmsg`` with ``SCM_RIGHTS``), which the shm channel needs;
- ``protocol``: an event loop on both sides with ``asyncio.Protocol`` transports
  (``data_received``), which cannot receive file descriptors.

No framing, no header, no decode: whatever the peer does per message comes on top.

    .venv/bin/python bench/python_rtt_floor.py [--round-trips N] [--uvloop]

``--uvloop`` runs the event-loop styles on uvloop (``pip install uvloop``; not a dependency
of handoff). Prints one line per channel and style: the median and minimum of five batches,
in µs per round trip, and the CPU each process spent per round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time

MESSAGE_BYTES = 100
BATCHES = 5


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of another process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def socket_pair(channel: str) -> tuple[socket.socket, socket.socket]:
    """A connected pair on a Unix socket or on loopback TCP with Nagle off."""
    if channel == "unix":
        return socket.socketpair()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


async def _readable(loop: asyncio.AbstractEventLoop, s: socket.socket) -> None:
    ready = loop.create_future()
    loop.add_reader(s.fileno(), ready.set_result, None)
    try:
        await ready
    finally:
        loop.remove_reader(s.fileno())


async def _recv_some(loop: asyncio.AbstractEventLoop, s: socket.socket) -> bytes:
    while True:
        try:
            return s.recv(65536)
        except BlockingIOError:
            await _readable(loop, s)


async def echo_add_reader(s: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    s.setblocking(False)
    while data := await _recv_some(loop, s):
        s.send(data)


async def ping_add_reader(s: socket.socket, n: int) -> None:
    loop = asyncio.get_running_loop()
    s.setblocking(False)
    message = os.urandom(MESSAGE_BYTES)
    for _ in range(n):
        s.send(message)
        got = 0
        while got < MESSAGE_BYTES:
            got += len(await _recv_some(loop, s))


def echo_block(s: socket.socket) -> None:
    while data := s.recv(65536):
        s.sendall(data)


def ping_block(s: socket.socket, n: int) -> None:
    message = os.urandom(MESSAGE_BYTES)
    buf = memoryview(bytearray(MESSAGE_BYTES))
    for _ in range(n):
        s.sendall(message)
        got = 0
        while got < MESSAGE_BYTES:
            got += s.recv_into(buf[got:])


class _Echo(asyncio.Protocol):
    def __init__(self, done: asyncio.Future) -> None:
        self.done = done

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(None)


class _Pinger(asyncio.Protocol):
    def __init__(self) -> None:
        self.answered: asyncio.Future | None = None
        self.got = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= MESSAGE_BYTES and self.answered is not None and not self.answered.done():
            self.got = 0
            self.answered.set_result(None)


async def _connect(protocol: asyncio.Protocol, s: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    if s.family == socket.AF_UNIX:
        await loop.create_unix_connection(lambda: protocol, sock=s)
    else:
        await loop.create_connection(lambda: protocol, sock=s)


async def echo_protocol(s: socket.socket) -> None:
    done = asyncio.get_running_loop().create_future()
    await _connect(_Echo(done), s)
    await done


def measure(channel: str, style: str, n: int, new_loop) -> str:
    """Runs one style on one channel in a forked echo child; returns the report line."""
    a, b = socket_pair(channel)
    pid = os.fork()
    if pid == 0:
        a.close()
        if style == "block":
            echo_block(b)
        elif style == "add_reader":
            new_loop(echo_add_reader(b))
        else:
            new_loop(echo_protocol(b))
        os._exit(0)
    b.close()
    per_round_trip: list[float] = []

    def batches_sync(ping) -> tuple[float, float]:
        ping(500)
        cpu0, echo0 = time.process_time(), process_cpu_seconds(pid)
        for _ in range(BATCHES):
            t = time.perf_counter()
            ping(n)
            per_round_trip.append((time.perf_counter() - t) / n)
        return time.process_time() - cpu0, process_cpu_seconds(pid) - echo0

    async def batches_async(ping) -> tuple[float, float]:
        await ping(500)
        cpu0, echo0 = time.process_time(), process_cpu_seconds(pid)
        for _ in range(BATCHES):
            t = time.perf_counter()
            await ping(n)
            per_round_trip.append((time.perf_counter() - t) / n)
        return time.process_time() - cpu0, process_cpu_seconds(pid) - echo0

    if style == "block":
        cpu, echo_cpu = batches_sync(lambda k: ping_block(a, k))
    elif style == "add_reader":
        cpu, echo_cpu = new_loop(batches_async(lambda k: ping_add_reader(a, k)))
    else:

        async def protocol_main() -> tuple[float, float]:
            pinger = _Pinger()
            await _connect(pinger, a)
            message = os.urandom(MESSAGE_BYTES)
            loop = asyncio.get_running_loop()

            async def ping(k: int) -> None:
                for _ in range(k):
                    pinger.answered = loop.create_future()
                    pinger.transport.write(message)
                    await pinger.answered

            result = await batches_async(ping)
            pinger.transport.close()
            return result

        cpu, echo_cpu = new_loop(protocol_main())
    a.close()
    os.waitpid(pid, 0)
    per_round_trip.sort()
    total = BATCHES * n
    return (
        f"{channel:4} {style:10} median {per_round_trip[BATCHES // 2] * 1e6:7.1f} µs"
        f"  min {per_round_trip[0] * 1e6:7.1f} µs"
        f"  cpu per round trip: pinger {cpu / total * 1e6:5.1f} µs, echo {echo_cpu / total * 1e6:5.1f} µs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=5000, help="per batch (5 batches)")
    parser.add_argument("--uvloop", action="store_true", help="run the event-loop styles on uvloop")
    args = parser.parse_args()
    if args.round_trips < 1:
        parser.error("--round-trips must be at least 1")
    new_loop = asyncio.run
    loop_name = "asyncio (stdlib)"
    if args.uvloop:
        try:
            import uvloop
        except ImportError:
            print("--uvloop: uvloop is not installed (pip install uvloop)", file=sys.stderr)
            return 2
        new_loop = uvloop.run
        loop_name = f"uvloop {uvloop.__version__}"
    print(f"100-byte ping-pong between two processes; event loop: {loop_name}")
    for channel in ("unix", "tcp"):
        for style in ("block", "add_reader", "protocol"):
            print(measure(channel, style, args.round_trips, new_loop), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

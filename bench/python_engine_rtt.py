"""A 100-byte round trip between two Python processes on the Rust engine, against the
asyncio floor of the same channel, in one run (issue 40).

The floor is ``bench/python_rtt_floor.py``'s ``add_reader`` style: an event loop on both
sides, readiness from ``add_reader``, ``recv`` and ``send`` on the socket, no framing and
no decode (the style that can also receive descriptors). The engine rows run the same
ping-pong as handoff messages through ``handoff.engine`` (the handshake first, then a
``msg`` with a body of ``{"seq": n, "data": <100 bytes>}`` encoded and decoded by
``handoff.codec`` on both sides, as an application does), on the same kind of socket pair.

    .venv/bin/python bench/python_engine_rtt.py [--round-trips N]

A third row per channel sends and echoes the body as it is, without ``handoff.codec``: what
the engine and this driver add on their own. Prints, per channel, the median and minimum
of five batches in µs per round trip for each, the CPU each process spent per round trip,
and the ratios of the medians to the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from python_rtt_floor import BATCHES, MESSAGE_BYTES, measure, process_cpu_seconds, socket_pair  # noqa: E402

SECRET = b"bench secret"
TYPE = "handoff.bench.Ping"


async def echo_engine(sock, codec: bool = True) -> None:
    from handoff.codec import decode_body, encode_body
    from handoff.engine import Driver, Engine
    from handoff.errors import PeerClosed

    driver = Driver(Engine("bench-echo", SECRET))
    conn = driver.adopt(sock, "acceptor", "bench pinger")
    await conn.ready(10)
    while True:
        try:
            got = await conn.recv()
        except PeerClosed:
            break
        if codec:
            value = decode_body(got.body, got.frames, got.type_name)
            enc = encode_body(value)
            conn.send_now(got.type_name, enc.body, enc.frames)
        else:
            conn.send_now(got.type_name, got.body, got.frames)
    driver.close()


def measure_engine(channel: str, n: int, codec: bool = True) -> tuple[float, str]:
    """The engine's round trip on `channel`: (median seconds, report line). Without
    ``codec`` the body is sent and echoed as it is (what the engine and its driver add,
    without ``handoff.codec``'s encoding and decoding)."""
    a, b = socket_pair(channel)
    pid = os.fork()
    if pid == 0:
        a.close()
        asyncio.run(echo_engine(b, codec))
        os._exit(0)
    b.close()
    per_round_trip: list[float] = []

    async def main() -> tuple[float, float]:
        from handoff.codec import decode_body, encode_body
        from handoff.engine import Driver, Engine

        driver = Driver(Engine("bench-pinger", SECRET))
        conn = driver.adopt(a, "dialer", "bench echo")
        await conn.ready(10)
        data = os.urandom(MESSAGE_BYTES)

        raw = encode_body({"seq": 0, "data": data}).body

        async def ping(k: int) -> None:
            for seq in range(k):
                if codec:
                    enc = encode_body({"seq": seq, "data": data})
                    conn.send_now(TYPE, enc.body, enc.frames)
                    got = await conn.recv(30)
                    decode_body(got.body, got.frames, got.type_name)
                else:
                    conn.send_now(TYPE, raw, ())
                    await conn.recv(30)

        await ping(500)
        cpu0, echo0 = time.process_time(), process_cpu_seconds(pid)
        for _ in range(BATCHES):
            t = time.perf_counter()
            await ping(n)
            per_round_trip.append((time.perf_counter() - t) / n)
        result = time.process_time() - cpu0, process_cpu_seconds(pid) - echo0
        conn.close()
        driver.close()
        return result

    cpu, echo_cpu = asyncio.run(main())
    os.waitpid(pid, 0)
    per_round_trip.sort()
    total = BATCHES * n
    median = per_round_trip[BATCHES // 2]
    return median, (
        f"{channel:4} {'engine' if codec else 'engine, no codec':16} median {median * 1e6:7.1f} µs"
        f"  min {per_round_trip[0] * 1e6:7.1f} µs"
        f"  cpu per round trip: pinger {cpu / total * 1e6:5.1f} µs, echo {echo_cpu / total * 1e6:5.1f} µs"
    )


def median_of(line: str) -> float:
    """The median figure of a report line of ``python_rtt_floor.measure``, in seconds."""
    return float(line.split("median", 1)[1].split("µs", 1)[0]) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=5000, help="per batch (5 batches)")
    args = parser.parse_args()
    if args.round_trips < 1:
        parser.error("--round-trips must be at least 1")
    print("100-byte round trip between two Python processes: asyncio floor vs the Rust engine")
    for channel in ("unix", "tcp"):
        floor_line = measure(channel, "add_reader", args.round_trips, asyncio.run)
        engine_median, engine_line = measure_engine(channel, args.round_trips)
        bare_median, bare_line = measure_engine(channel, args.round_trips, codec=False)
        floor = median_of(floor_line)
        print(floor_line)
        print(engine_line)
        print(bare_line)
        print(
            f"{channel:4} engine / floor: {engine_median / floor:.2f}x; without the codec: {bare_median / floor:.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One Dask comm between two processes of this host: a message's round trip, by size, on
tcp:// and on handoff://, in the same run.

A server process listens (``distributed.comm.listen``) and answers every message with a
small one; this process connects (``distributed.comm.connect``) and times ``write`` of a
message holding a numpy array of each ``--sizes`` (``to_serialize``, so the array travels
as a frame of its own, as Dask's worker-to-worker transfers do) followed by ``read`` of the
answer. Per scheme and size it reports the median of ``--rounds`` round trips after
``--warmup`` unmeasured ones; the ratio is handoff's time over tcp's (below 1: faster).
It also times ``--connects`` new comms: ``connect`` (on handoff://, its authenticated
handshake) and the first round trip of a small message, the median.

The handoff settings come from Dask's configuration and the environment as usual, so one
run can compare them: for example ``DASK_DISTRIBUTED__COMM__HANDOFF__SHM_THRESHOLD=64KiB``
(frames from 64 KiB as shared memory instead of from 1 MiB) or ``HANDOFF_UNIX_SNDBUF=0``
(the kernel's default Unix send buffer). From the repository root::

    .venv/bin/python bench/dask_comm.py [--sizes 8,64KiB,256KiB,1MiB,8MiB] [--rounds 500] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time

import dask
import numpy as np
from dask.utils import format_bytes, parse_bytes

SCHEMES = ("tcp", "handoff")
SECRET = {"distributed.comm.handoff.secret": "bench-dask-comm"}


def _serve(scheme: str, ready) -> None:
    """The server process: answers each message with a small one until killed."""
    from distributed.comm import listen

    async def main():
        async def handle(comm):
            while True:
                try:
                    await comm.read()
                    await comm.write({"ok": True})
                except Exception:
                    return

        with dask.config.set(SECRET):
            listener = listen(f"{scheme}://127.0.0.1", handle)
            await listener.start()
        ready.put(listener.contact_address)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _round_trips(address: str, size: int, rounds: int, warmup: int) -> list[float]:
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    with dask.config.set(SECRET):
        comm = await connect(address, timeout=30)
    try:
        msg = {"op": "bench", "data": to_serialize(np.random.default_rng(size).random(max(1, size // 8)))}
        times = []
        for i in range(warmup + rounds):
            t0 = time.perf_counter()
            await comm.write(msg)
            await comm.read()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return times
    finally:
        await comm.close()


async def _connects(address: str, n: int) -> list[float]:
    from distributed.comm import connect

    times = []
    with dask.config.set(SECRET):
        for _ in range(n):
            t0 = time.perf_counter()
            comm = await connect(address, timeout=30)
            await comm.write({"op": "bench"})
            await comm.read()
            times.append(time.perf_counter() - t0)
            await comm.close()
    return times


def measure(scheme: str, sizes: list[int], rounds: int, warmup: int, connects: int) -> dict:
    """``{size: [seconds, ...], "connect": [seconds, ...]}`` for one scheme, against a fresh
    server process."""
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    server = ctx.Process(target=_serve, args=(scheme, ready), daemon=True)
    server.start()
    try:
        address = ready.get(timeout=60)
        out: dict = {n: asyncio.run(_round_trips(address, n, rounds, warmup)) for n in sizes}
        if connects:
            out["connect"] = asyncio.run(_connects(address, connects))
        return out
    finally:
        server.kill()
        server.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,64KiB,256KiB,1MiB,8MiB", help="array sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=500, help="measured round trips per size")
    ap.add_argument("--warmup", type=int, default=50, help="unmeasured round trips first")
    ap.add_argument("--connects", type=int, default=100, help="new comms timed (0: none)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_bytes(s.strip()) for s in args.sizes.split(",") if s.strip()]
    except ValueError as e:
        ap.error(f"--sizes: {e}")
    if not sizes or args.rounds < 1 or args.warmup < 0 or args.connects < 0:
        ap.error("give at least one size, --rounds at least 1, --warmup and --connects at least 0")
    raw = {s: measure(s, sizes, args.rounds, args.warmup, args.connects) for s in SCHEMES}
    rows = []
    for n in sizes:
        t = statistics.median(raw["tcp"][n])
        h = statistics.median(raw["handoff"][n])
        rows.append({"bytes": n, "tcp_s": t, "handoff_s": h, "ratio": h / t})
    connect = None
    if args.connects:
        t, h = (statistics.median(raw[s]["connect"]) for s in SCHEMES)
        connect = {"tcp_s": t, "handoff_s": h, "ratio": h / t}
    if args.json:
        print(json.dumps({"rounds": args.rounds, "warmup": args.warmup, "rows": rows, "connect": connect}))
        return 0
    print(f"{'size':>10} {'tcp:// µs':>11} {'handoff:// µs':>14} {'h/t':>6}")
    for r in rows:
        print(f"{format_bytes(r['bytes']):>10} {r['tcp_s'] * 1e6:11.0f} {r['handoff_s'] * 1e6:14.0f} {r['ratio']:6.2f}")
    if connect:
        c = connect
        print(f"{'connect':>10} {c['tcp_s'] * 1e6:11.0f} {c['handoff_s'] * 1e6:14.0f} {c['ratio']:6.2f}")
    print(
        "median round trip of one message (an array of that size) and a small answer; connect: a new comm"
        " and its first round trip; h/t below 1: handoff faster"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

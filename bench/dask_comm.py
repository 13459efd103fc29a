#!/usr/bin/env python3
"""One Dask comm between two processes of this host: a message's round trip, by size, on
tcp:// and on handoff://, in the same run.

A server process listens (``distributed.comm.listen``) and answers every message with a
small one; this process connects (``distributed.comm.connect``) and times ``write`` of a
message holding a numpy array of each ``--sizes`` (``to_serialize``, so the array travels
as a frame of its own, as Dask's worker-to-worker transfers do) followed by ``read`` of the
answer. Both schemes' servers are up at once, and the round trips run in batches of
``--batch`` that alternate between the schemes, so that a drift of the machine falls on
both alike. Per scheme and size it reports the median of the batches' medians over
``--rounds`` round trips after ``--warmup`` unmeasured ones; the ratio is the median of
handoff's batch time over the tcp batch's beside it (below 1: faster), with their range.
It also times ``--connects`` new comms: ``connect`` (on handoff://, its authenticated
handshake) and the first round trip of a small message, the median.

The handoff settings come from Dask's configuration and the environment as usual, so one
run can compare them: for example ``DASK_DISTRIBUTED__COMM__HANDOFF__SHM_THRESHOLD=64KiB``
(frames from 64 KiB as shared memory instead of from 1 MiB) or ``HANDOFF_UNIX_SNDBUF=0``
(the kernel's default Unix send buffer). ``--between-hosts`` gives handoff's two processes
different host ids, so that its comm takes the route between hosts (TCP, every frame
inline), as tcp:// always does. From the repository root::

    .venv/bin/python bench/dask_comm.py [--sizes 8,64KiB,256KiB,1MiB,8MiB] [--rounds 500] [--between-hosts] [--json]
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
HOST_ID = "distributed.comm.handoff.host-id"


def configs(between_hosts: bool) -> tuple[dict, dict]:
    """Dask's configuration of the server process and of this one."""
    if not between_hosts:
        return SECRET, SECRET
    return {**SECRET, HOST_ID: "bench-server-host"}, {**SECRET, HOST_ID: "bench-client-host"}


def _serve(scheme: str, ready, config: dict) -> None:
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

        with dask.config.set(config):
            listener = listen(f"{scheme}://127.0.0.1", handle)
            await listener.start()
        ready.put(listener.contact_address)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _interleaved(addresses: dict, size: int, rounds: int, warmup: int, batch: int, config: dict) -> dict:
    """Round trips of one message of ``size`` on each scheme's comm, in batches of ``batch``
    that alternate between the schemes (the order rotating each time), so that a drift of the
    machine falls on both alike: ``{scheme: [batch medians, seconds]}``, batch by batch."""
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    comms = {}
    with dask.config.set(config):
        for scheme, address in addresses.items():
            comms[scheme] = await connect(address, timeout=30)
    try:
        msg = {"op": "bench", "data": to_serialize(np.random.default_rng(size).random(max(1, size // 8)))}

        async def run(comm, n: int) -> list[float]:
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                await comm.write(msg)
                await comm.read()
                times.append(time.perf_counter() - t0)
            return times

        for comm in comms.values():
            await run(comm, warmup)
        medians: dict = {scheme: [] for scheme in comms}
        order = list(comms)
        for _ in range(max(1, rounds // batch)):
            for scheme in order:
                medians[scheme].append(statistics.median(await run(comms[scheme], batch)))
            order.append(order.pop(0))
        return medians
    finally:
        for comm in comms.values():
            await comm.close()


async def _connects(address: str, n: int, config: dict) -> list[float]:
    from distributed.comm import connect

    times = []
    with dask.config.set(config):
        for _ in range(n):
            t0 = time.perf_counter()
            comm = await connect(address, timeout=30)
            await comm.write({"op": "bench"})
            await comm.read()
            times.append(time.perf_counter() - t0)
            await comm.close()
    return times


def _server(scheme: str, config: dict):
    """A fresh server process for ``scheme``: ``(process, address)``."""
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    server = ctx.Process(target=_serve, args=(scheme, ready, config), daemon=True)
    server.start()
    return server, ready.get(timeout=60)


def measure(sizes: list[int], rounds: int, warmup: int, batch: int, connects: int, between_hosts: bool = False) -> dict:
    """``{size: {scheme: [batch medians]}, "connect": {scheme: [seconds]}}`` against one
    server process per scheme, both up for the whole run."""
    servers = {}
    server_config, config = configs(between_hosts)
    try:
        for scheme in SCHEMES:
            servers[scheme] = _server(scheme, server_config)
        addresses = {scheme: address for scheme, (_, address) in servers.items()}
        out: dict = {n: asyncio.run(_interleaved(addresses, n, rounds, warmup, batch, config)) for n in sizes}
        if connects:
            out["connect"] = {s: asyncio.run(_connects(a, connects, config)) for s, a in addresses.items()}
        return out
    finally:
        for server, _ in servers.values():
            server.kill()
            server.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,64KiB,256KiB,1MiB,8MiB", help="array sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=500, help="measured round trips per size")
    ap.add_argument("--warmup", type=int, default=50, help="unmeasured round trips first")
    ap.add_argument("--batch", type=int, default=50, help="round trips per batch (the schemes alternate by batch)")
    ap.add_argument("--connects", type=int, default=100, help="new comms timed (0: none)")
    ap.add_argument(
        "--between-hosts",
        action="store_true",
        help="handoff's two processes claim different hosts: its comm takes TCP, as between hosts",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_bytes(s.strip()) for s in args.sizes.split(",") if s.strip()]
    except ValueError as e:
        ap.error(f"--sizes: {e}")
    if not sizes or args.rounds < 1 or args.warmup < 0 or args.connects < 0 or args.batch < 1:
        ap.error("give at least one size, --rounds and --batch at least 1, --warmup and --connects at least 0")
    raw = measure(sizes, args.rounds, args.warmup, args.batch, args.connects, args.between_hosts)
    rows = []
    for n in sizes:
        t = statistics.median(raw[n]["tcp"])
        h = statistics.median(raw[n]["handoff"])
        # Each batch of handoff:// against the tcp:// batch beside it: the median of those
        # ratios, and their range, say how far the machine's drift could move the figure.
        paired = sorted(hb / tb for hb, tb in zip(raw[n]["handoff"], raw[n]["tcp"]))
        rows.append(
            {
                "bytes": n,
                "tcp_s": t,
                "handoff_s": h,
                "ratio": statistics.median(paired),
                "ratio_range": [paired[0], paired[-1]],
                "batches": len(paired),
            }
        )
    connect = None
    if args.connects:
        t, h = (statistics.median(raw["connect"][s]) for s in SCHEMES)
        connect = {"tcp_s": t, "handoff_s": h, "ratio": h / t}
    if args.json:
        print(
            json.dumps(
                {
                    "rounds": args.rounds,
                    "warmup": args.warmup,
                    "batch": args.batch,
                    "between_hosts": args.between_hosts,
                    "rows": rows,
                    "connect": connect,
                }
            )
        )
        return 0
    print(f"{'size':>10} {'tcp:// µs':>11} {'handoff:// µs':>14} {'h/t':>6}  {'batches':>13}")
    for r in rows:
        lo, hi = r["ratio_range"]
        print(
            f"{format_bytes(r['bytes']):>10} {r['tcp_s'] * 1e6:11.0f} {r['handoff_s'] * 1e6:14.0f} {r['ratio']:6.2f}"
            f"  {lo:.2f}-{hi:.2f} of {r['batches']}"
        )
    if connect:
        c = connect
        print(f"{'connect':>10} {c['tcp_s'] * 1e6:11.0f} {c['handoff_s'] * 1e6:14.0f} {c['ratio']:6.2f}")
    print(
        "median round trip of one message (an array of that size) and a small answer, the schemes alternating"
        " batch by batch; h/t: the median of the batches' ratios (their range beside it); connect: a new comm"
        " and its first round trip; h/t below 1: handoff faster"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

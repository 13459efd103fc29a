#!/usr/bin/env python3
"""Dask on handoff:// against Dask on tcp://: an array from one worker to another, and a
small task's round trip.

For each protocol it starts ``LocalCluster(protocol=P, n_workers=2, threads_per_worker=1,
processes=True)`` on this host and measures, from the client:

- **transfer**: a numpy array of ``--sizes`` bytes is computed on worker A and waited for;
  then a task on worker B that only takes its length is timed: the time to move the
  array from A to B, plus one task round trip. The first run of each size is reported
  apart (``first``: handoff's segment pool has no segment of that size yet, and TCP's
  receiver maps fresh memory), the others as the median.
- **touch**: the same with a task that reads one value per 4 KiB page of the array
  (on handoff, the receiver's first touch of the mapped pages is paid here); median.
- **round trip**: ``--tasks`` tiny tasks submitted one after another; the median.

It prints a table, or with ``--json`` one object. From the repository root::

    .venv/bin/python bench/dask_transfer.py [--sizes 64MiB,1GiB] [--repeat 4] [--tasks 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import dask
import numpy as np
from dask.utils import format_bytes, parse_bytes
from distributed import Client, LocalCluster, wait


def _make(n: int, salt: int):
    return np.full(n // 8, float(salt))


def _length(arr) -> int:
    return arr.nbytes


def _touch(arr) -> float:
    return float(arr.view(np.uint8)[::4096].sum())


def _inc(x: int) -> int:
    return x + 1


async def _move(c: Client, a: str, b: str, size: int, reader, salt: int) -> float:
    x = c.submit(_make, size, salt, workers=[a], pure=False)
    await wait(x)
    t0 = time.perf_counter()
    y = c.submit(reader, x, workers=[b], pure=False)
    await y
    dt = time.perf_counter() - t0
    del x, y
    await asyncio.sleep(0.2)  # let b drop the array (and give a's segment back)
    return dt


async def _bench(protocol: str, sizes: list, repeat: int, tasks: int) -> dict:
    async with (
        LocalCluster(
            protocol=protocol,
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            asynchronous=True,
        ) as cluster,
        Client(cluster, asynchronous=True) as c,
    ):
        await c.wait_for_workers(2)
        a, b = sorted(await c.run(lambda: 0))
        out: dict = {"protocol": protocol, "sizes": {}}
        for size in sizes:
            runs = [await _move(c, a, b, size, _length, i) for i in range(repeat + 1)]
            touch = [await _move(c, a, b, size, _touch, i) for i in range(repeat)]
            out["sizes"][size] = {
                "first": runs[0],
                "transfer": statistics.median(runs[1:]),
                "touch": statistics.median(touch),
                "runs": {"transfer": runs, "touch": touch},
            }
        lat = []
        for i in range(tasks):
            t0 = time.perf_counter()
            await c.submit(_inc, i, workers=[a], pure=False)
            lat.append(time.perf_counter() - t0)
        out["round_trip"] = statistics.median(lat)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64MiB,1GiB")
    ap.add_argument("--repeat", type=int, default=4, help="runs per size and kind (after the first)")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    results = {}
    with dask.config.set({"distributed.comm.handoff.secret": "bench", "distributed.worker.memory.target": False}):
        for protocol in ("tcp", "handoff"):
            results[protocol] = asyncio.run(_bench(protocol, sizes, args.repeat, args.tasks))
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'':28}{'tcp://':>14}{'handoff://':>14}{'ratio':>8}")
    for size in sizes:
        for name in ("first", "transfer", "touch"):
            t = results["tcp"]["sizes"][size][name]
            h = results["handoff"]["sizes"][size][name]
            label = f"{format_bytes(size)} {name}"
            print(f"{label:28}{t * 1e3:11.1f} ms{h * 1e3:11.1f} ms{t / h:7.2f}x")
    t, h = results["tcp"]["round_trip"], results["handoff"]["round_trip"]
    print(f"{'task round trip (median)':28}{t * 1e3:11.2f} ms{h * 1e3:11.2f} ms{t / h:7.2f}x")


if __name__ == "__main__":
    main()

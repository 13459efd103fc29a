#!/usr/bin/env python3
"""One copy per host (issue 41): a large array made on Dask worker A and held by a task on
worker B of the same host, on ``tcp://`` and on ``handoff://``, in one run.

For each scheme, ``LocalCluster(protocol=P, n_workers=2, threads_per_worker=1,
processes=True)`` with the active memory manager off. Each round, interleaved across the
schemes:

- **hold**: an array of ``--size`` bytes is made on A and waited for; then a task on B
  that takes it and returns its length is timed (the replica's fetch and one task);
- **copies**: with A and B both holding it, the host memory it costs, in arrays: the
  growth, since before the array was made (and after each worker gave back what it kept
  only for reuse: freed arena ranges, idle segments, ``malloc_trim``), of the workers'
  private memory (``RssAnon`` of ``/proc/PID/status``, both workers) plus the host's
  shared memory (``Shmem`` of ``/proc/meminfo``: memfd segments and arenas, counted once
  however many processes map them), divided by ``--size``;
- **read**: a fresh array made on A, then a task on B that reads every byte (its sum),
  timed.

It prints the medians (and ranges) and each ratio ``tcp:// ÷ handoff://`` (times) or
``handoff:// ÷ tcp://`` (copies); ``--json PATH`` writes every figure. From the
repository root::

    .venv/bin/python bench/shared_arrays.py [--size 1GiB] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import dask
import numpy as np
from dask.utils import format_bytes, parse_bytes
from distributed import Client, LocalCluster, wait

SCHEMES = ("tcp", "handoff")


def make(n: int, salt: int) -> np.ndarray:
    x = np.empty(n, dtype=np.uint8)
    x[:] = salt  # every page written: the array is resident
    return x


def length(x) -> int:
    return len(x)


def read_all(x) -> int:
    """Reads every byte at memory speed: a sum of 64-bit words (modulo 2**64). A sum of the
    bytes into 64-bit integers runs at a fifth of it here (0.41 s per GiB against 0.08 s),
    and would measure NumPy's widening, not the transfer."""
    return int(x.view(np.uint64).sum())


def give_back() -> None:
    """What a worker keeps only for reuse goes back to the system, so that the next round's
    growth is the array's (handoff: freed arena ranges and idle segments; both: malloc's)."""
    import ctypes
    import gc

    gc.collect()
    try:
        from handoff.dask.memory import trim

        trim()
    except ImportError:
        pass
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _shmem() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def host_bytes(pids) -> int:
    """The workers' private memory plus the host's shared memory."""
    return sum(_status(p, "RssAnon") for p in pids) + _shmem()


async def one_round(c: Client, a: str, b: str, pids, size: int, salt: int) -> dict:
    await asyncio.sleep(0.5)  # what the last round freed is gone
    await c.run(give_back)
    before = host_bytes(pids)
    x = c.submit(make, size, salt, workers=[a], pure=False)
    await wait(x)
    t0 = time.perf_counter()
    held = c.submit(length, x, workers=[b], pure=False)
    await held
    hold = time.perf_counter() - t0
    await asyncio.sleep(0.3)
    copies = (host_bytes(pids) - before) / size
    del held, x
    fresh = c.submit(make, size, salt + 1, workers=[a], pure=False)
    await wait(fresh)
    t0 = time.perf_counter()
    total = await c.submit(read_all, fresh, workers=[b], pure=False)
    read = time.perf_counter() - t0
    word = ((salt + 1) % 256) * 0x0101010101010101
    assert total == (size // 8 * word) % (1 << 64), "every byte read, and right"
    del fresh
    return {"hold_s": hold, "copies": copies, "read_s": read}


async def run(args) -> dict:
    size = parse_bytes(args.size)
    if size % 8:
        raise SystemExit(f"--size {args.size}: a whole number of 8-byte words, please")
    results: dict = {s: [] for s in SCHEMES}
    config = {
        "distributed.scheduler.active-memory-manager.start": False,
        "distributed.scheduler.work-stealing": False,
        "distributed.comm.handoff.secret": os.environ.get("HANDOFF_SECRET", "bench secret"),
    }
    with dask.config.set(config):
        clusters = {}
        for scheme in SCHEMES:
            cluster = await LocalCluster(
                protocol=scheme,
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                memory_limit=0,
                asynchronous=True,
            )
            client = await Client(cluster, asynchronous=True)
            await client.wait_for_workers(2)
            pids = await client.run(os.getpid)
            a, b = sorted(pids)
            clusters[scheme] = (cluster, client, a, b, list(pids.values()))
        try:
            for r in range(args.rounds + 1):  # the first is a warm-up, not reported
                order = SCHEMES if r % 2 == 0 else SCHEMES[::-1]
                for scheme in order:
                    _, client, a, b, pids = clusters[scheme]
                    got = await one_round(client, a, b, pids, size, salt=2 * r + 1)
                    if r:
                        results[scheme].append(got)
        finally:
            for cluster, client, *_ in clusters.values():
                await client.close()
                await cluster.close()
    return {"size": size, "rounds": args.rounds, "runs": results}


def summary(out: dict) -> dict:
    rows = {}
    for key in ("copies", "hold_s", "read_s"):
        per = {s: [r[key] for r in out["runs"][s]] for s in SCHEMES}
        med = {s: statistics.median(v) for s, v in per.items()}
        ratio = med["handoff"] / med["tcp"] if key == "copies" else med["tcp"] / med["handoff"]
        rows[key] = {
            "median": med,
            "range": {s: [min(v), max(v)] for s, v in per.items()},
            "ratio": ratio,
        }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB", help="the array's size")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each scheme, interleaved")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    out["summary"] = summary(out)
    names = {
        "copies": "host memory for the array held by A and B, in copies (handoff ÷ tcp)",
        "hold_s": "take and hold a replica on B, seconds (tcp ÷ handoff)",
        "read_s": "read every byte of a fresh array on B, seconds (tcp ÷ handoff)",
    }
    print(f"{format_bytes(out['size'])} array, {args.rounds} rounds of each scheme, interleaved")
    for key, row in out["summary"].items():
        med, rng = row["median"], row["range"]
        cells = "  ".join(f"{s}:// {med[s]:.3f} ({rng[s][0]:.3f}–{rng[s][1]:.3f})" for s in SCHEMES)
        print(f"{names[key]}\n    {cells}  ratio {row['ratio']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

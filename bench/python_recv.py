#!/usr/bin/env python3
"""How fast a Python node receives a large buffer from a Rust node.

Starts ``handoff node`` (this host's identity), connects a Python node to it twice —
once over shared memory (the switch to its Unix socket), once pinned to TCP — and asks
for a ``handoff.demo.Payload`` of ``--bytes`` (default 1 GiB) on each, ``--repeat`` times.

For each run it measures, from sending the ``SendRequest``:

- **receive**: until the payload's ``data`` is a numpy array in Python (the Rust
  node's time to fill the buffer and hash it, its ``prepare_seconds``, is subtracted);
- **sum**: ``numpy.sum`` over the array (every byte read once: over shm, the first
  touch of the mapped pages).

It prints a table (the best of the runs per channel), or with ``--json`` one object.
Run it from the repository root with the Python peer installed::

    .venv/bin/python bench/python_recv.py [--bytes N] [--repeat K] [--json] [--bin target/release/handoff]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from handoff import Node, as_numpy

REPO = Path(__file__).resolve().parents[1]


def find_bin(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("HANDOFF_BIN"):
        return Path(os.environ["HANDOFF_BIN"])
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return p
    raise SystemExit("no handoff binary: run `cargo build --release -p handoff-cli` or pass --bin")


async def one_run(node: Node, peer, id_: int, size: int) -> dict:
    started = time.perf_counter()
    await peer.send("handoff.demo.SendRequest", {"id": id_, "bytes": size})
    env = await node.recv(600)
    body = env.body
    array = as_numpy(body["data"])
    received = time.perf_counter() - started - body["prepare_seconds"]
    zero_copy = isinstance(body["data"].obj, mmap.mmap) and env.frames[1].kind == "shm"
    t = time.perf_counter()
    total = int(array.sum(dtype=np.uint64))
    summed = time.perf_counter() - t
    assert len(array) == size and total >= 0
    del array, body
    env.release()
    return {"receive_seconds": max(received, 1e-9), "sum_seconds": summed, "zero_copy": zero_copy}


async def run(args) -> dict:
    binary = find_bin(args.bin)
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "secret"
        secret.write_text(os.urandom(16).hex())
        env = dict(os.environ, HANDOFF_LOG="error")
        child = subprocess.Popen(
            [str(binary), "node", "--name", "bench-rs", "--secret-file", str(secret)],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            ready = json.loads(child.stdout.readline())
            results = {}
            async with Node("bench-py", secret=secret.read_text().encode(), host_id=ready["host_id"]) as node:
                for channel in ("shm", "tcp"):
                    peer = await node.connect(ready["listen"], channel=channel)
                    runs = [await one_run(node, peer, i, args.bytes) for i in range(args.repeat)]
                    await peer.close()
                    best_rx = min(r["receive_seconds"] for r in runs)
                    best_sum = min(r["sum_seconds"] for r in runs)
                    results[channel] = {
                        "channel": channel,
                        "bytes": args.bytes,
                        "receive_seconds": best_rx,
                        "receive_gbps": args.bytes / best_rx / 1e9,
                        "sum_seconds": best_sum,
                        "sum_gbps": args.bytes / best_sum / 1e9,
                        "zero_copy": all(r["zero_copy"] for r in runs),
                        "runs": runs,
                    }
            return {
                "bytes": args.bytes,
                "repeat": args.repeat,
                "rust_node": str(binary),
                "results": list(results.values()),
            }
        finally:
            child.kill()
            child.wait()


def table(report: dict) -> str:
    head = ["channel", "bytes", "receive", "throughput", "numpy sum", "sum rate", "zero copy"]
    rows = [
        [
            r["channel"],
            f"{r['bytes'] / (1 << 20):.0f} MiB",
            f"{r['receive_seconds'] * 1e3:.2f} ms",
            f"{r['receive_gbps']:.2f} GB/s",
            f"{r['sum_seconds'] * 1e3:.1f} ms",
            f"{r['sum_gbps']:.2f} GB/s",
            "yes" if r["zero_copy"] else "no",
        ]
        for r in report["results"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [head, *rows])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bytes", type=int, default=1 << 30, help="size of the buffer (default 1 GiB)")
    p.add_argument("--repeat", type=int, default=3, help="runs per channel (the best is shown)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--bin", default=None, help="the handoff binary (default: $HANDOFF_BIN, target/release, target/debug)"
    )
    args = p.parse_args()
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

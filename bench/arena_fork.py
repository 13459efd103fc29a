"""What a fork costs a process whose arrays live in arenas (issue 41): ``os.fork()`` timed
until the child runs, and the child's ``RssAnon``, in a process holding a ``--size`` array
in an arena, against the same fork of a process holding it from ``malloc`` alone (the
baseline: copy-on-write, no copy), in one run.

    .venv/bin/python bench/arena_fork.py [--size 1GiB] [--rounds 5]

A child of a process with arena arrays makes its own copies inside ``fork``
(docs/shared-arrays.md); a plain fork copies nothing until a page is written.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import handoff
    size, arena = int(sys.argv[1]), sys.argv[2] == "arena"
    if arena:
        with handoff.shared_arrays():
            a = np.ones(size, dtype=np.uint8)
        assert handoff.shared.locate(a) is not None
    else:
        a = np.ones(size, dtype=np.uint8)
    r, w = os.pipe()
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        took = time.perf_counter() - t
        with open("/proc/self/status") as f:
            rss = int(f.read().split("RssAnon:")[1].split()[0]) * 1024
        os.write(w, f"{took} {rss}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(w)
    print(os.read(r, 100).decode())
    """
)


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, n in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * n)
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = parse_size(args.size)
    runs: dict = {"malloc": [], "arena": []}
    for r in range(args.rounds):
        for kind in ("malloc", "arena") if r % 2 == 0 else ("arena", "malloc"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(size), kind], capture_output=True, text=True, check=True
            )
            took, rss = out.stdout.split()
            runs[kind].append((float(took), int(rss)))
    print(f"fork of a process holding one {args.size} array, {args.rounds} rounds (medians, ranges)")
    for kind, got in runs.items():
        took = [t for t, _ in got]
        rss = [m for _, m in got]
        print(
            f"{kind:7s} fork {statistics.median(took) * 1e3:7.1f} ms ({min(took) * 1e3:.1f}-{max(took) * 1e3:.1f})"
            f"  child RssAnon {statistics.median(rss) / 2**20:6.0f} MiB"
        )
    ratio = statistics.median(t for t, _ in runs["arena"]) / statistics.median(t for t, _ in runs["malloc"])
    print(f"arena / malloc fork time: {ratio:.0f}x")


if __name__ == "__main__":
    main()

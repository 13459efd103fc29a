#!/usr/bin/env python3
"""Two builds of `handoff` compared case by case, in paired rounds, on one machine.

Each round runs `handoff bench --json` once with each binary, back to back, the order
alternating from round to round. For every case and size it pairs the two runs of a round
and takes the ratio of their efficiencies (baseline time / handoff's time, both measured
in the same run), so that a slow minute of the machine weighs on both sides of a pair.
The result is the median of the paired ratios and a 90 % interval for it (a seeded
bootstrap of the median), with a verdict against a bar (default: within 5 %):

- `holds`: the whole interval is at or above 1 - bar;
- `below`: the whole interval is under it;
- `unclear`: the interval spans it (more rounds may decide).

A single run of each binary cannot read a 5 % bar on a VM whose runs of one binary differ
by 10-50 %; paired ratios over rounds can, where the machine allows it at all.

    bench/compare_builds.py BEFORE AFTER [--rounds 6] [--only CASE] [--sizes 1M,64M]
                            [--reps 5] [--bar 0.05] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time


def run_bench(binary: str, args: argparse.Namespace) -> dict[tuple[str, int], float]:
    cmd = [binary, "bench", "--json", "--reps", str(args.reps)]
    if args.only:
        cmd += ["--only", args.only]
    if args.sizes:
        cmd += ["--sizes", args.sizes]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {(row["case"], int(row["bytes"])): float(row["efficiency"]) for row in json.loads(out)}


def interval(ratios: list[float], seed: int = 1) -> tuple[float, float]:
    """A 90 % bootstrap interval for the median of `ratios`."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choice(ratios) for _ in ratios) for _ in range(2000))
    return medians[int(0.05 * len(medians))], medians[int(0.95 * len(medians)) - 1]


def size_label(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="the handoff binary before the change")
    p.add_argument("after", help="the handoff binary after the change")
    p.add_argument("--rounds", type=int, default=6, help="paired rounds (default 6)")
    p.add_argument("--only", help="only the cases whose name contains this text")
    p.add_argument("--sizes", help="sizes, as handoff bench --sizes takes them")
    p.add_argument(
        "--reps",
        type=int,
        default=5,
        help="repetitions per case in each run (default 5)",
    )
    p.add_argument(
        "--bar",
        type=float,
        default=0.05,
        help="how far below 1 a ratio may be (default 0.05)",
    )
    p.add_argument("--json", dest="json_out", help="also write every figure to this file")
    args = p.parse_args()
    if args.rounds < 2:
        p.error("--rounds must be at least 2")

    runs: list[dict[str, dict[tuple[str, int], float]]] = []
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        pair = {}
        for side in order:
            started = time.monotonic()
            pair[side] = run_bench(getattr(args, side), args)
            print(
                f"round {r + 1}/{args.rounds}: {side} in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
        runs.append(pair)

    keys = sorted(set.intersection(*(set(pr["before"]) & set(pr["after"]) for pr in runs)))
    rows = []
    for case, size in keys:
        ratios = [pr["after"][(case, size)] / pr["before"][(case, size)] for pr in runs]
        low, high = interval(ratios)
        floor = 1 - args.bar
        verdict = "holds" if low >= floor else "below" if high < floor else "unclear"
        rows.append(
            {
                "case": case,
                "bytes": size,
                "before": [pr["before"][(case, size)] for pr in runs],
                "after": [pr["after"][(case, size)] for pr in runs],
                "ratios": ratios,
                "median_ratio": statistics.median(ratios),
                "interval_90": [low, high],
                "verdict": verdict,
            }
        )

    print(f"| case | size | median after/before | 90 % interval | verdict (bar {args.bar:.0%}) |")
    print("|---|---|---|---|---|")
    for row in rows:
        low, high = row["interval_90"]
        print(
            f"| `{row['case']}` | {size_label(row['bytes'])} | {row['median_ratio']:.3f} "
            f"| {low:.3f} - {high:.3f} | {row['verdict']} |"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {
                    "rounds": args.rounds,
                    "reps": args.reps,
                    "bar": args.bar,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

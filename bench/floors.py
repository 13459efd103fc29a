"""Runs ``handoff bench`` several times in a row and judges the Rust runtime's floors in each run.

The floors (issue 14) are ratios to the raw baseline that ``handoff bench`` measures in the
same run, plus one absolute time:

- ``shm-copy-in``: efficiency ≥ 0.7 at every size from 1 MiB;
- ``shm-rtt``: efficiency ≥ 0.95;
- ``shm-view``: 1 GiB held in ≤ 100 µs;
- ``ticket-pull`` and ``ticket-3party``: efficiency ≥ 0.85 at every size.

Usage::

    python bench/floors.py [--runs 3] [--bin target/release/handoff] [--json] [-- extra bench args]

Exit status 0 when every floor held in every run, 1 when one did not, 2 when a run failed.
Nothing is typed in: every figure printed is one ``handoff bench --json`` reported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30


def floor_for(row: dict) -> Optional[tuple]:
    """(what is judged, the floor, at_least) for a ``handoff bench`` row, or None when it has no floor."""
    case, n = row["case"], row["bytes"]
    if case == "shm-copy-in" and n >= MIB:
        return ("efficiency", 0.7, True)
    if case == "shm-rtt":
        return ("efficiency", 0.95, True)
    if case == "shm-view" and n == GIB:
        return ("ours", 100e-6, False)
    if case in ("ticket-pull", "ticket-3party"):
        return ("efficiency", 0.85, True)
    return None


def judge(rows: list) -> list:
    """The judged rows of one run: case, bytes, what, value, floor, holds."""
    out = []
    for row in rows:
        f = floor_for(row)
        if f is None:
            continue
        what, floor, at_least = f
        value = row[what]
        out.append(
            {
                "case": row["case"],
                "bytes": row["bytes"],
                "what": what,
                "value": value,
                "floor": floor,
                "holds": value >= floor if at_least else value <= floor,
            }
        )
    return out


def fmt(j: dict) -> str:
    if j["what"] == "ours":
        value, floor = f"{j['value'] * 1e6:.0f} µs", f"≤ {j['floor'] * 1e6:.0f} µs"
    else:
        value, floor = f"{j['value']:.2f}", f"≥ {j['floor']:g}"
    size = (
        f"{j['bytes'] // GIB} GiB"
        if j["bytes"] >= GIB
        else f"{j['bytes'] // MIB} MiB"
        if j["bytes"] >= MIB
        else f"{j['bytes']} B"
    )
    return f"{j['case']:<14} {size:>8}  {j['what']:<10} {value:>10}  floor {floor:<10} {'yes' if j['holds'] else 'NO'}"


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="consecutive runs of handoff bench (default 3)")
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "handoff"), help="the handoff binary")
    ap.add_argument("--json", action="store_true", help="print the judged runs as JSON")
    ap.add_argument("extra", nargs="*", help="more arguments for handoff bench (after --)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs = []
    for i in range(args.runs):
        cmd = [args.bin, "bench", "--json", *args.extra]
        print(f"== run {i + 1}/{args.runs}: {' '.join(cmd)}", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"handoff bench failed (exit {proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
            return 2
        judged = judge(json.loads(proc.stdout))
        runs.append(judged)
        if not args.json:
            print(f"run {i + 1}:")
            for j in judged:
                print("  " + fmt(j))
    every = all(j["holds"] for run in runs for j in run)
    if args.json:
        print(json.dumps({"runs": runs, "all_hold": every}, indent=2))
    else:
        print(f"every floor held in every run: {'yes' if every else 'no'}")
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())

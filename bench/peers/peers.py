"""Side-by-side benchmarks: handoff against Dask distributed, Ray and the raw limits.

Runs each system's script (``sys_raw.py``, ``sys_handoff.py`` — again for the Python
peer alone as ``handoff-pure``, on its pure-Python path, and as ``handoff-engine``, on the
Rust engine —, ``sys_dask.py`` — once on Dask's ``tcp://`` for ``dask`` and once on
``handoff://`` for ``dask-handoff`` — ``sys_ray.py``) in its own process, one after the other, merges what they measured into
``peers.json`` and renders the report (``peers.md``, PNG plots) into the output folder,
and, unless told not to, the generated part of ``BENCHMARKS.md``. A system that cannot
be imported or fails is recorded as such in the report, never left out silently.

Use ``bench/peers/run`` (it sets up the virtual environment and builds the binary);
``bench/peers/run --help`` lists the options.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from common import DEFAULT_SIZES, MiB, RepsPolicy, parse_size, size_arg  # noqa: E402

SYSTEMS = ("raw", "handoff", "handoff-pure", "handoff-engine", "dask", "dask-handoff", "ray")
#: Systems measured by another system's script: (script, its extra arguments).
SCRIPTS = {
    "dask-handoff": ("dask", ["--protocol", "handoff"]),
    # The Python peer's rows again, on its pure-Python path (HANDOFF_NATIVE=0, docs/native.md).
    "handoff-pure": ("handoff", ["--skip-rust", "--pure"]),
    # Again, with handoff.Node on the Rust engine (HANDOFF_ENGINE=1, docs/native.md).
    "handoff-engine": ("handoff", ["--skip-rust", "--engine"]),
}
#: What a system's script runs with, beyond this process's environment.
SCRIPT_ENV = {"handoff-pure": {"HANDOFF_NATIVE": "0"}, "handoff-engine": {"HANDOFF_ENGINE": "1"}}
SMOKE_SIZES = [1 << 10, 64 << 10, 1 << 20]


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
        info["os"] = next(
            (
                line.split("=", 1)[1].strip('"')
                for line in Path("/etc/os-release").read_text().splitlines()
                if line.startswith("PRETTY_NAME=")
            ),
            None,
        )
    except OSError:
        pass
    try:
        info["rustc"] = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        info["rustc"] = None
    return info


def loadavg() -> list:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def run_system(name: str, sizes: list, reps: RepsPolicy, rtt_reps: int, timeout: float, extra: list) -> dict:
    """Runs one system's script; its result, or one that records how it failed."""
    base, args = SCRIPTS.get(name, (name, []))
    script = HERE / f"sys_{base}.py"
    extra = [*args, *extra]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(script), "--sizes", ",".join(size_arg(s) for s in sizes)]
        cmd += ["--reps", reps.to_arg(), "--rtt-reps", str(rtt_reps), "--out", str(out), *extra]
        env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.update(SCRIPT_ENV.get(name, {}))
        print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd[1:])}", file=sys.stderr, flush=True)
        load_before = loadavg()
        started = time.perf_counter()
        err_tail = ""
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout, stderr=subprocess.PIPE, text=True)
            err_tail = proc.stderr[-3000:]
            sys.stderr.write(proc.stderr[-20000:])
            failure = None if proc.returncode == 0 else f"exited with status {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            err_tail = err[-3000:]
            failure = f"did not finish within {timeout:.0f} s"
        seconds = time.perf_counter() - started
        result = None
        if out.exists():
            try:
                result = json.loads(out.read_text())
            except ValueError:
                result = None
        if result is None:
            result = {"system": name, "versions": {}, "transfers": [], "rtt": [], "notes": [], "errors": []}
        if failure:
            last = [ln for ln in err_tail.strip().splitlines() if ln.strip()][-3:]
            result["errors"].append(f"{name}: {failure}; last lines: " + " | ".join(last))
        result["seconds"] = round(seconds, 1)
        result["load_before"] = load_before
        result["load_after"] = loadavg()
        return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="bench/peers/run",
        description="handoff against Dask distributed, Ray and the raw limits, side by side.",
    )
    p.add_argument("--sizes", default=None, help="comma-separated sizes (default: powers of 4, 1K to 1G)")
    p.add_argument("--max-size", default=None, help="leave out sizes above this (e.g. 64M)")
    p.add_argument("--quick", action="store_true", help="sizes up to 64 MiB and fewer repetitions")
    p.add_argument("--reps", type=int, default=None, help="measured repetitions at every size (default: by size)")
    p.add_argument("--rtt-reps", type=int, default=None, help="repetitions of each round-trip measurement (7)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"which to run (default {','.join(SYSTEMS)})")
    p.add_argument("--out", default=str(REPO / "bench" / "results"), help="output folder (default bench/results)")
    p.add_argument("--no-doc", action="store_true", help="do not update BENCHMARKS.md")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one system may take (default 1800)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, handoff (both Python paths) and raw only, 2 repetitions, no BENCHMARKS.md (what the tests run)",
    )
    p.add_argument("--report-only", action="store_true", help="render the report again from OUT/peers.json")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import report

    doc = None if (args.no_doc or args.smoke) else REPO / "BENCHMARKS.md"
    if args.report_only:
        data = json.loads((out / "peers.json").read_text())
        report.write_all(data, out, doc)
        return 0

    if args.smoke:
        sizes, reps, rtt_reps = SMOKE_SIZES, RepsPolicy(fixed=args.reps or 2), args.rtt_reps or 2
        systems = [s for s in args.systems.split(",") if s in ("raw", "handoff", "handoff-pure", "handoff-engine")]
    else:
        sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
        if args.quick and not args.sizes:
            sizes = [s for s in sizes if s <= 64 * MiB]
        if args.max_size:
            sizes = [s for s in sizes if s <= parse_size(args.max_size)]
        reps = RepsPolicy(fixed=args.reps, quick=args.quick)
        rtt_reps = args.rtt_reps or (3 if args.quick else 7)
        systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not sizes:
        p.error(f"unknown systems {unknown}" if unknown else "no sizes left")
    sizes = sorted(set(sizes))

    started = dt.datetime.now(dt.timezone.utc)
    results = []
    for name in systems:
        results.append(run_system(name, sizes, reps, rtt_reps, args.timeout, []))
    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    data = {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(
                ["bench/peers/run"] + [shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])]
            ),
            "git": git.stdout.strip(),
            "machine": machine(),
            "sizes": sizes,
            "reps": {size_arg(s): reps(s) for s in sizes},
            "rtt_reps": rtt_reps,
            "smoke": args.smoke,
            "systems": {
                r["system"]: {
                    "versions": r.get("versions", {}),
                    "seconds": r.get("seconds"),
                    "load_before": r.get("load_before"),
                    "load_after": r.get("load_after"),
                    "notes": r.get("notes", []),
                }
                for r in results
            },
        },
        "transfers": [x for r in results for x in r.get("transfers", [])],
        "rtt": [x for r in results for x in r.get("rtt", [])],
        "errors": [e for r in results for e in r.get("errors", [])],
    }
    (out / "peers.json").write_text(json.dumps(data, indent=1) + "\n")
    report.write_all(data, out, doc)
    for e in data["errors"]:
        print(f"error: {e}", file=sys.stderr)
    print(f"wrote {out / 'peers.json'}, {out / 'peers.md'}" + (f" and {doc}" if doc else ""), file=sys.stderr)
    return 1 if data["errors"] and args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())

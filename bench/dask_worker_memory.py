"""Where a Dask worker's memory is, on tcp:// and on handoff://, idle and after a workload.

For each scheme it starts a ``LocalCluster`` of ``--workers`` worker processes (one
thread each, ``--memory-limit`` each), reads every worker's memory while the cluster is
idle, runs one workload of ``bench/dask_workloads.py`` ``--runs`` times, waits
``--settle`` seconds and reads it again, then once more after ``malloc_trim(0)`` in
each worker. A reading, per worker, in MiB: ``RssAnon``, ``RssFile`` and ``RssShmem``
of ``/proc/self/status``; glibc's heap (``mallinfo2``: ``arena`` in use or free,
``hblkhd`` mapped apart); and, on handoff://, what handoff holds for reuse
(``handoff.dask.memory.shared_bytes``: ``arena-idle``, ``pool-idle``, …). The two
schemes' figures side by side say which part of a worker differs. From the repository
root::

    .venv/bin/python bench/dask_worker_memory.py [--workload shuffle] [--scale 1]
        [--workers 4] [--runs 2] [--settle 2] [--json PATH]

Nothing here is Dask's code: it only uses Dask's public API.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from distributed import Client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dask_workloads  # noqa: E402  (the workloads, from beside this file)

MIB = 1 << 20


def reading() -> dict:
    """This worker's memory now, in MiB (run in the worker)."""
    import ctypes

    out: dict = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                key, kib = line.split()[:2]
                out[key.rstrip(":")] = int(kib) // 1024

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    out["malloc_heap"] = info.arena // MIB
    out["malloc_mapped"] = info.hblkhd // MIB
    try:
        from handoff.dask.memory import shared_bytes
    except ImportError:
        return out
    if "handoff.dask" in sys.modules:
        out.update({k: v // MIB for k, v in shared_bytes().items() if v >= MIB})
    return out


def trimmed() -> dict:
    """This worker's memory after glibc gave back what it can (run in the worker)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return reading()


def measure(scheme: str, args) -> dict:
    sizes = dask_workloads.sizes_for(args.scale)
    run = dask_workloads.RUNNERS[args.workload]
    # The workloads bench's cluster: --workers processes of one thread, --memory-limit each.
    with dask_workloads._cluster(scheme, args) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        out: dict = {"idle": list(client.run(reading).values()), "seconds": []}
        for _ in range(args.runs):
            started = time.perf_counter()
            run(client, sizes)
            out["seconds"].append(time.perf_counter() - started)
        time.sleep(args.settle)
        out["after"] = list(client.run(reading).values())
        out["after_trim"] = list(client.run(trimmed).values())
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="shuffle", choices=sorted(dask_workloads.RUNNERS))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--memory-limit", default="2GiB")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--json", help="write every reading there as JSON")
    args = ap.parse_args(argv)
    results = {}
    for scheme in ("tcp", "handoff"):
        results[scheme] = measure(scheme, args)
        r = results[scheme]
        print(f"{scheme}:// {args.workload}, {args.runs} runs: " + ", ".join(f"{s:.2f} s" for s in r["seconds"]))
        for when in ("idle", "after", "after_trim"):
            for i, w in enumerate(r[when]):
                print(f"  {when:10} worker {i}: " + ", ".join(f"{k} {v}" for k, v in w.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

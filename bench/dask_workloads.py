#!/usr/bin/env python3
"""Real Dask workloads on tcp:// and handoff://, side by side in one run.

Six workloads on ``LocalCluster(protocol=P, n_workers=4, threads_per_worker=1,
processes=True, memory_limit=--memory-limit)`` of this host, on ``tcp://`` and on
``handoff://``. By default (``--cluster per-workload``) each workload gets a fresh cluster
of each scheme, both up at once; it runs ``--warmup`` times on each (reported as ``cold``:
a cluster that has moved nothing yet, whose segment pools are empty), then ``--repeat``
times on each, the schemes taking turns and the order flipping from one turn to the next,
so that neither always runs on a warmer machine or right after the other's load. Runs on
this 2-core machine vary by ±25 % from one to the next (the P2P workloads write their
shards to the disk), so the figures are medians and the turns interleave the schemes:

- ``shuffle``: a P2P shuffle of a dataframe on its ``key`` column (``shuffle_method="p2p"``);
- ``rechunk``: a P2P rechunk of a 2-d array from column slabs to row slabs (``method="p2p"``);
- ``matmul``: ``x @ x.T`` of a blocked square array;
- ``tree``: a pairwise tree reduction (``a + b``) of arrays made on all the workers;
- ``groupby``: a dataframe ``groupby(...).agg`` with ``split_out`` partitions;
- ``small``: many small tasks, each a pair of which depends on two others;
- ``broadcast``: one array (512 MiB at scale 1) made on one worker and used by a task on
  every worker, the pattern of lookup tables, model weights and broadcast joins.

Each workload ends in a small digest computed on the cluster (a hash of every output
partition or block, or the number itself), gathered by the client and compared across the
two schemes: ``equal`` is true when they are the same value.

Per workload and scheme it reports: the wall time from submission to the digest at the
client (the median over ``--repeat`` runs); the peak RSS of each worker process (``VmRSS``
of ``/proc/PID/status``, what Dask's memory monitor reads, sampled every ``--sample-ms``
by a thread of this process; ``RssShmem`` at that peak beside it) and its RSS at rest
(``--settle`` seconds after the results were released); the host's peak memory for the
cluster (``host peak``: at each sample, every worker's private memory, RSS less
``RssShmem``, plus the growth of the host's shared memory, ``Shmem`` of ``/proc/meminfo``,
since the sampler started: shared pages count once however many workers map them; and
``host_growth``, that peak less the same figure for the cluster at rest when the run
started, what the workload itself added; ``host_peak_anon``, the same peak with each
worker's ``RssAnon`` instead of RSS less ``RssShmem``: without the pages of files the
workers map, the program's and its libraries' text among them, which the host's page
cache holds once however many workers map them and which the first figure counts once
per worker); the bytes the workers wrote, by
channel (``handoff.dask.comm.counters`` on handoff://, ``shm`` and ``tcp``; on tcp://, the
bytes Dask's TCP comm wrote, counted by a worker plugin that wraps ``TCP.write``); and what
Dask's memory manager did: workers paused (``worker-status-change`` events to ``paused``),
workers removed or restarted (``remove-worker`` events, and nanny restarts seen as a new
process), and "Unmanaged memory use is high" warnings in the workers' logs.

It prints a table with the ratio of handoff's time to tcp's (below 1: handoff is faster)
and of the highest worker peak RSS (and of the highest peak of the memory Dask's manager
reads, which on handoff:// counts each shared byte once: ``handoff.dask.memory``), and with
``--json PATH`` writes every figure. From the
repository root::

    .venv/bin/python bench/dask_workloads.py [--scale 1] [--repeat 1] [--memory-limit 2GiB]
        [--only shuffle,rechunk] [--json PATH]

``--scale`` multiplies every size (``--scale 0.02`` is a smoke run of a few seconds per
cluster). Nothing here is Dask's code: it only uses Dask's public API.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import dask
import numpy as np
import pandas as pd
from dask.utils import format_bytes, parse_bytes
from distributed import Client, LocalCluster, WorkerPlugin

SCHEMES = ("tcp", "handoff")
WORKLOADS = ("shuffle", "rechunk", "matmul", "tree", "groupby", "small", "broadcast")
JSON_VERSION = 1

# ---------------------------------------------------------------------------- digests


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _frame_digest(part: pd.DataFrame) -> pd.Series:
    """One partition's digest: a hash of its rows sorted, so their order does not count."""
    rows = part.reset_index(drop=True)
    rows = rows.sort_values(list(rows.columns), kind="stable").reset_index(drop=True)
    h = pd.util.hash_pandas_object(rows, index=False).to_numpy()
    return pd.Series([_hash64(h.tobytes()) % (1 << 62), len(rows)], dtype="int64")


def _block_digest(block: np.ndarray) -> np.ndarray:
    """One block's digest as a 1×1 block: a hash of its bytes and its shape."""
    data = np.ascontiguousarray(block)
    return np.array([[_hash64(repr(data.shape).encode() + data.tobytes())]], dtype=np.uint64)


def _array_digest(arr: np.ndarray) -> int:
    return _hash64(np.ascontiguousarray(arr).tobytes())


# ---------------------------------------------------------------------------- the workloads


def _frame_part(i: int, rows: int, keys: int) -> pd.DataFrame:
    rng = np.random.default_rng(1000 + i)
    return pd.DataFrame(
        {
            "key": rng.integers(0, keys, rows, dtype=np.int64),
            "x": rng.random(rows),
            "y": rng.integers(0, 1 << 30, rows, dtype=np.int64),
        }
    )


def _frame(sizes: dict):
    import dask.dataframe as dd

    parts = sizes["frame_parts"]
    meta = _frame_part(0, 0, 1)
    return dd.from_map(
        _frame_part,
        list(range(parts)),
        rows=sizes["frame_rows"],
        keys=sizes["keys"],
        meta=meta,
    )


def run_shuffle(client: Client, sizes: dict):
    df = _frame(sizes)
    out = df.shuffle("key", shuffle_method="p2p", npartitions=sizes["frame_parts"])
    digests = out.map_partitions(_frame_digest, meta=pd.Series(dtype="int64"))
    return client.compute(digests, sync=True).tolist()


def run_groupby(client: Client, sizes: dict):
    df = _frame(sizes)
    out = df.groupby("key").agg({"x": "sum", "y": "max"}, split_out=sizes["split_out"]).reset_index()
    digests = out.map_partitions(_frame_digest, meta=pd.Series(dtype="int64"))
    return client.compute(digests, sync=True).tolist()


def _digest_blocks(client: Client, arr) -> list:
    d = arr.map_blocks(_block_digest, chunks=tuple((1,) * len(c) for c in arr.chunks), dtype=np.uint64)
    return client.compute(d, sync=True).ravel().tolist()


def run_rechunk(client: Client, sizes: dict):
    import dask.array as da

    n, c = sizes["rechunk_n"], sizes["rechunk_chunk"]
    x = da.random.default_rng(7).random((n, n), chunks=(n, c))
    return _digest_blocks(client, x.rechunk((c, n), method="p2p"))


def run_matmul(client: Client, sizes: dict):
    import dask.array as da

    n, b = sizes["matmul_n"], sizes["matmul_chunk"]
    x = da.random.default_rng(11).random((n, n), chunks=(b, b))
    return _digest_blocks(client, x @ x.T)


def _leaf(i: int, n: int) -> np.ndarray:
    return np.random.default_rng(2000 + i).random(n)


def _add(a, b):
    return a + b


def _inc(i: int) -> int:
    return i + 1


def run_tree(client: Client, sizes: dict):
    level = client.map(_leaf, range(sizes["tree_leaves"]), n=sizes["tree_leaf_bytes"] // 8, pure=False)
    while len(level) > 1:
        nxt = [client.submit(_add, a, b, pure=False) for a, b in zip(level[::2], level[1::2])]
        level = nxt + ([level[-1]] if len(level) % 2 else [])
    return client.submit(_array_digest, level[0], pure=False).result()


def run_small(client: Client, sizes: dict):
    n = sizes["small_tasks"]
    a = client.map(_inc, range(n), pure=False)
    b = client.map(_add, a, a[::-1], pure=False)
    return client.submit(sum, b, pure=False).result()


def _table(n: int) -> np.ndarray:
    return np.random.default_rng(512).random(n // 8)


def _use_table(table: np.ndarray, i: int) -> int:
    """A task that reads every byte of the broadcast table (and holds it, as Dask keeps
    the replica while the table's key lives)."""
    return (int(table.view(np.uint64).sum()) + i) % (1 << 64)


def run_broadcast(client: Client, sizes: dict):
    workers = sorted(client.scheduler_info()["workers"])
    table = client.submit(_table, sizes["broadcast_bytes"], workers=workers[:1], pure=False)
    uses = [client.submit(_use_table, table, i, workers=[w], pure=False) for i, w in enumerate(workers)]
    return client.gather(uses)


RUNNERS = {
    "shuffle": run_shuffle,
    "rechunk": run_rechunk,
    "matmul": run_matmul,
    "tree": run_tree,
    "groupby": run_groupby,
    "small": run_small,
    "broadcast": run_broadcast,
}


def sizes_for(scale: float) -> dict:
    """Every size of the workloads at ``scale`` (1: a few hundred MiB each)."""
    sq = math.sqrt(scale)
    rechunk_chunk = max(16, int(256 * sq) // 16 * 16)
    matmul_chunk = max(16, int(1024 * sq) // 16 * 16)
    return {
        "frame_parts": 32,
        "frame_rows": max(100, int(400_000 * scale)),
        "keys": 20_000,
        "split_out": 8,
        "rechunk_chunk": rechunk_chunk,
        "rechunk_n": rechunk_chunk * 32,
        "matmul_chunk": matmul_chunk,
        "matmul_n": matmul_chunk * 4,
        "tree_leaves": 64,
        "tree_leaf_bytes": max(8 * 1024, int(8 * 2**20 * scale)) // 8 * 8,
        "small_tasks": max(200, int(5000 * scale)),
        "broadcast_bytes": max(1 << 20, int(512 * 2**20 * scale)) // 8 * 8,
    }


# ---------------------------------------------------------------------------- measurements


class CountTcpWrites(WorkerPlugin):
    """Counts the bytes Dask's TCP comm writes in a worker process (``TCP.write`` returns
    them), so that tcp:// has bytes by channel as handoff:// has from its own counters.
    Registered on the cluster, so that a worker a nanny restarts counts too."""

    name = "bench-count-tcp-writes"

    def setup(self, worker):
        from distributed.comm import tcp

        if getattr(tcp.TCP.write, "_bench_counted", False):
            return
        inner = tcp.TCP.write
        tcp._bench_written = 0  # on Dask's module: a by-value pickle of this one has its own globals

        async def write(self, msg, serializers=None, on_error="message"):
            n = await inner(self, msg, serializers=serializers, on_error=on_error)
            tcp._bench_written += n or 0
            return n

        write._bench_counted = True
        tcp.TCP.write = write


def _worker_counters() -> dict:
    """This worker's bytes by channel so far: handoff's comm counters and Dask TCP's."""
    from distributed.comm import tcp

    out = {"dask-tcp-written": getattr(tcp, "_bench_written", 0)}
    try:
        from handoff.dask.comm import counters
    except ImportError:
        return out
    out.update({k: v for k, v in counters.items() if k.startswith("bytes-")})
    return out


def _host_shmem() -> int:
    """The host's shared memory (``Shmem`` of ``/proc/meminfo``), in bytes."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def _published(pid: int):
    """What a handoff:// worker publishes of the shared memory it made (``None`` elsewhere)."""
    try:
        from handoff.dask.memory import published
    except ImportError:
        return None
    return published(pid)


def _proc_status(pid: int) -> tuple[int, int, int]:
    """``VmRSS``, ``RssShmem`` and ``RssAnon`` of a process in bytes (zeros when it is gone)."""
    rss = shmem = anon = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith(b"RssShmem:"):
                    shmem = int(line.split()[1]) * 1024
                elif line.startswith(b"RssAnon:"):
                    anon = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return rss, shmem, anon


class RssSampler:
    """Samples the RSS of a cluster's worker processes in a thread: the peak of each worker
    (by name, across restarts) and the shared memory in its RSS at that peak."""

    def __init__(self, cluster: LocalCluster, every_s: float):
        self._cluster = cluster
        self._every = every_s
        self._stop = threading.Event()
        self.peak: dict = {}
        self.shmem_at_peak: dict = {}
        self.pids: dict = {}
        #: The host's memory for the cluster at its peak: private memory of every worker,
        #: plus the host's shared memory grown since the sampler started (counted once).
        self.host_peak = 0
        #: The same with each worker's anonymous memory only (no file pages: see the module).
        self.host_peak_anon = 0
        #: Each worker's peak of the memory Dask's manager reads: its RSS on tcp://; on
        #: handoff:// its private memory plus the shared memory it made
        #: (``handoff.dask.memory.process_memory``, from the figure the worker publishes).
        self.dask_peak: dict = {}
        self._shmem0 = _host_shmem()
        #: The host's memory for the cluster when the sampler started (the cluster at rest).
        self.host_start: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pids_now(self) -> dict:
        out = {}
        for name, nanny in list(self._cluster.workers.items()):
            try:
                pid = nanny.pid
            except Exception:
                pid = None
            if pid:
                out[str(name)] = pid
        return out

    def sample(self) -> dict:
        """RSS of each worker now."""
        now = {}
        private = anonymous = 0
        for name, pid in self.pids_now().items():
            self.pids.setdefault(name, set()).add(pid)
            rss, shmem, anon = _proc_status(pid)
            now[name] = rss
            private += rss - shmem
            anonymous += anon
            owned = _published(pid)
            dask = rss if owned is None else max(0, rss - shmem) + owned
            self.dask_peak[name] = max(self.dask_peak.get(name, 0), dask)
            if rss > self.peak.get(name, 0):
                self.peak[name] = rss
                self.shmem_at_peak[name] = shmem
        shared = max(0, _host_shmem() - self._shmem0)
        host = private + shared
        if self.host_start is None:
            self.host_start = host
        self.host_peak = max(self.host_peak, host)
        self.host_peak_anon = max(self.host_peak_anon, anonymous + shared)
        return now

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def _unmanaged_warnings(client: Client) -> int:
    """How many lines of the workers' logs say "Unmanaged memory use is high"."""
    logs = client.get_worker_logs()
    return sum("Unmanaged memory use is high" in msg for lines in logs.values() for _level, msg in lines)


def _memory_events(client: Client, since: float) -> dict:
    """Pauses and removals of workers the scheduler logged since ``since``."""
    events = client.get_events()
    paused = removed = 0
    for topic, evs in events.items():
        for ts, msg in evs:
            if ts < since or not isinstance(msg, dict):
                continue
            if topic != "all" and msg.get("action") == "worker-status-change" and msg.get("status") == "paused":
                paused += 1
            if topic == "all" and msg.get("action") == "remove-worker":
                removed += 1
    return {"paused": paused, "removed": removed}


def _sum_counters(per_worker: dict) -> dict:
    total: dict = {}
    for c in per_worker.values():
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _bytes_by_channel(scheme: str, before: dict, after: dict) -> dict:
    b, a = _sum_counters(before), _sum_counters(after)
    diff = {k: a.get(k, 0) - b.get(k, 0) for k in a}
    if scheme == "tcp":
        return {"tcp": diff.get("dask-tcp-written", 0)}
    return {
        "shm": diff.get("bytes-written-shm", 0),
        "tcp": diff.get("bytes-written-tcp", 0),
    }


@dataclass
class Run:
    """One workload on one scheme, once."""

    seconds: float
    digest: object
    peak_rss: dict
    shmem_at_peak: dict
    rest_rss: dict
    bytes_written: dict
    paused: int
    removed: int
    restarted: int
    unmanaged_warnings: int
    host_peak: int = 0
    host_growth: int = 0
    host_peak_anon: int = 0
    dask_peak: dict = field(default_factory=dict)
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _cluster(scheme: str, args) -> LocalCluster:
    return LocalCluster(
        protocol=scheme,
        n_workers=args.workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        memory_limit=args.memory_limit,
    )


class Session:
    """A cluster on one scheme and its client, with the byte-counting plugin registered."""

    def __init__(self, scheme: str, args):
        self.scheme = scheme
        self.cluster = _cluster(scheme, args)
        try:
            self.client = Client(self.cluster)
            self.client.wait_for_workers(args.workers)
            self.client.register_plugin(CountTcpWrites())
        except BaseException:
            self.cluster.close()
            raise

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def measure(workload: str, session: Session, sizes: dict, args) -> Run:
    """Runs ``workload`` once on ``session``'s cluster and measures it."""
    client = session.client
    before = client.run(_worker_counters)
    warned = _unmanaged_warnings(client)
    since = time.time()
    with RssSampler(session.cluster, args.sample_ms / 1000) as sampler:
        t0 = time.perf_counter()
        error = None
        try:
            digest = RUNNERS[workload](client, sizes)
        except Exception as e:  # recorded, and the other runs go on
            digest, error = None, f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        after = client.run(_worker_counters)
        time.sleep(args.settle)
    rest = sampler.sample()
    events = _memory_events(client, since)
    return Run(
        seconds=seconds,
        digest=digest,
        peak_rss=sampler.peak,
        shmem_at_peak=sampler.shmem_at_peak,
        rest_rss=rest,
        bytes_written=_bytes_by_channel(session.scheme, before, after),
        paused=events["paused"],
        removed=events["removed"],
        restarted=sum(len(p) - 1 for p in sampler.pids.values()),
        unmanaged_warnings=_unmanaged_warnings(client) - warned,
        host_peak=sampler.host_peak,
        host_peak_anon=sampler.host_peak_anon,
        dask_peak=sampler.dask_peak,
        host_growth=sampler.host_peak - (sampler.host_start or 0),
        error=error,
    )


def run_one(workload: str, scheme: str, sizes: dict, args, sessions: dict) -> Run:
    """``workload`` on ``scheme``: on the scheme's cluster in ``sessions`` if there is one,
    else (``--cluster per-run``) on a fresh cluster of its own."""
    if scheme in sessions:
        return measure(workload, sessions[scheme], sizes, args)
    session = Session(scheme, args)
    try:
        return measure(workload, session, sizes, args)
    finally:
        session.close()


def _summarise(runs: list[Run], cold: list[Run]) -> dict:
    last = runs[-1]
    return {
        "seconds": statistics.median(r.seconds for r in runs),
        "seconds_runs": [r.seconds for r in runs],
        # The warm-up runs (on the same cluster, before the measured ones): what a workload
        # costs on a cluster that has moved nothing yet (empty segment pools on handoff://).
        "cold_seconds": [r.seconds for r in cold],
        "peak_rss": {w: max(r.peak_rss.get(w, 0) for r in runs) for w in sorted(last.peak_rss)},
        "peak_rss_max": max((max(r.peak_rss.values(), default=0) for r in runs), default=0),
        "cold_peak_rss_max": max((max(r.peak_rss.values(), default=0) for r in cold), default=0),
        "shmem_at_peak": last.shmem_at_peak,
        "rest_rss": last.rest_rss,
        "rest_rss_max": max((max(r.rest_rss.values(), default=0) for r in runs), default=0),
        "bytes_written": last.bytes_written,
        "host_peak": statistics.median(r.host_peak for r in runs),
        "dask_memory_max": max((max(r.dask_peak.values(), default=0) for r in runs), default=0),
        "host_peak_runs": [r.host_peak for r in runs],
        # Without file pages (libraries' text, once in the page cache however many map it).
        "host_peak_anon": statistics.median(r.host_peak_anon for r in runs),
        "host_peak_anon_runs": [r.host_peak_anon for r in runs],
        # The peak over the cluster at rest when the run started: what the workload added.
        "host_growth": statistics.median(r.host_growth for r in runs),
        "paused": sum(r.paused for r in runs + cold),
        "removed": sum(r.removed for r in runs + cold),
        "restarted": sum(r.restarted for r in runs + cold),
        "unmanaged_warnings": sum(r.unmanaged_warnings for r in runs + cold),
        "errors": [r.error for r in runs + cold if r.error],
        "digests": [r.digest for r in runs + cold],
    }


def _order(turn: int) -> tuple:
    """The schemes' order on one turn: tcp first on even turns, handoff first on odd ones,
    so that neither always runs right after the other's load (or always first)."""
    return SCHEMES if turn % 2 == 0 else SCHEMES[::-1]


def _progress(args, w: str, scheme: str, r: Run, label: str = "") -> None:
    if args.quiet:
        return
    peak = format_bytes(max(r.peak_rss.values(), default=0))
    err = f"  ERROR {r.error}" if r.error else ""
    print(f"  {w:8} {scheme:8} {r.seconds:8.2f} s  peak {peak}{label}{err}", file=sys.stderr, flush=True)


def _run_workload(args, sizes: dict, w: str, raw: dict, cold: dict, sessions: dict, turn0: int) -> None:
    """Warm-up runs, then ``--repeat`` measured runs, of ``w`` on both schemes, alternating."""
    for k in range(args.warmup):
        for scheme in _order(turn0 + k):
            r = run_one(w, scheme, sizes, args, sessions)
            cold[w][scheme].append(r)
            _progress(args, w, scheme, r, "  (warm-up)")
    for rep in range(args.repeat):
        for scheme in _order(turn0 + rep):
            r = run_one(w, scheme, sizes, args, sessions)
            raw[w][scheme].append(r)
            _progress(args, w, scheme, r)


def _run_reps(args, sizes: dict, workloads: list, raw: dict, cold: dict) -> None:
    """Every workload on both schemes, on the clusters ``--cluster`` says."""
    if args.cluster == "per-workload":
        for i, w in enumerate(workloads):
            sessions = {s: Session(s, args) for s in SCHEMES}
            try:
                _run_workload(args, sizes, w, raw, cold, sessions, i)
            finally:
                for session in sessions.values():
                    session.close()
        return
    sessions: dict = {}
    try:
        if args.cluster == "per-scheme":
            sessions = {s: Session(s, args) for s in SCHEMES}
        for i, w in enumerate(workloads):
            _run_workload(args, sizes, w, raw, cold, sessions, i)
    finally:
        for session in sessions.values():
            session.close()


def run_all(args) -> dict:
    load_start = list(os.getloadavg())
    sizes = sizes_for(args.scale)
    workloads = args.only
    raw: dict = {w: {s: [] for s in SCHEMES} for w in workloads}
    cold: dict = {w: {s: [] for s in SCHEMES} for w in workloads}
    config = {"distributed.comm.handoff.secret": "bench-dask-workloads"}
    with dask.config.set(config):
        _run_reps(args, sizes, workloads, raw, cold)

    out: dict = {
        "version": JSON_VERSION,
        "machine": {
            "python": platform.python_version(),
            "dask": dask.__version__,
            "cpus": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": list(os.getloadavg()),
        },
        "options": {
            "scale": args.scale,
            "repeat": args.repeat,
            "warmup": args.warmup,
            "workers": args.workers,
            "memory_limit": parse_bytes(args.memory_limit),
            "sample_ms": args.sample_ms,
            "settle_s": args.settle,
            "cluster": args.cluster,
        },
        "sizes": sizes,
        "workloads": {},
    }
    for w in workloads:
        per = {s: _summarise(raw[w][s], cold[w][s]) for s in SCHEMES}
        digests = [d for s in SCHEMES for d in per[s]["digests"]]
        equal = all(d is not None for d in digests) and all(d == digests[0] for d in digests)
        t, h = per["tcp"], per["handoff"]
        out["workloads"][w] = {
            "tcp": {k: v for k, v in t.items() if k != "digests"},
            "handoff": {k: v for k, v in h.items() if k != "digests"},
            "equal": equal,
            "time_ratio": h["seconds"] / t["seconds"] if t["seconds"] else None,
            "peak_rss_ratio": (h["peak_rss_max"] / t["peak_rss_max"]) if t["peak_rss_max"] else None,
            "host_peak_ratio": (h["host_peak"] / t["host_peak"]) if t["host_peak"] else None,
            "dask_memory_ratio": (h["dask_memory_max"] / t["dask_memory_max"]) if t["dask_memory_max"] else None,
            "host_growth_ratio": (h["host_growth"] / t["host_growth"]) if t["host_growth"] else None,
            "host_peak_anon_ratio": (h["host_peak_anon"] / t["host_peak_anon"]) if t["host_peak_anon"] else None,
            "cold_time_ratio": (
                statistics.median(h["cold_seconds"]) / statistics.median(t["cold_seconds"])
                if h["cold_seconds"] and t["cold_seconds"]
                else None
            ),
        }
    return out


def print_table(out: dict) -> None:
    mib = 2**20
    print(
        f"{'workload':9}{'tcp s':>9}{'handoff s':>11}{'h/t':>7}{'equal':>7}"
        f"{'peak tcp':>11}{'peak h':>9}{'h/t':>7}{'rest tcp':>10}{'rest h':>9}"
        f"{'tcp MiB':>9}{'h shm MiB':>11}{'h tcp MiB':>11}{'paused t/h':>12}{'restart t/h':>13}"
        f"{'host tcp':>10}{'host h':>8}{'h/t':>6}{'anon h/t':>9}{'dask h/t':>9}"
    )
    for w, r in out["workloads"].items():
        t, h = r["tcp"], r["handoff"]
        print(
            f"{w:9}{t['seconds']:9.2f}{h['seconds']:11.2f}{r['time_ratio']:7.2f}{str(r['equal']):>7}"
            f"{t['peak_rss_max'] / mib:11.0f}{h['peak_rss_max'] / mib:9.0f}{r['peak_rss_ratio'] or 0:7.2f}"
            f"{t['rest_rss_max'] / mib:10.0f}{h['rest_rss_max'] / mib:9.0f}"
            f"{t['bytes_written']['tcp'] / mib:9.0f}{h['bytes_written']['shm'] / mib:11.0f}"
            f"{h['bytes_written']['tcp'] / mib:11.0f}"
            f"{t['paused']:>6}/{h['paused']:<5}{max(t['removed'], t['restarted']):>7}/{max(h['removed'], h['restarted']):<5}"
            f"{t['host_peak'] / mib:10.0f}{h['host_peak'] / mib:8.0f}{r['host_peak_ratio'] or 0:6.2f}"
            f"{r['host_peak_anon_ratio'] or 0:9.2f}{r['dask_memory_ratio'] or 0:9.2f}"
        )
        for s in SCHEMES:
            for e in r[s]["errors"]:
                print(f"  {w} on {s}://: {e}")
    print(
        "peak and rest: the highest worker's RSS in MiB; h/t: handoff's over tcp's; MiB: bytes the workers wrote"
        " (tcp:// through Dask's TCP comm; handoff:// by channel); paused: pauses, restart: workers removed or restarted"
        " (tcp/handoff counts); host: the host's peak memory for the cluster in MiB (medians; shared pages once); anon h/t: the same without file pages (each worker's RssAnon); dask h/t: the highest worker's peak of the memory Dask's manager reads."
    )


# The issue's bar for a run (issue 25, "Done when"): no workload slower on handoff:// than 0.95×
# its tcp:// speed, the ones that move large data between same-host workers faster, and no
# worker's peak RSS more than 10 % over tcp://'s (the highest worker against the highest).
MIN_SPEED = 0.95
MUST_BE_FASTER = ("shuffle", "rechunk", "matmul")
MAX_PEAK_RATIO = 1.10
# Issue 41: no workload's host peak above its tcp:// peak, and the broadcast's at most 0.4×.
MAX_HOST_PEAK_RATIO = 1.0
MAX_BROADCAST_HOST_RATIO = 0.4


def check(out: dict) -> list[str]:
    """The ways ``out`` misses the bar above, one line each (empty: it meets it)."""
    misses = []
    for w, r in out["workloads"].items():
        t, h = r["tcp"]["seconds"], r["handoff"]["seconds"]
        if not r["equal"]:
            misses.append(f"{w}: results differ between the schemes (or a run failed)")
        if h > 0 and t / h < MIN_SPEED:
            misses.append(f"{w}: handoff:// runs at {t / h:.2f}× tcp://'s speed (< {MIN_SPEED})")
        if w in MUST_BE_FASTER and h >= t:
            misses.append(f"{w}: handoff:// ({h:.2f} s) is not faster than tcp:// ({t:.2f} s)")
        # What Dask's memory manager reads: RSS on tcp://, each shared byte counted once (in
        # the worker that made it) on handoff:// (RSS counts it in every worker that maps it).
        ratio = r.get("dask_memory_ratio") or r["peak_rss_ratio"]
        if ratio is not None and ratio > MAX_PEAK_RATIO:
            misses.append(
                f"{w}: highest worker's peak memory (as Dask reads it) {ratio:.2f}× tcp://'s (> {MAX_PEAK_RATIO})"
            )
        host = r.get("host_peak_ratio")
        bound = MAX_BROADCAST_HOST_RATIO if w == "broadcast" else MAX_HOST_PEAK_RATIO
        if host is not None and host > bound:
            misses.append(f"{w}: the host's peak memory {host:.2f}× tcp://'s (> {bound})")
    return misses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies every size (0.02: a smoke run)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="measured runs of each workload on each scheme (the figures are their medians)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="runs of each workload on each scheme before the measured ones, reported as cold",
    )
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument(
        "--memory-limit",
        default="2GiB",
        help="each worker's memory limit (Dask's memory_limit)",
    )
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, in this order")
    ap.add_argument(
        "--sample-ms",
        type=float,
        default=20.0,
        help="how often the workers' RSS is read",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds after a workload before the rest RSS",
    )
    ap.add_argument(
        "--cluster",
        choices=("per-workload", "per-run", "per-scheme"),
        default="per-workload",
        help="a fresh cluster per scheme for each workload (both up at once; the default), a fresh"
        " cluster for each run, or one per scheme for all the workloads",
    )
    ap.add_argument("--json", metavar="PATH", help="write every figure there as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the run meets the issue's bar (time, RSS)")
    args = ap.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    if args.repeat < 1 or args.warmup < 0:
        ap.error("--repeat must be at least 1 and --warmup at least 0")
    unknown = [w for w in args.only if w not in RUNNERS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    # The P2P extension's scheduler plugin (in this process) warns at each shuffle's start and end.
    logging.getLogger("distributed.shuffle._scheduler_plugin").setLevel(logging.ERROR)
    out = run_all(args)
    print_table(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    if not all(r["equal"] for r in out["workloads"].values()):
        print("results differ between tcp:// and handoff:// (or a run failed)")
        return 1
    if args.check:
        misses = check(out)
        for m in misses:
            print("below the bar:", m)
        print(
            "check:",
            "missed" if misses else "met",
            f"(speed >= {MIN_SPEED}x, {', '.join(MUST_BE_FASTER)} faster, peak RSS <= {MAX_PEAK_RATIO}x)",
        )
        return 1 if misses else 0
    return 0


if __name__ != "__main__":
    # Imported (by the smoke test): send this module's functions to the workers by value,
    # so that they need not import it.
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

if __name__ == "__main__":
    sys.exit(main())

"""The Dask rows of ``handoff demo``: a ``LocalCluster`` on ``handoff://`` moving an array
between two workers of this host (shm) and to a worker of another host identity (tcp),
every transfer verified, beside the time the same transfer takes on Dask's ``tcp://``.

``python -m handoff.dask.demo [--bytes N] [--reps R]`` prints a JSON array of rows in the
format of ``handoff demo --json`` (which runs it): ``from``, ``to``, ``locality``,
``channel``, ``bytes``, ``seconds``, ``verified``, and ``dask_tcp_seconds``; ``cold`` says
whether ``seconds`` is a first transfer (the data-handle rows) or warm (the array rows,
which add ``warm_seconds``, the same median, and ``cold_seconds``, their warm-up).

- **The clusters.** ``LocalCluster(protocol="handoff", n_workers=2, processes=True)``:
  workers ``dask-a`` and ``dask-b``, with this host's identity; and ``dask-r``, a
  ``Nanny`` of the same scheduler whose ``distributed.comm.handoff.host-id`` is another
  one, so it reaches the others over TCP. Then ``LocalCluster(protocol="tcp",
  n_workers=2)`` for the comparison.
- **A transfer.** A task on ``dask-a`` makes an array of ``--bytes`` random bytes (a new
  one each time) and its BLAKE2b digest; a task pinned to the receiver takes it as its
  argument, so Dask fetches it from ``dask-a``. ``seconds`` is what the receiver's own
  transfer log says the fetch took (``Worker.transfer_incoming_log``: from its request
  to ``dask-a`` until it held the deserialized array), the median of ``--reps`` transfers
  after one warm-up (the first fills the sender's pool of segments); ``dask_tcp_seconds``
  is the same on ``tcp://`` (Dask's workers always talk TCP, so one figure serves both
  rows).
- **Verified** means, for every transfer on both protocols: the receiver's digest of the
  array equals the sender's; and on ``handoff://`` the channel is the claimed one — the
  receiver's ``handoff.dask.stats()`` counters grew by the array's size on that channel
  (``bytes-read-shm`` or ``bytes-read-tcp``) and not on the other, and the receiver's
  array lies in memory the sender shared (a segment of its pool or a window of its arena,
  both memfds) over shm, and in its own memory over tcp.

- **Data handles** (:mod:`handoff.dask.data`): one more worker, ``dask-n``, of this
  host but with a catalog that lacks the dataset; every worker opens its catalog and a cache
  folder per host identity. A task on ``dask-a`` reads ``demo-data`` (``--bytes`` bytes on an
  HTTP server on loopback, which counts GETs) and returns the ``Blob``; ``dask-b``,
  ``dask-r`` and ``dask-n`` each read it: one row per origin (``path``: ``shared-cache``,
  ``storage``, ``remote-blob``), with ``storage_gets`` the GETs the row caused and
  ``verified`` the BLAKE3 digests equal. These rows have no ``dask_tcp_seconds``.

Needs the ``dask`` extra (``pip install 'handoff[dask]'``); without it, it exits with
status 3 and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

from ..memregion import from_peer, region_of

__all__ = ["main", "run_rows"]

#: The exit status when Dask is not installed (``handoff demo`` then skips the rows).
NO_DASK = 3


def _make(n: int, seed: int):
    """An array of ``n`` random bytes (from ``seed``)."""
    import numpy as np

    arr = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)
    return arr


def _digest(arr) -> str:
    import hashlib

    return hashlib.blake2b(memoryview(arr).cast("B"), digest_size=16).hexdigest()


def _received(arr) -> tuple:
    return _digest(arr), arr.nbytes, region_of(arr), from_peer(arr)


def _counters() -> dict:
    """This process's comm counters (what ``handoff.dask.stats()["counters"]`` says).

    Imported when called, by absolute name: run as ``python -m handoff.dask.demo`` this
    module is ``__main__``, whose functions Dask sends to its workers by value, and a
    module-level name would carry the client's counters instead of the worker's."""
    from handoff.dask.comm import counters

    return dict(counters)


def _fetch_seconds(key, dask_worker=None):
    """How long this worker's fetch of ``key`` took (its transfer log), or ``None``."""
    for entry in reversed(dask_worker.transfer_incoming_log):
        if key in entry["keys"]:
            return entry["stop"] - entry["start"]
    return None


async def _transfer(client, a: str, b: str, nbytes: int, seed: int, protocol: str, channel: str) -> tuple:
    """One verified transfer from ``a`` to ``b``: (seconds, verified, why not)."""
    x = client.submit(_make, nbytes, seed, workers=[a], pure=False)
    sent = await client.submit(_digest, x, workers=[a], pure=False)
    before = (await client.run(_counters, workers=[b]))[b] if protocol == "handoff" else {}
    digest, got, region, in_segment = await client.submit(
        _received, x, workers=[b], allow_other_workers=False, pure=False
    )
    seconds = (await client.run(_fetch_seconds, x.key, workers=[b]))[b]
    problems = []
    if digest != sent or got != nbytes:
        problems.append(f"digest {digest} of {got} bytes received, {sent} of {nbytes} sent")
    if seconds is None:
        problems.append("the receiver's transfer log has no fetch of the array")
    if protocol == "handoff":
        after = (await client.run(_counters, workers=[b]))[b]
        grew = {ch: after.get(f"bytes-read-{ch}", 0) - before.get(f"bytes-read-{ch}", 0) for ch in ("shm", "tcp")}
        other = "tcp" if channel == "shm" else "shm"
        if grew[channel] < nbytes or grew[other] >= nbytes:
            problems.append(f"the receiver read {grew} bytes by channel, not {nbytes} over {channel}")
        if in_segment != (channel == "shm"):
            problems.append(f"the received array lies in {region or 'anonymous memory'!r}")
    del x
    return seconds, not problems, "; ".join(problems)


async def _series(client, a: str, b: str, nbytes: int, reps: int, protocol: str, channel: str, seed: int) -> dict:
    times, why, first = [], [], None
    for i in range(reps + 1):
        seconds, ok, problem = await _transfer(client, a, b, nbytes, seed + i, protocol, channel)
        if not ok:
            why.append(problem)
        if i == 0:
            first = seconds
        elif seconds is not None:
            times.append(seconds)
        await asyncio.sleep(0.05)  # let the receiver drop the array (its segment goes back)
    median = statistics.median(times) if times else None
    return {"seconds": median, "first": first, "verified": not why, "why": why}


class _Storage:
    """The demo's storage: an HTTP file server on loopback (Range requests, as object_store
    asks them) that counts the GETs of the object, and the catalogs that name it."""

    def __init__(self, folder: str, nbytes: int):
        import http.server
        import threading

        self.folder = folder
        with open(os.path.join(folder, "demo-data.bin"), "wb") as f:
            f.write(os.urandom(nbytes))
        self.gets = 0
        storage = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/demo-data.bin":
                    storage.gets += 1
                size = os.path.getsize(os.path.join(folder, "demo-data.bin"))
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes=") and self.path == "/demo-data.bin":
                    first, _, last = rng[6:].partition("-")
                    start, end = int(first), min(int(last) if last else size - 1, size - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                else:
                    start, end = 0, size - 1
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("ETag", f'"demo-{size}"')
                self.end_headers()
                with open(os.path.join(folder, "demo-data.bin"), "rb") as f:
                    f.seek(start)
                    self.wfile.write(f.read(end - start + 1))

            def do_HEAD(self):
                size = os.path.getsize(os.path.join(folder, "demo-data.bin"))
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.send_header("ETag", f'"demo-{size}"')
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{self.server.server_address[1]}/demo-data.bin"
        self.catalog = os.path.join(folder, "Data.toml")
        with open(self.catalog, "w") as f:
            f.write(
                "data_config_version = 1\n"
                f'[[datasets]]\nname = "demo-data"\nuuid = "{DATA_UUID}"\n'
                f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "{url}"\n'
            )
        #: The catalog of the worker that lacks the dataset.
        self.empty = os.path.join(folder, "Empty.toml")
        with open(self.empty, "w") as f:
            f.write("data_config_version = 1\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: The demo dataset's uuid.
DATA_UUID = "5f0c8f7e-7a41-4d2b-9c3e-2a6b1d9e4f10"


def _produce_blob():
    from handoff.dask.data import read_all, worker_catalog

    blob = worker_catalog().blob("demo-data")
    read_all(blob)  # the sender has it: cached, as a worker that used it would
    return blob


def _blake3(data) -> str:
    import blake3

    return blake3.blake3(data).hexdigest()


def _consume_blob(blob):
    from handoff.dask.data import read_all

    data = read_all(blob)
    return _blake3(data), len(data), blob.last_origin


async def _data_rows(client, a: str, workers: dict, storage: _Storage) -> list:
    import distributed

    """One row per origin: a handle made on ``a``, read by each of ``workers``
    ({name: (address, locality, channel)}), the storage GETs each read caused."""
    made = client.submit(_produce_blob, workers=[a], pure=False)
    await distributed.wait(made)  # made on a (one GET), before any row is timed
    with open(os.path.join(storage.folder, "demo-data.bin"), "rb") as f:
        want = _blake3(f.read())
    rows = []
    for name, (address, locality, channel) in workers.items():
        gets = storage.gets
        started = time.perf_counter()
        got, n, origin = await client.submit(
            _consume_blob, made, workers=[address], allow_other_workers=False, pure=False
        )
        rows.append(
            {
                "from": "dask-a",
                "to": name,
                "locality": locality,
                "channel": channel,
                "bytes": n,
                "seconds": time.perf_counter() - started,
                "verified": got == want,
                "data": "demo-data",
                "path": origin,
                "storage_gets": storage.gets - gets,
                "cold": True,  # the first read of the handle (a second comes from the worker's own cache)
            }
        )
    del made
    return rows


async def _rows(nbytes: int, reps: int) -> list:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="handoff-dask-demo-") as folder:
        storage = _Storage(folder, nbytes)
        # The workers open their catalog from HANDOFF_CATALOG (handoff.dask.data.OpenCatalog).
        saved = os.environ.get("HANDOFF_CATALOG")
        os.environ["HANDOFF_CATALOG"] = storage.catalog
        try:
            return await _clusters(nbytes, reps, storage)
        finally:
            if saved is None:
                os.environ.pop("HANDOFF_CATALOG", None)
            else:
                os.environ["HANDOFF_CATALOG"] = saved
            storage.close()


async def _clusters(nbytes: int, reps: int, storage: "_Storage") -> list:
    from distributed import Client, LocalCluster, Nanny

    from .data import OpenCatalog

    common = dict(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        memory_limit=0,
        asynchronous=True,
    )
    results = {}
    async with LocalCluster(protocol="handoff", **common) as cluster, Client(cluster, asynchronous=True) as client:
        await client.wait_for_workers(2)
        a, b = sorted(await client.run(os.getpid))
        # Another host identity: it reaches the others over TCP.
        remote = {"distributed.comm.handoff.host-id": f"handoff-dask-demo-elsewhere-{os.urandom(4).hex()}"}
        async with (
            Nanny(cluster.scheduler_address, host="127.0.0.1", nthreads=1, memory_limit=0, config=remote) as nanny,
            # This host, but a catalog without the dataset: it pulls a handle's bytes from the sender.
            Nanny(
                cluster.scheduler_address,
                host="127.0.0.1",
                nthreads=1,
                memory_limit=0,
                env={"HANDOFF_CATALOG": storage.empty},
            ) as lacking,
        ):
            await client.wait_for_workers(4)
            r = nanny.worker_address
            results["shm"] = await _series(client, a, b, nbytes, reps, "handoff", "shm", 100)
            results["tcp"] = await _series(client, a, r, nbytes, reps, "handoff", "tcp", 200)
            cache = os.path.join(storage.folder, "cache-{host_id}")
            await client.register_plugin(OpenCatalog(cache_dir=cache))
            data_rows = await _data_rows(
                client,
                a,
                {
                    "dask-b": (b, "same-host", "shm"),
                    "dask-r": (r, "remote", "tcp"),
                    "dask-n": (lacking.worker_address, "same-host", "shm"),
                },
                storage,
            )
    async with LocalCluster(protocol="tcp", **common) as cluster, Client(cluster, asynchronous=True) as client:
        await client.wait_for_workers(2)
        ta, tb = sorted(await client.run(os.getpid))
        results["dask-tcp"] = await _series(client, ta, tb, nbytes, reps, "tcp", "tcp", 300)
    base = results["dask-tcp"]
    rows = []
    for channel, to, locality in (("shm", "dask-b", "same-host"), ("tcp", "dask-r", "remote")):
        res = results[channel]
        for why in res["why"] + base["why"]:
            print(f"handoff.dask.demo: {channel}: {why}", file=sys.stderr)
        rows.append(
            {
                "from": "dask-a",
                "to": to,
                "locality": locality,
                "channel": channel,
                "bytes": nbytes,
                "seconds": res["seconds"] if res["seconds"] is not None else 0.0,
                "verified": res["verified"] and base["verified"] and res["seconds"] is not None,
                "dask_tcp_seconds": base["seconds"],
                # seconds is warm (the median after the warm-up); the warm-up itself is the cold figure.
                "cold": False,
                "warm_seconds": res["seconds"],
                "cold_seconds": res["first"],
            }
        )
    return rows + data_rows


def run_rows(nbytes: int = 64 << 20, reps: int = 3) -> list:
    """The demo's Dask rows (starts and stops the clusters)."""
    import dask

    config = {
        "distributed.comm.handoff.secret": os.urandom(16).hex(),
        "distributed.comm.compression": None,  # random bytes: compare the comms, not lz4
        "distributed.worker.memory.target": False,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": False,
        "distributed.admin.system-monitor.gil.enabled": False,
    }
    with dask.config.set(config):
        return asyncio.run(_rows(nbytes, reps))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m handoff.dask.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=64 << 20, help="size of the array (default 64 MiB)")
    ap.add_argument("--reps", type=int, default=3, help="measured transfers per row, after one warm-up (default 3)")
    args = ap.parse_args(argv)
    if args.bytes < 1 or args.reps < 1:
        ap.error("--bytes and --reps must be positive")
    # Dask's log (its workers inherit the environment): errors only, on stderr.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
    try:
        import distributed  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"handoff.dask.demo: Dask is not installed ({e}); pip install 'handoff[dask]'", file=sys.stderr)
        return NO_DASK
    started = time.perf_counter()
    rows = run_rows(args.bytes, args.reps)
    print(json.dumps(rows, indent=1))
    print(f"handoff.dask.demo: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

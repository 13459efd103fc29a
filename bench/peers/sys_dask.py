"""Dask distributed: a LocalCluster of two worker processes with one thread each, on
Dask's ``tcp://`` comm (system ``dask``) or on handoff's ``handoff://`` comm backend
(``--protocol handoff``, system ``dask-handoff``: the same host, so the workers talk
over a Unix socket and frames from 1 MiB, the backend's shm-threshold, travel as shared-memory
segments).

Transfer: an array made by a task on worker A (not timed; random bytes that do not
compress, and compression is off) is fetched by worker B with Dask's own
``distributed.worker.get_data_from_worker`` (what B's ``gather_dep`` calls for a task's
dependency: the pooled comm to A, A's serialization, the transfer, B's deserialization),
timed on B from the request until B holds the array (then B reads 64 bytes, ``sample``,
or every byte, ``full``) — as for the other systems. A fresh array for each run.
(Until 2026-12-03 this was the time of ``client.submit(task, x, workers=[B]).result()``
minus that of the same task on A: the difference of two task round trips of about 10 ms
each, whose noise on a 2-vCPU machine made small sizes come out negative. The scheduler's
part of a task is the task round trip below.)

Round trips: a Dask comm between the two workers (``distributed.comm.connect`` on A to
a ``distributed.comm.listen`` echo on B, msgpack messages carrying 100 bytes), and a
task round trip from the client (client → scheduler → worker B → client).
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
os.environ["DASK_DISTRIBUTED__COMM__COMPRESSION"] = "None"

from common import (  # noqa: E402
    RTT_BYTES,
    common_args,
    log,
    parse_common,
    pattern,
    read_full,
    read_sample,
    round_trips,
    row,
    versions,
    write_result,
)


def make(n: int, seed: int):
    return pattern(n, seed)


def consume(a, how: str):
    t = time.perf_counter()
    v = read_sample(a) if how == "sample" else read_full(a)
    return v, time.perf_counter() - t


def noop(i):
    return i


async def fetch_from(key, a_addr: str, how: str, dask_worker=None) -> tuple:
    """On worker B: fetches ``key`` from worker A as B's ``gather_dep`` does, then reads it.
    ``(seconds until B holds it, seconds B's read took)``."""
    from distributed.worker import get_data_from_worker

    t0 = time.perf_counter()
    response = await get_data_from_worker(dask_worker.rpc, [key], a_addr, who=dask_worker.address)
    if response["status"] != "OK":
        raise RuntimeError(f"worker A answered {response['status']!r}")
    data = response["data"][key]
    t1 = time.perf_counter()
    read_sample(data) if how == "sample" else read_full(data)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def comm_stats():
    """This worker's handoff:// counters (comms and bytes by channel), if it uses the backend."""
    try:
        import handoff.dask

        return dict(handoff.dask.stats()["counters"])
    except ImportError:
        return {}


async def start_echo(protocol: str, dask_worker=None):
    from distributed.comm import listen

    async def handle(comm):
        try:
            while True:
                await comm.write(await comm.read())
        except Exception:
            pass

    listener = listen(f"{protocol}://127.0.0.1:0", handle)
    await listener.start()
    dask_worker._bench_echo = listener  # keep it alive
    return listener.contact_address


async def ping(addr: str, reps: int, dask_worker=None):
    from distributed.comm import connect

    from common import round_trips_async

    comm = await connect(addr)
    msg = {"op": "ping", "data": os.urandom(RTT_BYTES)}

    async def one():
        await comm.write(msg)
        await comm.read()

    try:
        return await round_trips_async(one, reps)
    finally:
        await comm.close()


#: Per protocol: the system, the name of its series, and how its comm moves the bytes.
PROTOCOLS = {
    "tcp": ("dask", "Dask", "fetched over Dask's TCP comm"),
    "handoff": (
        "dask-handoff",
        "Dask on handoff://",
        "fetched over the handoff:// comm: a Unix socket, frames from 1 MiB as shared-memory segments",
    ),
}


def main() -> int:
    ap = common_args(__doc__.split("\n")[0])
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="tcp", help="Dask's comm (default tcp)")
    args = ap.parse_args()
    sizes, reps = parse_common(args)
    import dask
    from distributed import Client, LocalCluster, wait

    system, name, fetched = PROTOCOLS[args.protocol]
    dask.config.set({"distributed.comm.compression": None})
    mods = ["dask", "distributed", "numpy", "cloudpickle", "msgpack", "tornado", "lz4"]
    if args.protocol == "handoff":
        # The cluster secret, for the workers too (the nannies pass the config on).
        dask.config.set({"distributed.comm.handoff.secret": os.urandom(16).hex()})
        mods.append("handoff")
    result = {
        "system": system,
        "versions": versions(mods),
        "transfers": [],
        "rtt": [],
        "notes": [],
        "errors": [],
    }
    started = time.perf_counter()
    cluster = LocalCluster(
        protocol=args.protocol,
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        memory_limit=0,
    )
    client = Client(cluster)
    try:
        a_addr, b_addr = sorted(client.scheduler_info()["workers"])
        result["notes"].append(
            f"LocalCluster(protocol={args.protocol!r}, n_workers=2, threads_per_worker=1, processes=True) up in "
            f"{time.perf_counter() - started:.1f} s; workers {a_addr}, {b_addr}; compression "
            f"{client.run(lambda: dask.config.get('distributed.comm.compression'), workers=[b_addr])[b_addr]!r}"
        )

        seed = 0
        for n in sizes:
            log(f"dask {n}")
            runs = {"sample": [], "full": []}
            raw = {"sample": [], "full": []}
            for rep in range(reps(n) + 1):
                for how in ("sample", "full"):
                    seed += 1
                    x = client.submit(make, n, seed, workers=[a_addr], pure=False)
                    wait(x)
                    arrived, read = client.run(fetch_from, x.key, a_addr, how, workers=[b_addr])[b_addr]
                    del x
                    if rep:
                        runs[how].append(arrived + read)
                        raw[how].append({"arrived_on_b": arrived, "read_on_b": read})
            for how in ("sample", "full"):
                x = row(
                    name,
                    system,
                    "same-host",
                    how,
                    n,
                    runs[how],
                    f"worker B fetches an array made on worker A ({fetched}) with Dask's "
                    "get_data_from_worker (as gather_dep does), timed on B until it holds the array, "
                    "then reads " + ("64 bytes" if how == "sample" else "every byte"),
                )
                x["parts"] = raw[how]
                result["transfers"].append(x)
                if args.protocol == "tcp":
                    # Dask has no same-host shortcut: between hosts it is the same TCP transfer.
                    remote = dict(x, route="remote")
                    remote["how"] = x["how"] + " (the same measurement as same-host: Dask workers always talk TCP)"
                    result["transfers"].append(remote)

        if args.protocol == "handoff":
            counters = client.run(comm_stats)
            result["notes"].append(
                "handoff.dask.stats() counters after the transfers: "
                + "; ".join(f"{w}: {dict(sorted(c.items()))}" for w, c in sorted(counters.items()))
            )
            if sizes and max(sizes) >= 64 << 10 and not counters.get(b_addr, {}).get("bytes-read-shm"):
                result["errors"].append(f"{system}: worker B read nothing over shm: {counters.get(b_addr)}")

        log(f"{system} comm round trips")
        echo = client.run(start_echo, args.protocol, workers=[b_addr])[b_addr]
        runs, batch = client.run(ping, echo, args.rtt_reps, workers=[a_addr])[a_addr]
        result["rtt"].append(
            row(
                f"{name} comm (worker↔worker)",
                system,
                "same-host",
                None,
                None,
                runs,
                f"distributed.comm.connect from worker A to a distributed.comm.listen echo on worker B "
                f"({'TCP' if args.protocol == 'tcp' else 'handoff://, a Unix socket'}), a msgpack message with "
                f"100 bytes there and back ({batch} per repetition)",
            )
        )
        i = 0

        def task_rt():
            nonlocal i
            i += 1
            client.submit(noop, i, workers=[b_addr], pure=False).result()

        # About 1 s per repetition (some 100 tasks): a task's ~10 ms round trip on a loaded
        # 2-vCPU machine varies by tens of percent from one batch of 20 to the next.
        runs, batch = round_trips(task_rt, args.rtt_reps, target_seconds=1.0)
        result["rtt"].append(
            row(
                f"{name} task (client→worker→client)",
                system,
                "same-host",
                None,
                None,
                runs,
                f"client.submit(noop, i, workers=[B]).result(): client → scheduler → worker → client "
                f"({batch} per repetition)",
            )
        )
    finally:
        client.close()
        cluster.close()
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

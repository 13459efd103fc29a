"""Dask distributed: a LocalCluster of two worker processes with one thread each, on
Dask's ``tcp://`` comm (system ``dask``) or on handoff's ``handoff://`` comm backend
(``--protocol handoff``, system ``dask-handoff``: the same host, so the workers talk
over a Unix socket and frames from 64 KiB travel as shared-memory segments).

Transfer: an array made by a task on worker A (not timed; random bytes that do not
compress, and compression is off) is consumed by a task on worker B, which fetches it
from A over the comm. The time of ``client.submit(task, x, workers=[B]).result()``
minus that of the same task on A (where ``x`` already is), plus A's own time to read
the bytes (measured inside its task: the subtraction took it away), is the time until
B has read every byte (``full``) or 64 of them (``sample``) — as for the other systems.
(Until 2026-12 the time B's read took was added back instead of A's, which counts B's
read twice and A's never: a few percent on TCP, where B reads bytes it has just
written, more where B's first read is what maps them in.) A fresh array for each run.

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
        "fetched over the handoff:// comm: a Unix socket, frames from 64 KiB as shared-memory segments",
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

        def timed(fut) -> tuple:
            t = time.perf_counter()
            value = fut.result()
            return time.perf_counter() - t, value

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
                    t_b, (_, read_b) = timed(
                        client.submit(consume, x, how, workers=[b_addr], allow_other_workers=False, pure=False)
                    )
                    t_a, (_, read_a) = timed(client.submit(consume, x, how, workers=[a_addr], pure=False))
                    del x
                    if rep:
                        runs[how].append(t_b - t_a + read_a)
                        raw[how].append({"on_b": t_b, "on_a": t_a, "read_on_b": read_b, "read_on_a": read_a})
            for how in ("sample", "full"):
                x = row(
                    name,
                    system,
                    "same-host",
                    how,
                    n,
                    runs[how],
                    f"task on worker B consuming an array made on worker A ({fetched}), "
                    "minus the same task on A, plus A's time reading "
                    + ("64 bytes" if how == "sample" else "every byte"),
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

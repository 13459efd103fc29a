"""Ray: an array returned by one actor, consumed by another.

Same host: one Ray node (``ray.init``), so both actors share its plasma object store
and the consumer gets a zero-copy, read-only numpy view of the producer's object.
Remote: two Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head node and a
second raylet, each with its own object store), the producer on one and the consumer
on the other, so the object is copied between the stores by Ray's object manager over
TCP. Actors take no CPU (``num_cpus=0``) and are pinned with custom resources.

Transfer: the producer's ``make(n)`` returns random bytes (Ray stores objects of 100 KiB
and more in plasma; smaller ones travel inline with the call); once it is ready (not
timed) the consumer's ``sample(x)`` or ``full(x)`` is timed from the driver, minus an
empty call to the consumer right after. A fresh object for each run. Also measured:
the same with the producer's copy into the object store included (the producer returns
an array it already holds; minus the same chain of two empty calls).

Round trips: an empty actor call from the driver, and a call with 100 bytes from one
actor to the other (``ray.get(other.echo.remote(b))`` inside the first).
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")

from common import (  # noqa: E402
    RTT_BYTES,
    GiB,
    MiB,
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


def actor_class(ray):
    @ray.remote(num_cpus=0)
    class Actor:
        def __init__(self):
            self.held = None

        def make(self, n, seed):
            return pattern(n, seed)

        def prepare(self, n, seed):
            self.held = pattern(n, seed)

        def emit(self):
            return self.held

        def empty(self, x=None):
            return 0

        def echo(self, b):
            return b

        def sample(self, a):
            return read_sample(a)

        def full(self, a):
            return read_full(a)

        def ping(self, other, reps):
            from common import round_trips

            b = os.urandom(RTT_BYTES)
            return round_trips(lambda: ray.get(other.echo.remote(b)), reps)

    return Actor


def measure(ray, route: str, sizes: list, reps, rtt_reps: int, producer, consumer, result: dict) -> None:
    def timed(ref) -> float:
        t = time.perf_counter()
        ray.get(ref)
        return time.perf_counter() - t

    where = (
        "two actors of one Ray node (shared plasma store)"
        if route == "same-host"
        else "two actors on two Ray nodes of this machine "
        "(separate object stores, copied by the object manager over TCP)"
    )
    seed = 0
    for n in sizes:
        log(f"ray {route} {n}")
        runs = {"sample": [], "full": [], "put": []}
        for rep in range(reps(n) + 1):
            for how in ("sample", "full"):
                seed += 1
                ref = producer.make.remote(n, seed)
                ray.wait([ref], fetch_local=False)
                t = timed(getattr(consumer, how).remote(ref))
                t0 = timed(consumer.empty.remote())
                del ref
                if rep:
                    runs[how].append(t - t0)
            seed += 1
            ray.get(producer.prepare.remote(n, seed))
            t = timed(consumer.sample.remote(producer.emit.remote()))
            t0 = timed(consumer.empty.remote(producer.empty.remote()))
            if rep:
                runs["put"].append(t - t0)
        ray.get(producer.prepare.remote(1, 0))  # drop the held array
        inline = " (under 100 KiB: inline with the call, not in plasma)" if n < 100 * 1024 else ""
        for how in ("sample", "full"):
            result["transfers"].append(
                row(
                    "Ray",
                    "ray",
                    route,
                    how,
                    n,
                    runs[how],
                    f"{where}: consumer.{how}(ref) of an object returned by the producer{inline}, "
                    "minus an empty call to the consumer",
                )
            )
        result["transfers"].append(
            row(
                "Ray (incl. producer's put)",
                "ray",
                route,
                "sample",
                n,
                runs["put"],
                f"{where}: consumer.sample(producer.emit()), the producer returning an array it holds "
                f"(its copy into the object store included){inline}, minus consumer.empty(producer.empty())",
            )
        )
    log(f"ray {route} round trips")
    runs, batch = round_trips(lambda: ray.get(consumer.empty.remote()), rtt_reps)
    if route == "same-host":
        result["rtt"].append(
            row(
                "Ray empty call (driver→actor)",
                "ray",
                route,
                None,
                None,
                runs,
                f"ray.get(actor.empty.remote()) from the driver ({batch} per repetition)",
            )
        )
    runs, batch = ray.get(producer.ping.remote(consumer, rtt_reps))
    result["rtt"].append(
        row(
            "Ray actor→actor call" + (" (2 Ray nodes)" if route == "remote" else ""),
            "ray",
            route,
            None,
            None,
            runs,
            f"{where}: ray.get(other.echo.remote(100 bytes)) inside the first actor ({batch} per repetition)",
        )
    )


def store_bytes(sizes: list) -> int:
    return int(min(8 * GiB, max(GiB, 3 * max(sizes) + 512 * MiB)))


def same_host(sizes, reps, rtt_reps, result) -> None:
    import ray

    t = time.perf_counter()
    ray.init(
        num_cpus=2,
        object_store_memory=store_bytes(sizes),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        result["notes"].append(
            f"same-host: ray.init(num_cpus=2, object_store_memory={store_bytes(sizes)}) up in "
            f"{time.perf_counter() - t:.1f} s"
        )
        Actor = actor_class(ray)
        producer, consumer = Actor.remote(), Actor.remote()
        ray.get([producer.empty.remote(), consumer.empty.remote()])
        measure(ray, "same-host", sizes, reps, rtt_reps, producer, consumer, result)
    finally:
        ray.shutdown()


def remote(sizes, reps, rtt_reps, result) -> None:
    import ray
    from ray.cluster_utils import Cluster

    t = time.perf_counter()
    store = store_bytes(sizes)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "object_store_memory": store},
    )
    try:
        cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=store)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        result["notes"].append(
            f"remote: ray.cluster_utils.Cluster with 2 nodes (object_store_memory={store} each) up in "
            f"{time.perf_counter() - t:.1f} s"
        )
        Actor = actor_class(ray)
        producer = Actor.options(resources={"node_a": 0.01}).remote()
        consumer = Actor.options(resources={"node_b": 0.01}).remote()
        ray.get([producer.empty.remote(), consumer.empty.remote()])
        measure(ray, "remote", sizes, reps, rtt_reps, producer, consumer, result)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> int:
    p = common_args(__doc__.split("\n")[0])
    p.add_argument("--routes", default="same-host,remote", help="same-host, remote or both")
    args = p.parse_args()
    sizes, reps = parse_common(args)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    result = {
        "system": "ray",
        "versions": versions(["ray", "numpy", "cloudpickle", "grpcio"]),
        "transfers": [],
        "rtt": [],
        "notes": [],
        "errors": [],
    }
    for route, fn in (("same-host", same_host), ("remote", remote)):
        if route not in args.routes.split(","):
            continue
        try:
            fn(sizes, reps, args.rtt_reps, result)
        except Exception as e:  # recorded, not hidden
            import traceback

            traceback.print_exc()
            result["errors"].append(f"ray {route}: {type(e).__name__}: {e}")
        write_result(args.out, result)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

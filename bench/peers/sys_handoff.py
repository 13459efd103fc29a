"""handoff, from Rust and from the Python peer.

Rust: runs ``handoff bench --json --sizes … --reps … --only CASE`` (crates/handoff-cli/
src/bench/) and turns its cases into rows: ``shm-view``, ``shm-read``, ``shm-copy-in``
(same host), ``tcp-read``, ``ticket-pull``, ``ticket-3party`` (remote), ``shm-rtt`` and
``tcp-rtt``. Their sender and receiver are two nodes of one process joined by a real
Unix socket (memfds passed with SCM_RIGHTS, mapped by the receiver) or TCP connection
(the ticket owner is a child process). Each row keeps the raw baseline ``handoff bench``
measured beside it (``baseline_runs``).

Python: this process runs Python nodes and asks, with ``handoff.demo.SendRequest``, a
Rust node (``handoff node``, a child process) or a Python worker (``python -m
handoff.worker``, a child process) for a payload of ``n`` bytes; the producer fills it
in place in shared memory (or in its heap for TCP) and reports that time
(``prepare_seconds``), which is subtracted. Same host: this host's identity, so the
connection switches to shm. Remote: the Python node takes another host identity, so the
bytes cross TCP (pinned), or travel as tickets the Python node pulls from a Rust owner.

The binary is ``$HANDOFF_BIN`` (else target/release, target/debug); the report records
``git describe`` of the checkout it was built in, or ``$HANDOFF_BIN_SOURCE`` if set.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    RTT_BYTES,
    common_args,
    log,
    parse_common,
    read_full,
    read_sample,
    round_trips_async,
    row,
    size_arg,
    versions,
    write_result,
)

REPO = Path(__file__).resolve().parents[2]

SEND_REQUEST = "handoff.demo.SendRequest"
PING = "handoff.bench.Ping"

RUST_CASES = {
    # case: (series, route, read, how)
    "shm-view": (
        "handoff Rust shm zero-copy",
        "same-host",
        "none",
        "Rust node to Rust node over the shm channel: a buffer written in place in shared memory, "
        "sent until the receiver holds the decoded zero-copy view",
    ),
    "shm-read": (
        "handoff Rust shm zero-copy",
        "same-host",
        "full",
        "as shm-view, then the receiver reads every byte of the view",
    ),
    "shm-copy-in": (
        "handoff Rust shm copy-in",
        "same-host",
        "none",
        "as shm-view, but the sender's buffer is an ordinary heap buffer, copied into a pooled segment at send",
    ),
    "tcp-read": (
        "handoff Rust tcp",
        "remote",
        "full",
        "Rust node to Rust node of another host identity over TCP, until the receiver has read every byte",
    ),
    "ticket-pull": (
        "handoff Rust ticket pull",
        "remote",
        "full",
        "the owner (a child process, another host identity) sent a ticket; time for the holder to "
        "redeem it: pull every byte over TCP and check the BLAKE3 digest",
    ),
    "ticket-3party": (
        "handoff Rust ticket 3rd party",
        "remote",
        "full",
        "the holder forwards the ticket to a third node, which redeems it from the owner",
    ),
}
RUST_RTT = {
    "tcp-rtt": ("handoff Rust tcp", "remote", "raw TCP (Rust, in-process)"),
    "shm-rtt": ("handoff Rust shm", "same-host", "raw Unix socket (Rust, in-process)"),
}


def find_bin() -> Path:
    if os.environ.get("HANDOFF_BIN"):
        return Path(os.environ["HANDOFF_BIN"])
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return p
    raise SystemExit("no handoff binary: run `cargo build --release -p handoff-cli` or set HANDOFF_BIN")


def run_bench(binary: Path, only: str, sizes: list, reps: int) -> list:
    cmd = [str(binary), "bench", "--json", "--only", only, "--reps", str(reps)]
    if sizes:
        cmd += ["--sizes", ",".join(size_arg(s) for s in sizes)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=dict(os.environ, HANDOFF_LOG="error"))
    return json.loads(out.stdout)


def rust_rows(binary: Path, sizes: list, reps, rtt_reps: int, result: dict) -> None:
    by_reps: dict = {}
    for n in sizes:
        by_reps.setdefault(reps(n), []).append(n)
    for case, (series, route, read, how) in RUST_CASES.items():
        for r, group in sorted(by_reps.items()):
            log(f"handoff bench --only {case} --sizes {','.join(size_arg(s) for s in group)} --reps {r}")
            try:
                cases = run_bench(binary, case, group, r)
            except subprocess.CalledProcessError as e:
                result["errors"].append(f"handoff bench --only {case}: {e.stderr.strip()[-500:]}")
                continue
            for c in cases:
                if c["case"] != case:
                    continue
                x = row(series, "handoff-rust", route, read, c["bytes"], c["ours_runs"], how)
                x["case"] = case
                x["baseline_runs"] = c["baseline_runs"]
                x["baseline"] = c["baseline"]
                x["baseline_how"] = (
                    "a raw TCP stream of the same bytes (Rust, in-process)"
                    if case.startswith("ticket")
                    else "memcpy of the same bytes between two warm buffers (Rust)"
                )
                result["transfers"].append(x)
    log("handoff bench --only rtt")
    for c in run_bench(binary, "rtt", [], rtt_reps):
        series, route, raw = RUST_RTT[c["case"]]
        x = row(
            series,
            "handoff-rust",
            route,
            None,
            None,
            c["ours_runs"],
            f"100-byte handoff.bench.Ping echoed "
            f"by a node of the same process over {c['channel']} (handoff bench {c['case']})",
        )
        x["case"] = c["case"]
        result["rtt"].append(x)
        result["rtt"].append(
            row(
                raw,
                "raw",
                route,
                None,
                None,
                c["baseline_runs"],
                f"the raw baseline of handoff bench {c['case']}: "
                "a 108-byte ping-pong between two tasks of one Rust process",
            )
        )


# --- the Python peer -----------------------------------------------------------------------


async def fetch(node, peer, n: int, id_: int) -> tuple:
    """One SendRequest → Payload: seconds until the Python node holds it, has read 64 bytes of
    it, has then read every byte (each minus the producer's ``prepare_seconds``)."""
    from handoff import as_numpy

    t0 = time.perf_counter()
    await peer.send(SEND_REQUEST, {"id": id_, "bytes": n})
    env = await node.recv(600)
    body = env.body
    data = body["data"]
    t1 = time.perf_counter()
    a = as_numpy(data)
    read_sample(a)
    t2 = time.perf_counter()
    read_full(a)
    t3 = time.perf_counter()
    prep = body["prepare_seconds"]
    kinds = sorted({f.kind for f in env.frames})
    assert len(a) == n, (len(a), n)
    del a, data, body
    env.release()
    return t1 - t0 - prep, t2 - t0 - prep, t3 - t0 - prep, kinds


async def floor_rows(rtt_reps: int, result: dict, suffix: str) -> None:
    """The asyncio floor of a 100-byte round trip between two Python processes, on a Unix
    socket pair and on loopback TCP: ``bench/python_rtt_floor.py``'s ``add_reader`` style
    (an event loop on both sides, readiness from ``add_reader``, ``recv`` and ``send``; the
    style that can also receive descriptors), measured in the same run as the Python peer's
    round trips it is the floor of."""
    sys.path.insert(0, str(REPO / "bench"))
    from python_rtt_floor import echo_add_reader, ping_add_reader, socket_pair

    for channel in ("unix", "tcp"):
        a, b = socket_pair(channel)
        pid = os.fork()
        if pid == 0:
            try:  # (the child never returns into the parent's code, whatever happens)
                a.close()
                asyncio.run(echo_add_reader(b))
            finally:
                os._exit(0)
        b.close()
        try:

            async def one(a=a) -> None:
                await ping_add_reader(a, 1)

            runs, batch = await round_trips_async(one, rtt_reps)
        finally:
            a.close()
            os.waitpid(pid, 0)
        result["rtt"].append(
            row(
                f"asyncio add_reader floor {channel}{suffix}",
                "raw",
                "same-host" if channel == "unix" else "remote",
                None,
                None,
                runs,
                f"100 bytes echoed between two Python processes on a {channel} socket pair: an event loop on "
                f"both sides, add_reader readiness, recv and send, no framing ({batch} round trips per "
                "repetition; bench/python_rtt_floor.py's add_reader style)",
            )
        )


async def python_rows(
    binary: Path, sizes: list, reps, rtt_reps: int, result: dict, pure: bool = False, engine: bool = False
) -> None:
    """The Python peer's rows: on the native path, with ``pure`` on the pure-Python one
    (this process and the worker run with ``HANDOFF_NATIVE=0``; the series end in
    " (pure Python)" and their system is ``handoff-python-pure``), or with ``engine`` on the
    Rust engine (``HANDOFF_ENGINE=1``: series end in " (engine)", system
    ``handoff-python-engine``). The asyncio floors of the round trips come first."""
    from handoff import Bin, Node

    system = "handoff-python-pure" if pure else "handoff-python-engine" if engine else "handoff-python"
    suffix = " (pure Python)" if pure else " (engine)" if engine else ""
    await floor_rows(rtt_reps, result, suffix)

    tmp = tempfile.TemporaryDirectory()
    secret_file = Path(tmp.name) / "secret"
    secret = os.urandom(16).hex()
    secret_file.write_text(secret)
    env = dict(os.environ, HANDOFF_LOG="error")
    children = []

    def start(cmd: list) -> dict:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)
        children.append(child)
        while True:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"{cmd[0]} exited before its ready line")
            if line.startswith("{") and json.loads(line).get("event") == "ready":
                return json.loads(line)

    try:
        rs = start([str(binary), "node", "--name", "bench-rs", "--secret-file", str(secret_file)])
        owner = start(
            [str(binary), "node", "--name", "bench-rs-owner", "--host-id", "bench-owner-host"]
            + ["--ticket-threshold", "65536", "--secret-file", str(secret_file)]
        )
        pyw = start([sys.executable, "-m", "handoff.worker", "--name", "bench-pyw", "--secret-file", str(secret_file)])
        local = Node("bench-py", secret=secret.encode(), host_id=rs["host_id"])
        remote = Node("bench-py-remote", secret=secret.encode(), host_id="bench-py-remote-host")
        async with local, remote:
            routes = [
                # (series, route, node, address, channel, sizes)
                ("handoff Python←Rust shm", "same-host", local, rs["listen"], "shm", sizes),
                ("handoff Python←Python shm", "same-host", local, pyw["listen"], "shm", sizes),
                ("handoff Python←Rust tcp", "remote", remote, rs["listen"], "tcp", sizes),
                ("handoff Python←Python tcp", "remote", remote, pyw["listen"], "tcp", sizes),
                (
                    "handoff Python←Rust ticket",
                    "remote",
                    remote,
                    owner["listen"],
                    "tcp",
                    [n for n in sizes if n >= 65536],
                ),
            ]
            id_ = 0
            for series, route, node, addr, channel, route_sizes in routes:
                peer = await node.connect(addr, channel=channel)
                assert peer.channel == channel, (series, peer.channel)
                producer = (
                    "Rust node (handoff node)" if "←Rust" in series else "Python worker (python -m handoff.worker)"
                )
                for n in route_sizes:
                    log(f"{series} {n}")
                    runs = []
                    kinds = set()
                    for rep in range(reps(n) + 1):
                        id_ += 1
                        *r, k = await fetch(node, peer, n, id_)
                        kinds.update(k)
                        if rep:
                            runs.append(r)
                    how = (
                        f"a Python node asks a {producer} for n bytes (SendRequest); time until it holds "
                        f"them as a numpy array (frames: {', '.join(sorted(kinds)) or 'none'}), minus the "
                        "producer's time to fill them"
                    )
                    if "ticket" in series:
                        how += "; the owner sends a ticket, the Python node redeems it eagerly (pull + BLAKE3 check)"
                    for i, read in ((1, "sample"), (2, "full")):
                        extra = " then reads 64 bytes" if read == "sample" else " then reads 64 bytes and every byte"
                        x = row(series + suffix, system, route, read, n, [r[i] for r in runs], how + ";" + extra)
                        x["frames"] = sorted(kinds)
                        result["transfers"].append(x)
                # Round trips on the same connection (not for the ticket owner: same as tcp).
                if "ticket" not in series:
                    seqs = iter(range(1, 1 << 62))
                    data = Bin(os.urandom(RTT_BYTES))

                    async def one(peer=peer, node=node, data=data, seqs=seqs) -> None:
                        await peer.send(PING, {"seq": next(seqs), "data": data})
                        env_ = await node.recv(30)
                        env_.release()

                    runs, batch = await round_trips_async(one, rtt_reps)
                    result["rtt"].append(
                        row(
                            series.replace("←", "↔") + suffix,
                            system,
                            route,
                            None,
                            None,
                            runs,
                            f"100-byte handoff.bench.Ping from a Python node, echoed by the {producer} over "
                            f"{channel} ({batch} round trips per repetition)",
                        )
                    )
                await peer.close()
    finally:
        for c in children:
            c.kill()
            c.wait()
        tmp.cleanup()


def python_peer_source() -> str:
    """Where ``import handoff`` finds the Python peer (the checkout's python/src, or another)."""
    try:
        import handoff
    except ImportError as e:
        return f"not importable: {e}"
    return str(Path(handoff.__file__).resolve().parents[1])


def main() -> int:
    p = common_args(__doc__.split("\n")[0])
    p.add_argument("--skip-rust", action="store_true", help="only the Python peer")
    p.add_argument("--skip-python", action="store_true", help="only the Rust benches")
    p.add_argument(
        "--pure", action="store_true", help="the Python peer's rows on its pure-Python path (needs HANDOFF_NATIVE=0)"
    )
    p.add_argument(
        "--engine", action="store_true", help="the Python peer's rows on the Rust engine (needs HANDOFF_ENGINE=1)"
    )
    args = p.parse_args()
    import handoff.native

    if args.pure and handoff.native.ENABLED:
        p.error("--pure needs HANDOFF_NATIVE=0 in the environment (the path is chosen per process)")
    if args.engine and os.environ.get("HANDOFF_ENGINE") != "1":
        p.error("--engine needs HANDOFF_ENGINE=1 in the environment (the worker's too)")
    sizes, reps = parse_common(args)
    binary = find_bin()
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    # The source the binary was built from: its checkout (target/<profile>/handoff), else this one.
    src = binary.resolve().parents[2] if binary.resolve().parent.parent.name == "target" else REPO
    described = subprocess.run(
        ["git", "-C", str(src), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    source = f"git {described}" if described else f"built in {src}, not a git checkout"
    source = os.environ.get("HANDOFF_BIN_SOURCE", source)  # where a binary built elsewhere came from
    result = {
        "system": "handoff-pure" if args.pure else "handoff-engine" if args.engine else "handoff",
        "versions": {
            "handoff (Rust)": f"{version} ({source})",
            "handoff (Python peer)": f"{versions(['handoff'])['handoff']} (from {python_peer_source()})",
            **versions(["msgpack", "blake3"]),
        },
        "transfers": [],
        "rtt": [],
        "notes": [],
        "errors": [],
    }
    if not args.skip_rust:
        rust_rows(binary, sizes, reps, args.rtt_reps, result)
    if not args.skip_python:
        result["notes"].append(f"the Python peer runs {handoff.native.REASON}")
        from handoff.node import engine_default

        result["notes"].append(
            "its handoff.Node runs on the Rust engine (handoff.engine_node)"
            if engine_default()
            else "its handoff.Node is the pure-Python reference, handoff_pure (HANDOFF_ENGINE=0 or HANDOFF_NATIVE=0)"
        )
        try:
            asyncio.run(python_rows(binary, sizes, reps, args.rtt_reps, result, pure=args.pure, engine=args.engine))
        except Exception as e:  # recorded, not hidden
            import traceback

            traceback.print_exc()
            result["errors"].append(f"handoff Python peer: {type(e).__name__}: {e}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

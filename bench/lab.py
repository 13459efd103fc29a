"""handoff between two hosts of a network-namespace lab, against a raw TCP stream between
the same two hosts in the same run.

Each case makes a lab (`scripts/netlab`) of two hosts with the link shaped as the case says,
then times, alternating, at every size:
- raw: a Python process on host 2 holds a warm buffer and answers an 8-byte request with
  n bytes over one TCP connection; a Python process on host 1 receives them into a warm
  buffer (`recv_into`), as `bench/peers`'s raw TCP row does;
- handoff: a Python node on host 1 asks a Rust `handoff node` on host 2 for n bytes
  (`handoff.demo.SendRequest`) over TCP, and is timed until it holds them (the producer's
  own preparation time subtracted, as in `bench/peers`).
The ratio is the raw time divided by handoff's: 1.0 means as fast as the raw stream.

The `delay` case puts the same link (10 Gbit/s) behind a TCP delay line (`delay-line`,
crates/handoff-testkit: this kernel has no netem) that holds every byte 0.5 ms in each
direction, and runs `handoff bench --remote` on host 1 against a Rust `handoff node` on
host 2, both through the line:
- `remote-rtt`: 100-byte messages there and back, against raw 100-byte echoes from the
  node's `--raw-listen` server; floor: at most 1.1x raw;
- `remote-ticket-pull`: redeeming a ticket of the node's, against a raw request for the same
  bytes; floor: at most one extra round trip over the raw request-response.
It also runs the same two cases on the link without the line (`via: direct`), for scale.

    sudo bench/lab.py [--cases rate,loss,delay] [--sizes 64M,256M] [--reps 5] [--json] [--out FILE]

Needs root (network namespaces) and a built `handoff` ($HANDOFF_BIN, else
target/release/handoff, else target/debug/handoff), and for `delay` the `delay-line` beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NETLAB = REPO / "scripts" / "netlab"
REQUEST = struct.Struct(">Q")
SECRET = b"lab bench secret"
DELAY_MS = 0.5
CASES = {
    "rate": {"what": "link shaped to 10 Gbit/s (htb)", "args": ["--rate", "10gbit"]},
    "loss": {
        "what": "link shaped to 10 Gbit/s, 0.1 % of packets dropped",
        "args": ["--rate", "10gbit", "--loss", "0.1"],
    },
    "delay": {
        "what": f"link shaped to 10 Gbit/s, behind a TCP delay line of {DELAY_MS} ms each way",
        "args": ["--rate", "10gbit"],
    },
}
RTT_FLOOR = 1.1  # remote-rtt: at most this many times raw
EXTRA_RTT_FLOOR = 1.0  # remote-ticket-pull: at most this many round trips over raw
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def find_bin() -> Path:
    if os.environ.get("HANDOFF_BIN"):
        return Path(os.environ["HANDOFF_BIN"])
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return p
    raise SystemExit("bench/lab.py: no handoff binary (set HANDOFF_BIN or cargo build --release -p handoff-cli)")


def find_delay_line() -> Path:
    p = find_bin().parent / "delay-line"
    if not p.exists():
        raise SystemExit(f"bench/lab.py: no {p} (cargo build -p handoff-testkit, same profile as handoff)")
    return p


# --- the raw far end (runs on host 2) ------------------------------------------------------


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def raw_server(max_bytes: int, host: str) -> None:
    data = memoryview(bytearray(b"\x5a" * max_bytes))
    listener = socket.create_server((host, 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            request = bytearray(8)
            while True:
                try:
                    recv_exact(conn, memoryview(request))
                except ConnectionError:
                    return
                (n,) = REQUEST.unpack(request)
                conn.sendall(data[:n])

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(listener.getsockname()[1], flush=True)
    sys.stdin.read()  # until the parent closes our stdin


# --- one case, inside host 1 ---------------------------------------------------------------


def in_host(lab: str, host: int, cmd: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", f"{lab}-h{host}", *cmd], **kw)


async def run_case(lab: str, sizes: list[int], reps: int) -> dict:
    from handoff import Node

    here, there = "10.77.0.1", "10.77.0.2"
    raw = in_host(
        lab, 2, [sys.executable, __file__, "--raw-server", str(max(sizes)), "--host", there],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    secret = Path(f"/tmp/{lab}-secret")
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    rust = in_host(
        lab, 2, [str(find_bin()), "node", "--name", "producer", "--listen", f"{there}:0", "--secret-file", str(secret)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=os.environ | {"HANDOFF_LOG": "warn"},
    )  # fmt: skip
    try:
        port = int(raw.stdout.readline())
        ready = json.loads(rust.stdout.readline())
        sock = socket.create_connection((there, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sink = memoryview(bytearray(max(sizes)))
        rows = []
        async with Node("consumer", secret=SECRET, listen=f"{here}:0") as node:
            peer = await node.connect(ready["listen"])
            assert peer.channel == "tcp", peer.channel
            seq = 0
            for n in sizes:
                raw_runs, ours_runs = [], []
                for rep in range(reps + 1):  # the first of each is a warm-up
                    t = time.perf_counter()
                    sock.sendall(REQUEST.pack(n))
                    recv_exact(sock, sink[:n])
                    raw_time = time.perf_counter() - t
                    seq += 1
                    t = time.perf_counter()
                    await peer.send("handoff.demo.SendRequest", {"id": seq, "bytes": n})
                    env = await node.recv(600)
                    ours = time.perf_counter() - t - env.body["prepare_seconds"]
                    assert len(env.body["data"]) == n
                    env.release()
                    if rep:
                        raw_runs.append(raw_time)
                        ours_runs.append(ours)
                raw_med, ours_med = sorted(raw_runs)[len(raw_runs) // 2], sorted(ours_runs)[len(ours_runs) // 2]
                rows.append(
                    {
                        "bytes": n,
                        "raw_runs": raw_runs,
                        "handoff_runs": ours_runs,
                        "raw_median": raw_med,
                        "handoff_median": ours_med,
                        "ratio": raw_med / ours_med,
                    }
                )
        sock.close()
        return {"rows": rows}
    finally:
        raw.stdin.close()
        for p in (raw, rust):
            p.terminate()
            p.wait(10)
        secret.unlink(missing_ok=True)


# --- the delay case: handoff bench --remote on host 1, against a node on host 2 ---------------


def first_line(proc: subprocess.Popen, what: str) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} exited before it said where it listens")
    return json.loads(line)


def run_delay_case(lab: str, sizes: list[int], reps: int) -> list[dict]:
    """`handoff bench --remote` from host 1, through the delay line and directly."""
    there = "10.77.0.2"
    secret = Path(f"/tmp/{lab}-secret")
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    env = os.environ | {"HANDOFF_LOG": "warn"}
    far = in_host(
        lab, 2, [str(find_bin()), "node", "--name", "lab-far", "--listen", f"{there}:0", "--raw-listen", f"{there}:0",
                 "--ticket-threshold", "65536", "--secret-file", str(secret)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    line = None
    try:
        ready = first_line(far, "handoff node")
        node_addr = ready["listen"].removeprefix("tcp://")
        line = in_host(
            lab, 2, [str(find_delay_line()), "--delay-ms", str(DELAY_MS),
                     "--forward", f"{there}:0={node_addr}", "--forward", f"{there}:0={ready['raw_listen']}"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        forwards = first_line(line, "delay-line")["forwards"]
        rows = []
        for via, node, raw in (
            ("delay-line", forwards[0]["listen"], forwards[1]["listen"]),
            ("direct", node_addr, ready["raw_listen"]),
        ):
            bench = subprocess.run(
                ["ip", "netns", "exec", f"{lab}-h1", str(find_bin()), "bench", "--only", "remote", "--json",
                 "--remote", f"tcp://{node}", "--raw-remote", raw, "--secret-file", str(secret),
                 "--sizes", ",".join(str(n) for n in sizes), "--reps", str(reps)],
                capture_output=True, text=True, env=env, timeout=1800,
            )  # fmt: skip
            if bench.returncode != 0:
                raise RuntimeError(f"handoff bench --remote ({via}) failed: {bench.stderr[-2000:]}")
            for row in json.loads(bench.stdout):
                row["via"] = via
                if via != "delay-line":
                    pass  # the floors are the delay line's; direct rows are for scale
                elif row["case"] == "remote-rtt":
                    row["floor"] = f"<= {RTT_FLOOR}x raw"
                    row["holds"] = row["ours"] <= RTT_FLOOR * row["baseline"]
                else:
                    row["floor"] = f"<= {EXTRA_RTT_FLOOR} extra round trip"
                    row["holds"] = row["extra_round_trips"] <= EXTRA_RTT_FLOOR
                rows.append(row)
        return rows
    finally:
        for p in (line, far):
            if p is not None:
                p.terminate()
                p.wait(10)
        secret.unlink(missing_ok=True)


# --- the outer run ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--sizes", default="64M,256M")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", help="also write the JSON result to this file")
    parser.add_argument("--raw-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_server:
        raw_server(args.raw_server, args.host)
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1 or args.reps < 1:
        parser.error("--sizes needs sizes of at least 1 byte, --reps at least 1")
    if args.inside:
        print(json.dumps(asyncio.run(run_case(args.inside, sizes, args.reps))))
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    check = subprocess.run([sys.executable, str(NETLAB), "check"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"bench/lab.py: cannot make a lab here: {check.stdout.strip()}", file=sys.stderr)
        return 2
    result = {"bench": "lab", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}
    for case in cases:
        lab = f"bl{os.getpid() % 100000}"
        up = [sys.executable, str(NETLAB), "up", "--lab", lab, "--hosts", "2", *CASES[case]["args"], "--json"]
        made = subprocess.run(up, capture_output=True, text=True)
        if made.returncode != 0:
            print(f"bench/lab.py: {case}: {made.stderr.strip()}", file=sys.stderr)
            return 2
        try:
            shaping = json.loads(made.stdout)["shaping"]
            print(f"== {case}: {CASES[case]['what']} ({shaping['how']})", file=sys.stderr, flush=True)
            if case == "delay" and find_bin().parent.name == "debug":
                print("   (a debug build: the floors below are judged for a release build)", file=sys.stderr)
            if case == "delay":
                try:
                    rows = run_delay_case(lab, sizes, args.reps)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"bench/lab.py: delay failed: {e}", file=sys.stderr)
                    return 1
                result["cases"].append({"case": case, "what": CASES[case]["what"], "shaping": shaping, "rows": rows})
                continue
            inner = subprocess.run(
                ["ip", "netns", "exec", f"{lab}-h1", sys.executable, __file__, "--inside", lab]
                + ["--sizes", args.sizes, "--reps", str(args.reps)],
                capture_output=True, text=True,
            )  # fmt: skip
            if inner.returncode != 0:
                print(f"bench/lab.py: {case} failed:\n{inner.stderr[-3000:]}", file=sys.stderr)
                return 1
            rows = json.loads(inner.stdout)["rows"]
        finally:
            subprocess.run([sys.executable, str(NETLAB), "down", "--lab", lab], capture_output=True)
        result["cases"].append({"case": case, "what": CASES[case]["what"], "shaping": shaping, "rows": rows})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'case':6} {'size':>9} {'raw TCP':>10} {'handoff':>10} {'ratio':>6}")
        for case in result["cases"]:
            for r in case["rows"]:
                if case["case"] == "delay":
                    print(delay_row(r))
                    continue
                size = f"{r['bytes'] >> 20} MiB"
                raw_ms, ours_ms = r["raw_median"] * 1e3, r["handoff_median"] * 1e3
                print(f"{case['case']:6} {size:>9} {raw_ms:8.1f} ms {ours_ms:8.1f} ms {r['ratio']:6.2f}")
    return 0


def delay_row(r: dict) -> str:
    """One line of the delay case: the bench row, its floor and whether it holds."""
    size = f"{r['bytes']} B" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20} MiB"
    unit, scale = ("us", 1e6) if r["bytes"] < 1 << 20 else ("ms", 1e3)
    line = (
        f"delay  {size:>9} {r['baseline'] * scale:8.1f} {unit} {r['ours'] * scale:8.1f} {unit} "
        f"{r['efficiency']:6.2f}  {r['case']} via {r['via']}"
    )
    if "extra_round_trips" in r:
        line += f", {r['extra_round_trips']:+.2f} round trips of {r['round_trip'] * 1e6:.0f} us"
    if r["via"] == "delay-line":
        line += f"; floor {r['floor']}: {'holds' if r['holds'] else 'DOES NOT HOLD'}"
    return line


if __name__ == "__main__":
    sys.exit(main())

"""The raw limits, measured in the same run as the systems: memcpy, a TCP stream and a
Unix-socket stream between two processes, and 100-byte ping-pongs over both sockets.

The far end is a child process (this script with ``--serve``) holding a warm buffer of
the largest size; the consumer (this process) asks for ``n`` bytes with an 8-byte
request and receives them into its own warm buffer. Times run from the request to the
last byte received (so they include the request's one-way latency, as handoff's Python
rows do). Nothing is subtracted.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from common import RTT_BYTES, common_args, log, parse_common, read_full, round_trips, row, versions, write_result

REQ = struct.Struct(">Q")


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


# --- the far end -------------------------------------------------------------------------


def serve_conn(conn: socket.socket, data: memoryview) -> None:
    with conn:
        mode = conn.recv(1)
        if mode == b"S":  # stream: 8-byte size, answered with that many bytes
            req = bytearray(8)
            while True:
                try:
                    recv_exact(conn, memoryview(req))
                except ConnectionError:
                    return
                (n,) = REQ.unpack(req)
                conn.sendall(data[:n])
        elif mode == b"E":  # echo of fixed 100-byte records
            buf = bytearray(RTT_BYTES)
            while True:
                try:
                    recv_exact(conn, memoryview(buf))
                except ConnectionError:
                    return
                conn.sendall(buf)


def accept_loop(lsock: socket.socket, data: memoryview) -> None:
    while True:
        conn, _ = lsock.accept()
        if conn.family == socket.AF_INET:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve_conn, args=(conn, data), daemon=True).start()


def serve(max_bytes: int, unix_path: str) -> None:
    data = memoryview(np.full(max_bytes, 0x5A, dtype=np.uint8)).cast("B")
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(unix_path)
    uds.listen()
    for ls in (tcp, uds):
        threading.Thread(target=accept_loop, args=(ls, data), daemon=True).start()
    print(tcp.getsockname()[1], flush=True)
    sys.stdin.read()  # until the parent closes our stdin


# --- the consumer ------------------------------------------------------------------------


def connect(kind: str, port: int, unix_path: str, mode: bytes) -> socket.socket:
    if kind == "tcp":
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(unix_path)
    s.sendall(mode)
    return s


def stream_runs(s: socket.socket, dst: memoryview, n: int, reps: int, full_read: bool = False) -> list:
    """Times of ``reps`` requests for ``n`` bytes received into ``dst`` (after one warm-up);
    with ``full_read``, each time also covers reading every received byte once
    (``read_full``, as handoff's "full read" rows do)."""
    view = dst[:n]
    runs = []
    for rep in range(reps + 1):
        t = time.perf_counter()
        s.sendall(REQ.pack(n))
        recv_exact(s, view)
        if full_read:
            read_full(view)
        dt = time.perf_counter() - t
        if rep:
            runs.append(dt)
    return runs


def memcpy_runs(src: np.ndarray, dst: np.ndarray, n: int, reps: int) -> list:
    batch = max(1, (16 << 20) // n)
    s, d = src[:n], dst[:n]
    np.copyto(d, s)
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            np.copyto(d, s)
        runs.append((time.perf_counter() - t) / batch)
    return runs


def main() -> int:
    p = common_args(__doc__.split("\n")[0])
    p.add_argument("--serve", type=int, default=None, help=argparse_hidden())
    p.add_argument("--unix", default=None, help=argparse_hidden())
    if "--serve" in sys.argv:
        a, _ = p.parse_known_args()
        serve(a.serve, a.unix)
        return 0
    args = p.parse_args()
    sizes, reps = parse_common(args)
    top = max(sizes)
    result = {"system": "raw", "versions": versions(["numpy"]), "transfers": [], "rtt": [], "notes": [], "errors": []}
    with tempfile.TemporaryDirectory() as tmp:
        unix_path = os.path.join(tmp, "raw.sock")
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(top), "--unix", unix_path, "--sizes", "1", "--out", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(child.stdout.readline())
            src = np.full(top, 0x5A, dtype=np.uint8)
            dst = np.zeros(top, dtype=np.uint8)
            dst[:] = 1  # warm: every page faulted in
            socks = {k: connect(k, port, unix_path, b"S") for k in ("tcp", "unix")}
            for n in sizes:
                log(f"raw {n}")
                result["transfers"].append(
                    row(
                        "raw memcpy",
                        "raw",
                        "same-host",
                        "copy",
                        n,
                        memcpy_runs(src, dst, n, reps(n)),
                        "numpy.copyto between two warm buffers of this process (one memcpy)",
                    )
                )
                for kind, route, label in (("unix", "same-host", "raw Unix socket"), ("tcp", "remote", "raw TCP")):
                    how = (
                        f"{'Unix stream socket' if kind == 'unix' else 'loopback TCP'} between two Python "
                        "processes: an 8-byte request, then n bytes from the far end's warm buffer "
                        "received into a warm buffer (recv_into)"
                    )
                    # "copy": the bytes have landed (as handoff's sampled rows); "full": and
                    # every byte was read once (as its full-read rows), so each is compared
                    # with the raw row that did the same work.
                    for read, full, extra in (("copy", False, ""), ("full", True, ", then every byte read once")):
                        runs = stream_runs(socks[kind], memoryview(dst).cast("B"), n, reps(n), full_read=full)
                        result["transfers"].append(row(label, "raw", route, read, n, runs, how + extra))
            for s in socks.values():
                s.close()
            for kind, label in (("unix", "raw Unix socket"), ("tcp", "raw TCP")):
                s = connect(kind, port, unix_path, b"E")
                msg = bytearray(os.urandom(RTT_BYTES))
                view = memoryview(msg)

                def one(s=s, msg=msg, view=view) -> None:
                    s.sendall(msg)
                    recv_exact(s, view)

                runs, batch = round_trips(one, args.rtt_reps)
                result["rtt"].append(
                    row(
                        label,
                        "raw",
                        "same-host" if kind == "unix" else "remote",
                        None,
                        None,
                        runs,
                        f"100-byte ping-pong between two Python processes ({batch} round trips per repetition)",
                    )
                )
                s.close()
        finally:
            child.stdin.close()
            child.wait(timeout=30)
    write_result(args.out, result)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())

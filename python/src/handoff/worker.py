"""``python -m handoff.worker``: a Python node that serves the demo protocol (spec Appendix A).

Same options as ``handoff node`` (``--name``, ``--listen``, ``--host-id``,
``--secret-file``, ``--connect`` …) and the same ready line on standard output,
printed once its ``--connect`` connections are up (same-host ones switched to shm)::

    {"event": "ready", "name": "py-a", "listen": "tcp://127.0.0.1:40123", "host_id": "…", "pid": 1234}

It answers ``handoff.demo.Payload`` (verifies the BLAKE3 digest, answers ``Receipt``),
``handoff.demo.SendRequest`` (answers a ``Payload``; ``data`` in shared memory when the
asker is reached over shm), ``handoff.bench.Ping`` (echo), ``handoff.bench.Blob``,
``handoff.demo.Hold`` / ``Release`` / ``Forward`` (answers ``Held``),
``handoff.demo.BlobWork`` (reads the data handle — from a local file given with
``--dataset UUID=PATH``, else from the sender — and answers ``BlobReceipt`` with the path
the bytes took) and ``handoff.admin.StatsRequest`` (answers ``Stats``). Logs go to
standard error (``HANDOFF_LOG=info|debug|warn``, default warn).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import blake3

from .codec import Bin, Buffer
from .data import BlobHandle, FileDataset, dataset_key
from .envelope import Envelope
from .node import Node
from .peer import Peer
from .shm import ShmBuffer
from .tickets import digest

log = logging.getLogger("handoff.worker")

PAYLOAD = "handoff.demo.Payload"
RECEIPT = "handoff.demo.Receipt"
SEND_REQUEST = "handoff.demo.SendRequest"
PING = "handoff.bench.Ping"
BLOB = "handoff.bench.Blob"
HOLD = "handoff.demo.Hold"
HELD = "handoff.demo.Held"
RELEASE = "handoff.demo.Release"
FORWARD = "handoff.demo.Forward"
STATS_REQUEST = "handoff.admin.StatsRequest"
STATS = "handoff.admin.Stats"
REPORT = "handoff.chaos.Report"
BLOB_WORK = "handoff.demo.BlobWork"
BLOB_RECEIPT = "handoff.demo.BlobReceipt"

#: The types this worker accepts (others are refused with ``unknown-type``).
TYPES = (
    PAYLOAD,
    RECEIPT,
    SEND_REQUEST,
    PING,
    BLOB,
    HOLD,
    HELD,
    RELEASE,
    FORWARD,
    STATS_REQUEST,
    STATS,
    REPORT,
    BLOB_WORK,
    BLOB_RECEIPT,
)


def read_secret(path: str) -> bytes:
    """A secret file's bytes; a trailing newline is not part of the secret."""
    data = Path(path).read_bytes().rstrip(b"\r\n")
    if not data:
        raise SystemExit(f"error: the secret file {path} is empty")
    return data


def fill_pattern(view: memoryview, seed: int) -> None:
    """Fills ``view`` with deterministic bytes (a 1 MiB BLAKE3 XOF block, repeated)."""
    n = len(view)
    block = blake3.blake3(seed.to_bytes(8, "little")).digest(length=min(n, 1 << 20))
    for off in range(0, n, len(block)):
        m = min(len(block), n - off)
        view[off : off + m] = block[:m]


def make_payload(id_: int, size: int, shared: bool) -> dict:
    """A ``Payload`` of ``size`` bytes; in a fresh shared segment, filled in place, if ``shared``."""
    started = time.perf_counter()
    if shared and size > 0:
        buf = ShmBuffer(size)
        fill_pattern(buf.view, id_)
        dg = digest(buf.view)
        data: Any = buf.freeze()
    else:
        data = bytearray(size)
        fill_pattern(memoryview(data), id_)
        dg = digest(data)
    return {"id": id_, "digest": Buffer(dg), "data": Buffer(data), "prepare_seconds": time.perf_counter() - started}


def blob_receipt(id_: int, path: str, detail: Optional[str], bytes_: int = 0, verified: bool = False, seconds=0.0):
    """A ``handoff.demo.BlobReceipt`` (spec Appendix A): ``path`` an origin of §8.5, or ``failed``."""
    return {
        "id": id_,
        "bytes": bytes_,
        "verified": verified,
        "path": path,
        "detail": detail,
        "read_seconds": seconds,
    }


async def read_blob_work(work: dict) -> dict:
    """Reads a ``BlobWork``'s handle and checks the digest (as the reference's ``read_blob_work``)."""
    started = time.perf_counter()
    handle = work["blob"]
    if not isinstance(handle, BlobHandle):
        return blob_receipt(work["id"], "failed", "the blob field is not a data handle")
    try:
        data = await handle.read_all()
    except Exception as e:
        return blob_receipt(work["id"], "failed", str(e), seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    verified = digest(data) == bytes(work["digest"])
    return blob_receipt(
        work["id"], handle.last_origin or "unknown", handle.fallback_reason, len(data), verified, seconds
    )


class Worker:
    def __init__(self, node: Node):
        self.node = node
        self.held: dict = {}  # id -> Envelope keeping the bytes
        self.forwarded: dict = {}  # id -> asker Peer
        self.tasks: set = set()

    async def blob_work(self, sender: Peer, env: Envelope) -> None:
        # Read on a task of its own: a download must not hold up other messages. A handle this
        # node can neither bind nor pull fails to decode: say so, keep serving.
        try:
            work = env.body
        except Exception as e:
            await sender.send(BLOB_RECEIPT, blob_receipt(0, "failed", str(e)))
            return

        async def read() -> None:
            receipt = await read_blob_work(work)
            try:
                await sender.send(BLOB_RECEIPT, receipt)
            except Exception as e:
                log.warning("cannot send a blob receipt to %s: %s", sender.name, e)
            finally:
                if isinstance(work["blob"], BlobHandle):
                    work["blob"].release()  # the sender can free its bytes now

        task = asyncio.ensure_future(read())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self) -> None:
        while True:
            env = await self.node.recv()
            try:
                await self.handle(env)
            except Exception as e:
                log.warning("%s from %s: %s", env.type_name, env.sender.name, e)

    async def handle(self, env: Envelope) -> None:
        t, sender = env.type_name, env.sender
        if t == PAYLOAD:
            with env:
                b = env.body
                started = time.perf_counter()
                verified = digest(b["data"]) == bytes(b["digest"])
                seconds = time.perf_counter() - started
                receipt = {"id": b["id"], "bytes": len(b["data"]), "verified": verified, "verify_seconds": seconds}
                del b
            await sender.send(RECEIPT, receipt)
        elif t == SEND_REQUEST:
            b = env.body
            env.release()
            payload = make_payload(b["id"], b["bytes"], shared=sender.channel == "shm")
            await sender.send(PAYLOAD, payload)
        elif t == PING:
            b = env.body
            await sender.send(PING, {"seq": b["seq"], "data": Bin(b["data"])})
            env.release()
        elif t == BLOB:
            seq = env.body["seq"]
            env.release()
            await sender.send(PING, {"seq": seq, "data": Bin()})
        elif t == HOLD:
            b = env.body
            data = b["data"]
            answer = {
                "id": b["id"],
                "holder": self.node.name,
                "bytes": len(data),
                "segment": env.segment_of(data),
            }
            old = self.held.pop(b["id"], None)
            if old is not None:
                old.release()
            self.held[b["id"]] = env
            del b, data
            await sender.send(HELD, answer)
        elif t == RELEASE:
            rid = env.body["id"]
            dropped = self.held.pop(rid, None)
            size = len(dropped.body["data"]) if dropped is not None else 0
            if dropped is not None:
                dropped.release()
            await sender.send(HELD, {"id": rid, "holder": self.node.name, "bytes": size, "segment": None})
        elif t == FORWARD:
            b = env.body
            nxt: Optional[Peer] = self.node.peer(b["to"])
            if nxt is None:
                log.warning("cannot forward %s: no peer named %r", b["id"], b["to"])
                return
            self.forwarded[b["id"]] = sender
            await nxt.send(HOLD, {"id": b["id"], "data": Buffer(b["data"])})
            env.release()
        elif t == HELD:
            b = env.body
            asker = self.forwarded.pop(b["id"], None)
            if asker is not None:
                await asker.send(HELD, b)
        elif t == BLOB_WORK:
            await self.blob_work(sender, env)
        elif t == STATS_REQUEST:
            await sender.send(STATS, self.node.stats())
        else:
            log.info("%s from %s: nothing to do", t, sender.name)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m handoff.worker", description="A Python handoff node serving the demo protocol."
    )
    p.add_argument("--name", required=True, help="the node's name")
    p.add_argument("--listen", default="127.0.0.1:0", help="TCP address to listen on (default 127.0.0.1:0)")
    p.add_argument("--host-id", default=None, help="host identity (default: from the kernel's machine and boot ids)")
    p.add_argument("--secret-file", default=None, help="file holding the cluster secret (trailing newline ignored)")
    p.add_argument("--connect", action="append", default=[], help="peer to connect to at start (repeatable)")
    p.add_argument("--redeem", choices=("eager", "lazy"), default="eager", help="when received tickets are redeemed")
    p.add_argument(
        "--ticket-threshold",
        type=int,
        default=None,
        help="send buffers of at least this many bytes to TCP peers as tickets",
    )
    p.add_argument("--lease-ttl-ms", type=int, default=30_000, help="how long a ticket hold lasts without renewal")
    p.add_argument("--pull-timeout-ms", type=int, default=30_000, help="how long a pull may wait for the owner")
    p.add_argument("--no-shm", action="store_true", help="no Unix socket, no shared memory")
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="UUID=PATH",
        help="a dataset this node reads itself: data handles for UUID bind to the file or directory PATH (repeatable)",
    )
    args = p.parse_args(argv)
    for d in args.dataset:
        if "=" not in d:
            p.error(f"--dataset wants UUID=PATH, got {d!r}")
    return args


async def run(args: argparse.Namespace) -> None:
    secret = read_secret(args.secret_file) if args.secret_file else b""
    node = Node(
        args.name,
        host_id=args.host_id,
        secret=secret,
        listen=args.listen,
        shm=not args.no_shm,
        types=TYPES,
        redeem=args.redeem,
        ticket_threshold=args.ticket_threshold,
        lease_ttl=args.lease_ttl_ms / 1000,
        pull_timeout=args.pull_timeout_ms / 1000,
    )
    for d in args.dataset:
        uuid, path = d.split("=", 1)
        node.resources.insert(dataset_key(uuid), FileDataset(path))
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for addr in args.connect:
            peer = await node.connect(addr)
            log.info("connected to %s (%s, %s)", peer.name, peer.locality, peer.channel)
        print(
            json.dumps(
                {
                    "event": "ready",
                    "name": node.name,
                    "listen": node.listen_addr,
                    "host_id": node.host_id,
                    "pid": os.getpid(),
                }
            ),
            flush=True,
        )
        serving = asyncio.ensure_future(Worker(node).serve())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for f in (serving, stopping):
            f.cancel()
        if serving.done() and not serving.cancelled() and serving.exception():
            raise serving.exception()
    finally:
        await node.close()


def main(argv=None) -> int:
    level = os.environ.get("HANDOFF_LOG", "warn").split(",")[0].strip().lower()
    level = {
        "warn": "WARNING",
        "warning": "WARNING",
        "error": "ERROR",
        "info": "INFO",
        "debug": "DEBUG",
        "trace": "DEBUG",
    }.get(level, "WARNING")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        pass
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

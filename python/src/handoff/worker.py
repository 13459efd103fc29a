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

No peer can take it down (spec §9.1, Appendix A). What one peer's requests can make it
do is bounded, each bound a flag (``--help`` lists them with their defaults):

- the node's bounds (:class:`handoff.bounds.Bounds`): ``--max-buffered-bytes-per-peer``
  (1 GiB) and ``--max-buffered-bytes`` (4 GiB) of messages read and not yet handled,
  beyond which it stops reading; ``--max-handshakes`` (256), ``--max-connections``
  (1024), ``--handshake-timeout`` (10 s), ``--progress-timeout`` (30 s of silence inside
  a message), ``--write-timeout`` (120 s without progress writing to a peer),
  ``--lease-wait`` (30 s), ``--max-shm-bytes-per-peer`` (8 GiB),
  ``--max-shm-leases-per-peer`` (65 536), ``--max-ticket-bytes`` (16 GiB),
  ``--max-ticket-bytes-per-peer`` (8 GiB);
- the demo protocol's (:class:`WorkerBounds`): ``--max-request-bytes`` (1 GiB per
  ``SendRequest``; larger ones get a warning and no answer), ``--max-preparing-bytes``
  (2 GiB of payloads prepared or being sent at once), ``--max-held`` (1024) and
  ``--max-held-bytes`` (4 GiB) kept by ``Hold`` for one peer (beyond: ``Held`` of 0
  bytes, not kept), ``--max-relays`` (1024 ``Forward`` relays waiting), and
  ``--answer-queue`` (64): answers to each peer go out in order through a queue of
  their own, so a peer that does not read fills only its own queue, whose further
  answers are dropped with a warning until it drains.

A body that does not decode, or any request that fails, is logged (at most 10
warnings per peer per 10 s, then a count) and the worker keeps serving. ``--delay``
makes it wait before handling each message, as a slow application would (for tests).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import blake3

from . import demo_types
from .bounds import Bounds
from .codec import Bin, Buffer
from .data import BlobHandle, FileDataset, dataset_key
from .envelope import Envelope
from .node import Node
from .peer import Peer
from .shm import ShmBuffer
from .throttle import WarningThrottle
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
    """A ``Payload`` of ``size`` bytes; in a segment of the process's pool, filled in place,
    if ``shared`` (as the Rust node's ``SharedBufMut``)."""
    started = time.perf_counter()
    if shared and size > 0:
        buf = ShmBuffer(size, pooled=True)
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


@dataclass(frozen=True)
class WorkerBounds:
    """What requests of the demo protocol can make the worker do (spec Appendix A)."""

    #: Most bytes one ``SendRequest`` may ask for (larger: refused with a warning, no answer).
    max_request_bytes: int = 1 << 30
    #: Most bytes of payloads being prepared or sent at once, all peers together.
    max_preparing_bytes: int = 2 << 30
    #: Most holds (``Hold``) kept for one peer, and the bytes they keep.
    max_held: int = 1024
    max_held_bytes: int = 4 << 30
    #: Most ``Forward`` relays waiting for their ``Held`` answer.
    max_relays: int = 1024
    #: Most answers queued for one peer, and the bytes they keep (one alone may be larger).
    answer_queue: int = 64
    answer_queue_bytes: int = 1 << 30
    #: Seconds to wait before handling each message: a slow application, for tests.
    delay: float = 0.0


class _Credit:
    """Bytes of payloads being prepared or sent at once (one request alone may be larger)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._room = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._room:
            await self._room.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    async def release(self, n: int) -> None:
        async with self._room:
            self.used -= n
            self._room.notify_all()


class _Releasing:
    """Releases several things at once (an envelope and the data handle taken from it)."""

    def __init__(self, *things: Any):
        self.things = [t for t in things if hasattr(t, "release")]

    def release(self) -> None:
        for t in self.things:
            t.release()


class Session:
    """What the worker keeps for one connected peer: its queue of answers (sent in order
    by one task, so that a peer that reads nothing fills only its own queue) and its holds."""

    def __init__(self, worker: "Worker", peer: Peer):
        self.worker = worker
        self.peer = peer
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued_bytes = 0
        self.held: set = set()  # ids of the worker's holds that this peer asked for
        self.held_bytes = 0
        self.running = False  # a job taken from the queue is being sent
        self.task = asyncio.ensure_future(self._run())

    def put(self, what: str, job, nbytes: int = 0, keep: Any = None) -> bool:
        """Queues ``job`` (a coroutine function that sends one answer); drops it, with a
        warning, when the peer's queue is full. ``keep`` (anything with ``release()``: the
        envelope whose bytes the answer uses) is released when the job is done or dropped."""
        b = self.worker.bounds
        full = self.queue.qsize() >= b.answer_queue or (
            self.queue.qsize() and self.queued_bytes + nbytes > b.answer_queue_bytes
        )
        if full or self.peer.closed:
            self.worker.warn(
                self.peer,
                "dropping the answer to %s from %s: %s",
                what,
                self.peer.name,
                "its connection is closed"
                if self.peer.closed
                else f"{self.queue.qsize()} answers ({self.queued_bytes} bytes) wait for it to read",
            )
            if keep is not None:
                keep.release()
            return False
        self.queued_bytes += nbytes
        self.queue.put_nowait((what, job, nbytes, keep))
        return True

    def idle(self) -> bool:
        """Whether no answer of this peer's is queued or being sent."""
        return not self.running and self.queue.empty()

    async def _run(self) -> None:
        while True:
            what, job, nbytes, keep = await self.queue.get()
            self.running = True
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.worker.warn(self.peer, "cannot answer %s from %s: %s", what, self.peer.name, e)
            finally:
                self.running = False
                self.queued_bytes -= nbytes
                if keep is not None:
                    keep.release()

    def close(self) -> None:
        self.task.cancel()
        while not self.queue.empty():
            _, _, _, keep = self.queue.get_nowait()
            if keep is not None:
                keep.release()
        for id_ in list(self.held):
            self.worker.drop_hold(id_)


class _Gone:
    """The session of a peer whose connection is closed: answers to it are dropped."""

    held: frozenset = frozenset()
    held_bytes = 0

    def idle(self) -> bool:
        return False

    def put(self, what: str, job, nbytes: int = 0, keep: Any = None) -> bool:
        if keep is not None:
            keep.release()
        return False


_GONE = _Gone()


class Worker:
    def __init__(self, node: Node, bounds: WorkerBounds = WorkerBounds()):
        self.node = node
        self.bounds = bounds
        self.sessions: dict = {}  # Peer -> Session
        #: id -> (Envelope keeping the bytes, bytes, Session of the peer that asked). Any
        #: peer may release an id; each hold counts against the peer that asked for it.
        self.held: dict = {}
        self.forwarded: dict = {}  # id -> (asker Peer, Peer asked to hold)
        self.preparing = _Credit(bounds.max_preparing_bytes)
        self._throttle = WarningThrottle(
            log, node.bounds.warnings_per_period, node.bounds.warning_period, prefix=f"{node.name}: "
        )

    def warn(self, peer: Peer, fmt: str, *args: Any) -> None:
        self._throttle.warn(f"peer {peer.name}", fmt, *args)

    def session(self, peer: Peer) -> "Session | _Gone":
        s = self.sessions.get(peer)
        if s is None and peer.closed:
            return _GONE  # its messages still in the inbox get no answer, and no new session
        if s is None:
            s = self.sessions[peer] = Session(self, peer)
            asyncio.ensure_future(peer.done.wait()).add_done_callback(lambda _: self._gone(peer))
        return s

    def _gone(self, peer: Peer) -> None:
        """A peer's connection closed: its queue, holds and relays go with it."""
        s = self.sessions.pop(peer, None)
        if s is not None:
            s.close()
        for id_, (asker, nxt) in list(self.forwarded.items()):
            if asker is peer or nxt is peer:
                del self.forwarded[id_]

    def answer(self, peer: Peer, what: str, type_name: str, body: Any, nbytes: int = 0, keep=None) -> None:
        if peer.closed:
            # Its connection is gone (its queue and holds went with it): nothing to answer.
            if keep is not None:
                keep.release()
            return
        s = self.session(peer)
        if s.idle() and peer.send_now(type_name, body):
            # Nothing of this peer's waits before it: sent now, in order, a loop turn sooner.
            if keep is not None:
                keep.release()
            return
        s.put(what, lambda: peer.send(type_name, body), nbytes, keep)

    async def serve(self) -> None:
        while True:
            env = await self.node.recv()
            if self.bounds.delay:
                await asyncio.sleep(self.bounds.delay)
            try:
                self.handle(env)
            except Exception as e:  # a body that does not decode, a bug: log it and keep serving
                self.warn(env.sender, "%s from %s: %s", env.type_name, env.sender.name, e)
                env.release()
            # Let the answer queues drain between messages: a peer that pipelines requests
            # and reads its answers must not see its queue fill up. With no message waiting,
            # recv() yields anyway: a yield here would only cost a turn of the loop.
            if self.node.has_messages():
                await asyncio.sleep(0)

    def send_request(self, sender: Peer, b: dict) -> None:
        n = b["bytes"]
        if type(n) is not int or n < 0:
            raise ValueError(f"bytes must be a non-negative integer, got {n!r}")
        limit = self.bounds.max_request_bytes
        if n > limit:
            self.warn(
                sender,
                "refusing SendRequest %s from %s: %d bytes asked, the most is %d (--max-request-bytes)",
                b["id"],
                sender.name,
                n,
                limit,
            )
            return
        id_, shared = b["id"], sender.channel == "shm"

        async def prepare_and_send() -> None:
            await self.preparing.acquire(n)
            try:
                if n >= (1 << 20):
                    payload = await asyncio.to_thread(make_payload, id_, n, shared)
                else:
                    payload = make_payload(id_, n, shared)
                await sender.send(PAYLOAD, payload)
            finally:
                await self.preparing.release(n)

        self.session(sender).put(SEND_REQUEST, prepare_and_send)

    def drop_hold(self, id_: Any) -> int:
        """Drops the hold under ``id_``; returns the bytes it kept."""
        entry = self.held.pop(id_, None)
        if entry is None:
            return 0
        env, n, s = entry
        s.held.discard(id_)
        s.held_bytes -= n
        env.release()
        return n

    def hold(self, sender: Peer, env: Envelope) -> None:
        if sender.closed:  # its holds went with its connection; nothing to keep or answer
            env.release()
            return
        b = env.body
        data = b["data"]
        n = len(data)
        self.drop_hold(b["id"])
        s = self.session(sender)
        keep = len(s.held) < self.bounds.max_held and s.held_bytes + n <= self.bounds.max_held_bytes
        answer = {
            "id": b["id"],
            "holder": self.node.name,
            "bytes": n if keep else 0,
            "segment": env.segment_of(data) if keep else None,
        }
        del b, data
        if keep:
            self.held[answer["id"]] = (env, n, s)
            s.held.add(answer["id"])
            s.held_bytes += n
        else:
            self.warn(
                sender,
                "not keeping Hold %s from %s: it has %d holds of %d bytes (the most: %d, %d bytes)",
                answer["id"],
                sender.name,
                len(s.held),
                s.held_bytes,
                self.bounds.max_held,
                self.bounds.max_held_bytes,
            )
            env.release()
        self.answer(sender, HOLD, HELD, answer)

    def handle(self, env: Envelope) -> None:
        t, sender = env.type_name, env.sender
        if t != BLOB_WORK:  # whose handle may fail to bind: answered below
            demo_types.check(t, env.body)  # bad-body: no answer (Appendix A)
        if t == PAYLOAD:
            with env:
                b = env.body
                started = time.perf_counter()
                verified = digest(b["data"]) == bytes(b["digest"])
                seconds = time.perf_counter() - started
                receipt = {"id": b["id"], "bytes": len(b["data"]), "verified": verified, "verify_seconds": seconds}
                del b
            self.answer(sender, PAYLOAD, RECEIPT, receipt)
        elif t == SEND_REQUEST:
            b = env.body
            env.release()
            self.send_request(sender, b)
        elif t == PING:
            b = env.body
            data = b["data"]
            self.answer(sender, PING, PING, {"seq": b["seq"], "data": Bin(data)}, len(data), keep=env)
        elif t == BLOB:
            seq = env.body["seq"]
            env.release()
            self.answer(sender, BLOB, PING, {"seq": seq, "data": Bin()})
        elif t == HOLD:
            self.hold(sender, env)
        elif t == RELEASE:
            rid = env.body["id"]
            env.release()
            size = self.drop_hold(rid)
            self.answer(sender, RELEASE, HELD, {"id": rid, "holder": self.node.name, "bytes": size, "segment": None})
        elif t == FORWARD:
            b = env.body
            nxt: Optional[Peer] = self.node.peer(b["to"])
            if nxt is None:
                self.warn(sender, "cannot forward %s for %s: no peer named %r", b["id"], sender.name, b["to"])
                env.release()
                return
            if len(self.forwarded) >= self.bounds.max_relays and b["id"] not in self.forwarded:
                self.warn(
                    sender,
                    "refusing Forward %s from %s: %d relays wait for their answer, the most allowed",
                    b["id"],
                    sender.name,
                    len(self.forwarded),
                )
                env.release()
                return
            self.forwarded[b["id"]] = (sender, nxt)
            data = b["data"]
            self.session(nxt).put(
                FORWARD, lambda: nxt.send(HOLD, {"id": b["id"], "data": Buffer(data)}), len(data), keep=env
            )
        elif t == HELD:
            b = env.body
            relay = self.forwarded.pop(b["id"], None)
            if relay is not None:
                self.answer(relay[0], HELD, HELD, b)
        elif t == BLOB_WORK:
            try:
                work = env.body
            except Exception as e:  # a handle this node can neither bind nor pull: say so
                self.answer(sender, BLOB_WORK, BLOB_RECEIPT, blob_receipt(0, "failed", str(e)))
                return
            try:
                demo_types.check(t, work)
            except Exception:
                blob = work.get("blob") if isinstance(work, dict) else None
                if hasattr(blob, "release"):
                    blob.release()  # its fallback ticket: the sender's lease ends now
                raise

            async def read() -> None:
                # A download holds up only this peer's answers, never other peers'.
                receipt = await read_blob_work(work)
                await sender.send(BLOB_RECEIPT, receipt)

            # Released when the read is done (or dropped): the sender can free its bytes then.
            self.session(sender).put(BLOB_WORK, read, keep=_Releasing(env, work.get("blob")))
        elif t == STATS_REQUEST:
            self.answer(sender, STATS_REQUEST, STATS, self.node.stats())
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
        "--accept-v1",
        action="store_true",
        help="also accept peers that speak only protocol version 1, whose handshake reveals this node's id, name, "
        "host id, pid and addresses to anyone who connects, before any proof of the secret (spec WIRE.md §5.4)",
    )
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="UUID=PATH",
        help="a dataset this node reads itself: data handles for UUID bind to the file or directory PATH (repeatable)",
    )
    g = p.add_argument_group(
        "bounds",
        "What peers can make this node hold (spec §9.1 and Appendix A; the defaults are the reference's). "
        "Sizes take a suffix: 64KiB, 8MiB, 1GiB (or K, M, G); times are in milliseconds, as for handoff node.",
    )
    d, w = Bounds(), WorkerBounds()

    def bound(flag: str, kind, default, meta: str, text: str) -> None:
        if kind is parse_ms:
            shown = f"{round(default * 1000)}"
        else:
            shown = human_size(default) if kind is parse_size else f"{default:g}" if kind is float else default
        g.add_argument(flag, type=kind, default=default, metavar=meta, help=f"{text} (default {shown})")

    bound(
        "--max-request-bytes",
        parse_size,
        w.max_request_bytes,
        "SIZE",
        "most bytes one SendRequest may ask for; a larger one gets a warning and no answer",
    )
    bound(
        "--max-preparing-bytes",
        parse_size,
        w.max_preparing_bytes,
        "SIZE",
        "most bytes of SendRequest payloads being prepared or sent at once, all peers together",
    )
    bound("--max-held", int, w.max_held, "N", "most Hold items kept for one peer; beyond, Held says 0 bytes")
    bound("--max-held-bytes", parse_size, w.max_held_bytes, "SIZE", "most bytes kept by Hold for one peer")
    bound("--max-relays", int, w.max_relays, "N", "most Forward relays waiting for their Held answer")
    bound(
        "--answer-queue",
        int,
        w.answer_queue,
        "N",
        "most answers queued for one peer; further ones are dropped with a warning until it reads",
    )
    bound(
        "--max-buffered-bytes-per-peer",
        parse_size,
        d.max_buffered_bytes_per_peer,
        "SIZE",
        "bytes of one peer's messages read and not yet handled; then the node stops reading that peer",
    )
    bound("--max-buffered-bytes", parse_size, d.max_buffered_bytes, "SIZE", "the same, all peers together")
    bound("--max-handshakes", int, d.max_handshakes, "N", "handshakes in progress at once; the oldest makes room")
    bound("--max-connections", int, d.max_connections, "N", "established connections")
    bound(
        "--min-buffered-bytes-per-peer",
        parse_size,
        d.min_buffered_bytes_per_peer,
        "SIZE",
        "bytes any peer may buffer whatever all peers hold together (its guaranteed share)",
    )
    bound("--handshake-timeout-ms", parse_ms, d.handshake_timeout, "MS", "time to complete a handshake")
    bound("--progress-timeout-ms", parse_ms, d.progress_timeout, "MS", "silence allowed in the middle of a message")
    bound(
        "--write-timeout-ms",
        parse_ms,
        d.write_timeout,
        "MS",
        "a write to a peer that reads nothing fails after this, and its connection closes",
    )
    bound(
        "--lease-wait-ms",
        parse_ms,
        d.lease_wait,
        "MS",
        "how long a send waits for a peer to release shared memory or tickets before it fails",
    )
    bound(
        "--max-shm-bytes-per-peer",
        parse_size,
        d.max_shm_bytes_per_peer,
        "SIZE",
        "bytes of shared memory leased to one peer",
    )
    bound("--max-shm-leases-per-peer", int, d.max_shm_leases_per_peer, "N", "shared-memory leases held for one peer")
    bound("--max-ticket-bytes", parse_size, d.max_ticket_bytes, "SIZE", "bytes pinned by ticket leases, in total")
    bound(
        "--max-ticket-bytes-per-peer",
        parse_size,
        d.max_ticket_bytes_per_peer,
        "SIZE",
        "bytes pinned by ticket leases issued to one peer",
    )
    bound(
        "--answer-queue-bytes",
        parse_size,
        w.answer_queue_bytes,
        "SIZE",
        "bytes of received data waiting in one peer's answer queue",
    )
    bound(
        "--delay-ms", parse_ms, 0.0, "MS", "wait this long before handling each message: a slow application, for tests"
    )
    args = p.parse_args(argv)
    for ds in args.dataset:
        if "=" not in ds:
            p.error(f"--dataset wants UUID=PATH, got {ds!r}")
    try:
        args.bounds = node_bounds(args)
        args.worker_bounds = worker_bounds(args)
    except ValueError as e:
        p.error(str(e))
    return args


_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(i?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``4096``, ``64KiB``, ``8M``, ``1GiB`` → bytes (powers of 1024)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 8MiB, 1GiB)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def parse_ms(text: str) -> float:
    """Milliseconds on the command line → seconds."""
    try:
        ms = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if ms < 0:
        raise argparse.ArgumentTypeError(f"milliseconds cannot be negative: {text!r}")
    return ms / 1000


def human_size(n: int) -> str:
    """``1073741824`` → ``1GiB`` (exact multiples only)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def node_bounds(args: argparse.Namespace) -> Bounds:
    """The node's bounds (:class:`handoff.bounds.Bounds`) from the command line."""
    return dataclasses.replace(
        Bounds(),
        max_buffered_bytes_per_peer=args.max_buffered_bytes_per_peer,
        max_buffered_bytes=args.max_buffered_bytes,
        max_handshakes=args.max_handshakes,
        max_connections=args.max_connections,
        min_buffered_bytes_per_peer=args.min_buffered_bytes_per_peer,
        handshake_timeout=args.handshake_timeout_ms,
        progress_timeout=args.progress_timeout_ms,
        write_timeout=args.write_timeout_ms,
        lease_wait=args.lease_wait_ms,
        max_shm_bytes_per_peer=args.max_shm_bytes_per_peer,
        max_shm_leases_per_peer=args.max_shm_leases_per_peer,
        max_ticket_bytes=args.max_ticket_bytes,
        max_ticket_bytes_per_peer=args.max_ticket_bytes_per_peer,
    )


def worker_bounds(args: argparse.Namespace) -> WorkerBounds:
    """The demo protocol's bounds (:class:`WorkerBounds`) from the command line."""
    w = WorkerBounds(
        max_request_bytes=args.max_request_bytes,
        max_preparing_bytes=args.max_preparing_bytes,
        max_held=args.max_held,
        max_held_bytes=args.max_held_bytes,
        max_relays=args.max_relays,
        answer_queue=args.answer_queue,
        answer_queue_bytes=args.answer_queue_bytes,
        delay=args.delay_ms,
    )
    for name, value in dataclasses.asdict(w).items():
        if value < 0 or (value == 0 and name not in ("delay", "max_held", "max_held_bytes", "max_relays")):
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    return w


def _raise_fd_limit() -> None:
    """Up to the hard limit: every connection and handshake the bounds allow needs a descriptor."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


async def run(args: argparse.Namespace) -> None:
    _raise_fd_limit()
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
        bounds=args.bounds,
        accept_v1=args.accept_v1,
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
        serving = asyncio.ensure_future(Worker(node, args.worker_bounds).serve())
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

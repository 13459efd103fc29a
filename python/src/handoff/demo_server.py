"""The demo protocol of spec Appendix A, served by a Python node: :class:`Worker` takes
messages from its node and answers them, one :class:`Session` per peer (answers in order
through a bounded queue of their own), within :class:`WorkerBounds`.

``python -m handoff.worker`` (:mod:`handoff.worker`) is its command line: options, the
ready line, signals. The message types and what each answer carries are described there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import blake3

from . import demo_types
from .codec import Bin, Buffer
from .data import BlobHandle
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

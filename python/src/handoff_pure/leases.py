"""The owner's ticket leases (spec §7.5–§7.9) and the holder's digest checks, in Python.

Owner side: :class:`LeaseTable` keeps each buffer sent as a ticket under a lease with
one hold per holder node (a token and a deadline), answers ``pull`` and ``forward``
and takes ``unlease`` and ``renew``, checking them in the order of §7.7.

Holder side: :func:`check_digest` and :class:`StreamDigest` check a whole redemption
against the BLAKE3 or XXH3-128 digest its ticket carries.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hmac
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import blake3

from handoff.errors import CapReached, PeerClosed
from handoff.tickets import digest

__all__ = ["LeaseTable", "Refusal", "check_digest", "xxh3_digest", "StreamDigest", "STREAM_DIGEST_MIN"]


def xxh3_digest(data: Any) -> bytes:
    """XXH3-128 (16 bytes, canonical big-endian) of a bytes-like object: a ticket's ``xxh3``
    (§7.5), a tenth of BLAKE3's CPU (xxhash releases the GIL for large inputs)."""
    try:
        import xxhash
    except ImportError as e:
        raise ImportError(
            f"the reference checks xxh3 tickets with xxhash ({e}): pip install 'handoff[reference]'"
        ) from e
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    return xxhash.xxh3_128_digest(view)


def check_digest(desc: Any, data: Any) -> bool:
    """Whether ``data`` has the digest the ticket ``desc`` carries (``xxh3`` or BLAKE3 ``digest``)."""
    if desc.xxh3 is not None:
        return xxh3_digest(data) == bytes(desc.xxh3)
    return digest(data) == bytes(desc.digest)


#: Whole redemptions at least this large are hashed while their bytes arrive (:class:`StreamDigest`).
STREAM_DIGEST_MIN = 8 << 20
#: A hashing thread starts once this many new bytes have arrived (blake3 releases the GIL for them).
_HASH_STEP = 4 << 20
_hash_threads: Optional[concurrent.futures.ThreadPoolExecutor] = None
_hash_threads_lock = threading.Lock()


def _hash_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process's hashing threads: at most one per CPU (never more, whatever peers send)."""
    global _hash_threads
    with _hash_threads_lock:
        if _hash_threads is None:
            _hash_threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="handoff-blake3"
            )
        return _hash_threads


class StreamDigest:
    """The BLAKE3 digest of a buffer that is being filled front to back, computed by a
    hashing thread while the rest still arrives, so that a ticket's redemption costs
    about the time of its transfer rather than transfer plus hash (issue 14).

    The reader calls :meth:`feed` with how many bytes of the buffer are filled; each
    time enough new ones have arrived, one of the process's hashing threads (at most
    one per stream at a time) hashes the filled part it has not hashed yet. The
    hashed bytes are never written again (the reader fills the buffer in order), and
    the buffer is delivered only after :meth:`finish`'s digest is known.
    """

    def __init__(self, view: memoryview):
        self._view = view.cast("B") if view.format != "B" else view
        self._hasher = blake3.blake3()
        self._lock = threading.Lock()
        self._filled = 0
        self._hashed = 0
        self._kicked = 0  # filled bytes when a thread was last asked to run
        self._running = False
        self._final = False
        self._cancelled = False
        self.result: concurrent.futures.Future = concurrent.futures.Future()

    def feed(self, filled: int) -> None:
        """``filled`` bytes from the start of the buffer hold their final bytes."""
        with self._lock:
            self._filled = filled
            if self._running or filled - self._kicked < _HASH_STEP:
                return
            self._running = True
            self._kicked = filled
        _hash_executor().submit(self._run)

    def finish(self) -> "concurrent.futures.Future":
        """The whole buffer is filled: a future of its digest (32 bytes)."""
        with self._lock:
            self._final = True
            self._filled = len(self._view)
            if self._running:
                return self.result
            self._running = True
        _hash_executor().submit(self._run)
        return self.result

    def cancel(self) -> None:
        """The buffer will not be filled: stop hashing (the digest never comes)."""
        with self._lock:
            self._cancelled = True
        self.result.cancel()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    start, end = self._hashed, self._filled
                    if self._cancelled or start == end:
                        self._running = False
                        final = self._final and not self._cancelled
                        break
                    self._kicked = end
                self._hasher.update(self._view[start:end])
                self._hashed = end
            if final and not self.result.done():
                self.result.set_result(self._hasher.digest())
        except BaseException as e:  # pragma: no cover - a bug: the redemption fails, not the thread
            with self._lock:
                self._running = False
            if not self.result.done():
                self.result.set_exception(e)


# --------------------------------------------------------------------------- owner side

_NODE_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class Refusal(Exception):
    code: str
    message: str


@dataclass
class _Hold:
    token: bytes
    deadline: float


@dataclass
class _Lease:
    view: memoryview
    issued_to: str
    ttl: float
    created: float
    holds: dict = field(default_factory=dict)
    #: Holds that ended by their deadline while the lease lives: holder -> token (§7.7).
    expired: "collections.OrderedDict" = field(default_factory=collections.OrderedDict)


class LeaseTable:
    """The leases a node keeps as the owner of the tickets it sent.

    Bounded (spec §7.7, §7.9, §9.1): at most ``max_bytes`` pinned by all leases and
    ``max_bytes_per_peer`` by those first issued to one peer — a new lease that would
    exceed either waits up to ``wait`` seconds for leases to end, then fails with
    :class:`~handoff.errors.CapReached` (live holds are never ended to make room) —
    and at most ``max_holders`` live holds per lease (``too-many-holders``). Holds that
    ended by their deadline are remembered with their tokens while their lease lives
    (at most ``max_holders`` per lease, the oldest forgotten first), so that a late
    holder learns ``expired`` rather than ``bad-token``.
    """

    def __init__(
        self,
        ttl: float = 30.0,
        *,
        max_bytes: int = 16 << 30,
        max_bytes_per_peer: int = 8 << 30,
        max_holders: int = 64,
        wait: float = 30.0,
    ):
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.max_bytes_per_peer = max_bytes_per_peer
        self.max_holders = max_holders
        self.wait = wait
        self._leases: dict[int, _Lease] = {}
        self._next = 1
        self.bytes = 0
        self._bytes_by_peer: dict[str, int] = {}
        self._changed: Optional[asyncio.Event] = None
        self.expired = 0
        #: Pulls answered and the bytes they carried, since the node started.
        self.pulls = 0
        self.bytes_pulled = 0

    def _full(self, to_node: str, n: int) -> Optional[str]:
        if self.bytes + n > self.max_bytes:
            return f"{self.bytes} of {self.max_bytes} bytes are leased in total"
        peer = self._bytes_by_peer.get(to_node, 0)
        if peer + n > self.max_bytes_per_peer:
            return f"{peer} of {self.max_bytes_per_peer} bytes are leased to it"
        return None

    async def issue(
        self,
        view: memoryview,
        to_node: str,
        known_digest: Any = None,
        to_name: Optional[str] = None,
        xxh3: bool = False,
        gone: Optional[Callable[[], bool]] = None,
    ) -> tuple[int, bytes, bytes]:
        """A new lease on ``view`` with one hold for ``to_node``; returns (lease, token, digest):
        the digest is 32 bytes (BLAKE3, the ticket's ``digest``) or, with ``xxh3`` (the holder
        announced it) and no known digest, 16 bytes (XXH3-128, the ticket's ``xxh3``, §7.5).

        ``known_digest``, if given, is the BLAKE3 of ``view`` (not computed again; a large
        one is computed in a thread, so that the event loop goes on meanwhile). Waits
        for room under the caps, at most ``wait`` seconds, then raises ``CapReached``; or
        ``PeerClosed`` as soon as ``gone()`` says the connection it is for closed (its
        closing calls :meth:`wake`)."""
        n = len(view)
        hash_fn = xxh3_digest if xxh3 else digest
        if known_digest is not None:
            dg = bytes(known_digest)
        elif n >= STREAM_DIGEST_MIN:
            dg = await asyncio.get_running_loop().run_in_executor(_hash_executor(), hash_fn, view)
        else:
            dg = hash_fn(view)
        # No await from the last look at the caps to the lease's entry (they hold then).
        reason = self._full(to_node, n)
        if reason is not None:
            deadline = time.monotonic() + self.wait
            while reason is not None:
                if gone is not None and gone():
                    raise PeerClosed(f"the connection to {to_name or to_node} closed while the send waited for room")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CapReached(
                        f"cannot send {n} bytes to {to_name or to_node} as a ticket: {reason} "
                        f"(waited {self.wait:g} s for its holders to release leases)"
                    )
                if self._changed is None:
                    self._changed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
                reason = self._full(to_node, n)
        lease = self._next
        self._next += 1
        token = secrets.token_bytes(32)
        now = time.monotonic()
        entry = _Lease(view=view, issued_to=to_node, ttl=self.ttl, created=now)
        entry.holds[to_node] = _Hold(token, now + self.ttl)
        self._leases[lease] = entry
        self.bytes += n
        self._bytes_by_peer[to_node] = self._bytes_by_peer.get(to_node, 0) + n
        return lease, token, dg

    def wake(self) -> None:
        """Every issue waiting for room looks again (a lease ended, or a connection closed)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _check(self, lease: int, holder: str, token: bytes) -> tuple[_Lease, _Hold]:
        """The checks of §7.7, in order: ``unknown-lease``, ``bad-token``, ``expired``."""
        entry = self._leases.get(lease)
        if entry is None:
            raise Refusal("unknown-lease", f"no lease {lease}: it ended or was never issued")
        token = bytes(token)
        hold = entry.holds.get(holder)
        if hold is None:
            old = entry.expired.get(holder)
            if old is not None and hmac.compare_digest(old, token):
                raise Refusal("expired", f"the hold of node {holder} on lease {lease} expired")
            raise Refusal("bad-token", f"node {holder} holds no share of lease {lease} under this token")
        if not hmac.compare_digest(hold.token, token):
            raise Refusal("bad-token", f"node {holder} holds no share of lease {lease} under this token")
        if time.monotonic() > hold.deadline:
            self._end_hold(lease, holder, expired=True)
            raise Refusal("expired", f"the hold of node {holder} on lease {lease} expired")
        return entry, hold

    def pull(self, lease: int, holder: str, token: bytes, off: int, n: int) -> memoryview:
        entry, _ = self._check(lease, holder, token)
        if off + n > len(entry.view):
            raise Refusal(
                "out-of-range", f"bytes {off}..{off + n} are outside lease {lease} of {len(entry.view)} bytes"
            )
        self.pulls += 1
        self.bytes_pulled += n
        return entry.view[off : off + n]

    def forward(self, lease: int, holder: str, token: bytes, to: str, owner: str = "") -> bytes:
        """Adds node ``to`` as a holder (``bad-holder``: not a node id, or the owner's own;
        ``too-many-holders``: the lease has ``max_holders`` live holds and ``to`` is not one)."""
        entry, _ = self._check(lease, holder, token)
        if not isinstance(to, str) or not _NODE_ID.fullmatch(to):
            raise Refusal("bad-holder", f"{to!r} is not a node id (32 lower-case hex characters)")
        if to == owner:
            raise Refusal("bad-holder", f"{to} is the owner of lease {lease}, not a holder")
        if to not in entry.holds and len(entry.holds) >= self.max_holders:
            raise Refusal(
                "too-many-holders", f"lease {lease} already has {len(entry.holds)} holders, the most it allows"
            )
        new = secrets.token_bytes(32)
        entry.holds[to] = _Hold(new, time.monotonic() + entry.ttl)
        entry.expired.pop(to, None)
        return new

    def unlease(self, lease: int, holder: str, token: bytes) -> None:
        self._check(lease, holder, token)
        self._end_hold(lease, holder)

    def renew(self, lease: int, holder: str, token: bytes) -> None:
        entry, hold = self._check(lease, holder, token)
        hold.deadline = time.monotonic() + entry.ttl

    def _end_hold(self, lease: int, holder: str, expired: bool = False) -> None:
        entry = self._leases.get(lease)
        if entry is None:
            return
        hold = entry.holds.pop(holder, None)
        if hold is None:
            return
        if expired:
            self.expired += 1
        if not entry.holds:
            del self._leases[lease]
            n = len(entry.view)
            self.bytes -= n
            left = self._bytes_by_peer.get(entry.issued_to, 0) - n
            if left > 0:
                self._bytes_by_peer[entry.issued_to] = left
            else:
                self._bytes_by_peer.pop(entry.issued_to, None)
            self.wake()
        elif expired:
            entry.expired[holder] = hold.token
            while len(entry.expired) > self.max_holders:
                entry.expired.popitem(last=False)

    def withdraw(self, lease: int) -> None:
        """Ends a lease whose ticket was never sent (its message failed before it left)."""
        entry = self._leases.get(lease)
        if entry is not None:
            for holder in list(entry.holds):
                self._end_hold(lease, holder)

    def drop_holder(self, holder: str) -> int:
        """Ends every hold of ``holder`` (its connection was lost); returns how many."""
        ended = 0
        for lease in [lease for lease, e in self._leases.items() if holder in e.holds]:
            self._end_hold(lease, holder)
            ended += 1
        return ended

    def expire(self) -> int:
        now = time.monotonic()
        late = [(lease, h) for lease, e in self._leases.items() for h, hold in e.holds.items() if hold.deadline < now]
        for lease, holder in late:
            self._end_hold(lease, holder, expired=True)
        return len(late)

    def is_alive(self, lease: int) -> bool:
        return lease in self._leases

    def stats(self) -> dict:
        now = time.monotonic()
        return {
            "count": len(self._leases),
            "bytes": self.bytes,
            "holders": sum(len(e.holds) for e in self._leases.values()),
            "oldest_seconds": max((now - e.created for e in self._leases.values()), default=0.0),
            "expired": self.expired,
            "pulls": self.pulls,
            "bytes_pulled": self.bytes_pulled,
        }

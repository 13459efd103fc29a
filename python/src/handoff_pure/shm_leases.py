"""The shared-memory leases a node keeps for one peer (spec §7.3–§7.4): what it sent as
shm frames and must keep alive until the peer sends ``release`` or the connection ends.

:class:`ShmLeases` is one peer's table: lease ids, the bytes they hold against the caps
of :class:`~handoff.bounds.Bounds` (a send waits for room, at most ``lease_wait``), and
how leases end. A lease keeps a sealed memfd (:class:`~handoff.shm.SharedFrame`) or a
window of a pooled segment (:class:`PooledLease`); a pooled segment goes back to the
process's pool only when the peer released it or its process is gone (:mod:`handoff_pure.pool`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Callable, Optional

from handoff.bounds import Bounds
from handoff.errors import CapReached, PeerClosed
from .pool import Segment, pool

__all__ = ["ShmLeases", "PooledLease", "SealedLease", "pooled_copy"]

log = logging.getLogger("handoff")

#: Copies into a pooled segment at least this large run in a thread (numpy releases the GIL).
_COPY_IN_THREAD = 8 << 20
#: How long a closed connection's pooled segments wait for the peer process to exit (then
#: they come back to the pool) before they are retired (the peer may still map them).
_EXIT_WAIT = 2.0


class PooledLease:
    """A lease on a window of a pooled segment (:mod:`handoff_pure.pool`). ``copy``: the
    segment holds a copy made for this send only (:func:`pooled_copy`), which the sender
    unmaps once it is sent (:meth:`sent`)."""

    __slots__ = ("segment", "size", "copy", "turn")

    def __init__(self, segment: Segment, copy: bool = False):
        self.segment = segment
        self.size = segment.size
        self.copy = copy
        self.turn = segment.turn

    def sent(self) -> None:
        """The descriptor went out: a copy's segment is unmapped here (see :mod:`handoff_pure.pool`)."""
        if self.copy:
            self.segment.detach(self.turn)

    def close(self, reusable: bool = True) -> None:
        self.segment.let_go(reusable)


class SealedLease:
    """A lease on a sealed segment sent to the peer: only its size, for the caps. The
    descriptor was closed once it was sent (the receiver's mapping holds the memory;
    nothing is written to a sealed segment again), so a held frame costs the sender no
    descriptor."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size

    def close(self) -> None:
        pass


def _end_lease(kept: Any, reusable: bool) -> None:
    if isinstance(kept, PooledLease):
        kept.close(reusable)
    else:
        kept.close()


def _write(seg: Segment, view: memoryview) -> None:
    """Copies into a segment fresh from the pool, which is not mapped (``pwrite``): the
    bytes stay in the memfd's pages, in no process's RSS until the receiver maps them, so
    that a message of many frames never has their copies mapped in the sender."""
    seg.write(view)


def _copy_done(seg: Segment, job: asyncio.Future) -> None:
    if not job.cancelled():
        job.exception()  # retrieved: the send that wanted it is gone
    seg.let_go(True)


async def pooled_copy(view: memoryview) -> PooledLease:
    """Copies a buffer into a segment of the process's pool (a thread does large copies).

    If the caller is cancelled while a thread copies, the segment stays busy until that
    thread is done: it goes back to the pool only then, so that the next send never gets a
    segment another thread still writes into (issue 25, item 5)."""
    seg = pool().take(view.nbytes)
    if view.nbytes < _COPY_IN_THREAD:
        try:
            _write(seg, view)
        except BaseException:
            seg.let_go(True)
            raise
        return PooledLease(seg, copy=True)
    # Shielded: a cancellation of this coroutine does not cancel the copy (it could not
    # stop the thread anyway); the copy's own future says when the thread is done.
    job = asyncio.get_running_loop().run_in_executor(None, _write, seg, view)
    try:
        await asyncio.shield(job)
    except BaseException:
        if job.done():
            seg.let_go(True)
        else:  # cancelled while the thread writes: nobody was sent it, reusable once it is done
            job.add_done_callback(lambda j: _copy_done(seg, j))
        raise
    return PooledLease(seg, copy=True)


async def _process_exited(pid: int, wait: float) -> bool:
    """Whether process ``pid`` has exited (it holds no mapping then), waiting up to ``wait`` s.

    A process that closed its socket by dying releases its memory before its files, and
    becomes waitable (its pidfd readable) after both, so a short wait suffices. A live
    process, or a pid taken by another one since, reads as not exited: the safe answer."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):
        return False
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    try:
        loop.add_reader(pidfd, lambda: done.done() or done.set_result(True))
        try:
            return await asyncio.wait_for(done, wait)
        except asyncio.TimeoutError:
            return False
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)


class ShmLeases:
    """One peer's shared-memory leases: lease id -> what the lease keeps alive."""

    def __init__(self) -> None:
        self._leases: dict = {}  # shm lease -> SharedFrame or PooledLease kept for the peer
        self._bytes = 0
        self._changed: Optional[asyncio.Event] = None
        self._next = 1
        #: Set once the connection's leases ended (:meth:`end_at_close`): no lease is kept after.
        self.closed = False

    @property
    def kept(self) -> dict:
        """Lease id -> what it keeps alive (a :class:`~handoff.shm.SharedFrame` or a
        :class:`PooledLease`); read it, do not change it."""
        return self._leases

    def stats(self) -> dict:
        """``{count, bytes}`` of the leases kept."""
        return {"count": len(self._leases), "bytes": self._bytes}

    def full(self, size: int, bounds: Bounds) -> Optional[str]:
        """Why one more lease of ``size`` bytes would go over the caps for the peer, or ``None``."""
        if len(self._leases) + 1 > bounds.max_shm_leases_per_peer:
            return f"{len(self._leases)} shared-memory leases (the most allowed: {bounds.max_shm_leases_per_peer})"
        if self._bytes + size > bounds.max_shm_bytes_per_peer:
            return f"{self._bytes} of {bounds.max_shm_bytes_per_peer} bytes in shared-memory leases"
        return None

    async def room(self, size: int, bounds: Bounds, peer_name: str, closed: Callable[[], bool]) -> None:
        """Waits until one more lease of ``size`` bytes fits the caps for this peer (§7.4),
        at most the bounds' ``lease_wait``; then fails the send with ``CapReached``."""
        reason = self.full(size, bounds)
        if reason is None:
            return
        wait = bounds.lease_wait
        deadline = time.monotonic() + wait
        while reason is not None:
            left = deadline - time.monotonic()
            if left <= 0 or closed():
                raise CapReached(
                    f"cannot send {size} bytes to {peer_name} in shared memory: it holds {reason}; "
                    f"waited {wait:g} s for it to release some (it must send `release` for frames it dropped)"
                )
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass
            reason = self.full(size, bounds)

    def keep(self, shared: Any) -> int:
        """Keeps ``shared`` under a new lease; returns the lease id. Raises ``PeerClosed``
        once the connection's leases have ended: a send that waited (for a copy in a
        thread) while the connection was cleaned up must not add a lease that nothing
        would end (issue 25, item 6); the caller ends ``shared`` itself."""
        if self.closed:
            raise PeerClosed("the connection closed while the frame was being prepared")
        lease = self._next
        self._next += 1
        self._leases[lease] = shared
        self._bytes += shared.size
        return lease

    def _changed_now(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def end(self, leases, reusable: bool = True) -> int:
        """Ends leases: released by the peer (``reusable``), or by the connection's end."""
        ended = 0
        for lease in leases:
            sf = self._leases.pop(lease, None)
            if sf is not None:
                self._bytes -= sf.size
                _end_lease(sf, reusable)
                ended += 1
        if ended:
            self._changed_now()
        return ended

    def end_at_close(self, pid: Optional[int], recycle: bool, spawn: Callable[[Any], Any], label: str) -> None:
        """The connection ended: every lease ends (§7.3). Pooled segments come back to the
        pool only if the peer process (``pid``) is gone (it maps nothing then); a live peer
        may still hold views, so they are retired instead (:mod:`handoff_pure.pool`). Without
        ``recycle`` (the node is closing) they are retired at once; else ``spawn`` runs the
        wait for the process to exit. ``label`` names the connection in the log."""
        self.closed = True
        pooled = [lease for lease, kept in self._leases.items() if isinstance(kept, PooledLease)]
        others = [lease for lease, kept in self._leases.items() if not isinstance(kept, PooledLease)]
        self.end(others)
        if not pooled:
            return
        kept = [self._leases.pop(lease) for lease in pooled]
        self._bytes -= sum(k.size for k in kept)
        self._changed_now()
        if not pid or pid == os.getpid() or not recycle:
            for k in kept:
                k.close(False)
            return

        async def recycle_when_gone() -> None:
            gone = False
            try:
                gone = await _process_exited(pid, _EXIT_WAIT)
            finally:
                for k in kept:
                    k.close(gone)
                if gone:
                    log.debug("%s exited: %d pooled segments come back", label, len(kept))

        spawn(recycle_when_gone())

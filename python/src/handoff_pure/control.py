"""One connection's writer of control headers (spec §7.7, §9.1): ticket answers
(``pulled`` with its bytes, ``forwarded``, ``ticket-error``), and other headers that a
node sends without the application asking (``unlease``, pin updates).

They go out in order through one task per connection, not a task per request. The
connection's reader stops reading while too many wait (``max_pulls_in_flight`` pulled
answers, ``max_control_queued`` headers in all), so a peer that asks and does not read
cannot make the node buffer answers without end.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Awaitable, Callable, Optional

from . import wire
from handoff.bounds import Bounds
from handoff.errors import PeerClosed

__all__ = ["ControlWriter", "MAX_UNLEASES_QUEUED"]

#: ``unlease``s queued unwritten on one connection (spec §9.1: their bytes stay under
#: 1 MiB); past it an ended hold's ``unlease`` is dropped and its deadline ends it.
MAX_UNLEASES_QUEUED = 16_384

log = logging.getLogger("handoff")


class ControlWriter:
    """The queue of control headers of one connection, and the task that writes them.

    ``send(header, payload)`` writes one header (and a ``pulled``'s bytes); ``bounds()``
    gives the node's bounds, ``closed()`` whether the connection is closed; ``label()``
    names the connection in the log: ``(node name, peer name)``."""

    def __init__(
        self,
        send: Callable[[Any, Any], Awaitable[None]],
        bounds: Callable[[], Bounds],
        closed: Callable[[], bool],
        loop: asyncio.AbstractEventLoop,
        label: Callable[[], tuple],
    ):
        self._send = send
        self._bounds = bounds
        self._closed = closed
        self._loop = loop
        self._label = label
        self._queue: collections.deque = collections.deque()
        self._task: Optional[asyncio.Task] = None
        self._room: Optional[asyncio.Event] = None
        self._pulls_queued = 0
        #: Our ``unlease``s among the queued headers: they do not stop the reader (they
        #: come from our own drops, not from reading the peer), and past
        #: :data:`MAX_UNLEASES_QUEUED` more are dropped (the hold then ends by its deadline).
        self._unleases_queued = 0

    def queue(self, header: Any, payload: Any = None) -> None:
        """Queues a header (and a ``pulled``'s bytes) for the connection's one control writer."""
        if self._closed():
            return
        if isinstance(header, wire.Pulled):
            self._pulls_queued += 1
        self._queue.append((header, payload))
        if self._task is None:
            self._task = self._loop.create_task(self._write())

    def queue_unlease(self, header: Any) -> bool:
        """Queues one of our ``unlease``s, unless :data:`MAX_UNLEASES_QUEUED` wait unwritten
        already (an owner that reads nothing): ``False`` when it is dropped."""
        if self._closed() or self._unleases_queued >= MAX_UNLEASES_QUEUED:
            return False
        self._unleases_queued += 1
        self.queue(header)
        return True

    def full(self) -> bool:
        """Whether the reader must stop until answers are written (§9.1)."""
        b = self._bounds()
        answers = len(self._queue) - self._unleases_queued
        return self._pulls_queued >= b.max_pulls_in_flight or answers >= b.max_control_queued

    async def has_room(self) -> None:
        """Stops reading (the caller waits) while too many answers wait to be written (§9.1)."""
        while self.full() and not self._closed():
            if self._room is None:
                self._room = asyncio.Event()
            await self._room.wait()

    def wake(self) -> None:
        """Wakes a reader waiting for room (the connection is closing)."""
        if self._room is not None:
            self._room.set()

    def stop(self) -> None:
        """The connection ended: nothing more is written, a waiting reader wakes."""
        self._queue.clear()
        self._pulls_queued = 0
        self._unleases_queued = 0
        self.wake()

    def cancel(self) -> None:
        """Cancels the writing task, if one runs."""
        if self._task is not None:
            self._task.cancel()

    async def _write(self) -> None:
        try:
            while self._queue and not self._closed():
                header, payload = self._queue[0]
                try:
                    await self._send(header, payload)
                except PeerClosed as e:
                    log.debug("%s: could not answer %s: %s", *self._label(), e)
                    self._queue.clear()
                    self._pulls_queued = 0
                    self._unleases_queued = 0
                    return
                finally:
                    if self._queue and self._queue[0][0] is header:
                        self._queue.popleft()
                        if isinstance(header, wire.Pulled):
                            self._pulls_queued -= 1
                        elif isinstance(header, wire.Unlease):
                            self._unleases_queued -= 1
                    if self._room is not None and not self.full():
                        self._room.set()
                        self._room = None
        finally:
            self._task = None
            if self._room is not None:
                self._room.set()
                self._room = None

"""The inbox: received messages waiting for the application, one queue per connection,
taken fairly by bytes, sparse and open connections first (how and why:
``handoff_proto::inbox``). The queues and the choice of the next message are the engine's
(``handoff._native.Inbox``), as in the Rust node; this module keeps the wait for a message
on the event loop. How much waits is bounded by the node's buffered-bytes budget (§9.1),
which every envelope is charged against until the application takes it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Optional

from . import native

__all__ = ["Inbox", "ConnectionQueue", "Signal", "wait_until"]


#: The clock's resolution: a timer is due this close to its time (as asyncio counts it).
_RESOLUTION = time.get_clock_info("monotonic").resolution


class Signal:
    """Wakes the tasks that wait for it, each wait with an optional time limit.

    ``asyncio.wait_for`` runs the awaited coroutine as a task of its own: one more task
    and two more turns of the event loop for every message a timed ``recv`` takes. Here a
    wait is one future. The time limits share one timer, armed for the earliest of them:
    a receiver that waits with a limit again and again (``recv(30)`` in a loop) re-arms it
    only when it fires, not for every message (a timer that fires before a wait's own
    limit re-arms itself for the earliest limit still waiting)."""

    __slots__ = ("_waiters", "_limits", "_timer")

    def __init__(self) -> None:
        self._waiters: list = []
        #: The waits with a time limit: future -> when it ends (the loop's clock).
        self._limits: dict = {}
        self._timer: Optional[asyncio.TimerHandle] = None

    def set(self) -> None:
        """Wakes every task waiting now."""
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(True)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for the next :meth:`set`: ``True``, or ``False`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        if timeout is not None:
            at = loop.time() + timeout
            self._limits[fut] = at
            if self._timer is None or self._timer.when() > at:
                self._arm(loop, at)
        try:
            return await fut
        finally:
            if timeout is not None:
                self._limits.pop(fut, None)
            if fut in self._waiters:  # timed out or cancelled: not woken by set()
                self._waiters.remove(fut)

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer fired: ends the waits whose limit passed, and re-arms for the rest."""
        self._timer = None
        now = loop.time()
        earliest = None
        for fut, at in list(self._limits.items()):
            if fut.done():
                continue
            if at <= now + _RESOLUTION:  # (due, as the loop counts timers due)
                fut.set_result(False)
            elif earliest is None or at < earliest:
                earliest = at
        if earliest is not None:
            self._arm(loop, earliest)


async def wait_until(ready, signal: Signal, timeout: Optional[float]) -> None:
    """Waits until ``ready()`` (checked after each wake-up); ``asyncio.TimeoutError`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    if timeout is None:
        # (Signal.wait in place, without its timer: the common wait of a receiver.)
        waiters = signal._waiters
        while not ready():
            fut = loop.create_future()
            waiters.append(fut)
            try:
                await fut
            finally:
                if fut in waiters:  # cancelled: not woken by set()
                    waiters.remove(fut)
        return
    deadline = loop.time() + timeout
    while not ready():
        left = deadline - loop.time()
        if left <= 0 or not await signal.wait(left):
            raise asyncio.TimeoutError


class Inbox:
    """Messages for the application, taken fairly from each connection (the engine's
    algorithm: sparse connections first, then open ones by deficit round-robin in bytes,
    then closed ones)."""

    __slots__ = ("overhead", "_queues", "_arrived")

    def __init__(self, overhead: int):
        #: What a message without a charge weighs (the node's per-message overhead).
        self.overhead = max(1, overhead)
        #: Credit a connection gains per turn is about one small message.
        self._queues = native.required("the inbox").Inbox(2 * self.overhead)
        self._arrived = Signal()

    def put(self, env: Any) -> None:
        """Adds a message behind the others of its connection."""
        self._queues.push(id(env.sender), env.charge or self.overhead, env)
        self._arrived.set()

    def closed(self, sender: Any) -> None:
        """``sender``'s connection has closed: what it sent waits until no open connection has
        a message (nothing is dropped)."""
        self._queues.closed(id(sender))

    async def get(self, timeout: Optional[float] = None) -> Any:
        """The next message, waiting until there is one (``asyncio.TimeoutError`` after
        ``timeout`` seconds). A message already waiting is taken without yielding."""
        queues = self._queues
        if not queues:
            await wait_until(queues.__bool__, self._arrived, timeout)
        return queues.pop()

    def __bool__(self) -> bool:
        """Whether a message waits."""
        return bool(self._queues)

    def __len__(self) -> int:
        return len(self._queues)


class ConnectionQueue:
    """One connection's own messages, in order (a node built with ``per_connection=True``).

    Bounded like the inbox: every envelope in it is charged against the node's buffered
    bounds until it is taken, and the connection's reader stops while there is no room.
    :meth:`close` ends it: what arrived stays readable, then :meth:`get` returns ``None``.
    """

    def __init__(self) -> None:
        self._messages: collections.deque = collections.deque()
        self._arrived = Signal()
        self.closed = False
        self._dropping = False

    def put(self, env: Any) -> bool:
        """Adds a message; ``False`` if the queue was dropped (the caller gives back its charge)."""
        if self._dropping:
            return False
        self._messages.append(env)
        self._arrived.set()
        return True

    def close(self, drop: bool = False) -> list:
        """No more messages; with ``drop`` the waiting ones are discarded and returned."""
        self.closed = True
        self._arrived.set()
        if not drop:
            return []
        self._dropping = True
        dropped = list(self._messages)
        self._messages.clear()
        return dropped

    async def get(self, timeout: Optional[float] = None) -> Any:
        """The next message, waiting for one (``asyncio.TimeoutError`` after ``timeout``
        seconds); ``None`` once closed and empty."""
        if not self._messages and not self.closed:
            await wait_until(self._ready, self._arrived, timeout)
        return self._messages.popleft() if self._messages else None

    def _ready(self) -> bool:
        return bool(self._messages) or self.closed

    def __len__(self) -> int:
        return len(self._messages)

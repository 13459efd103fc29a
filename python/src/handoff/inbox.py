"""The inbox: received messages waiting for the application, one queue per connection,
taken fairly by bytes (as in the Rust reference), sparse and open connections first.

A single queue would let a peer that sends a flood put every other peer's messages
behind its own. Here :meth:`Inbox.get` serves the connections that have messages by
deficit round-robin: each turn gives a connection a quantum of credit in bytes, and it
is served while its credit covers its next message. A peer's messages stay in order; a
peer that sends large messages gets its share in bytes, not in messages, so a peer that
sends a small one now and then is served within a turn whatever the others have
queued. How much waits is bounded by the node's buffered-bytes budget (§9.1), which
every envelope is charged against until the application takes it.

**Sparse connections first** (as fq_codel does for packets, RFC 8290): a connection
whose queue was empty when its message arrived — a peer with one request out at a time,
waiting for its answer — is served before the connections that have a backlog, for
one quantum (a larger message waits for its share in the round); then it joins the
others' round. A peer that floods many connections at
once, each with bodies that are slow to decode in pure Python (deeply nested ones),
otherwise makes every round, and the round trip of every other peer, as long as one
turn of each of its connections; here such a peer waits at most for the message being
handled now. A flood cannot use this: a connection keeps its place among the new ones
only while it has nothing queued. The price, as in fq_codel: while sparse messages from
many connections arrive faster than the application takes messages, the backlogged
connections wait (each sparse connection still gets one quantum per message).

**Open connections first.** Messages of a connection that has closed stay in the inbox
(nothing a peer sent before it left is lost), but they are served only when no open
connection has a message waiting (:meth:`Inbox.closed`): its peer waits for no answer.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Optional

__all__ = ["Inbox", "ConnectionQueue", "Signal"]


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


async def _wait_until(ready, signal: Signal, timeout: Optional[float]) -> None:
    """Waits until ``ready()`` (checked after each wake-up); ``asyncio.TimeoutError`` after ``timeout`` s."""
    if timeout is None:
        while not ready():
            await signal.wait()
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready():
        left = deadline - loop.time()
        if left <= 0 or not await signal.wait(left):
            raise asyncio.TimeoutError


class _Queue:
    __slots__ = ("messages", "credit")

    def __init__(self) -> None:
        self.messages: collections.deque = collections.deque()
        self.credit = 0


class Inbox:
    """Messages for the application, taken fairly from each connection: sparse connections
    first, then open ones by deficit round-robin, then closed ones."""

    def __init__(self, overhead: int):
        #: What a message without a charge weighs (the node's per-message overhead).
        self.overhead = max(1, overhead)
        #: Credit a connection gains per turn: about one small message.
        self.quantum = 2 * self.overhead
        self._queues: dict = {}
        self._new: collections.deque = collections.deque()  # open, queue empty when a message came
        self._turns: collections.deque = collections.deque()  # open, with a backlog: round-robin
        self._closed_turns: collections.deque = collections.deque()  # closed, messages still waiting
        self._closed: set = set()  # keys of closed connections whose messages still wait
        self._arrived = Signal()

    def _weight(self, env: Any) -> int:
        return getattr(env, "charge", 0) or self.overhead

    def put(self, env: Any) -> None:
        """Adds a message behind the others of its connection."""
        key = id(env.sender)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue()
            if key in self._closed:
                self._closed_turns.append(key)
            else:
                q.credit = self.quantum
                self._new.append(key)
        q.messages.append(env)
        self._arrived.set()

    def closed(self, sender: Any) -> None:
        """``sender``'s connection has closed: what it sent waits until no open connection has
        a message (nothing is dropped)."""
        key = id(sender)
        if key not in self._queues or key in self._closed:
            return
        self._closed.add(key)
        for ring in (self._new, self._turns):
            if key in ring:
                ring.remove(key)
        self._closed_turns.append(key)

    def _take_new(self) -> Optional[Any]:
        key = self._new[0]
        q = self._queues[key]
        weight = self._weight(q.messages[0])
        if weight > q.credit:
            # More than a quantum (a large message): it waits for its share in the round.
            self._new.popleft()
            self._turns.append(key)
            return None
        env = q.messages.popleft()
        q.credit -= weight
        if not q.messages:
            del self._queues[key]
            self._new.popleft()
        elif q.credit <= 0:
            # Its quantum is spent and it has more: it joins the round of the backlogged.
            self._new.popleft()
            q.credit = max(0, q.credit + self.quantum)
            self._turns.append(key)
        return env

    def _take(self) -> Any:
        while self._new:
            env = self._take_new()
            if env is not None:
                return env
        turns = self._turns or self._closed_turns
        while True:
            for _ in range(len(turns)):
                key = turns[0]
                q = self._queues[key]
                weight = self._weight(q.messages[0])
                if q.credit >= weight or len(turns) == 1:
                    env = q.messages.popleft()
                    q.credit = max(0, q.credit - weight)
                    if not q.messages:
                        del self._queues[key]
                        self._closed.discard(key)
                        turns.popleft()
                    return env
                q.credit += self.quantum
                turns.rotate(-1)
            # Nobody could be served in a whole round: skip the rounds it takes at once.
            waiting = [self._queues[key] for key in turns]
            rounds = min(-(-max(0, self._weight(q.messages[0]) - q.credit) // self.quantum) for q in waiting)
            for q in waiting:
                q.credit += max(0, rounds - 1) * self.quantum

    async def get(self, timeout: Optional[float] = None) -> Any:
        """The next message, waiting until there is one (``asyncio.TimeoutError`` after
        ``timeout`` seconds). A message already waiting is taken without yielding."""
        if not self._queues:
            if timeout is None:
                # (Signal.wait in place, without its timer: the common wait of a receiver.)
                waiters = self._arrived._waiters
                loop = asyncio.get_running_loop()
                while not self._queues:
                    fut = loop.create_future()
                    waiters.append(fut)
                    try:
                        await fut
                    finally:
                        if fut in waiters:  # cancelled: not woken by set()
                            waiters.remove(fut)
            else:
                await _wait_until(self._has_messages, self._arrived, timeout)
        return self._take()

    def _has_messages(self) -> bool:
        return bool(self._queues)

    def __bool__(self) -> bool:
        """Whether a message waits."""
        return bool(self._queues)

    def __len__(self) -> int:
        return sum(len(q.messages) for q in self._queues.values())


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
            await _wait_until(self._ready, self._arrived, timeout)
        return self._messages.popleft() if self._messages else None

    def _ready(self) -> bool:
        return bool(self._messages) or self.closed

    def __len__(self) -> int:
        return len(self._messages)

"""The inbox: received messages waiting for the application, one queue per connection,
taken fairly by bytes (as in the Rust reference).

A single queue would let a peer that sends a flood put every other peer's messages
behind its own. Here :meth:`Inbox.get` serves the connections that have messages by
deficit round-robin: each turn gives a connection a quantum of credit in bytes, and it
is served while its credit covers its next message. A peer's messages stay in order; a
peer that sends large messages gets its share in bytes, not in messages, so a peer that
sends a small one now and then is served within a turn whatever the others have
queued. How much waits is bounded by the node's buffered-bytes budget (§9.1), which
every envelope is charged against until the application takes it.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

__all__ = ["Inbox", "ConnectionQueue"]


class _Queue:
    __slots__ = ("messages", "credit")

    def __init__(self) -> None:
        self.messages: collections.deque = collections.deque()
        self.credit = 0


class Inbox:
    """Messages for the application, taken fairly from each connection."""

    def __init__(self, overhead: int):
        #: What a message without a charge weighs (the node's per-message overhead).
        self.overhead = max(1, overhead)
        #: Credit a connection gains per turn: about one small message.
        self.quantum = 2 * self.overhead
        self._queues: dict = {}
        self._turns: collections.deque = collections.deque()
        self._arrived = asyncio.Event()

    def _weight(self, env: Any) -> int:
        return getattr(env, "charge", 0) or self.overhead

    def put(self, env: Any) -> None:
        """Adds a message behind the others of its connection."""
        key = id(env.sender)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue()
            self._turns.append(key)
        q.messages.append(env)
        self._arrived.set()

    def _take(self) -> Any:
        while True:
            for _ in range(len(self._turns)):
                key = self._turns[0]
                q = self._queues[key]
                weight = self._weight(q.messages[0])
                if q.credit >= weight or len(self._turns) == 1:
                    env = q.messages.popleft()
                    q.credit = max(0, q.credit - weight)
                    if not q.messages:
                        del self._queues[key]
                        self._turns.popleft()
                    return env
                q.credit += self.quantum
                self._turns.rotate(-1)
            # Nobody could be served in a whole round: skip the rounds it takes at once.
            rounds = min(
                -(-max(0, self._weight(q.messages[0]) - q.credit) // self.quantum) for q in self._queues.values()
            )
            for q in self._queues.values():
                q.credit += max(0, rounds - 1) * self.quantum

    async def get(self) -> Any:
        """The next message, waiting until there is one."""
        while not self._turns:
            self._arrived.clear()
            await self._arrived.wait()
        return self._take()

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
        self._arrived = asyncio.Event()
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

    async def get(self) -> Any:
        """The next message, waiting for one; ``None`` once closed and empty."""
        while not self._messages:
            if self.closed:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        return self._messages.popleft()

    def __len__(self) -> int:
        return len(self._messages)

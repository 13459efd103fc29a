"""The reference's inbox: received messages waiting for the application, one queue per
connection, taken fairly by bytes, sparse and open connections first.

The algorithm is the one of ``handoff_proto::inbox`` (its text says why each rule is
there), written again in Python: this package is the spec's independent implementation.
The node on the engine runs the Rust one (:mod:`handoff.inbox`); the two pass the same
tests (``python/tests/test_bounds.py``).
"""

from __future__ import annotations

import collections
from typing import Any, Optional

from handoff.inbox import Signal, wait_until

__all__ = ["Inbox"]


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
            await wait_until(self._has_messages, self._arrived, timeout)
        return self._take()

    def _has_messages(self) -> bool:
        return bool(self._queues)

    def __bool__(self) -> bool:
        """Whether a message waits."""
        return bool(self._queues)

    def __len__(self) -> int:
        return sum(len(q.messages) for q in self._queues.values())

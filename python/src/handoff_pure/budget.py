"""The buffered-bytes budget of a node (spec §9.1): per peer and in total, with backpressure.

Every message a connection reads is charged, from the start of its header's read until
the application takes its envelope (:meth:`handoff.node.Node.recv`): header, inline
frames, ``shm`` windows, the tickets redeemed on receipt, and a fixed overhead per
message. A reader that finds no room waits — it stops reading its connection — until
the application takes messages. A message is admitted when it fits, or alone: when
nothing else of its peer is buffered (for the total: nothing at all), so that a message
up to the message limit always gets through. A message that keeps its peer within its
guaranteed share (``min_buffered_bytes_per_peer``, 1 MiB) is admitted even when the total
is reached, so that another peer's large (or slowly trickling) message delays no one.

While a connection has requests of this node outstanding (pulls, forwards), its reader
may go over the bounds — up to twice the per-peer bound for that peer and one per-peer
bound over the total, each raised by that peer's tickets charged ahead of their pull —
so that a ``pulled`` this node waits for is never stuck behind a message that waits for
room held by the message that waits for the ``pulled``.

A reader that waits because of its own peer's bounds (bytes or messages) is woken when
that peer's messages are released, not by every release: a flood spread over many
connections would otherwise wake every one of their readers for each message the
application takes, only for all but one to wait again.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Union

from handoff.bounds import Bounds
from handoff.errors import PeerClosed

__all__ = ["Budget"]


class Budget:
    def __init__(self, bounds: Bounds):
        self.per_peer = bounds.max_buffered_bytes_per_peer
        self.limit = bounds.max_buffered_bytes
        #: What any peer may hold whatever all peers hold together (its guaranteed share).
        self.share = min(bounds.min_buffered_bytes_per_peer, bounds.max_buffered_bytes_per_peer)
        #: Messages one peer may have buffered, whatever their size.
        self.max_messages = bounds.max_buffered_messages_per_peer
        #: Bytes buffered for all peers together.
        self.total = 0
        #: Waiting readers: the key is the account whose release may make room for them,
        #: or ``None`` for those waiting for the total (any release may).
        self._waiting: dict = {}

    def fits(self, account: Any, n: int, own: int = 0, over: bool = False) -> bool:
        """Whether ``n`` more bytes for ``account`` (a peer, with ``buffered``) are admitted now;
        ``own`` bytes of the same message are charged already."""
        return self._blocker(account, n, own, over) is False

    def _blocker(self, account: Any, n: int, own: int, over: bool) -> Any:
        """``False`` if it fits; else what must release first: ``account`` (its own
        bounds) or ``None`` (the total)."""
        if own == 0 and account.messages >= self.max_messages:
            return account  # a new message, and this peer has as many waiting as it may
        if account.buffered + n <= self.share:
            return False  # small messages are never stuck behind another peer's large one
        # Over: one more per-peer bound, and the peer's tickets taken ahead of their pull
        # (one admitted alone may be larger than the bound: its answer must still come).
        tickets = getattr(account, "tickets", 0) if over else 0
        per_peer = self.per_peer * 2 + tickets if over else self.per_peer
        limit = self.limit + self.per_peer + tickets if over else self.limit
        if not (account.buffered + n <= per_peer or account.buffered == own):
            return account
        if not (self.total + n <= limit or self.total == own):
            return None
        return False

    def admit_now(self, account: Any, n: int, over: bool = False) -> bool:
        """Charges ``n`` bytes of a new message to ``account`` if they fit now (as
        :meth:`admit` would without waiting); ``False``, and nothing charged, if not."""
        if self._blocker(account, n, 0, over) is not False:
            return False
        account.buffered += n
        account.messages += 1
        self.total += n
        return True

    async def admit(
        self, account: Any, n: int, own: Union[int, Callable[[], int]] = 0, over: Callable[[], bool] = bool
    ) -> None:
        """Charges ``n`` bytes to ``account``, waiting for room first (see the module).

        ``own``: bytes of the same message charged already (it is alone when they are all
        its peer has), or what says them now. ``over()`` says whether the account may go
        over the bounds now (it has requests of this node outstanding). Both are asked
        again each time room may have appeared."""
        own_now = own if callable(own) else (lambda: own)
        while True:
            blocker = self._blocker(account, n, own_now(), over())
            if blocker is False:
                break
            if account.closed:
                raise PeerClosed(f"the connection to {account.name} is closed")
            room = asyncio.Event()
            key = id(blocker) if blocker is not None else None
            waiters = self._waiting.setdefault(key, [])
            waiters.append(room)
            try:
                await room.wait()
            finally:
                if room in waiters:  # cancelled, or the account closed: not woken by a release
                    waiters.remove(room)
                    if not waiters and self._waiting.get(key) is waiters:
                        del self._waiting[key]
        account.buffered += n
        if not callable(own) and own == 0:
            account.messages += 1
        self.total += n

    def release(self, account: Any, n: int) -> None:
        """Gives back all that one message was charged (each admitted message is released once)."""
        account.buffered -= n
        account.messages -= 1
        self.total -= n
        if self._waiting:
            self._wake(id(account))
            self._wake(None)

    def release_env(self, env: Any) -> None:
        """Gives back what a delivered (or dropped) envelope was charged."""
        tickets = getattr(env, "ticket_charge", 0)
        if tickets:
            env.ticket_charge = 0
            env.sender.tickets -= tickets
        charge = getattr(env, "charge", 0)
        if charge:
            env.charge = 0
            self.release(env.sender, charge)

    def poke(self, account: Any) -> None:
        """Lets the waits that ``account``'s state may now let through check again (a
        message queued behind a ticket that waits to be admitted alone)."""
        if self._waiting:
            self._wake(id(account))
            self._wake(None)

    def _wake(self, key: Any) -> None:
        for room in self._waiting.pop(key, ()):
            room.set()

    def wake(self) -> None:
        """Lets every waiting reader check again (room appeared, or a connection closed)."""
        for key in list(self._waiting):
            self._wake(key)

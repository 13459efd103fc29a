"""Tickets (spec §7.5–§7.9): the holder's handle on a ticket, and the digests.

:class:`Ticket` is a received ticket; it pulls ranges or the whole buffer from the owner
through its node (which checks the digest of a whole redemption), renews, and sends
``unlease`` when it is released or garbage-collected. The owner's side is the engine's
(and, in the pure-Python reference, ``handoff_pure.leases``).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import blake3

from . import wire
from .errors import PeerClosed

__all__ = ["Redeemer", "Ticket", "digest"]


def digest(data: Any) -> bytes:
    """BLAKE3 (32 bytes) of a bytes-like object, multi-threaded for large inputs."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    threads = blake3.blake3.AUTO if len(view) >= (1 << 20) else 1
    return blake3.blake3(view, max_threads=threads).digest()


# --------------------------------------------------------------------------- holder side


class Redeemer(Protocol):
    """What a :class:`Ticket` asks of the node that received it (a :class:`handoff.node.Node`,
    above this module): pull bytes from the owner, renew the hold, end it."""

    async def _pull(self, ticket: "Ticket", off: int, n: int, whole: bool) -> memoryview: ...

    async def _renew(self, ticket: "Ticket") -> None: ...

    def _ticket_released(self, desc: wire.TicketDesc, label: str) -> None: ...


def _send_unlease(node_ref: "weakref.ref[Redeemer]", desc: wire.TicketDesc, label: str) -> None:
    node = node_ref()
    if node is not None:
        node._ticket_released(desc, label)


class Ticket:
    """A received ticket (lazy redemption): a claim on ``len(ticket)`` bytes that its owner keeps.

    ``await ticket.read(off, n)`` pulls a range, ``await ticket.redeem()`` pulls everything
    and checks the digest; the hold ends (``unlease``) on :meth:`release`, or when the
    ticket is garbage-collected.
    """

    def __init__(self, node: Redeemer, desc: wire.TicketDesc, owner_label: str):
        self.desc = desc
        self.owner_label = owner_label
        #: Taken over by a data handle (its fallback): the envelope's release leaves it alone.
        self.adopted = False
        #: On a node on the Rust engine: the engine's claim behind this ticket, whose hold
        #: ends when it is released or dropped (:mod:`handoff.engine_node`).
        self.native: Any = None
        self._node = weakref.ref(node)
        self._finalizer = weakref.finalize(self, _send_unlease, self._node, desc, owner_label)
        self._finalizer.atexit = False

    @property
    def owner(self) -> str:
        return self.desc.owner

    @property
    def lease(self) -> int:
        return self.desc.lease

    @property
    def lazy(self) -> bool:
        """Whether the sender asked for it to be pulled only on use (it is not redeemed on receipt)."""
        return self.desc.lazy

    def __len__(self) -> int:
        return self.desc.n

    def _node_or_fail(self) -> Redeemer:
        node = self._node()
        if node is None:
            raise PeerClosed("the node that received this ticket is closed")
        return node

    async def read(self, off: int, n: int) -> memoryview:
        """Pulls bytes ``off .. off + n`` (not checked against the digest, which covers the whole buffer)."""
        return await self._node_or_fail()._pull(self, off, n, whole=False)

    async def redeem(self) -> memoryview:
        """Pulls the whole buffer and checks its digest, XXH3-128 or BLAKE3 (``TicketCorrupt`` if it differs)."""
        return await self._node_or_fail()._pull(self, 0, self.desc.n, whole=True)

    async def renew(self) -> None:
        """Extends this node's hold by the lease's ttl."""
        await self._node_or_fail()._renew(self)

    def release(self) -> None:
        """Ends this node's hold now (``unlease``); the ticket cannot be used afterwards."""
        self._finalizer()
        if self.native is not None:
            self.native.release()  # now, even if a traceback still refers to it
            self.native = None

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"Ticket({self.desc.n} bytes, owner {self.owner_label}, lease {self.desc.lease})"

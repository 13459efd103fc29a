"""Which connections a node lets in (spec §9.1, §5.1 step 6, §5.4 step 7).

- At most ``max_handshakes`` accepted connections handshake at once: a new one closes
  the oldest (:meth:`Admission.begin_handshake`).
- After the preambles, at most ``max_connections`` established connections
  (:meth:`Admission.room`).
- Before ``ready``, a node id names one node in one process: a peer claiming an id that
  is connected (or being claimed) from another process is refused
  (:meth:`Admission.check_node_id`); the claim lasts until the connection is registered
  or closes (:meth:`Admission.unclaim`).

The node passes in how to find a connected peer by node id and how many connections it
has; this module knows nothing else of it.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable, Optional

from . import wire
from handoff.bounds import Bounds
from .transport import Transport

__all__ = ["Admission", "Handshaking"]


class Handshaking:
    """An accepted connection whose handshake is in progress (for the cap on them, §9.1)."""

    __slots__ = ("transport", "task", "evicted")

    def __init__(self, transport: Transport, task: Optional[asyncio.Task]):
        self.transport = transport
        self.task = task
        #: Closed to make room for a newer handshake.
        self.evicted = False


class Admission:
    """One node's admission of connections: ``node_id`` is the node's own id,
    ``peer_by_id(node_id)`` its open connection to a node (or ``None``) and
    ``connections()`` how many connections it has."""

    def __init__(
        self,
        node_id: str,
        bounds: Bounds,
        peer_by_id: Callable[[str], Any],
        connections: Callable[[], int],
    ):
        self._node_id = node_id
        self._bounds = bounds
        self._peer_by_id = peer_by_id
        self._connections = connections
        self._handshaking: "collections.OrderedDict[int, Handshaking]" = collections.OrderedDict()
        self._claims: dict = {}  # node id -> [process id, claims], between step 6 of a handshake and registering

    def room(self) -> Optional[tuple]:
        """After the preambles: room for one more established connection? (§9.1) ``None``,
        or the ``(code, message)`` of the error that refuses it."""
        n = self._connections()
        if n >= self._bounds.max_connections:
            # Said to a peer that proved nothing: no name, nothing that identifies us.
            return (
                "overloaded",
                f"this node has {n} connections, the most it allows; try again later",
            )
        return None

    def check_node_id(self, ident: wire.Ident, transport: Transport) -> Optional[str]:
        """The step before ``ready`` (§5.1 step 6, §5.4 step 7): a node id names one node in one process.

        A node id connected (or passing this step on another connection) from another
        process is refused; the same process may open a second connection. ``ident`` is
        the peer's ident (v2) or its hello's identity (v1), sent by a peer that proved the secret."""
        if ident.node == self._node_id:
            return f"the peer claims this node's own node id {ident.node}"
        other = self._peer_by_id(ident.node)
        claim = self._claims.get(ident.node)
        proc = other.ident.proc if other is not None else claim[0] if claim is not None else None
        if proc is not None and proc != ident.proc:
            return (
                f"node id {ident.node} is already connected from another process (proc {proc}, this one says "
                f"{ident.proc}): two processes claim one node id (a copied configuration? a forked process?)"
            )
        if claim is None or claim[0] != ident.proc:
            claim = self._claims[ident.node] = [ident.proc, 0]
        claim[1] += 1
        transport.claimed = ident.node
        return None

    def unclaim(self, transport: Transport) -> None:
        """Ends the connection's claim of its node id (registered, or closed)."""
        node = getattr(transport, "claimed", None)
        if node is None:
            return
        transport.claimed = None
        claim = self._claims.get(node)
        if claim is not None:
            claim[1] -= 1
            if claim[1] <= 0:
                del self._claims[node]

    def begin_handshake(self, transport: Transport) -> Handshaking:
        """Registers an accepted connection's handshake, closing the oldest beyond the cap (§9.1)."""
        while len(self._handshaking) >= self._bounds.max_handshakes:
            _, oldest = self._handshaking.popitem(last=False)
            oldest.evicted = True
            if oldest.task is not None:
                oldest.task.cancel()
        entry = Handshaking(transport, asyncio.current_task())
        self._handshaking[id(entry)] = entry
        return entry

    def end_handshake(self, entry: Handshaking) -> None:
        """The handshake of ``entry`` is over (done, failed or evicted)."""
        self._handshaking.pop(id(entry), None)

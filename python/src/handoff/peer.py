"""A connected node (:class:`Peer`): who it is, its route, and its own queue of messages.

The connection under it is the implementation's: the engine's
(:class:`handoff.engine_node.EnginePeer`) or the pure-Python reference's
(``handoff_pure.peer.Peer``).
"""

from __future__ import annotations

from typing import Any, Optional

from . import wire
from .envelope import Envelope
from .errors import HandoffError, PeerClosed
from .inbox import ConnectionQueue
from .route import Route

__all__ = ["Peer"]


class Peer:
    """A connected node. Get one from :meth:`Node.connect <handoff.node.Node.connect>`,
    :meth:`Node.peer <handoff.node.Node.peer>` or ``envelope.sender``.

    What every kind of connection shares, the engine's (:mod:`handoff.engine_node`) and
    the pure-Python reference's (``handoff_pure.peer``): who the peer is and how it is
    reached, from its ``ident`` (what it said in the handshake) and the node's own
    identity, and the connection's own queue of messages on a ``per_connection`` node
    (taken with :meth:`recv`). A class that builds on it sets ``node``, ``ident``,
    ``channel``, ``protocol_version``, ``queue`` and ``_routes = None``, and sends
    (``send``, ``send_now``, ``send_packed``) and ends (``close``, ``abort``) the connection."""

    node: Any
    ident: wire.Ident
    channel: str
    protocol_version: int
    queue: Optional[ConnectionQueue]
    _routes: Optional[tuple]

    @property
    def name(self) -> str:
        return self.ident.name

    @property
    def node_id(self) -> str:
        return self.ident.node

    @property
    def host_id(self) -> str:
        return self.ident.host

    @property
    def lang(self) -> str:
        return self.ident.lang

    @property
    def caps(self) -> list:
        return list(self.ident.caps)

    @property
    def listen_addr(self) -> Optional[str]:
        return self.ident.listen

    @property
    def unix_addr(self) -> Optional[str]:
        return self.ident.unix

    @property
    def locality(self) -> str:
        """``remote``, ``same-host`` or ``same-process`` (spec §1; :func:`handoff.route.locality_between`)."""
        return self.route.locality

    @property
    def route(self) -> Route:
        """The route of what this node sends to the peer (:mod:`handoff.route`)."""
        if self._routes is None:
            out = Route.outbound(self)
            self._routes = (out, out.reversed())
        return self._routes[0]

    @property
    def inbound_route(self) -> Route:
        """The route of what the peer sends to this node."""
        routes = self._routes
        if routes is None:
            self.route
            routes = self._routes
        return routes[1]

    def _warn(self, fmt: str, *args: Any) -> None:
        """A warning about this peer, rate-limited per peer (§9.1)."""
        self.node._throttle.warn(f"peer {self.name}", "%s: " + fmt, self.node.name, *args)

    async def recv(self, timeout: Optional[float] = None) -> Envelope:
        """The next message of this connection (``per_connection`` nodes only).

        Messages that arrived before the connection ended are still returned; then it
        raises :class:`PeerClosed`. Taking a message gives its bytes back to the node's
        buffered bounds (§9.1), as :meth:`Node.recv` does."""
        if self.queue is None:
            raise HandoffError("this node delivers every message to Node.recv() (built without per_connection)")
        env = await self.queue.get(timeout)
        if env is None:
            raise PeerClosed(f"the connection to {self.name} is closed")
        self.node._budget.release_env(env)
        return env

    def _drop_queued(self) -> None:
        if self.queue is not None:
            for env in self.queue.close(drop=True):
                self.node._budget.release_env(env)

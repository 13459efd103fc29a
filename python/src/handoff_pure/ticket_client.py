"""The holder side of tickets for one node (spec §7.6–§7.8): reaching a ticket's owner
(its connection, or one dial per owner and address), and the requests a holder sends it
(``pull``, ``renew``, ``forward``, ``unlease``) with their answers; eager redemption of a
received message's tickets.

:class:`~handoff.tickets.Ticket` calls the node (``_pull``, ``_renew``,
``_ticket_released``), which hands these to its :class:`TicketClient`. The client sits
below the node: what it uses of it is :class:`ClientNode`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional, Protocol

from . import wire
from handoff.addresses import split_host_port, strip_scheme

from .addresses import is_own_address
from handoff.envelope import Envelope
from handoff.errors import HandoffError, OwnerLost, PeerClosed, TicketCorrupt, TicketRefused
from handoff.tickets import Ticket
from .leases import check_digest

__all__ = ["TicketClient", "ClientNode"]

log = logging.getLogger("handoff")

#: Seconds after a request of ours a kept owner connection does not make room for another
#: (the request is counted as outstanding only once it is sent), as the engine's
#: ``handoff_proto::dialing::RECENTLY_USED``.
RECENTLY_USED = 0.1


class OwnerBusy(HandoffError):
    """No kept owner connection can make room for another (§9.1)."""


class ClientNode(Protocol):
    """What a :class:`TicketClient` uses of its node (a :class:`handoff.node.Node`)."""

    name: str
    node_id: str
    listen_addr: Optional[str]
    pull_timeout: float
    loop: asyncio.AbstractEventLoop
    _budget: Any
    _closed: bool

    def peer_by_id(self, node_id: str) -> Any: ...

    async def connect(self, addr: str, channel: Optional[str] = None) -> Any: ...

    def _spawn(self, coro: Any) -> asyncio.Task: ...

    def _warn_about(self, source: str, fmt: str, *args: Any) -> None: ...


class TicketClient:
    """A node's requests to the owners of the tickets it holds.

    ``node`` is the node that received the tickets; at most ``max_owner_dials`` owners are
    dialled at once, and at most ``max_owner_connections`` connections so dialled are kept
    (§9.1)."""

    def __init__(self, node: ClientNode, max_owner_dials: int, max_owner_connections: int = 64):
        self._node = node
        self._dial_slots = asyncio.Semaphore(max_owner_dials)
        self._dialing: dict = {}  # (owner, addr) -> task connecting to it
        self._next_req = 1
        #: Owners this node dialed whose connection it keeps, least recently used first.
        self._kept: dict = {}
        self._kept_max = max(1, max_owner_connections)
        #: Places reserved by dials under way.
        self._reserved = 0
        #: Tickets received and not yet released, by owner: a connection to an owner where
        #: this node holds something is never closed to make room (that would end the holds).
        self._holds: dict = {}

    def held(self, owner: str) -> None:
        """A ticket of ``owner``'s was received: a hold there until it is released."""
        self._holds[owner] = self._holds.get(owner, 0) + 1

    def _make_room(self) -> None:
        """Reserves a place for one more dialled owner (§9.1): when all are taken, closes the
        connection unused longest with no request of ours outstanding, no ticket of its
        owner's held and no request in the last :data:`RECENTLY_USED` seconds; or raises
        :class:`OwnerBusy` saying why none can go."""
        for owner in [o for o in self._kept if self._node.peer_by_id(o) is None]:
            del self._kept[owner]  # closed since (by either side)
        if len(self._kept) + self._reserved >= self._kept_max:
            now = time.monotonic()
            idle = next(
                (
                    o
                    for o, used in self._kept.items()
                    if not self._node.peer_by_id(o).pending and o not in self._holds and now - used >= RECENTLY_USED
                ),
                None,
            )
            if idle is None:
                raise OwnerBusy(
                    f"this node keeps {len(self._kept) + self._reserved} connections to ticket owners it dialed "
                    "(its bound), and none can close: each has a request outstanding, tickets of its owner held, "
                    f"or was used within {RECENTLY_USED} s"
                )
            del self._kept[idle]
            # What we queued is written first, and the owner has a moment to close its side.
            self._node._spawn(self._node.peer_by_id(idle).close())
        self._reserved += 1

    def _used(self, owner: str) -> None:
        if owner in self._kept:
            del self._kept[owner]
            self._kept[owner] = time.monotonic()  # the most recently used now

    def owner_label(self, desc: wire.TicketDesc) -> str:
        p = self._node.peer_by_id(desc.owner)
        if p is not None:
            return f"{p.name} ({desc.addr})" if desc.addr else p.name
        return f"{desc.owner[:12]} ({desc.addr})" if desc.addr else desc.owner

    def _dial_refusal(self, desc: wire.TicketDesc) -> Optional[str]:
        """Why a holder must not dial this ticket's ``addr`` (§9.1), or ``None``."""
        if desc.owner == self._node.node_id:
            return "the ticket names this node itself as its owner; a node does not dial itself"
        if not desc.addr:
            return "not connected to the owner, and the ticket has no address"
        if not desc.addr.startswith("tcp://"):
            return f"its address {desc.addr!r} is not a tcp:// address"
        try:
            host, port = split_host_port(strip_scheme(desc.addr, "tcp://"))
        except ValueError:
            return f"its address {desc.addr!r} is not a tcp://HOST:PORT address"
        if is_own_address(self._node.listen_addr, host, port):
            return f"its address {desc.addr} is this node's own listen address; a node does not dial itself"
        return None

    async def _dial_owner(self, desc: wire.TicketDesc) -> Any:
        # At most ``max_owner_dials`` at once (§9.1); the wait counts in the caller's timeout.
        async with self._dial_slots:
            self._make_room()
            try:
                # Pinned to TCP: pulled bytes travel inline on any channel, and switching to the
                # owner's Unix socket would close the TCP connection, which owners may take as
                # the loss of this node's hold (the reference does, §7.7).
                p = await asyncio.wait_for(self._node.connect(desc.addr, channel="tcp"), self._node.pull_timeout)
            finally:
                self._reserved -= 1
        if p.node_id != desc.owner:
            await p.close()
            raise HandoffError(f"the node at {desc.addr} is {p.node_id}, not the ticket's owner")
        self._kept[desc.owner] = time.monotonic()
        return p

    async def _owner_peer(self, ticket: Ticket) -> Any:
        desc = ticket.desc
        p = self._node.peer_by_id(desc.owner)
        if p is not None:
            self._used(desc.owner)
            return p
        why = self._dial_refusal(desc)
        if why is not None:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, why)
        key = (desc.owner, desc.addr)
        task = self._dialing.get(key)
        if task is None:  # one dial per owner and address, whoever waits for it
            task = self._dialing[key] = self._node._spawn(self._dial_owner(desc))
            task.add_done_callback(lambda t, key=key: (self._dialing.pop(key, None), t.cancelled() or t.exception()))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._node.pull_timeout)
        except asyncio.TimeoutError:
            raise OwnerLost(
                ticket.owner_label, desc.lease, desc.n, f"connecting took over {self._node.pull_timeout}s"
            ) from None
        except asyncio.CancelledError:
            if task.cancelled() and not self._node._closed:
                raise OwnerLost(
                    ticket.owner_label, desc.lease, desc.n, "the connection attempt was cancelled"
                ) from None
            raise
        except OwnerLost:
            raise
        except OwnerBusy as e:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, str(e)) from None
        except Exception as e:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"cannot connect: {e}") from None

    async def _request(
        self, ticket: Ticket, what: str, make, expect: Optional[int] = None, whole: bool = False
    ) -> tuple:
        desc = ticket.desc
        peer = await self._owner_peer(ticket)
        req = self._next_req
        self._next_req += 1
        fut = self._node.loop.create_future()
        peer.pending[req] = (fut, what, expect, whole)
        self._node._budget.wake()  # its reader, if it waits for room, may now go over the bounds
        try:
            try:
                await peer._send_control(make(req))
            except PeerClosed as e:
                raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"sending the {what}: {e}") from None
            try:
                result = await asyncio.wait_for(fut, self._node.pull_timeout)
            except asyncio.TimeoutError:
                raise OwnerLost(
                    ticket.owner_label, desc.lease, desc.n, f"no answer to the {what} within {self._node.pull_timeout}s"
                ) from None
        finally:
            if not fut.done() or fut.cancelled():
                # No answer came (not sent, the pull timeout, or the caller cancelled): the
                # request is forgotten, so the connection no longer waits for one.
                peer.pending.pop(req, None)
        if result[0] == "refused":
            raise TicketRefused(ticket.owner_label, desc.lease, what, result[1], result[2])
        if result[0] == "lost":
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, result[1])
        return result

    async def pull(self, ticket: Ticket, off: int, n: int, whole: bool) -> memoryview:
        if ticket.released:
            raise HandoffError(f"the ticket for lease {ticket.lease} was released")
        desc = ticket.desc
        # Only a BLAKE3 digest is hashed while the bytes arrive; XXH3 runs at memory speed after.
        result = await self._request(
            ticket, "pull", lambda req: wire.Pull(req, desc.lease, desc.token, off, n), n, whole and desc.xxh3 is None
        )
        if result[0] != "bytes":
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, "answered a pull with a token")
        view, hashed = result[1], result[2]
        if len(view) != n:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"asked for {n} bytes, got {len(view)}")
        if whole:
            if hashed is not None:  # BLAKE3, hashed while it arrived (handoff.tickets.StreamDigest)
                ok = await asyncio.wrap_future(hashed) == desc.digest
            elif n >= (8 << 20):
                ok = await asyncio.get_running_loop().run_in_executor(None, check_digest, desc, view)
            else:
                ok = check_digest(desc, view)
            if not ok:
                raise TicketCorrupt(ticket.owner_label, desc.lease)
        return view

    async def renew(self, ticket: Ticket) -> None:
        peer = await self._owner_peer(ticket)
        await peer._send_control(wire.Renew(ticket.desc.lease, ticket.desc.token))

    async def forward(self, ticket: Ticket, to: str) -> wire.TicketDesc:
        desc = ticket.desc
        result = await self._request(ticket, "forward", lambda req: wire.Forward(req, desc.lease, desc.token, to))
        if result[0] != "token":
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, "answered a forward with bytes")
        return wire.TicketDesc(
            n=desc.n,
            owner=desc.owner,
            addr=desc.addr,
            lease=desc.lease,
            token=result[1],
            digest=desc.digest,
            ttl=desc.ttl,
            lazy=desc.lazy,
            xxh3=desc.xxh3,
        )

    def released(self, desc: wire.TicketDesc, label: str) -> None:
        """A ticket handle was released or collected: send ``unlease`` (any thread)."""
        try:
            self._node.loop.call_soon_threadsafe(self._unlease, desc)
        except (RuntimeError, AttributeError):
            pass

    def _unlease(self, desc: wire.TicketDesc) -> None:
        left = self._holds.get(desc.owner, 0) - 1
        if left > 0:
            self._holds[desc.owner] = left
        else:
            self._holds.pop(desc.owner, None)
        p = self._node.peer_by_id(desc.owner)
        if p is None:
            log.debug(
                "%s: not connected to the owner of lease %d; its deadline will end the hold",
                self._node.name,
                desc.lease,
            )
            return
        if not p._queue_unlease(desc.lease, desc.token):
            log.debug(
                "%s: too many unleases unwritten to %s; the deadline of lease %d ends its hold",
                self._node.name,
                p.name,
                desc.lease,
            )

    async def redeem_all(self, env: Envelope) -> None:
        """Eager redemption: pulls every ticket of the message, then ends each hold (§7.6).

        Tickets the sender marked ``lazy`` are left for the application to pull on use."""
        for f in env.frames:
            if f.kind != "ticket" or not isinstance(f.view, Ticket) or f.view.desc.lazy:
                continue
            ticket = f.view
            try:
                f.view = await ticket.redeem()
            except Exception as e:
                self._node._warn_about(
                    f"peer {env.sender.name}", "a ticket from %s could not be redeemed: %s", env.sender.name, e
                )
                env.error = e.with_traceback(None)
                for g in env.frames:
                    if isinstance(g.view, Ticket):
                        g.view.release()
                return
            finally:
                ticket.release()

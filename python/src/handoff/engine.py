"""The asyncio driver of the Rust engine (``handoff._native``, crate ``handoff-proto``).

The engine decides everything a connection does: the handshake of every version, then
reading, the bounds, the receive budget, shared memory and the owner's answers to ticket
requests. This module only tells it what the event loop sees: a readable or writable
socket (``add_reader``/``add_writer``), a deadline (``call_later``), and the engine's wake
pipe (room given back in the receive budget, a received view of a peer's segment dropped).
Each callback hands the engine what is there and takes whole events back; nothing waits
in Rust, and nothing crosses threads.

Every connection of :class:`handoff.Node` (:mod:`handoff.engine_node`) and of the Dask
backend runs here.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import itertools
import logging
import socket
from typing import Awaitable, Callable, Optional

from .addresses import tcp_socket
from .errors import (
    AuthenticationError,
    CapReached,
    HandoffError,
    MessageTooLarge,
    OwnerLost,
    PeerClosed,
    PeerRefused,
    TicketCorrupt,
    TicketRefused,
    TlsError,
)
from .native import REASON, ext
from .tls import required_by as tls_required_by

if ext is None:
    raise ImportError(f"handoff.engine runs on the extension handoff._native, which is not in use: {REASON}")
_native = ext

Engine = _native.Engine
Frame = _native.Frame
OnDemand = _native.OnDemand
Received = _native.Received
Ticket = _native.Ticket
DeviceClaim = _native.DeviceClaim
DeviceFrame = _native.DeviceFrame


log = logging.getLogger("handoff")


class ConnectionFailed(PeerClosed):
    """The connection ended with an error: the engine refused what the peer did (``by_peer``
    false, and the peer was told), or the peer refused us (``by_peer`` true)."""

    def __init__(self, label: str, code: str, message: str, by_peer: bool):
        who = f"{label} refused" if by_peer else f"refused {label}"
        super().__init__(f"{who}: {message} [{code}]")
        self.label, self.code, self.message, self.by_peer = label, code, message, by_peer


def _error(label: str, code: str, message: str, by_peer: bool) -> Exception:
    if code == "auth-failed":
        return AuthenticationError(f"{label}: {message}")
    if code == "tls":
        return TlsError(f"TLS with {label}: {message}")
    if code == "tls-required" and by_peer:
        # A node that requires TLS refused our plain connection (spec §3.1).
        return tls_required_by(label, message)
    if by_peer:
        return PeerRefused(label, code, message)
    return ConnectionFailed(label, code, message, by_peer)


def _tcp_socket(addr: str):
    """:func:`handoff.addresses.tcp_socket`, its error naming both forms a driver takes."""
    try:
        return tcp_socket(addr)
    except ValueError:
        raise ValueError(f"not an address: {addr!r} (tcp://HOST:PORT, [V6HOST]:PORT, or unix://PATH)") from None


class Driver:
    """Runs one engine's connections on this event loop.

    ``engine`` is a :class:`handoff._native.Engine`; the driver watches its wake pipe.
    """

    def __init__(
        self,
        engine: Engine,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        *,
        pull_timeout: float = 30.0,
        redeem: str = "lazy",
    ):
        if redeem not in ("eager", "lazy"):
            raise ValueError(f"redeem is 'eager' or 'lazy', not {redeem!r}")
        #: ``eager``: a received message's tickets (but the sender's lazy ones) are pulled
        #: before it is delivered, in the order messages arrived; ``lazy``: they are
        #: delivered as :class:`Ticket` for the application to redeem.
        self.redemption = redeem
        self.engine = engine
        self.loop = loop or asyncio.get_running_loop()
        self.connections: set[EngineConnection] = set()
        #: Ready connections by the peer's node id, oldest first (the newest is used).
        self._by_id: dict[str, list[EngineConnection]] = {}
        #: Ticket owners being dialed at once (spec §9.1: at most ``max_ticket_dials``).
        self._dials = asyncio.Semaphore(max(1, engine.bounds["max_ticket_dials"]))
        #: How long a ticket request waits for the owner's answer.
        self.pull_timeout = pull_timeout
        self._wake_fd = engine.wake_fd()
        #: How a ticket's owner is dialed (``dial(addr, timeout)``, giving a ready
        #: connection): a node sets it so that such a connection is one of its peers too.
        self.dial: Optional[Callable[[str, float], Awaitable["EngineConnection"]]] = None
        self._lease_room: Optional[asyncio.Future] = None
        self._room: Optional[asyncio.Future] = None
        #: Gives idle shared memory back to the host from time to time (Engine.sweep_idle).
        self._sweeper: Optional[asyncio.TimerHandle] = self.loop.call_later(engine.sweep_idle(), self._sweep)
        self._expiry: Optional[asyncio.TimerHandle] = None
        self.loop.add_reader(self._wake_fd, self._on_wake)

    def connection_to(self, node_id: str) -> Optional["EngineConnection"]:
        """The newest open connection to node ``node_id``."""
        for c in reversed(self._by_id.get(node_id, ())):
            if not c._ended:
                return c
        return None

    def _on_wake(self) -> None:
        self.engine.take_wake()
        for c in list(self.connections):
            c._flush()  # (each fails only itself: `_run`)
        # Holds on other nodes' buffers whose last handle was dropped: tell their owners.
        for owner, lease, token in self.engine.take_ended_holds():
            c = self.connection_to(owner)
            if c is not None:
                try:
                    c.conn.send_unlease(lease, token)
                    c._after()
                except OSError:
                    pass  # the connection is gone: the hold ends with it (or its ttl)
        for room in (self._lease_room, self._room):
            if room is not None and not room.done():
                room.set_result(None)

    async def _reserve(self, received: Received, behind: Callable[[], int], pulled: Optional[int] = None) -> None:
        """Takes room for ``received``'s tickets before they are pulled (the engine knows
        their bytes; or for ``pulled`` other bytes), waiting until room is given back in the
        receive budget (``behind()``: the room of the messages waiting after it)."""
        if received.reserve(behind(), pulled):
            return
        # Counted as waiting before trying again: room given back from now on fires the
        # wake pipe, whose handler wakes the future made before this task yields. A message
        # queued behind it (which the budget is not told of) is seen within ROOM_RECHECK.
        self.engine.wait_for_room(True)
        try:
            while not received.reserve(behind(), pulled):
                if self._room is None or self._room.done():
                    self._room = self.loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._room), _native.ROOM_RECHECK)
                except TimeoutError:
                    pass
        finally:
            self.engine.wait_for_room(False)

    async def _wait_for_lease_room(self, timeout: Optional[float]) -> None:
        """Waits until a hold in the lease table ends (or `timeout` passes)."""
        if self._lease_room is None or self._lease_room.done():
            self._lease_room = self.loop.create_future()
        self.engine.wait_for_leases(True)
        try:
            await asyncio.wait_for(asyncio.shield(self._lease_room), timeout)
        except TimeoutError:
            pass
        finally:
            self.engine.wait_for_leases(False)

    def _arm_expiry(self) -> None:
        """Ends the leases whose holds all expired, when they are due."""
        if self._expiry is not None:
            return
        _, due = self.engine.expire_leases()
        if due is not None:
            self._expiry = self.loop.call_later(due + 0.001, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self._arm_expiry()

    # ------------------------------------------------------------------ tickets

    def owner_label(self, ticket: Ticket) -> str:
        """How errors name a ticket's owner, as the Rust node names it
        (``handoff_proto::ticket_requests::owner_label``): its name if connected, and the
        address the ticket carries. A holder fixes its label when it receives the ticket
        and passes it as ``label`` to the methods below, as the Rust node does."""
        c = self.connection_to(ticket.owner)
        name = c.peer["name"] if c is not None and c.peer is not None else None
        return ticket.owner_label(name)

    def _lost(self, ticket: Ticket, why: str, label: Optional[str]) -> OwnerLost:
        return OwnerLost(label or self.owner_label(ticket), ticket.lease, len(ticket), why)

    async def owner_of(self, ticket: Ticket, label: Optional[str] = None) -> "EngineConnection":
        """A connection to the ticket's owner: the one we have, or a new one to its address."""
        owner = ticket.owner
        why = self.engine.check_owner(owner)
        if why is not None:
            raise self._lost(ticket, why, label)
        c = self.connection_to(owner)
        if c is not None:
            self.engine.owner_used(owner)
            return c
        addr, why = ticket.dial_target(self.engine)
        if why is not None:
            raise self._lost(ticket, why, label)
        deadline = self.loop.time() + self.pull_timeout
        try:
            # Only so many dials at once: a flood of tickets cannot make this node open
            # connections without bound.
            await asyncio.wait_for(self._dials.acquire(), self.pull_timeout)
        except TimeoutError:
            raise self._lost(ticket, f"no turn to connect within {self.pull_timeout} s", label) from None
        try:
            c = self.connection_to(owner)
            if c is not None:
                self.engine.owner_used(owner)
                return c
            # Only so many kept (spec §9.1): the one unused longest, with no request of ours
            # outstanding and none of its tickets held, makes room.
            busy = {node_id for node_id, conns in self._by_id.items() if any(x._requests for x in conns)}
            try:
                idle = self.engine.owner_make_room(set(self._by_id), busy)
            except ValueError as e:
                raise self._lost(ticket, str(e), label) from None
            for x in list(self._by_id.get(idle, ())) if idle is not None else ():
                log.debug("closing an idle connection to the ticket owner %s to dial another", x.label)
                x.close()  # (what is queued is written first, as far as the socket takes it)
            try:
                left = max(0.001, deadline - self.loop.time())
                c = await (self.dial(addr, left) if self.dial is not None else self.connect(addr, timeout=left))
            except (OSError, TimeoutError, HandoffError) as e:
                self.engine.owner_gave_up()
                raise self._lost(ticket, f"cannot connect to {addr}: {e}", label) from None
            except BaseException:
                self.engine.owner_gave_up()
                raise
        finally:
            self._dials.release()
        why = self.engine.check_reached_owner(addr, c.peer["node_id"], owner)
        if why is not None:
            self.engine.owner_gave_up()
            c.close()
            raise self._lost(ticket, why, label)
        self.engine.owner_dialed(owner)
        return c

    async def redeem(self, ticket: Ticket, label: Optional[str] = None) -> Frame:
        """Pulls the whole buffer from its owner and checks it against the ticket's digest."""
        c = await self.owner_of(ticket, label)
        blake3 = ticket.digest[0] == "blake3"
        frame, hashed = await c._pull(ticket, 0, len(ticket), blake3, label)
        if not ticket.verify(frame, hashed):
            raise TicketCorrupt(label or self.owner_label(ticket), ticket.lease)
        return frame

    async def read(self, ticket: Ticket, offset: int, length: int, label: Optional[str] = None) -> Frame:
        """Pulls only ``length`` bytes from ``offset`` of the ticket's buffer."""
        c = await self.owner_of(ticket, label)
        frame, _ = await c._pull(ticket, offset, length, False, label)
        return frame

    async def forward(self, ticket: Ticket, to: str, label: Optional[str] = None) -> Ticket:
        """Asks the owner to make node ``to`` a holder; returns ``to``'s claim."""
        c = await self.owner_of(ticket, label)
        kind, value = await c._request(ticket, "forward", c.conn.request_forward(ticket, to), label)
        if kind != "token":
            raise self._lost(ticket, f"answered a forward with {value}", label)
        return ticket.forwarded(value, to)

    async def renew(self, ticket: Ticket, label: Optional[str] = None) -> None:
        """Extends this node's hold on the ticket's lease by its ttl."""
        c = await self.owner_of(ticket, label)
        c.conn.send_renew(ticket)
        c._after()

    async def connect(
        self, addr: str, *, admit: Optional[Callable[[dict], Optional[str]]] = None, timeout: float = 30.0
    ) -> "EngineConnection":
        """Dials ``tcp://HOST:PORT`` or ``unix://PATH`` and runs the handshake; returns once
        the peer is ready. ``admit(peer)`` may refuse the peer's identity with a reason."""
        host = None
        if addr.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: object = addr[len("unix://") :]
        else:
            sock, target = _tcp_socket(addr)
            host = target[0]
        sock.setblocking(False)
        try:
            await asyncio.wait_for(self.loop.sock_connect(sock, target), timeout)
        except BaseException:
            sock.close()
            raise
        ec = self.adopt(sock, "dialer", addr, admit=admit, host=host)
        try:
            await ec.ready(timeout)
        except BaseException:
            ec.close()
            raise
        return ec

    def adopt(
        self, sock: socket.socket, role: str, label: str, *, admit=None, host: Optional[str] = None
    ) -> "EngineConnection":
        """Runs a connection on a socket that is already connected (a listener's, a
        ``socketpair``'s); ``role`` is ``dialer`` or ``acceptor``. With TLS, a dialer checks
        the peer's certificate against ``host``. Await its ``ready()``."""
        unix = sock.family == socket.AF_UNIX
        try:
            if not unix:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            names = (sock.getsockname(), sock.getpeername())
        except OSError:
            sock.close()  # (reset already, say): closed here, as the extension closes its own
            raise
        conn = _native.Connection(self.engine, sock.detach(), role, label, unix, admit, host)
        ec = EngineConnection(self, conn)
        ec.sockname, ec.peername = names
        return ec

    async def listen(
        self, addr: str = "tcp://127.0.0.1:0", *, admit=None, max_handshakes: int = 64, max_unaccepted: int = 64
    ) -> "Listener":
        """Listens on ``tcp://HOST:PORT`` or ``unix://PATH``; :meth:`Listener.accept` gives
        the connections whose handshake is over. At most ``max_handshakes`` handshakes run
        at once and ``max_unaccepted`` ready connections wait for ``accept``: a connection
        past either is closed at once."""
        unix = addr.startswith("unix://")
        sock, target = (
            (socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), addr[len("unix://") :]) if unix else _tcp_socket(addr)
        )
        try:
            if not unix:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(target)
            sock.listen(128)
        except BaseException:
            sock.close()  # (a path or port it cannot have keeps no descriptor)
            raise
        sock.setblocking(False)
        return Listener(self, sock, admit, max_handshakes, max_unaccepted)

    def _sweep(self) -> None:
        self._sweeper = self.loop.call_later(self.engine.sweep_idle(), self._sweep)

    def close(self) -> None:
        """Closes every connection and stops watching the wake pipe."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for c in list(self.connections):
            c.close()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._wake_fd >= 0:
            self.loop.remove_reader(self._wake_fd)
            self._wake_fd = -1
            # Its descriptors go now: the engine's state may live on in objects that only a
            # collection frees (connections in reference cycles, tickets, views).
            self.engine.close_wake()


#: Connections a listener accepts per turn of the loop.
ACCEPTS_PER_TURN = 32
#: Refusals (``overloaded``) a listener runs at once, each at most :data:`REFUSAL_TIME`;
#: a connection past them is closed without a word.
MAX_REFUSALS = 64
#: How long a refusal waits for the peer's preamble before it closes (seconds).
REFUSAL_TIME = 1.0
#: How long a listener rests when the process is out of descriptors.
ACCEPT_REST = 0.1


class Listener:
    """Accepts connections and runs their handshakes (see :meth:`Driver.listen`)."""

    def __init__(
        self,
        driver: Driver,
        sock: socket.socket,
        admit,
        max_handshakes: int,
        max_unaccepted: int,
        on_failed: Optional[Callable[[str, BaseException], None]] = None,
    ):
        self.driver, self.sock, self.admit = driver, sock, admit
        #: Called with the label and the error of each handshake that fails (to log it).
        self.on_failed = on_failed
        self.max_handshakes, self.max_unaccepted = max_handshakes, max_unaccepted
        name = sock.getsockname()
        self.address = f"unix://{name}" if sock.family == socket.AF_UNIX else f"tcp://{name[0]}:{name[1]}"
        #: Handshakes in progress, oldest first.
        self._handshaking: dict[EngineConnection, None] = {}
        self._ready: asyncio.Queue = asyncio.Queue()
        self._resting: Optional[asyncio.TimerHandle] = None
        #: Refusals under way (sockets told ``overloaded``).
        self._refusing: set = set()
        #: Connections refused because a bound was reached, handshakes evicted for newer
        #: ones, and handshakes that failed.
        self.refused = 0
        self.evicted = 0
        self.failed = 0
        driver.loop.add_reader(sock.fileno(), self._on_acceptable)

    def _on_acceptable(self) -> None:
        # A batch per callback, so that a flood of connections shares the loop.
        for _ in range(ACCEPTS_PER_TURN):
            try:
                s, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors, for one: the connection waits in the backlog, and the
                # listener rests a moment instead of spinning on it.
                self.driver.loop.remove_reader(self.sock.fileno())
                self._resting = self.driver.loop.call_later(ACCEPT_REST, self._wake_up)
                return
            why = self.driver.engine.over_connections()
            if why is None and self._ready.qsize() >= self.max_unaccepted:
                why = f"{self.max_unaccepted} connections wait to be accepted, as many as the listener allows"
            if why is not None:
                self.refused += 1
                self._refuse(s, why)
                continue
            try:
                peer = s.getpeername()
            except OSError:
                # Reset before we took it (ENOTCONN): nothing to say to it.
                s.close()
                self.refused += 1
                continue
            label = f"{self.address} <- {peer if peer else 'a peer'}"
            try:
                ec = self.driver.adopt(s, "acceptor", label, admit=self.admit)
            except OSError:
                # A same-host peer of another user (PermissionError), a socket that broke:
                # the extension closed it.
                self.refused += 1
                continue
            if len(self._handshaking) >= self.max_handshakes:
                # The oldest handshake makes room for this one (spec §9.1): it is told
                # `overloaded`, or closed if it failed already and only drains.
                oldest = next(iter(self._handshaking))
                self._handshaking.pop(oldest)
                if oldest._ended:
                    oldest.close()
                else:
                    oldest._run(oldest.conn.evict)
                self.evicted += 1
            # Counted until it is ready or closed: a failed handshake that still drains
            # holds its descriptor.
            self._handshaking[ec] = None
            ec._ready.add_done_callback(lambda f, ec=ec: self._handshake_over(ec, f))
            ec._on_closed = lambda ec=ec: self._handshaking.pop(ec, None)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """Tells a connection the node cannot take that it is ``overloaded`` (our preamble,
        then the error once the peer's whole preamble came, spec §3, §12), and closes it;
        past :data:`MAX_REFUSALS` at once, closes it without a word."""
        if len(self._refusing) >= MAX_REFUSALS:
            sock.close()
            return
        task = self.driver.loop.create_task(self._say_overloaded(sock, why))
        self._refusing.add(task)
        task.add_done_callback(self._refusing.discard)

    async def _say_overloaded(self, sock: socket.socket, why: str) -> None:
        loop = self.driver.loop
        preamble, error = self.driver.engine.overloaded(why)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(REFUSAL_TIME):
                await loop.sock_sendall(sock, preamble)
                theirs = b""
                while len(theirs) < len(preamble):
                    got = await loop.sock_recv(sock, len(preamble) - len(theirs))
                    if not got:
                        return
                    theirs += got
                await loop.sock_sendall(sock, error)
        except (OSError, TimeoutError):
            pass
        finally:
            sock.close()

    def _wake_up(self) -> None:
        self._resting = None
        self.driver.loop.add_reader(self.sock.fileno(), self._on_acceptable)

    def _handshake_over(self, ec: "EngineConnection", f: asyncio.Future) -> None:
        error = f.exception()
        if error is None:
            self._handshaking.pop(ec, None)
            self._ready.put_nowait(ec)
            return
        self.failed += 1
        if self.on_failed is not None:
            self.on_failed(ec.label, error)

    async def accept(self, timeout: Optional[float] = None) -> "EngineConnection":
        """The next connection whose handshake is over."""
        return await asyncio.wait_for(self._ready.get(), timeout)

    def close(self) -> None:
        """Stops accepting (connections made so far stay open)."""
        if self._resting is not None:
            self._resting.cancel()
        else:
            self.driver.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for ec in list(self._handshaking):
            ec.close()
        while not self._ready.empty():  # ready, never accepted: nobody will take them
            self._ready.get_nowait().close()
        for task in list(self._refusing):
            task.cancel()


def _map_device_frames(received: Received) -> bool:
    """Maps each cuda frame of ``received`` (the sender's GPU memory, spec §7.10) in place;
    whether some could not be (their bytes are then pulled, :meth:`_copy_device_frames`)."""
    frames = received.frames
    unmapped = False
    for i, frame in enumerate(frames):
        if isinstance(frame, DeviceClaim):
            try:
                frames[i] = frame.open()
            except OSError as e:
                log.info("a cuda frame of %d bytes is copied instead: %s", len(frame), e)
                unmapped = True
    return unmapped


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no message within the timeout"))


class EngineConnection:
    """One connection on the engine: :meth:`send` (or :meth:`send_now`), :meth:`recv`,
    :meth:`close`."""

    def __init__(self, driver: Driver, conn):
        self.driver, self.conn, self.loop = driver, conn, driver.loop
        self.label: str = conn.label
        self.peer: Optional[dict] = None
        self._fd = conn.fileno()
        self._messages: collections.deque = collections.deque()
        self._waiter: Optional[asyncio.Future] = None
        self._ready: asyncio.Future = self.loop.create_future()
        self._failure: Optional[Exception] = None
        #: The ``OSError`` that ended the connection (a reset, ``ETIMEDOUT``), if one did.
        self.os_failure: Optional[OSError] = None
        #: This end's and the peer's socket addresses (set by :meth:`Driver.adopt`).
        self.sockname: object = None
        self.peername: object = None
        self._ended = False
        self._writing = False
        #: The engine's last ``state()``, if applying it again would change nothing.
        self._quiet: Optional[tuple] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._recheck: Optional[asyncio.TimerHandle] = None
        #: A call of ``on_readable`` the loop makes without the socket's say-so: reading had
        #: stopped for answers the peer left unread, they drained, and bytes read before
        #: wait in the engine (the socket may never signal them).
        self._resume: Optional[asyncio.Handle] = None
        self._reading = True
        self._on_closed: Optional[Callable[[], None]] = None
        #: Sends waiting for the peer to release shared memory (each woken by a release).
        self._release_waiters: list = []
        #: Messages whose tickets are being redeemed (eager redemption), in order; bounded by
        #: the receive budget, which each holds its room in.
        self._redeeming: collections.deque = collections.deque()
        self._redeemer: Optional[asyncio.Task] = None
        #: Our ticket requests on this connection, by id, waiting for the owner's answer.
        self._requests: dict[int, asyncio.Future] = {}
        #: Set by a node that takes each message in the loop's callback that read it
        #: (instead of :meth:`recv`): called with each ``Received``, in order.
        self.on_message: Optional[Callable[[Received], None]] = None
        #: Called once with why the connection ended, after its last message.
        self.on_end: Optional[Callable[[Exception], None]] = None
        self._end_told = False
        #: Sends waiting until the stream is written up to their message's end, in order:
        #: ``(end offset, future)``. A peer that reads nothing makes its senders wait here
        #: (and, past the write timeout, fail), not the queue grow.
        self._written_waiters: collections.deque = collections.deque()
        driver.connections.add(self)
        self.loop.add_reader(self._fd, self._on_readable)
        self._after()

    # -------------------------------------------------------------- the loop's callbacks

    def _on_readable(self) -> None:
        self._run(self.conn.on_readable)

    def _on_writable(self) -> None:
        self._run(self.conn.on_writable)

    def _on_timeout(self) -> None:
        self._timer = None
        self._run(self.conn.on_timeout)

    def _on_resume(self) -> None:
        self._resume = None
        self._run(self.conn.on_readable)

    def _on_recheck(self) -> None:
        self._recheck = None
        self._run(self.conn.flush)

    def _flush(self) -> None:
        self._run(self.conn.flush)

    def _run(self, call) -> None:
        if self._fd < 0:
            return
        try:
            events = call()
            if events:
                self._handle(events)
            self._after()
        except Exception as e:  # noqa: BLE001 - whatever it is, it ends this connection only
            if isinstance(e, OSError) and self.os_failure is None:
                self.os_failure = e
            elif not isinstance(e, OSError):
                log.warning("closing the connection to %s: %r", self.label, e)
            self._end(PeerClosed(f"{self.label}: {e}"))
            self._stop_watching()

    def _handle(self, events: list) -> None:
        for event in events:
            kind = event[0]
            if kind == "message":
                received = event[1]
                if not (self._redeeming or received.eager_tickets or received.device_frames):
                    self._deliver(received)  # (most messages: in order, at once)
                    continue
                unmapped = received.device_frames and _map_device_frames(received)
                if self._redeeming or unmapped or (received.eager_tickets and self.driver.redemption == "eager"):
                    # Redeemed in a task of its own, so that this connection keeps reading
                    # the owners' answers; later messages wait behind it to keep their order.
                    self._redeeming.append(received)
                    if self._redeemer is None:
                        self._redeemer = self.loop.create_task(self._redeem_in_order())
                else:
                    self._deliver(received)
            elif kind == "ready":
                self.peer = event[1]
                self.driver._by_id.setdefault(self.peer["node_id"], []).append(self)
                if not self._ready.done():
                    self._ready.set_result(None)
            elif kind == "pulled":
                _, req, frame, hashed = event
                fut = self._requests.pop(req, None)
                if fut is not None and not fut.done():
                    fut.set_result(("bytes", (frame, hashed)))
            elif kind == "answer":
                _, req, what, value = event
                fut = self._requests.pop(req, None)
                if fut is not None and not fut.done():
                    fut.set_result((what, value))
            elif kind == "released":
                self._wake_release_waiters()
            elif kind == "closed":
                self._end(PeerClosed(f"{self.label} closed the connection"))
            elif kind == "error":
                _, code, message, by_peer = event
                if code == "timeout" and not by_peer and self.os_failure is None:
                    # A write that made no progress, or silence inside a message: as the
                    # kernel's own timeouts say it.
                    self.os_failure = TimeoutError(errno.ETIMEDOUT, message)
                self._end(_error(self.label, code, message, by_peer))

    def _deliver(self, received: Received) -> None:
        """A message, in order: to :attr:`on_message` if a node takes them so, else queued
        for :meth:`recv`."""
        if self.on_message is not None:
            self.on_message(received)
        else:
            self._messages.append(received)
            self._wake()

    def _tell_end(self) -> None:
        """Tells :attr:`on_end` why the connection ended, once, after its last message (those
        whose tickets are being redeemed come first)."""
        if self._end_told or not self._ended or self._redeeming or self.on_end is None:
            return
        self._end_told = True
        self.on_end(self._failure or PeerClosed(f"{self.label} is closed"))

    def _after(self) -> None:
        """Watches the socket as the engine wants it (reading, writing), and arms the
        engine's deadline and its retry for room."""
        if self._written_waiters:
            written = self.conn.written
            while self._written_waiters and self._written_waiters[0][0] <= written:
                _, fut = self._written_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
        state = self.conn.state()
        if state == self._quiet and not self._ended:
            return  # (most calls: as last time, with nothing timed and nothing to resume)
        # A state with no deadline, no recheck and no resume, once applied, needs nothing
        # more while it stays the same.
        self._quiet = state if state[2] is None and state[3] is None and not state[5] else None
        read, want, delay, recheck, done, resume = state
        if self._ended and done:
            self._stop_watching()
            return
        if want != self._writing:
            if want:
                self.loop.add_writer(self._fd, self._on_writable)
            else:
                self.loop.remove_writer(self._fd)
            self._writing = want
        if read != self._reading:
            # Not while waiting for room (the wake pipe says when), while the peer leaves
            # our answers unread, or once over: a readable socket would only spin the loop.
            if read:
                self.loop.add_reader(self._fd, self._on_readable)
            else:
                self.loop.remove_reader(self._fd)
            self._reading = read
        if recheck is not None and self._recheck is None:
            self._recheck = self.loop.call_later(recheck, self._on_recheck)
        if resume and self._resume is None:
            self._resume = self.loop.call_soon(self._on_resume)
        if delay is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        at = self.loop.time() + delay
        # A timer that fires early only asks the engine again; one that would fire late is
        # moved.
        if self._timer is None or self._timer.when() > at + 0.001:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(at, self._on_timeout)

    def _end(self, failure: Exception) -> None:
        if self._ended:
            return
        self._ended = True
        self._failure = failure
        if self.peer is not None:
            live = self.driver._by_id.get(self.peer["node_id"], [])
            if self in live:
                live.remove(self)
            if not live:
                self.driver._by_id.pop(self.peer["node_id"], None)
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(PeerClosed(f"{self.label} closed before it answered"))
                fut.exception()
        self._requests.clear()
        while self._written_waiters:
            _, fut = self._written_waiters.popleft()
            if not fut.done():
                fut.set_exception(failure)
                fut.exception()
        if not self._ready.done():
            self._ready.set_exception(failure)
            self._ready.exception()  # retrieved: the caller of ready() raises it
        self._wake()
        # A send of ours waiting for room in the node's lease table finds out now (the
        # others waiting there look again, and wait on).
        room = self.driver._lease_room
        if room is not None and not room.done():
            room.set_result(None)
        self._tell_end()

    def _wake_release_waiters(self) -> None:
        """Every send waiting for the peer's releases tries again (one release may make
        room for several)."""
        waiters, self._release_waiters = self._release_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._ended:
            self._wake_release_waiters()

    def _stop_watching(self) -> None:
        self._quiet = None
        if self._fd >= 0:
            if self._reading:
                self.loop.remove_reader(self._fd)
                self._reading = False
            if self._writing:
                self.loop.remove_writer(self._fd)
                self._writing = False
        for timer in (self._timer, self._recheck, self._resume):
            if timer is not None:
                timer.cancel()
        self._timer = self._recheck = self._resume = None
        self.driver.connections.discard(self)
        self.conn.close()
        self._fd = -1
        if self._on_closed is not None:
            self._on_closed()
            self._on_closed = None

    # -------------------------------------------------------------------- the API

    async def ready(self, timeout: Optional[float] = None) -> None:
        """Waits for the handshake; raises why it failed."""
        await asyncio.wait_for(asyncio.shield(self._ready), timeout)

    def send_now(self, type_name: str, body, frames=()) -> None:
        """Queues a message (``body`` its msgpack, ``frames`` any buffers, held without a
        copy until written) and writes what the socket takes now. Raises
        :class:`CapReached` when the peer holds as much of our shared memory as it may
        (:meth:`send` waits for its releases instead), :class:`MessageTooLarge` for what
        the peer would have to refuse."""
        blocked = self._send(type_name, body, frames)
        if blocked is not None:
            raise self._cap_reached(blocked)

    async def send(
        self, type_name: str, body, frames=(), *, by_ticket: bool = False, timeout: Optional[float] = 30.0
    ) -> None:
        """:meth:`send_now`, waiting (at most ``timeout`` seconds) for room: for the peer to
        release shared memory, or for holds in the node's lease table to end. Tickets this
        node holds among the frames are redeemed or forwarded first, as the engine says
        (spec §7.8). ``by_ticket`` sends every non-empty frame as a ticket.

        Returns once the message is written to the socket: a peer that reads nothing holds
        up its own senders (until the write timeout fails the connection), and the queue of
        what it has not read stays one message per sender."""
        frames = [await self._resolve(f) if isinstance(f, Ticket) else f for f in frames]
        deadline = None if timeout is None else self.loop.time() + timeout
        while (blocked := self._send(type_name, body, frames, by_ticket)) is not None:
            left = None if deadline is None else deadline - self.loop.time()
            if left is not None and left <= 0:
                raise self._cap_reached(blocked, f" for {timeout} s")
            if blocked == "ticket-leases":
                await self.driver._wait_for_lease_room(left)
                continue
            waiter = self.loop.create_future()
            self._release_waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                pass
            finally:
                if waiter in self._release_waiters:
                    self._release_waiters.remove(waiter)
        await self.written()

    async def written(self) -> None:
        """Waits until everything queued so far is written to the socket; raises why the
        connection failed if it did first."""
        end = self.conn.queued
        if self.conn.written >= end:
            return
        if self._ended:
            raise self._failure or PeerClosed(f"{self.label} is closed")
        fut = self.loop.create_future()
        self._written_waiters.append((end, fut))
        await fut

    async def _resolve(self, ticket: Ticket):
        """A ticket among a send's frames, as it can travel to this peer."""
        if ticket.holder != self.driver.engine.node_id:
            return ticket  # made for a node already (checked by the engine)
        if self.conn.plan_held(ticket) == "forward":
            return await self.driver.forward(ticket, self.peer["node_id"])
        return await self.driver.redeem(ticket)

    def _cap_reached(self, blocked: str, how_long: str = "") -> CapReached:
        if blocked == "ticket-leases":
            count, held = self.driver.engine.ticket_leases
            return CapReached(
                f"the node's ticket leases pin {held} bytes in {count} leases{how_long}, as much as they may"
            )
        count, held = self.conn.shm_leases
        return CapReached(
            f"{self.label} holds {count} shared-memory leases of ours ({held} bytes){how_long}, as many as it may"
        )

    def _send(self, type_name: str, body, frames, by_ticket: bool = False) -> Optional[str]:
        if self._ended:
            raise self._failure or PeerClosed(f"{self.label} is closed")
        try:
            blocked = self.conn.send(type_name, body, list(frames), by_ticket)
        except ValueError as e:
            if len(e.args) != 3:
                raise
            raise MessageTooLarge(*e.args) from None
        self._after()
        if blocked is None and frames and self.driver._expiry is None:
            # Frames may have gone as tickets: their holds' expiry is due some time.
            self.driver._arm_expiry()
        return blocked

    async def _redeem_in_order(self) -> None:
        """Pulls the eager tickets of each waiting message, then delivers it, in order."""
        try:
            while self._redeeming:
                received = self._redeeming[0]
                if received.eager_tickets and self.driver.redemption == "eager":
                    await self._redeem_all(received)
                if received.failure is None:
                    await self._copy_device_frames(received)
                self._redeeming.popleft()
                try:
                    self._deliver(received)
                except Exception as e:  # noqa: BLE001 - it ends this connection only
                    log.warning("closing the connection to %s: %r", self.label, e)
                    self._redeeming.clear()
                    self._end(PeerClosed(f"{self.label}: {e}"))
                    self._stop_watching()
        finally:
            self._redeemer = None
            self._tell_end()

    async def _redeem_all(self, received: Received) -> None:
        """Replaces each eager ticket of ``received`` with its bytes; on a failure the message
        carries the error.

        The tickets count against the sender's budget with the rest of the message, and
        their room is taken before they are pulled (spec §9.1): this waits for room (until
        the application takes that peer's earlier messages), while the connection goes on
        reading, so the owner's answers on it still arrive."""
        frames = received.frames
        await self.driver._reserve(received, lambda: sum(r.room for r in itertools.islice(self._redeeming, 1, None)))
        for i, frame in enumerate(frames):
            if not isinstance(frame, Ticket) or frame.lazy:
                continue
            try:
                data = await self.driver.redeem(frame)
            except Exception as e:  # noqa: BLE001 - the application gets it with the message
                received.failure = e
                return
            frames[i] = data
            del frame  # our hold ends with the last handle (unlease)

    async def _copy_device_frames(self, received: Received) -> None:
        """Pulls the bytes of each cuda frame that could not be mapped here and puts them on a
        device of ours (spec §7.10); on a failure the message carries the error. Their bytes
        take room in the receive budget first, as eager tickets' do (§9.1)."""
        frames = received.frames
        pulled = sum(len(f) for f in frames if isinstance(f, DeviceClaim))
        if not pulled:
            return
        await self.driver._reserve(
            received, lambda: sum(r.room for r in itertools.islice(self._redeeming, 1, None)), pulled
        )
        for i, frame in enumerate(frames):
            if not isinstance(frame, DeviceClaim):
                continue
            try:
                data = await self.driver.read(frame.ticket, 0, len(frame))
                frames[i] = frame.upload(data)
            except Exception as e:  # noqa: BLE001 - the application gets it with the message
                received.failure = e
                return
            del frame, data  # our hold ends with the claim (unlease); the host copy goes too

    def _lost(self, ticket: Ticket, why: str, label: Optional[str]) -> OwnerLost:
        return self.driver._lost(ticket, why, label)

    async def _request(self, ticket: Ticket, what: str, req: int, label: Optional[str] = None):
        """Waits for the owner's answer to request ``req``: ``(kind, value)``."""
        self._after()
        fut = self._requests[req] = self.loop.create_future()
        try:
            kind, value = await asyncio.wait_for(fut, self.driver.pull_timeout)
        except TimeoutError:
            raise self._lost(ticket, f"no answer to the {what} within {self.driver.pull_timeout} s", label) from None
        except PeerClosed as e:
            raise self._lost(ticket, str(e), label) from None
        finally:
            if fut.cancelled():
                # No answer came (the pull timeout, or the caller cancelled): the request is
                # forgotten, so the connection no longer counts as waiting for one.
                self.conn.forget_request(req)
                self._requests.pop(req, None)
        if kind == "refused":
            code, message = value
            raise TicketRefused(label or self.driver.owner_label(ticket), ticket.lease, what, code, message)
        if kind == "mismatch":
            raise self._lost(ticket, value, label)
        return kind, value

    async def _pull(self, ticket: Ticket, offset: int, length: int, hash: bool, label: Optional[str] = None):
        """``length`` bytes from ``offset`` of the ticket's buffer, and their BLAKE3 if
        ``hash``: ``(frame, digest or None)``."""
        req = self.conn.request_pull(ticket, offset, length, hash)
        kind, value = await self._request(ticket, "pull", req, label)
        if kind != "bytes":
            raise self._lost(ticket, f"answered a pull with a {kind}", label)
        frame, hashed = value
        return frame, hashed

    async def recv(self, timeout: Optional[float] = None, *, take: bool = True) -> Received:
        """The next message; its room in the receive budget goes back as it is taken
        (``take``), or when the caller calls its ``taken()`` (a node whose application
        takes it later)."""
        if not self._messages:
            await self._arrival(timeout)
        received = self._messages.popleft()
        # Room given back fires the wake pipe: a connection that waited for it reads on.
        if not take:
            return received  # (its failure, if any, is the caller's to report)
        received.taken()
        if received.failure is not None:
            # Its eager redemption failed: the message is consumed, and its error raised.
            raise received.failure
        return received

    async def _arrival(self, timeout: Optional[float]) -> None:
        """Waits until a message is queued or the connection ended (then raises why)."""
        deadline = None if timeout is None else self.loop.time() + timeout
        while not self._messages:
            # (Messages received before the end whose tickets are being redeemed still come.)
            if self._ended and not self._redeeming:
                raise self._failure or PeerClosed(f"{self.label} is closed")
            waiter = self._waiter = self.loop.create_future()
            # Each wait times out at the one deadline; its timer goes with it, however it ends.
            timer = None if deadline is None else self.loop.call_at(deadline, _time_out, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of this peer's messages held and not yet taken."""
        return self.conn.buffered_bytes

    @property
    def buffered_messages(self) -> int:
        """How many of this peer's messages are held and not yet taken."""
        return self.conn.buffered_messages

    def close(self) -> None:
        """Closes the connection (what is queued is written first, as far as it goes now)."""
        if self._redeemer is not None:
            self._redeemer.cancel()
            self._redeemer = None
            self._redeeming.clear()  # (their messages go with the connection)
        if not self._ended:
            self._end(PeerClosed(f"{self.label} is closed"))
        self._stop_watching()

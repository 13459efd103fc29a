"""The public :class:`Node`: its options, its peers, its inbox and what it delivers.

A node speaks the wire format of spec/WIRE.md (version 3 by default) with any
implementation: over TCP, and with a same-host peer (equal host ids) over a Unix socket
that carries shared memory, switching to it after connecting over TCP as the reference
does (§7.1). It issues and redeems tickets (§7.5–§7.9).

This module holds what every node does above its connections: the options, listening
sockets, the peers and their registry, delivery to the inbox or to per-connection queues,
pins, resources and statistics. The connections themselves are the Rust engine's
(:class:`handoff.engine_node.EngineNode`, what ``Node(...)`` makes). The pure-Python
implementation of them, the spec's reference, is the separate package ``handoff_pure``
(``handoff_pure.Node``); production code never imports it, and ``HANDOFF_ENGINE=0``
(tests only) makes ``Node(...)`` build it. It is over 600 lines mostly for the
:class:`Node` docstring and its options, which a reader wants in one place.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from . import identity, native, pins, wire
from .addresses import split_host_port, strip_scheme
from .bounds import DEFAULT_BOUNDS, Bounds
from .envelope import Envelope
from .errors import HandoffError
from .peer import Peer
from .pins import DEFAULT_PIN_BOUNDS, PinBounds, PinOutbox, PinTable
from .resources import Resources
from .throttle import WarningThrottle
from .tickets import Ticket
from .tls import TlsConfig


def engine_default() -> bool:
    """Whether nodes that do not say run on the Rust engine (:mod:`handoff.engine_node`):
    wherever the extension is in use, unless ``HANDOFF_ENGINE=0`` asks for the pure-Python
    reference (``handoff_pure``, for tests). ``HANDOFF_ENGINE=1`` insists: it is an error
    without the extension."""
    choice = os.environ.get("HANDOFF_ENGINE", "")
    if choice == "0":
        return False
    if choice not in ("", "1"):
        raise ValueError(f"HANDOFF_ENGINE is 0 or 1 (or unset), not {choice!r}")
    return choice == "1" or _ENGINE_NODE is not None


def reference_node_class() -> type:
    """``handoff_pure.Node``, the spec's pure-Python reference implementation, loaded by
    name: production code never imports ``handoff_pure`` (tests and the interop suites do)."""
    try:
        return importlib.import_module("handoff_pure").Node
    except ImportError as e:
        raise ValueError(f"the pure-Python reference node (handoff_pure) cannot be loaded: {e}") from None


#: An application's subclass of :class:`Node`, made on an implementation: ``(cls, impl)``
#: -> the class that is both (its methods first).
_IMPLEMENTED: dict = {}


def _implemented(cls: type, impl: type) -> type:
    """``cls`` (a subclass of :class:`Node` an application wrote) on the implementation
    ``impl``: a class with both as bases, ``cls`` first, named as ``cls``."""
    made = _IMPLEMENTED.get((cls, impl))
    if made is None:
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
        made = type(cls.__name__, (cls, impl), {"_implementation": True, **names})
        _IMPLEMENTED[(cls, impl)] = made
    return made


#: The class of nodes on the Rust engine: :mod:`handoff.engine_node` registers it when the
#: package is imported with the extension (it builds on this module, which so never
#: imports it).
_ENGINE_NODE: Optional[type] = None


__all__ = ["Node", "DEFAULT_SHM_THRESHOLD", "STATS_MAX_PEERS"]

log = logging.getLogger("handoff")

#: Buffers at least this large go to same-host peers as shared memory (as in the reference).
DEFAULT_SHM_THRESHOLD = 64 * 1024
_LISTEN_BACKLOG = 1024
#: The most connections ``handoff.admin.Stats`` lists (spec Appendix A); ``peers_total`` counts all.
STATS_MAX_PEERS = 4096


class Node:
    """A participant in a handoff cluster.

    ``async with Node("py-a", secret=b"s3cret", listen="127.0.0.1:0") as node:`` starts it;
    ``await node.connect("tcp://127.0.0.1:7000")`` returns a :class:`~handoff.peer.Peer`;
    ``await peer.send("handoff.bench.Ping", {"seq": 1, "data": b""})`` sends;
    ``await node.recv()`` returns the next :class:`~handoff.envelope.Envelope`.

    Options: ``host_id`` (default: the reference derivation, §5.2), ``secret`` (the
    cluster secret; default empty), ``listen`` (TCP address, e.g. ``127.0.0.1:0``),
    ``shm`` (accept same-host peers on a Unix socket and use shared memory; default on),
    ``shm_threshold`` (64 KiB), ``frame_threshold`` (bytes-like values from this size go
    out of band), ``ticket_threshold`` (send buffers this large to TCP peers as tickets;
    default never), ``redeem`` (``"eager"`` or ``"lazy"``; tickets the sender marked
    ``lazy`` are never redeemed on receipt), ``pull_timeout`` and
    ``lease_ttl`` (seconds), ``types`` (accepted type names; ``None`` accepts any),
    ``limits`` (per message, :class:`handoff.wire.Limits`, §9) and ``bounds`` (across
    messages and connections, :class:`handoff.bounds.Bounds`, §9.1: handshakes and
    connections at once, timeouts, buffered bytes, leases …). Messages wait for
    :meth:`recv` in an inbox that serves the connections fairly by bytes
    (:mod:`handoff.inbox`), bounded by the buffered bytes of ``bounds``.

    The node runs protocol version 3 (spec §5.7) and refuses peers that speak only an
    older one with ``unsupported-version``. In versions 1 and 2 a peer **without the
    cluster secret** can authenticate by reflecting the nodes' own proofs across two
    connections (§5.6), so accepting them lets any attacker who can connect choose that
    version and try that attack (§5.8): against a node that accepts version 2 it succeeds
    with a node of the cluster that still speaks only version 2 as the other oracle.
    ``accept_v2`` (default off) also accepts peers that speak only version 2 (it
    announces versions 2 and 3): only while the nodes of a cluster upgrade, inside a
    network you trust. ``accept_v1`` (default off) also accepts peers that speak
    only version 1, and version 2 with it (it announces 1 to 3; a range has no holes):
    version 1's hello moreover tells anyone who connects this node's id, name, host id,
    pid, process id, listen address and socket path before either side has proven the
    secret (§5.4). ``preamble`` (tests only) sends that preamble instead, e.g.
    :data:`handoff_pure.wire.V1_ONLY` or :data:`handoff_pure.wire.V2_DEFAULT` to play an older
    peer (the pure-Python reference node then runs it).

    The name, the host id and the addresses are bounded as the wire format bounds them
    (§5.2: a name and a host id of at most 256 bytes): a longer one is a ``ValueError``.

    Options for a node whose connections are independent streams (such as the comms
    of :mod:`handoff.dask`): ``per_connection`` delivers each connection's messages to
    its own queue (:meth:`Peer.recv <handoff.peer.Peer.recv>`) instead of the node's
    inbox, bounded by the same buffered bounds; ``on_accept(peer)`` is then called once
    for each accepted connection, when its first message arrives (a connection that
    carries no message, such as the TCP connection a same-host peer leaves for our Unix
    socket, never reaches it, and is closed if it is still open ``handshake_timeout``
    after its handshake; without ``on_accept`` an accepted connection that sends a
    message is closed). It runs on the node's event loop, possibly in the callback that
    received the message rather than in a task (``asyncio.current_task()`` may be
    ``None``), and must not block; if it raises, the connection is closed and the error
    logged. ``shm_pool`` sends large buffers to same-host peers from the
    process's pool of reused segments (the engine's, ``handoff_proto::shm``) instead of fresh sealed
    memfds, and goes inline rather than wait when a peer holds its cap of leases.
    ``shm_private`` maps received segments private and writable (copy-on-write)
    instead of shared and read-only (``MAP_PRIVATE``). ``kept_map_bytes`` and
    ``kept_map_seconds`` say how much of received segments no frame uses any more stays
    mapped for the next frame, and for how long (it counts in this process's RSS; the Dask
    backend keeps none).

    ``tls`` (a :class:`~handoff.tls.TlsConfig`) runs every TCP connection inside TLS, those
    it opens (tickets' pulls from an owner too) and those it accepts (spec §3.1): both
    sides present certificates signed by a CA the other trusts, and the connecting side
    checks the name. A plain peer that connects gets this node's preamble and the error
    ``tls-required`` (counted in :attr:`tls_refusals`); the Unix socket of same-host
    peers never uses TLS.

    Route-aware types (:mod:`handoff.route`) in a body are encoded for the peer's route
    and decoded with the inbound one; what they keep for a peer under a lease (a file
    sent as its path) is in :attr:`pins` (:mod:`handoff.pins`), bounded by ``pins``
    (:class:`~handoff.pins.PinBounds`).
    """

    #: Where a node's ids, host identity, socket folder and keepalive plan come from: the
    #: engine's (the pure-Python reference has its own, ``handoff_pure.identity``).
    _identity = identity
    #: What this node sends within (§9): the default limits, or its own where smaller (set
    #: by the implementation, from ``limits``).
    send_limits: wire.Limits

    def __new__(cls, *args, engine: Optional[bool] = None, **kwargs):
        if any(c.__dict__.get("_implementation", False) for c in cls.__mro__):
            return super().__new__(cls)  # an implementation, or a subclass of one
        explicit = engine is not None or kwargs.get("preamble") is not None
        if engine is None:
            # A node that plays an older peer (``preamble``, tests only) is the reference one.
            engine = engine_default() and kwargs.get("preamble") is None
        if engine:
            if _ENGINE_NODE is None:
                raise ValueError(f"a node on the engine needs the extension handoff._native: {native.REASON}")
            impl = _ENGINE_NODE
        elif explicit or native.reference_chosen():
            impl = reference_node_class()
        else:
            raise ValueError(
                f"handoff.Node runs on the extension handoff._native, which is not in use ({native.REASON}); "
                "install handoff from its wheel, or build it with `pip install ./python`. The pure-Python "
                "reference node (the package handoff_pure) is for tests: HANDOFF_ENGINE=0 selects it"
            )
        return super().__new__(impl if cls is Node else _implemented(cls, impl))

    def __init__(
        self,
        name: str,
        *,
        engine: Optional[bool] = None,
        host_id: Optional[str] = None,
        secret: bytes | str = b"",
        listen: Optional[str] = None,
        shm: bool = True,
        shm_threshold: int = DEFAULT_SHM_THRESHOLD,
        frame_threshold: int = 1024,
        ticket_threshold: Optional[int] = None,
        redeem: str = "eager",
        pull_timeout: float = 30.0,
        lease_ttl: float = 30.0,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        types: Optional[Iterable[str]] = None,
        bounds: Bounds = DEFAULT_BOUNDS,
        accept_v1: bool = False,
        accept_v2: bool = False,
        preamble: Optional[Any] = None,
        per_connection: bool = False,
        on_accept: Optional[Callable[[Peer], None]] = None,
        shm_pool: bool = False,
        shm_private: bool = False,
        pins: PinBounds = DEFAULT_PIN_BOUNDS,
        tls: Optional[TlsConfig] = None,
        tcp_timeout: Optional[float] = None,
        kept_map_bytes: Optional[int] = None,
        kept_map_seconds: Optional[float] = None,
    ):
        if not name:
            raise ValueError("a node needs a name")
        if redeem not in ("eager", "lazy"):
            raise ValueError("redeem is 'eager' or 'lazy'")
        self.name = name
        self.node_id = self._identity.random_id()
        self.process_id = self._identity.process_id()
        self.host_id = host_id or self._identity.host_id()
        self.secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        self._listen = listen
        self.shm = shm
        self.shm_threshold = max(1, shm_threshold)
        self.shm_pool = shm_pool
        self.shm_private = shm_private
        #: TLS on TCP connections (spec §3.1), or ``None``.
        self.tls = tls
        #: Seconds within which a TCP peer that stopped answering (its host lost power,
        #: or was cut off) fails the connection: keepalive and ``TCP_USER_TIMEOUT``
        #: (``handoff_proto::bounds::keepalive_plan``, Dask's plan);
        #: ``None``: the kernel's defaults (keepalive off).
        self.tcp_timeout = tcp_timeout
        if tcp_timeout is not None:
            self._identity.keepalive_plan(tcp_timeout)  # a ValueError now, not at the first connection
        for what, value in (("kept_map_bytes", kept_map_bytes), ("kept_map_seconds", kept_map_seconds)):
            if value is not None and not value >= 0:
                raise ValueError(f"{what} is zero or more, not {value!r}")
        #: Idle bytes of received segments kept mapped for the next frame, and for how long
        #: (``None``: ``$HANDOFF_SHM_KEEP_BYTES`` / ``$HANDOFF_SHM_KEEP_SECONDS``, else the
        #: implementation's default).
        self.kept_map_bytes = kept_map_bytes
        self.kept_map_seconds = kept_map_seconds
        #: How many plain peers this node refused with ``tls-required``.
        self.tls_refusals = 0
        self.per_connection = per_connection
        self.on_accept = on_accept
        self.frame_threshold = frame_threshold
        self.ticket_threshold = ticket_threshold
        self.redeem = redeem
        self.pull_timeout = pull_timeout
        self.limits = limits
        self.bounds = bounds
        #: Whether peers that speak version 1 (``accept_v1``), or 2 (either), at most are
        #: accepted (§3): the node then announces versions 1..=3 or 2..=3, not 3 only.
        self.accept_v1 = accept_v1
        self.accept_v2 = accept_v2 or accept_v1
        #: A preamble to send instead of the node's own (tests only: the reference's
        #: ``handoff_pure.wire.Preamble``, and a reference node plays it).
        self.preamble = preamble
        self.types = set(types) if types is not None else None
        #: The owner's leases on the tickets this node sent: the implementation's table.
        self.leases = None
        #: What this node's peers buffer for the application (§9.1): the implementation's budget.
        self._budget = None
        #: The ttl of the ticket leases this node issues (seconds).
        self.lease_ttl = lease_ttl
        self._throttle = WarningThrottle(
            log, bounds.warnings_per_period, bounds.warning_period, total=bounds.warnings_in_all_per_period
        )
        #: This node's local resources: resource keys in received bodies bind to them (§8.3).
        self.resources = Resources(name)
        #: What this node keeps for peers under a lease, as route-aware values asked (:mod:`handoff.pins`).
        self.pins = PinTable(pins, name)
        self._pin_out = PinOutbox(self)
        self.listen_addr: Optional[str] = None
        self.unix_path: Optional[Path] = None
        self._peers: dict[str, Peer] = {}  # node id -> its newest open connection
        self._connections: dict[str, list] = {}  # node id -> its open connections, oldest first
        self._all_peers: set = set()
        self._listeners: list = []
        self._accept_tasks: list = []
        self._tasks: set = set()
        self._started = False
        self._closed = False
        self._check_own_identity()

    # ------------------------------------------------------------------ life

    def _check_own_identity(self) -> None:
        """A ``ValueError`` naming the field if this node's name or host id breaks a bound of
        §5.2 (the engine's check; the rest of its identity is the implementation's own)."""
        native.required("the node's identity").check_own_identity(self.name, self.host_id)

    @property
    def caps(self) -> list:
        """The capabilities this node announces in its handshake (the implementation's)."""
        raise NotImplementedError

    @property
    def unix_addr(self) -> Optional[str]:
        return f"unix://{self.unix_path}" if self.unix_path else None

    async def start(self) -> "Node":
        """Binds the listening sockets and starts accepting (the implementation's own)."""
        raise NotImplementedError

    async def connect(self, addr: str, channel: Optional[str] = None) -> Peer:
        """Connects to ``tcp://HOST:PORT`` (or ``HOST:PORT``) or ``unix://PATH``.

        Over TCP, a peer with our host id that offers its Unix socket is reached through
        it (channel ``shm``) unless ``channel="tcp"``; with ``channel="shm"`` it must be.
        """
        if not self._started:
            await self.start()
        if addr.startswith("unix://"):
            return await self._connect_unix(strip_scheme(addr, "unix://"))
        peer = await self._connect_tcp(addr)
        if channel == "tcp":
            return peer
        try:
            return await self._switch_to_unix(peer, channel)
        except BaseException:
            # Cancelled (or failed) after the handshake: nobody else holds this connection.
            peer.abort()
            raise

    async def _connect_tcp(self, addr: str) -> Peer:
        """A connection to the node listening at ``addr`` (``tcp://HOST:PORT`` or
        ``HOST:PORT``), its handshake done."""
        raise NotImplementedError

    async def _connect_unix(self, path: str) -> Peer:
        """A connection to the same-host node listening on the Unix socket ``path``."""
        raise NotImplementedError

    async def _bind(self) -> list:
        """Binds the node's listening sockets, its TCP listener (``listen``) and, with
        ``shm``, its Unix socket (mode 0600), and sets :attr:`listen_addr` and
        :attr:`unix_path`; returns them (kept in ``_listeners`` too, closed by
        :meth:`stop_listening`)."""
        if self._listen is not None:
            host, port = split_host_port(strip_scheme(self._listen, "tcp://"))
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            lsock = socket.socket(family, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(sockaddr)
            lsock.listen(_LISTEN_BACKLOG)
            lsock.setblocking(False)
            bound = lsock.getsockname()
            self.listen_addr = (
                f"tcp://[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"tcp://{bound[0]}:{bound[1]}"
            )
            self._listeners.append(lsock)
        if self.shm:
            usock, self.unix_path = self._listen_unix()
            self._listeners.append(usock)
        return list(self._listeners)

    def _listen_unix(self) -> tuple:
        """The node's Unix socket for same-host peers, listening, and its path: the engine's
        (``handoff_sys::same_host::listen``: in the runtime directory, mode 0600)."""
        fd, path = native.required("the node's Unix socket").listen_unix(self.name, self.node_id)
        usock = socket.socket(fileno=fd)
        usock.setblocking(False)
        return usock, Path(path)

    def stop_listening(self) -> None:
        """Stops accepting connections (TCP and Unix socket); established ones carry on."""
        for task in list(self._accept_tasks):
            task.cancel()
        self._accept_tasks.clear()
        for s in self._listeners:
            try:
                s.close()
            except OSError:
                pass
        self._listeners.clear()
        if self.unix_path is not None:
            try:
                self.unix_path.unlink()
            except OSError:
                pass

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        if self._closed:
            return
        self._closed = True
        pins.unregister_node(self)
        self.stop_listening()
        for task in list(self._tasks):
            task.cancel()
        peers = list(self._all_peers)
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
        self.pins.end_all()

    async def __aenter__(self) -> "Node":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def register(self, *type_names: str) -> None:
        """Accept messages of these types (once any is registered, others are ``unknown-type``)."""
        if self.types is None:
            self.types = set()
        self.types.update(type_names)

    # ------------------------------------------------------------------ peers

    @property
    def peers(self) -> list:
        return list(self._peers.values())

    def peer(self, name: str) -> Optional[Peer]:
        """The connected peer named ``name``."""
        for p in self._peers.values():
            if p.name == name and not p.closed:
                return p
        return None

    def peer_by_id(self, node_id: str) -> Optional[Peer]:
        """The newest open connection to the node ``node_id``."""
        p = self._peers.get(node_id)
        if p is not None and not p.closed:
            return p
        live = self.connections_to(node_id)
        return live[-1] if live else None

    async def wait_for_peer(self, name: str, timeout: float = 10.0, channel: Optional[str] = None) -> Peer:
        """Waits until a peer named ``name`` is connected (on ``channel``, if given)."""
        deadline = time.monotonic() + timeout
        async with self._peers_changed:
            while True:
                p = self.peer(name)
                if p is not None and (channel is None or p.channel == channel):
                    return p
                left = deadline - time.monotonic()
                if left <= 0:
                    known = ", ".join(f"{q.name} ({q.channel})" for q in self.peers)
                    raise asyncio.TimeoutError(f"no peer {name!r} connected within {timeout}s; connected: {known}")
                try:
                    await asyncio.wait_for(self._peers_changed.wait(), left)
                except asyncio.TimeoutError:
                    pass

    async def _notify_peers(self) -> None:
        async with self._peers_changed:
            self._peers_changed.notify_all()

    def _add_peer(self, peer: Peer) -> None:
        self._peers[peer.node_id] = peer
        self._connections.setdefault(peer.node_id, []).append(peer)
        self._all_peers.add(peer)
        self._spawn(self._notify_peers())
        if self.per_connection and self.on_accept is not None:
            # An accepted connection reaches ``on_accept`` with its first message: one that
            # sends none would hold its place for good, unseen by the application.
            self.loop.call_later(self.bounds.handshake_timeout, self._close_if_silent, peer)

    def _close_if_silent(self, peer: Peer) -> None:
        """Closes an accepted connection of a ``per_connection`` node that delivered no
        message within ``handshake_timeout`` of its handshake (see the class's text)."""
        if peer.accepted and not peer._delivered and not peer.closed:
            log.info(
                "%s: closing the connection from %s: no message within %s s of its handshake",
                self.name,
                peer.name,
                self.bounds.handshake_timeout,
            )
            peer.abort()

    def _remove_peer(self, peer: Peer) -> None:
        """Forgets a closed connection; another open one to the same node (§5.1: the same
        node may hold several) then speaks for it, the newest first. What it sent and the
        application has not taken yet stays in the inbox, behind the open connections'."""
        self._all_peers.discard(peer)
        self._inbox.closed(peer)
        others = self._connections.get(peer.node_id, [])
        if peer in others:
            others.remove(peer)
        if not others:
            self._connections.pop(peer.node_id, None)
        if self._peers.get(peer.node_id) is peer:
            if others:
                self._peers[peer.node_id] = others[-1]
            else:
                del self._peers[peer.node_id]
        if not self._closed:
            self._spawn(self._notify_peers())

    def connections_to(self, node_id: str) -> list:
        """Every open connection to the node ``node_id``, oldest first."""
        return [p for p in self._connections.get(node_id, []) if not p.closed]

    def _warn_about(self, source: str, fmt: str, *args) -> None:
        self._throttle.warn(source, "%s: " + fmt, self.name, *args)

    async def _switch_to_unix(self, peer: Peer, channel: Optional[str]) -> Peer:
        """The same-host peer ``peer`` (over TCP) through its Unix socket, if it offers one
        (then ``peer`` is closed), else ``peer``; a Unix connection that is cancelled before
        it is returned is closed at once."""
        path, why_not = peer.unix_switch(self.shm)
        if why_not is not None:
            if channel == "shm":
                await peer.close()
                raise HandoffError(f"cannot use shm with {peer.name}: {why_not}")
            return peer
        try:
            shm_peer = await self._connect_unix(strip_scheme(path, "unix://"))
        except Exception as e:
            if channel == "shm":
                await peer.close()
                raise
            log.warning(
                "%s: same-host peer %s, but its Unix socket %s cannot be reached (%s); falling back to tcp",
                self.name,
                peer.name,
                peer.ident.unix,
                e,
            )
            return peer
        try:
            await peer.close()
        except BaseException:
            shm_peer.abort()
            raise
        log.info("%s: same-host peer %s: using shm", self.name, shm_peer.name)
        return shm_peer

    # ------------------------------------------------------------------ receiving

    def _deliver_now(self, env: Envelope) -> None:
        # The body is decoded when the application asks for it (§11.3 allows either): a peer
        # whose bodies are costly to decode (deeply nested, or invalid) then costs its own
        # turn in the application's loop, not the reading of every other connection.
        peer = env.sender
        if env.type_name == pins.TYPE_UPDATE:
            self._on_pin_update(env)
            return
        if peer.queue is None:
            self._inbox.put(env)
            return
        first = not peer._delivered
        if first and peer.accepted and self.on_accept is None:
            self._budget.release_env(env)
            raise wire.WireError(
                "unknown-type",
                f"node {self.name} takes no messages on connections it accepts (it only connects to others)",
            )
        peer._delivered = True
        if not peer.queue.put(env):  # the application closed this connection: nobody will take it
            self._budget.release_env(env)
            return
        if first and peer.accepted:
            self.on_accept(peer)

    def _on_pin_update(self, env: Envelope) -> None:
        """A holder's claims and releases of our pins (never queued for the application)."""
        self._budget.release_env(env)
        peer = env.sender
        size, limit = len(env._body_bytes), self.pins.bounds.max_update_bytes
        if size > limit:
            # Decoded here, in the loop's callback that read it: never more than an update can be.
            problem = f"its body of {size} bytes is over the {limit} an update can take"
        elif env.frames:
            problem = f"it carries {len(env.frames)} frames (an update has none)"
        else:
            try:
                problem = self.pins.on_update(peer.node_id, env.body)
            except Exception as e:
                problem = f"its body cannot be decoded: {e}"
        env.release()
        if problem is not None:
            self._warn_about(f"peer {peer.name}", "ignored (part of) a pin update from %s: %s", peer.name, problem)

    async def recv(self, timeout: Optional[float] = None) -> Envelope:
        """The next received message (``asyncio.TimeoutError`` after ``timeout`` seconds).

        Taking it gives its bytes back to the node's buffered bounds (§9.1): a peer whose
        connection stopped being read for lack of room is read again."""
        env = await self._inbox.get(timeout)
        self._budget.release_env(env)
        return env

    def has_messages(self) -> bool:
        """Whether :meth:`recv` has a message waiting (it would return it without waiting)."""
        return bool(self._inbox)

    def buffered(self) -> dict:
        """Bytes buffered for the application, in total and per peer (§9.1)."""
        return {
            "total": self._budget.total,
            "peers": {p.name: p.buffered for p in self._all_peers if p.buffered},
        }

    # ------------------------------------------------------------------ tickets (holder side)

    # What a received Ticket asks of its node (handoff.tickets.Redeemer), and what the
    # connections ask: the ticket client does it.

    async def _pull(self, ticket: Ticket, off: int, n: int, whole: bool) -> memoryview:
        """``n`` bytes of ``ticket``'s buffer from ``off`` (``whole``: its redemption)."""
        raise NotImplementedError

    async def _renew(self, ticket: Ticket) -> None:
        """Extends the hold on ``ticket``'s lease (§7.7)."""
        raise NotImplementedError

    def _ticket_released(self, desc: wire.TicketDesc, label: str) -> None:
        """The application let go of a ticket it held: its owner may end the hold."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tickets (owner side)

    def _holder_disconnected(self, node_id: str, name: str) -> None:
        def drop() -> None:
            if self.peer_by_id(node_id) is None:
                ended = self.leases.drop_holder(node_id)
                if ended:
                    log.info("%s: peer %s gone: its holds on %d ticket leases ended", self.name, name, ended)
                ended = self.pins.drop_holder(node_id)
                if ended:
                    log.info("%s: peer %s gone: its %d pins ended", self.name, name, ended)

        if self.peer_by_id(node_id) is None and not self._closed:
            self.loop.call_later(pins.DISCONNECT_GRACE, drop)

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            n = self.leases.expire()
            if n:
                log.info("%s: %d ticket holds ended by their deadline", self.name, n)
            n = self.pins.expire()
            if n:
                log.info("%s: %d pins never claimed ended after %g s", self.name, n, self.pins.bounds.claim_timeout)

    # ------------------------------------------------------------------ observing

    def shm_leases(self) -> dict:
        """Shared-memory leases this node holds for all its peers: ``{count, bytes}``."""
        count = total = 0
        for p in self._all_peers:
            s = p.shm_leases()
            count += s["count"]
            total += s["bytes"]
        return {"count": count, "bytes": total}

    def ticket_leases(self) -> dict:
        """The leases this node holds as the owner of tickets it sent."""
        return self.leases.stats()

    def segment_pool_stats(self) -> dict:
        """The pool of shared segments this process sends from (every node of the process
        shares it): ``{segments, bytes, idle_segments, idle_bytes, busy_segments, created,
        reused, retired}``. A segment is busy while a peer may map it, and idle (warm, for
        the next frame of its size) once every peer let go of it; one whose receiver still
        maps it is never reused. (Each implementation says it of its own pool.)"""
        raise NotImplementedError

    def stats(self) -> dict:
        """What ``handoff.admin.Stats`` carries (spec Appendix A): ``peers`` lists at most
        :data:`STATS_MAX_PEERS` connections, oldest first, and ``peers_total`` counts them
        all, so that the answer stays small whatever the peers claim."""
        shm = self.shm_leases()
        peers = self.peers
        return {
            "node": self.name,
            "ticket_leases": self.ticket_leases(),
            "shm_leases": shm,
            "shm_pool": {"segments": shm["count"], "bytes": shm["bytes"], "idle_segments": 0, "idle_bytes": 0},
            "peers": [[p.name, p.channel] for p in peers[:STATS_MAX_PEERS]],
            "peers_total": len(peers),
        }

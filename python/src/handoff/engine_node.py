"""``handoff.Node`` whose connections run on the Rust engine.

:class:`EngineNode` keeps :class:`~handoff.node.Node`'s API and everything above the
connections: the node's inbox (fair by bytes), ``per_connection`` queues and
``on_accept``, route-aware encoding, resources and pins. Below them, each connection is
an :class:`~handoff.engine.EngineConnection` of the node's
:class:`~handoff.engine.Driver`: the handshake, reading, the bounds, the receive budget,
shared memory, tickets and TLS are the engine's, as in the Rust node.

What ``handoff.Node(...)`` makes wherever the extension is in use (``engine=False`` or
``HANDOFF_ENGINE=0`` give the pure-Python reference, ``handoff_pure``, for tests); options
the engine does not take are refused by name (:data:`NOT_YET`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Optional

from . import engine as eng
from . import pins, wire
from .addresses import strip_scheme
from .codec import EncodedBody, OnDemand, encode_body, pack_framed
from .cuda import is_cuda_array
from .cuda import status as cuda_status
from .envelope import Envelope, ReceivedFrame
from .errors import HandoffError, PeerClosed, PeerRefused
from .inbox import ConnectionQueue, Inbox
from . import node as _node
from .node import Node
from .outgoing import check_type_name
from .peer import Peer
from .shm import PooledFrame, SharedFrame
from .tickets import Ticket as PyTicket
from .tls import refused_plain as tls_refused_plain

__all__ = ["EngineNode", "EnginePeer", "NOT_YET"]

log = logging.getLogger("handoff")

#: Node options the engine does not take yet, and what each would need.
NOT_YET = {
    "preamble": "a preamble other than the node's own",
}
# ``shm_pool`` is what the engine always does (it sends from its pool of reused segments);
# ``shm_private`` maps each received frame private and writable (copy-on-write).


class _EngineBudget:
    """What :class:`Node` asks of its receive budget, on the engine's: a message's room
    goes back when the application takes it (``Received.taken``)."""

    def __init__(self, node: "EngineNode"):
        self.node = node

    def release_env(self, env: Envelope) -> None:
        received = env._received
        if received is not None:
            env._received = None
            received.taken()

    @property
    def total(self) -> int:
        driver = self.node._driver
        return driver.engine.buffered_bytes if driver is not None else 0


class _EngineLeases:
    """The node's ticket leases as :class:`Node` reads them (``leases``), from the engine's
    lease table: its figures, and its expiry. A holder's holds end in the engine with its
    last connection."""

    def __init__(self, node: "EngineNode"):
        self.node = node

    def stats(self) -> dict:
        driver = self.node._driver
        if driver is None:
            return dict.fromkeys(("count", "bytes", "holders", "expired", "pulls", "bytes_pulled"), 0) | {
                "oldest_seconds": 0.0
            }
        return driver.engine.ticket_lease_stats()

    pulls = property(lambda self: self.stats()["pulls"])
    bytes_pulled = property(lambda self: self.stats()["bytes_pulled"])
    expired = property(lambda self: self.stats()["expired"])

    def expire(self) -> int:
        driver = self.node._driver
        return driver.engine.expire_leases()[0] if driver is not None else 0

    def drop_holder(self, node_id: str) -> int:
        return 0


class EngineNode(Node):
    """:class:`~handoff.node.Node` on the Rust engine (see the module's text)."""

    #: A class that implements the connections: ``Node(...)`` makes it as it is.
    _implementation = True

    def __init__(self, *args: Any, **kwargs: Any):
        for option, why in NOT_YET.items():
            if kwargs.get(option):
                raise ValueError(f"Node({option}=...) does not run on the engine yet: it needs {why}")
        tls = kwargs.get("tls")
        if tls is not None and tls.files is None and tls.pem is None:
            raise ValueError(
                "a node on the engine runs TLS on rustls, from PEM: give it TlsConfig.from_files(...) (a ready-made "
                "ssl context cannot be read back; Dask's are, from the Security that made them)"
            )
        super().__init__(*args, **kwargs)
        # A Bounds the engine would not apply (one it keeps fixed) is refused now, by name.
        eng._native.check_engine_bounds(dataclasses.asdict(self.bounds))
        self.send_limits = wire.Limits(**eng._native.limits_for_sending(dataclasses.asdict(self.limits)))
        self._budget = _EngineBudget(self)
        self.leases = _EngineLeases(self)
        self.dialer_nonces = None  # the engine's own (handoff_proto::handshake::DialerNonces)
        self._driver: Optional[eng.Driver] = None
        self._engine_listeners: list = []

    @property
    def caps(self) -> list:
        # "cuda": this node maps same-host peers' GPU memory by its IPC handle (§7.10), where
        # a CUDA driver works here (announced only with shared memory, a Unix socket).
        shm = bool(self.shm)
        return eng._native.node_capabilities(shm, shm and cuda_status()[0])

    # ------------------------------------------------------------------ life

    async def start(self) -> "EngineNode":
        if self._started:
            return self
        self.loop = asyncio.get_running_loop()
        self._inbox = Inbox(self.bounds.message_overhead)
        self._peers_changed = asyncio.Condition()
        socks = await self._bind()
        try:
            self._check_own_identity()
            engine = self._make_engine()
        except BaseException:
            self.stop_listening()
            raise
        # The engine names the node and this process (a node made before a fork is not
        # this process's).
        self.node_id = engine.node_id
        self.process_id = engine.process_id
        self._driver = eng.Driver(engine, self.loop, pull_timeout=self.pull_timeout, redeem=self.redeem)
        self._driver.dial = self._dial_owner
        b = self.bounds
        for s in socks:
            listener = eng.Listener(
                self._driver,
                s,
                None,  # (node-id uniqueness is the engine's own check, peers::admit)
                max_handshakes=b.max_handshakes,
                max_unaccepted=b.max_handshakes,
                on_failed=self._refused,
            )
            self._engine_listeners.append(listener)
            self._accept_tasks.append(self._spawn(self._accept_from(listener)))
        self._spawn(self._reap_expired())
        self._started = True
        pins.register_node(self)
        log.info(
            "node %s started on the engine (host %s, listen %s, unix %s)",
            self.name,
            self.host_id,
            self.listen_addr,
            self.unix_addr,
        )
        return self

    def _engine_tls(self) -> dict:
        """The node's TLS as the engine takes it: the PEM of :meth:`TlsConfig.from_files`, or
        the PEM it was given (``TlsConfig.pem``)."""
        if self.tls is None:
            return {}
        if self.tls.pem is not None:
            pem = dict(zip(("tls_cert_chain", "tls_key", "tls_ca"), self.tls.pem))
        else:
            pem = {}
            for name, path in zip(("tls_cert_chain", "tls_key", "tls_ca"), self.tls.files):
                with open(path, "rb") as f:
                    pem[name] = f.read()
        return {
            **pem,
            "tls_server_name": self.tls.server_name,
            "tls_check_name": self.tls.check_name,
            "tls_min_version": self.tls.min_version,
        }

    def _make_engine(self) -> "eng.Engine":
        engine = eng.Engine(
            self.name,
            self.secret,
            host_id=self.host_id,
            capabilities=self.caps,
            listen=self.listen_addr,
            unix=self.unix_addr,
            accept_v1=self.accept_v1,
            accept_v2=self.accept_v2,
            shm_threshold=self.shm_threshold,
            ticket_threshold=self.ticket_threshold,
            lease_ttl=self.lease_ttl,
            tcp_timeout=self.tcp_timeout,
            # Bounds by their Python names: the engine applies them, or leaves those the
            # driver applies (lease_wait, the warnings); it refused fixed ones in __init__.
            bounds=dataclasses.asdict(self.bounds),
            shm_private=self.shm_private,
            limits=dataclasses.asdict(self.limits),
            kept_map_bytes=self.kept_map_bytes,  # (None: $HANDOFF_SHM_KEEP_BYTES, the engine reads it)
            kept_map_seconds=self.kept_map_seconds,
            **self._engine_tls(),
        )
        if self.types is not None:
            engine.register(sorted(self.types | {pins.TYPE_UPDATE}))
        return engine

    def register(self, *type_names: str) -> None:
        super().register(*type_names)
        if self._driver is not None:
            self._driver.engine.register(sorted(self.types | {pins.TYPE_UPDATE}))

    def stop_listening(self) -> None:
        for listener in self._engine_listeners:
            listener.close()
        self._engine_listeners.clear()
        super().stop_listening()

    async def close(self) -> None:
        if self._closed:
            return
        await super().close()
        if self._driver is not None:
            self._driver.close()

    def _refused(self, label: str, error: BaseException) -> None:
        source = "unix peers" if label.startswith("unix://") else f"connections to {label.split(' <- ')[0]}"
        if getattr(error, "code", None) == "tls-required" and not getattr(error, "by_peer", True):
            # A plain peer, answered tls-required (spec §3.1).
            self.tls_refusals += 1
            self._warn_about(source, "%s", tls_refused_plain(label))
            return
        self._warn_about(source, "refused connection from %s: %s", label, error)

    # ------------------------------------------------------------------ connections

    async def _accept_from(self, listener: "eng.Listener") -> None:
        while True:
            try:
                ec = await listener.accept()
            except asyncio.CancelledError:
                return
            peer = self._adopt(ec, accepted=True)
            log.info("%s: accepted peer %s (%s, %s)", self.name, peer.name, peer.locality, peer.channel)

    def _adopt(self, ec: "eng.EngineConnection", accepted: bool) -> "EnginePeer":
        peer = EnginePeer(self, ec, accepted)
        if accepted and peer.channel == "shm" and peer.ident.host != self.host_id:
            # (As the Rust node and the reference say it.)
            self._warn_about(
                f"peer {peer.name}",
                "peer %s on our Unix socket claims another host id (%s); it shares our memory all the same",
                peer.name,
                peer.ident.host,
            )
        self._add_peer(peer)
        peer.take_messages()
        return peer

    async def _connect_tcp(self, addr: str) -> "EnginePeer":
        target = strip_scheme(addr, "tcp://")
        ec = await self._driver.connect(f"tcp://{target}", timeout=self.bounds.handshake_timeout)
        return self._adopt(ec, accepted=False)

    async def _dial_owner(self, addr: str, timeout: float) -> "eng.EngineConnection":
        """A ticket owner's connection, made one of this node's peers (what it sends on it
        reaches the node, and the node-id check applies)."""
        ec = await self._driver.connect(addr, timeout=timeout)
        self._adopt(ec, accepted=False)
        return ec

    async def _connect_unix(self, path: str) -> "EnginePeer":
        ec = await self._driver.connect(f"unix://{path}", timeout=self.bounds.handshake_timeout)
        return self._adopt(ec, accepted=False)

    # ------------------------------------------------------------------ tickets (holder side)

    def _native_ticket(self, ticket: PyTicket) -> "eng.Ticket":
        """The engine's claim behind a ticket this node holds."""
        native = getattr(ticket, "native", None)
        if native is not None:
            return native
        d = ticket.desc  # a Ticket made from a kept description: one claim for its life
        digest = ("xxh3", d.xxh3) if d.xxh3 is not None else ("blake3", d.digest)
        claim = eng.Ticket.claim(self._driver.engine, d.n, d.owner, d.lease, d.token, digest, d.ttl, d.addr, d.lazy)
        ticket.native = claim
        return claim

    async def _pull(self, ticket: PyTicket, off: int, n: int, whole: bool) -> memoryview:
        if ticket.released:
            raise HandoffError(f"the ticket for lease {ticket.lease} was released")
        native = self._native_ticket(ticket)
        if whole:
            frame = await self._driver.redeem(native, ticket.owner_label)
        else:
            frame = await self._driver.read(native, off, n, ticket.owner_label)
        return memoryview(frame)

    async def _renew(self, ticket: PyTicket) -> None:
        if ticket.released:
            raise HandoffError(f"the ticket for lease {ticket.lease} was released")
        await self._driver.renew(self._native_ticket(ticket), ticket.owner_label)

    def _owner_label(self, native: "eng.Ticket") -> str:
        """How errors name a ticket's owner (as the Rust node names it): its name if
        connected, and its address."""
        owner = self.peer_by_id(native.owner)
        return native.owner_label(owner.name if owner is not None else None)

    def _ticket_released(self, desc: wire.TicketDesc, label: str) -> None:
        pass  # the engine's claim ends its hold when its last handle goes (EngineTicket.release)

    # ------------------------------------------------------------------ observing

    def segment_pool_stats(self) -> dict:
        return eng._native.segment_pool_stats()


class EngineTicket(PyTicket):
    """A ticket this node received on the engine, with :class:`~handoff.tickets.Ticket`'s
    API; the engine's claim (``native``) ends the hold when it is dropped or released."""

    def __init__(self, node: EngineNode, native: "eng.Ticket", owner_label: str):
        kind, digest = native.digest
        desc = wire.TicketDesc(
            n=native.len,
            owner=native.owner,
            lease=native.lease,
            token=native.token,
            digest=digest if kind == "blake3" else None,
            ttl=native.ttl_ms,
            addr=native.addr,
            lazy=native.lazy,
            xxh3=digest if kind == "xxh3" else None,
        )
        super().__init__(node, desc, owner_label)
        self.native = native


#: How a frame came, in the names of :class:`~handoff.envelope.ReceivedFrame`.
_KINDS = {"inline": "inline", "shm": "shm", "pulled": "ticket"}


def _ident(peer: dict) -> wire.Ident:
    return wire.Ident(
        node=peer["node_id"],
        name=peer["name"],
        host=peer["host_id"],
        pid=peer["pid"],
        proc=peer["process_id"],
        lang=peer["language"],
        impl=peer["implementation"],
        caps=list(peer["capabilities"]),
        listen=peer["listen"],
        unix=peer["unix"],
    )


class EnginePeer(Peer):
    """A connected node, as :class:`~handoff.peer.Peer` offers it, on an engine connection."""

    def __init__(self, node: EngineNode, ec: "eng.EngineConnection", accepted: bool):
        self.node = node
        self.ec = ec
        self.ident = _ident(ec.peer)
        self.channel = "shm" if ec.conn.unix else "tcp"
        self.protocol_version = ec.peer["version"] or 3
        self.accepted = accepted
        self.closed = False
        self.done = asyncio.Event()
        self.queue: Optional[ConnectionQueue] = ConnectionQueue() if node.per_connection else None
        self._delivered = False
        self._routes: Optional[tuple] = None

    @property
    def buffered(self) -> int:
        """Bytes of this peer's messages the node holds and the application has not taken."""
        return self.ec.buffered_bytes

    @property
    def messages(self) -> int:
        """How many messages those are."""
        return self.ec.buffered_messages

    def __repr__(self) -> str:
        return f"Peer({self.name}, {self.locality}, {self.channel}, engine)"

    @property
    def tls(self) -> bool:
        """Whether the connection runs inside TLS (spec §3.1)."""
        return self.ec.conn.tls

    def fileno(self) -> int:
        """The connection's socket descriptor, to look at (its options, its addresses); the
        engine reads and writes it, nothing else may."""
        return self.ec._fd

    @property
    def failure(self) -> Optional[OSError]:
        """The ``OSError`` that ended the connection, if one did (see ``Peer.failure``)."""
        return self.ec.os_failure

    def sockname(self):
        """This end's socket address."""
        return self.ec.sockname

    def peername(self):
        """The peer's socket address."""
        return self.ec.peername

    def unix_switch(self, we_offer_shm: bool) -> tuple:
        """Whether this TCP connection moves on to the peer's Unix socket (spec §7.1):
        ``(path, None)``, or ``(None, why)`` when it may not (the engine's rule)."""
        return self.ec.conn.unix_switch(we_offer_shm)

    def shm_leases(self) -> dict:
        count, held = self.ec.conn.shm_leases
        return {"count": count, "bytes": held}

    # ------------------------------------------------------------------ sending

    def _encode(self, body: Any, enc: Optional[EncodedBody] = None) -> tuple:
        """``body``'s msgpack and its frames as the engine sends them (``enc``: what the
        extension made of it already, if it could)."""
        if enc is None:
            enc = encode_body(body, self.node.frame_threshold, is_frame=_is_node_frame, route=self.route)
        frames = list(enc.frames)
        for i, source in enumerate(enc.sources):
            if isinstance(source, (SharedFrame, PooledFrame)):
                # A segment the application filled goes as it is to a same-host peer (its
                # descriptor, no copy), as its bytes elsewhere.
                frames[i] = _segment_frame(source)
            elif isinstance(source, PyTicket):
                if source.released:
                    raise HandoffError(f"the ticket for lease {source.lease} was released")
                # Forwarded or redeemed as the engine says (spec §7.8).
                frames[i] = self.node._native_ticket(source)
            elif frames[i] is None and is_cuda_array(source):
                frames[i] = source  # device memory: the engine names it or copies it (§7.10)
            elif isinstance(source, OnDemand):
                # A lazy ticket to a peer that takes tickets, the bytes to one that does not.
                frames[i] = eng.OnDemand(frames[i], source.digest)
        return enc.body, frames

    async def send(self, type_name: str, body: Any, *, by_ticket: bool = False) -> None:
        if type(type_name) is not str:
            check_type_name(type_name)
        if self.closed:
            raise PeerClosed(f"the connection to {self.name} is closed")
        # One call into the extension for most bodies: plain values, with or without frames.
        enc = pack_framed(body, self.node.frame_threshold)
        if enc is not None and not enc.frames and not by_ticket:
            # Most small messages: plain values, no frame, so nothing to wait for but the
            # socket (the same as below, in fewer steps).
            ec = self.ec
            try:
                ec._send(type_name, enc.body, ())
                if ec._writing or ec._ended:  # (bytes of it still queued, or lost)
                    await ec.written()
            except PeerClosed:
                self.closed = True
                raise
            return
        packed, frames = self._encode(body, enc)
        try:
            await self.ec.send(type_name, packed, frames, by_ticket=by_ticket, timeout=self.node.bounds.lease_wait)
        except PeerClosed:
            self.closed = True
            raise

    def send_now(self, type_name: str, body: Any) -> bool:
        check_type_name(type_name)
        if self.closed:
            return False
        packed, frames = self._encode(body)
        if frames or self.ec.conn.queued > self.ec.conn.written:
            return False  # a frame, or another write in progress: send() waits its turn
        try:
            self.ec.send_now(type_name, packed)
        except Exception:  # noqa: BLE001 - send() raises it
            return False
        return True

    def _queue_control(self, msg: wire.Msg) -> None:
        """Queues a message without frames that the node sends on its own (a pin update,
        :mod:`handoff.pins`), without waiting; a closed connection drops it."""
        if self.closed or msg.f:
            return
        try:
            self.ec.send_now(msg.t, msg.b)
        except (PeerClosed, OSError):
            pass

    async def send_packed(self, type_name: str, body: bytes) -> None:
        check_type_name(type_name)
        if self.closed:
            raise PeerClosed(f"the connection to {self.name} is closed")
        await self.ec.send(type_name, body, (), timeout=None)

    # ------------------------------------------------------------------ receiving

    def take_messages(self) -> None:
        """From now on each message goes to the node as the loop's callback reads it (no
        task is woken for it), and the connection's end ends this peer."""
        ec = self.ec
        ec.on_end = self._ended
        ec.on_message = self._on_message
        while ec._messages:  # what arrived before (with the handshake's last bytes)
            self._on_message(ec._messages.popleft())
        if ec._ended:
            ec._tell_end()

    def _on_message(self, received: Any) -> None:
        body = received.body  # (the engine's buffer: decoded where it lies)
        frames = received.frames
        frames = [self._frame(f) for f in frames] if frames else []
        env = Envelope(self, received.type_name, body, frames)
        env._received = received
        # Its weight in the node's inbox, which serves connections fairly by bytes: the
        # room it holds in the receive budget, as the Rust node weighs it.
        env.charge = received.room
        if received.failure is not None:
            # Its eager redemption failed: the body raises why (as the Python peer's).
            env.error, env._decoded = received.failure, True
            received.failure = None
        try:
            self.node._deliver_now(env)
        except wire.WireError as e:
            self.node._warn_about(f"peer {self.name}", "closing the connection to %s: %s", self.name, e)
            self.node._budget.release_env(env)
            self.ec.close()

    def _ended(self, failure: Exception) -> None:
        # (The connection closes itself once what it still says, an error, is written.)
        if isinstance(failure, eng.ConnectionFailed) and not failure.by_peer:
            self._warn("closing connection to %s: %s [%s]", self.name, failure.message, failure.code)
        elif isinstance(failure, PeerRefused):
            self._warn("peer %s closed the connection: %s [%s]", self.name, failure.message, failure.code)
        self.closed = True
        self.done.set()
        if self.queue is not None:
            self.queue.close()
        self.node._remove_peer(self)
        self.node._holder_disconnected(self.node_id, self.name)

    def _frame(self, f: Any) -> ReceivedFrame:
        if isinstance(f, eng.Ticket):
            return ReceivedFrame("ticket", EngineTicket(self.node, f, self.node._owner_label(f)))
        if isinstance(f, (eng.DeviceFrame, eng.DeviceClaim)):
            # GPU memory (§7.10): its view is the frame itself (a claim still, in a message
            # whose pull failed: the message carries that error).
            return ReceivedFrame("cuda", f)
        return ReceivedFrame(_KINDS.get(f.kind, f.kind), memoryview(f), f.lease, f.segment)

    def abort(self) -> None:
        self.closed = True
        self._drop_queued()
        self.ec.close()

    async def close(self) -> None:
        """Closes the connection (what is queued is written first, as far as it goes now)."""
        self.abort()


def _segment_frame(source: SharedFrame) -> Any:
    """``source`` as the engine sends it: a :class:`handoff._native.SegmentFrame`, which a
    same-host send passes by descriptor. A pooled segment stays busy (out of the pool) until
    the last lease a send takes on it ends; one a receiver may still map after its lease
    ended (its connection closed) is never written again."""
    native_frame = getattr(source, "native_frame", None)
    if native_frame is not None:  # a segment of the engine's pool (a pooled ShmBuffer)
        return native_frame
    view = source.view
    segment = getattr(source, "segment", None)
    if segment is None:
        return eng._native.SegmentFrame(view, source.fd, source.sealed)
    segment.hold()
    done: list = []

    def ended(reusable: bool) -> None:
        if not done:  # once, whether the engine or the failure below ends the hold
            done.append(reusable)
            segment.let_go(reusable)

    try:
        return eng._native.SegmentFrame(view, source.fd, source.sealed, ended)
    except BaseException:
        ended(True)
        raise


def _is_node_frame(obj: Any) -> bool:
    return isinstance(obj, (SharedFrame, PooledFrame, PyTicket))


_node._ENGINE_NODE = EngineNode  # what Node(...) makes with the extension, unless engine=False or HANDOFF_ENGINE=0

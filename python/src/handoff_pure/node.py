"""The reference :class:`Node`: a node whose connections are pure Python.

The spec's second, independent implementation (spec/WIRE.md), kept to check the Rust
engine against: the vectors, the interop tests against Rust nodes and the hostile suite
run on it. Production code never imports this package; ``handoff.Node`` runs on the
engine, and ``HANDOFF_ENGINE=0`` (tests only) makes it build this class instead.

This module adds to :class:`handoff.node.Node` what the engine does in Rust: accepting
and dialing sockets, TLS on Python's ``ssl``, the handshake of each connection
(:mod:`handoff_pure.handshake`), which connections get in
(:mod:`handoff_pure.admission`), the receive budget, the owner's leases and the holder
side of tickets (:mod:`handoff_pure.ticket_client`); a connection is a
:class:`handoff_pure.peer.Peer`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import socket
import ssl
import time
from typing import Any, Optional

import handoff.node
from handoff import native, pins
from . import identity, mapcache, throttle
from . import tls as tls_layer
from . import wire
from handoff.addresses import split_host_port, strip_scheme

from .addresses import check_peer_uid, sanitize_name
from handoff.envelope import Envelope
from handoff.errors import HandoffError, PeerClosed, TlsError
from .inbox import Inbox
from handoff.tickets import Ticket
from .admission import Admission
from .budget import Budget
from .handshake import OurSide, handshake, own_ident, send_error
from .leases import LeaseTable
from .nonces import DialerNonces
from .outgoing import send_limits
from .peer import Peer
from .pool import pool
from .ticket_client import TicketClient
from .transport import Transport, raise_unix_send_buffer
from .turns import after_new_input

__all__ = ["Node"]

log = logging.getLogger("handoff")

#: How many connections a listening socket queues before they are accepted.
_LISTEN_BACKLOG = 1024
#: Longest the accept loop accepts waiting connections before other input goes first (s).
_ACCEPT_SLICE = 100e-6


class Node(handoff.node.Node):
    """:class:`handoff.Node` with pure-Python connections (the options are the same)."""

    #: A class that implements the connections: ``Node(...)`` makes it as it is.
    _implementation = True
    #: Its ids, host identity, socket folder and keepalive plan: the reference's own.
    _identity = identity

    @property
    def caps(self) -> list:
        # "xxh3": this node checks tickets that carry an XXH3-128 digest (§7.5).
        return ["inline", "shm", "ticket", "xxh3"] if self.shm else ["inline", "ticket", "xxh3"]

    def _listen_unix(self) -> tuple:
        """The node's Unix socket for same-host peers, listening (mode 0600), and its path."""
        path = self._identity.runtime_dir() / f"{sanitize_name(self.name)}-{self.node_id[:12]}.sock"
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        usock.bind(str(path))
        os.chmod(path, 0o600)
        usock.listen(_LISTEN_BACKLOG)
        usock.setblocking(False)
        return usock, path

    def _check_own_identity(self) -> None:
        """A ``ValueError`` naming the first field of this node's ident that breaks its bound
        (§5.2), checked by the reference's own table."""
        wire.check_identity(
            own_ident(
                self.node_id, self.name, self.host_id, self.process_id, self.caps, self.listen_addr, self.unix_addr
            )
        )

    def _check_type(self, type_name: str) -> None:
        if self.types is not None and type_name not in self.types and type_name != pins.TYPE_UPDATE:
            raise wire.WireError(
                "unknown-type", f"unknown type name {type_name!r}; this node knows: {', '.join(sorted(self.types))}"
            )

    async def _deliver(self, env: Envelope) -> None:
        self._deliver_now(env)

    def _delivers_now(self, peer: Peer) -> bool:
        """Whether :meth:`_deliver_now` would deliver a message from ``peer`` (rather than
        refuse it: an accepted connection's first message where nothing takes accepted ones)."""
        return peer.queue is None or peer._delivered or not peer.accepted or self.on_accept is not None

    def __init__(self, name: str, **kwargs: Any):
        super().__init__(name, **kwargs)
        #: What this node sends within (§9): the default limits, or its own where smaller.
        self.send_limits = send_limits(self.limits)
        bounds = self.bounds
        self._throttle = throttle.WarningThrottle(
            logging.getLogger("handoff"),
            bounds.warnings_per_period,
            bounds.warning_period,
            total=bounds.warnings_in_all_per_period,
        )
        #: The preamble this node sends (§3): version 3 only; 2..=3 with ``accept_v2``; 1..=3
        #: with ``accept_v1``; or the one given (to play an older peer).
        self.preamble = self.preamble or wire.our_preamble(accept_v1=self.accept_v1, accept_v2=self.accept_v2)
        # The reference's mappings are the process's (handoff_pure.mapcache).
        if self.kept_map_bytes is not None:
            mapcache.set_keep_bytes(self.kept_map_bytes)
        if self.kept_map_seconds is not None:
            mapcache.set_keep_seconds(self.kept_map_seconds)
        bounds = self.bounds
        #: What a header may be before a connection is established (§5.1, §9: 64 KiB, 1024 values).
        self.handshake_limits = dataclasses.replace(
            wire.during_handshake(self.limits),
            max_header_bytes=min(self.limits.max_header_bytes, bounds.handshake_header_bytes),
        )
        self.leases = LeaseTable(
            self.lease_ttl,
            max_bytes=bounds.max_ticket_bytes,
            max_bytes_per_peer=bounds.max_ticket_bytes_per_peer,
            max_holders=bounds.max_holders_per_lease,
            wait=bounds.lease_wait,
        )
        self._budget = Budget(bounds)
        #: The nonces this node sent as a dialer, remembered for twice the handshake timeout
        #: (version 3, §5.7 step 3: one of its own handshakes relayed back into it is refused).
        self.dialer_nonces = DialerNonces(2 * bounds.handshake_timeout)
        #: Which connections get in: the caps on handshakes and connections, and node-id claims.
        self._admission = Admission(self.node_id, bounds, self.peer_by_id, lambda: len(self._all_peers))
        #: The holder side of the tickets this node receives (:mod:`handoff_pure.ticket_client`).
        self._tickets = TicketClient(self, bounds.max_owner_dials, bounds.max_owner_connections)

    async def start(self) -> "Node":
        if self._started:
            return self
        self.loop = asyncio.get_running_loop()
        # Bounded by the buffered-bytes budget, which every envelope in it is charged against.
        self._inbox = Inbox(self.bounds.message_overhead)
        self._peers_changed = asyncio.Condition()
        for lsock in await self._bind():
            unix = lsock.family == socket.AF_UNIX
            self._accept_tasks.append(self._spawn(self._accept_loop(lsock, unix=unix)))
        try:
            self._check_own_identity()  # the addresses are known now
        except ValueError:
            self.stop_listening()
            raise
        self._spawn(self._reap_expired())
        self._started = True
        pins.register_node(self)
        log.info(
            "node %s started (host %s, listen %s, unix %s; %s)",
            self.name,
            self.host_id,
            self.listen_addr,
            self.unix_addr,
            native.REASON,
        )
        return self

    def _our_side(self, transport: Optional[Transport] = None, accepted: bool = False) -> OurSide:
        return OurSide(
            node_id=self.node_id,
            name=self.name,
            host_id=self.host_id,
            process_id=self.process_id,
            caps=self.caps,
            secret=self.secret,
            limits=self.handshake_limits,
            listen=self.listen_addr,
            unix=self.unix_addr,
            admit=self._admission.room,
            check_peer=(lambda ident: self._admission.check_node_id(ident, transport))
            if transport is not None
            else None,
            preamble=self.preamble,
            accepted=accepted,
            dialer_nonces=self.dialer_nonces,
        )

    async def _handshake_tls(self, transport: Transport, accepted: bool, host: Optional[str]):
        """TLS first (spec §3.1), then the handshake inside it; an accepted plain peer is
        answered ``tls-required``."""
        config = self.tls
        label = transport.label
        if accepted:
            first = await tls_layer.peek_first_byte(transport.sock)
            if first is None:
                raise PeerClosed(f"{label} closed the connection before sending a byte")
            if first == tls_layer.PREAMBLE_FIRST_BYTE:
                # A plain peer: our preamble and the error it reads like any refusal (§3.1).
                self.tls_refusals += 1
                await transport.send([self.preamble.encode()])
                await send_error(transport, "tls-required", tls_layer.TLS_REQUIRED_MESSAGE, before_preamble=True)
                raise tls_layer.refused_plain(label)
            ctx, name = config.server, None
            if ctx is None:
                raise TlsError(f"TLS with {label}: this node has no server TLS context to accept connections with")
        else:
            ctx, name = config.client, config.server_name or host
            if ctx is None:
                raise TlsError(f"TLS with {label}: this node has no client TLS context to connect with")
        transport.use_tls(tls_layer.wrap(ctx, transport.sock, accepted, name))
        try:
            await tls_layer.run_handshake(transport.sock)
        except (ssl.SSLError, OSError) as e:
            # TLS sent its alert: the close drains input first, so that the peer reads the
            # alert rather than a reset (§11.3), as after an error message.
            transport.error_sent = True
            raise tls_layer.explain(e, label, accepted, name) from None
        transport.tls_ready = True
        try:
            return await handshake(transport, self._our_side(transport, accepted))
        except Exception as e:
            if transport.tls_failure is not None and not isinstance(e, TlsError):
                # A TLS 1.3 client learns that the peer refused its certificate on its first read.
                raise tls_layer.explain(transport.tls_failure, label, accepted, name) from None
            raise

    async def _open(
        self,
        sock: socket.socket,
        label: str,
        accepted: bool = False,
        peer_pid: Optional[int] = None,
        host: Optional[str] = None,
    ) -> Peer:
        """Handshakes on a fresh connection (TLS first on TCP when the node has it, spec
        §3.1; ``host``: the host part of the dialed address), registers the peer and starts
        its reader."""
        if sock.family == socket.AF_UNIX:
            raise_unix_send_buffer(sock)
        transport = Transport(sock, label, self.bounds)
        transport.peer_pid = peer_pid
        transport.set_tcp_timeout(self.tcp_timeout)
        entry = self._admission.begin_handshake(transport) if accepted else None
        timeout = self.bounds.handshake_timeout
        transport.handshake_deadline = asyncio.get_running_loop().time() + timeout
        secure = self.tls is not None and not transport.unix
        try:
            try:
                if secure:
                    done = await asyncio.wait_for(self._handshake_tls(transport, accepted, host), timeout)
                else:
                    done = await asyncio.wait_for(handshake(transport, self._our_side(transport, accepted)), timeout)
            except asyncio.TimeoutError:
                if secure and not transport.tls_ready:
                    # Nothing to say in plain text inside a TLS handshake: close.
                    await transport.aclose()
                    raise TlsError(
                        f"TLS with {label}: the TLS handshake did not complete within {timeout:g} s "
                        "(the handshake timeout); the peer stalled"
                    ) from None
                msg = f"the handshake did not complete within {timeout:g} s"
                # (Sent only if the peer's whole preamble arrived, §3.)
                await send_error(transport, "timeout", f"timed out: {msg}")
                await transport.aclose(drain=self.bounds.drain_seconds)
                raise HandoffError(f"handshake with {label}: {msg}") from None
            except asyncio.CancelledError:
                if entry is None or not entry.evicted:
                    await transport.aclose()
                    raise
                # Closed to make room for a newer handshake: say so without waiting for
                # anything, if the peer has shown it speaks this format (its whole preamble, §3).
                if transport.preamble_received:
                    transport.try_send_now(
                        wire.encode_message(
                            wire.Error(
                                "overloaded",
                                f"this node runs {self.bounds.max_handshakes} handshakes at once, "
                                "the most it allows, and closed the oldest; try again later",
                            )
                        )
                    )
                    await transport.aclose(drain=0)
                else:
                    await transport.aclose()
                raise HandoffError(f"handshake with {label}: closed to make room for newer ones") from None
            except BaseException:
                await transport.aclose(drain=self.bounds.drain_seconds if transport.error_sent else None)
                raise
        finally:
            if entry is not None:
                self._admission.end_handshake(entry)
            if transport.closed:
                self._admission.unclaim(transport)
        channel = "shm" if transport.unix else "tcp"
        ident = done.ident
        if transport.unix and ident.host != self.host_id:
            self._warn_about(
                f"peer {ident.name}",
                "peer %s on our Unix socket claims another host id (%s); it shares our memory all the same",
                ident.name,
                ident.host,
            )
        peer = Peer(self, transport, ident, channel, done.version)
        peer.accepted = accepted
        self._add_peer(peer)
        self._admission.unclaim(transport)  # the established connection speaks for the node id now
        peer.reader = self.loop.create_task(peer.read_loop())
        return peer

    async def _connect_tcp(self, addr: str) -> Peer:
        target = strip_scheme(addr, "tcp://")
        host, port = split_host_port(target)
        infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        last: Optional[Exception] = None
        sock = None
        for family, kind, proto, _, sockaddr in infos:
            s = socket.socket(family, kind, proto)
            s.setblocking(False)
            try:
                await self.loop.sock_connect(s, sockaddr)
                sock = s
                break
            except OSError as e:
                s.close()
                last = e
        if sock is None:
            if isinstance(last, OSError) and last.errno is not None:
                raise type(last)(last.errno, f"connecting to {addr}: {last.strerror}")
            raise ConnectionError(f"connecting to {addr}: {last}")
        return await self._open(sock, addr, host=host)

    async def _connect_unix(self, path: str) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await self.loop.sock_connect(sock, path)
            pid = check_peer_uid(sock)
        except BaseException:
            sock.close()
            raise
        return await self._open(sock, f"unix://{path}", peer_pid=pid)

    async def _accept_loop(self, lsock: socket.socket, unix: bool) -> None:
        # An accept that finds a connection waiting does not return to the event loop: a
        # flood of connections (slowloris) would be accepted in one turn, every other
        # peer's message waiting behind it. After a slice, new input goes first.
        clock = time.perf_counter
        turn_began = clock()
        while True:
            if clock() - turn_began >= _ACCEPT_SLICE:
                await after_new_input()
                turn_began = clock()
            try:
                try:
                    conn, addr = lsock.accept()
                    conn.setblocking(False)
                except (BlockingIOError, InterruptedError):
                    conn, addr = await self.loop.sock_accept(lsock)
                    turn_began = clock()  # it waited: a new slice begins
            except asyncio.CancelledError:
                return
            except OSError as e:
                if self._closed:
                    return
                self._warn_about("accept", "accept failed: %s", e)
                # Out of descriptors: wait for connections to close instead of spinning.
                await asyncio.sleep(0.1 if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS) else 0.01)
                continue
            if unix:
                label = "unix peer"
            else:
                label = (
                    f"tcp://[{addr[0]}]:{addr[1]}" if conn.family == socket.AF_INET6 else f"tcp://{addr[0]}:{addr[1]}"
                )
            source = "unix peers" if unix else f"connections from {addr[0]}"
            self._spawn(self._accepted(conn, label, unix, source))

    async def _accepted(self, conn: socket.socket, label: str, unix: bool, source: str) -> None:
        try:
            pid = check_peer_uid(conn) if unix else None
            peer = await self._open(conn, label, accepted=True, peer_pid=pid)
            log.info("%s: accepted peer %s (%s, %s)", self.name, peer.name, peer.locality, peer.channel)
        except asyncio.CancelledError:
            conn.close()
        except Exception as e:
            self._warn_about(source, "refused connection from %s: %s", label, e)
            try:
                conn.close()
            except OSError:
                pass

    async def _pull(self, ticket: Ticket, off: int, n: int, whole: bool) -> memoryview:
        return await self._tickets.pull(ticket, off, n, whole)

    async def _renew(self, ticket: Ticket) -> None:
        await self._tickets.renew(ticket)

    def _ticket_released(self, desc: wire.TicketDesc, label: str) -> None:
        self._tickets.released(desc, label)

    def segment_pool_stats(self) -> dict:
        return pool().stats()

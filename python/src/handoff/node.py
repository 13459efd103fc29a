"""The asyncio :class:`Node`: listens, connects, handshakes, sends and receives.

A node speaks the wire format of spec/WIRE.md v1 with any implementation: over TCP,
and with a same-host peer (equal host ids) over a Unix socket that carries shared
memory, switching to it after connecting over TCP as the reference does (§7.1). It
issues and redeems tickets (§7.5–§7.9).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Iterable, Optional

from . import identity, wire
from .envelope import Envelope
from .errors import HandoffError, OwnerLost, PeerClosed, TicketCorrupt, TicketRefused
from .handshake import OurSide, handshake
from .peer import Peer
from .resources import Resources
from .tickets import LeaseTable, Ticket, digest
from .transport import Transport

__all__ = ["Node", "DEFAULT_SHM_THRESHOLD", "HANDSHAKE_TIMEOUT"]

log = logging.getLogger("handoff")

#: Buffers at least this large go to same-host peers as shared memory (as in the reference).
DEFAULT_SHM_THRESHOLD = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0


def _split_host_port(addr: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:]+):(\d+)", addr)
    if not m:
        raise ValueError(f"not a host:port address: {addr!r}")
    return (m.group(1) or m.group(3), int(m.group(2) or m.group(4)))


def _strip(addr: str, scheme: str) -> str:
    return addr[len(scheme) :] if addr.startswith(scheme) else addr


def _sanitize(name: str) -> str:
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "_" for c in name)[:32]


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
    ``lease_ttl`` (seconds), ``types`` (accepted type names; ``None`` accepts any).
    """

    def __init__(
        self,
        name: str,
        *,
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
        inbox_capacity: int = 1024,
    ):
        if not name:
            raise ValueError("a node needs a name")
        if redeem not in ("eager", "lazy"):
            raise ValueError("redeem is 'eager' or 'lazy'")
        self.name = name
        self.node_id = identity.random_id()
        self.process_id = identity.process_id()
        self.host_id = host_id or identity.host_id()
        self.secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        self._listen = listen
        self.shm = shm
        self.shm_threshold = max(1, shm_threshold)
        self.frame_threshold = frame_threshold
        self.ticket_threshold = ticket_threshold
        self.redeem = redeem
        self.pull_timeout = pull_timeout
        self.limits = limits
        self.types = set(types) if types is not None else None
        self.leases = LeaseTable(lease_ttl)
        #: This node's local resources: resource keys in received bodies bind to them (§8.3).
        self.resources = Resources(name)
        self.listen_addr: Optional[str] = None
        self.unix_path: Optional[Path] = None
        self._inbox_capacity = inbox_capacity
        self._peers: dict[str, Peer] = {}
        self._all_peers: set = set()
        self._listeners: list = []
        self._tasks: set = set()
        self._next_req = 1
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ life

    @property
    def caps(self) -> list:
        return ["inline", "shm", "ticket"] if self.shm else ["inline", "ticket"]

    @property
    def unix_addr(self) -> Optional[str]:
        return f"unix://{self.unix_path}" if self.unix_path else None

    async def start(self) -> "Node":
        if self._started:
            return self
        self.loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue = asyncio.Queue(self._inbox_capacity)
        self._peers_changed = asyncio.Condition()
        if self._listen is not None:
            host, port = _split_host_port(_strip(self._listen, "tcp://"))
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            lsock = socket.socket(family, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(sockaddr)
            lsock.listen(128)
            lsock.setblocking(False)
            bound = lsock.getsockname()
            self.listen_addr = (
                f"tcp://[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"tcp://{bound[0]}:{bound[1]}"
            )
            self._listeners.append(lsock)
            self._spawn(self._accept_loop(lsock, unix=False))
        if self.shm:
            path = identity.runtime_dir() / f"{_sanitize(self.name)}-{self.node_id[:12]}.sock"
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            usock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            usock.bind(str(path))
            os.chmod(path, 0o600)
            usock.listen(128)
            usock.setblocking(False)
            self.unix_path = path
            self._listeners.append(usock)
            self._spawn(self._accept_loop(usock, unix=True))
        self._spawn(self._reap_expired())
        self._started = True
        log.info(
            "node %s started (host %s, listen %s, unix %s)", self.name, self.host_id, self.listen_addr, self.unix_addr
        )
        return self

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        if self._closed:
            return
        self._closed = True
        for s in self._listeners:
            try:
                s.close()
            except OSError:
                pass
        if self.unix_path is not None:
            try:
                self.unix_path.unlink()
            except OSError:
                pass
        for task in list(self._tasks):
            task.cancel()
        peers = list(self._all_peers)
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)

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

    def _check_type(self, type_name: str) -> None:
        if self.types is not None and type_name not in self.types:
            raise wire.WireError(
                "unknown-type", f"unknown type name {type_name!r}; this node knows: {', '.join(sorted(self.types))}"
            )

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
        p = self._peers.get(node_id)
        return p if p is not None and not p.closed else None

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
        self._all_peers.add(peer)
        self._spawn(self._notify_peers())

    def _remove_peer(self, peer: Peer) -> None:
        self._all_peers.discard(peer)
        if self._peers.get(peer.node_id) is peer:
            del self._peers[peer.node_id]
        if not self._closed:
            self._spawn(self._notify_peers())

    def _our_side(self) -> OurSide:
        return OurSide(
            node_id=self.node_id,
            name=self.name,
            host_id=self.host_id,
            process_id=self.process_id,
            caps=self.caps,
            secret=self.secret,
            limits=self.limits,
            listen=self.listen_addr,
            unix=self.unix_addr,
        )

    async def _open(self, sock: socket.socket, label: str) -> Peer:
        """Handshakes on a fresh connection, registers the peer and starts its reader."""
        transport = Transport(sock, label)
        try:
            hello, _ = await asyncio.wait_for(handshake(transport, self._our_side()), HANDSHAKE_TIMEOUT)
        except asyncio.TimeoutError:
            await transport.aclose()
            raise HandoffError(f"handshake with {label} took over {HANDSHAKE_TIMEOUT}s") from None
        except BaseException:
            await transport.aclose()
            raise
        channel = "shm" if transport.unix else "tcp"
        if transport.unix and hello.host != self.host_id:
            log.warning(
                "%s: peer %s on our Unix socket claims another host id (%s); it shares our memory all the same",
                self.name,
                hello.name,
                hello.host,
            )
        peer = Peer(self, transport, hello, channel)
        self._add_peer(peer)
        peer.reader = self.loop.create_task(peer.read_loop())
        return peer

    async def connect(self, addr: str, channel: Optional[str] = None) -> Peer:
        """Connects to ``tcp://HOST:PORT`` (or ``HOST:PORT``) or ``unix://PATH``.

        Over TCP, a peer with our host id that offers its Unix socket is reached through
        it (channel ``shm``) unless ``channel="tcp"``; with ``channel="shm"`` it must be.
        """
        if not self._started:
            await self.start()
        if addr.startswith("unix://"):
            return await self._connect_unix(_strip(addr, "unix://"))
        target = _strip(addr, "tcp://")
        host, port = _split_host_port(target)
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
            raise ConnectionError(f"connecting to {addr}: {last}")
        peer = await self._open(sock, addr)
        if channel == "tcp":
            return peer
        why_not = None
        if peer.hello.host != self.host_id:
            why_not = "it is on another host"
        elif not self.shm:
            why_not = "this node has shared memory turned off"
        elif "shm" not in peer.hello.caps or not peer.hello.unix:
            why_not = "it offers no Unix socket"
        if why_not is not None:
            if channel == "shm":
                await peer.close()
                raise HandoffError(f"cannot use shm with {peer.name}: {why_not}")
            return peer
        try:
            shm_peer = await self._connect_unix(_strip(peer.hello.unix, "unix://"))
        except Exception as e:
            if channel == "shm":
                await peer.close()
                raise
            log.warning(
                "%s: same-host peer %s, but its Unix socket %s cannot be reached (%s); falling back to tcp",
                self.name,
                peer.name,
                peer.hello.unix,
                e,
            )
            return peer
        await peer.close()
        log.info("%s: same-host peer %s: using shm", self.name, shm_peer.name)
        return shm_peer

    async def _connect_unix(self, path: str) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await self.loop.sock_connect(sock, path)
            _check_peer_uid(sock)
        except BaseException:
            sock.close()
            raise
        return await self._open(sock, f"unix://{path}")

    async def _accept_loop(self, lsock: socket.socket, unix: bool) -> None:
        while True:
            try:
                conn, addr = await self.loop.sock_accept(lsock)
            except asyncio.CancelledError:
                return
            except OSError as e:
                if self._closed:
                    return
                log.warning("%s: accept failed: %s", self.name, e)
                await asyncio.sleep(0.05)
                continue
            if unix:
                label = "unix peer"
            else:
                label = (
                    f"tcp://[{addr[0]}]:{addr[1]}" if conn.family == socket.AF_INET6 else f"tcp://{addr[0]}:{addr[1]}"
                )
            self._spawn(self._accepted(conn, label, unix))

    async def _accepted(self, conn: socket.socket, label: str, unix: bool) -> None:
        try:
            if unix:
                _check_peer_uid(conn)
            peer = await self._open(conn, label)
            log.info("%s: accepted peer %s (%s, %s)", self.name, peer.name, peer.locality, peer.channel)
        except asyncio.CancelledError:
            conn.close()
        except Exception as e:
            log.warning("%s: refused connection from %s: %s", self.name, label, e)
            try:
                conn.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ receiving

    async def _deliver(self, env: Envelope) -> None:
        try:
            env.decode()
        except Exception as e:  # the application sees it when it asks for the body
            log.warning("%s: %s from %s: %s", self.name, env.type_name, env.sender.name, e)
        await self._inbox.put(env)

    async def recv(self, timeout: Optional[float] = None) -> Envelope:
        """The next received message (``asyncio.TimeoutError`` after ``timeout`` seconds)."""
        if timeout is None:
            return await self._inbox.get()
        return await asyncio.wait_for(self._inbox.get(), timeout)

    # ------------------------------------------------------------------ tickets (holder side)

    def _owner_label(self, desc: wire.TicketDesc) -> str:
        p = self.peer_by_id(desc.owner)
        if p is not None:
            return f"{p.name} ({desc.addr})" if desc.addr else p.name
        return f"{desc.owner[:12]} ({desc.addr})" if desc.addr else desc.owner

    async def _owner_peer(self, ticket: Ticket) -> Peer:
        desc = ticket.desc
        p = self.peer_by_id(desc.owner)
        if p is not None:
            return p
        if not desc.addr:
            raise OwnerLost(
                ticket.owner_label, desc.lease, desc.n, "not connected to the owner, and the ticket has no address"
            )
        try:
            # Pinned to TCP: pulled bytes travel inline on any channel, and switching to the
            # owner's Unix socket would close the TCP connection, which owners may take as
            # the loss of this node's hold (the reference does, §7.7).
            p = await asyncio.wait_for(self.connect(desc.addr, channel="tcp"), self.pull_timeout)
        except asyncio.TimeoutError:
            raise OwnerLost(
                ticket.owner_label, desc.lease, desc.n, f"connecting took over {self.pull_timeout}s"
            ) from None
        except Exception as e:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"cannot connect: {e}") from None
        if p.node_id != desc.owner:
            await p.close()
            raise OwnerLost(
                ticket.owner_label,
                desc.lease,
                desc.n,
                f"the node at {desc.addr} is {p.node_id}, not the ticket's owner",
            )
        return p

    async def _request(self, ticket: Ticket, what: str, make) -> tuple:
        desc = ticket.desc
        peer = await self._owner_peer(ticket)
        req = self._next_req
        self._next_req += 1
        fut = self.loop.create_future()
        peer.pending[req] = (fut, what)
        try:
            await peer._send_control(make(req))
        except PeerClosed as e:
            peer.pending.pop(req, None)
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"sending the {what}: {e}") from None
        try:
            result = await asyncio.wait_for(fut, self.pull_timeout)
        except asyncio.TimeoutError:
            peer.pending.pop(req, None)
            raise OwnerLost(
                ticket.owner_label, desc.lease, desc.n, f"no answer to the {what} within {self.pull_timeout}s"
            ) from None
        if result[0] == "refused":
            raise TicketRefused(ticket.owner_label, desc.lease, what, result[1], result[2])
        if result[0] == "lost":
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, result[1])
        return result

    async def _pull(self, ticket: Ticket, off: int, n: int, whole: bool) -> memoryview:
        if ticket.released:
            raise HandoffError(f"the ticket for lease {ticket.lease} was released")
        desc = ticket.desc
        result = await self._request(ticket, "pull", lambda req: wire.Pull(req, desc.lease, desc.token, off, n))
        if result[0] != "bytes":
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, "answered a pull with a token")
        view = result[1]
        if len(view) != n:
            raise OwnerLost(ticket.owner_label, desc.lease, desc.n, f"asked for {n} bytes, got {len(view)}")
        if whole:
            got = (
                await asyncio.get_running_loop().run_in_executor(None, digest, view) if n >= (8 << 20) else digest(view)
            )
            if got != desc.digest:
                raise TicketCorrupt(ticket.owner_label, desc.lease)
        return view

    async def _renew(self, ticket: Ticket) -> None:
        peer = await self._owner_peer(ticket)
        await peer._send_control(wire.Renew(ticket.desc.lease, ticket.desc.token))

    async def _forward(self, ticket: Ticket, to: str) -> wire.TicketDesc:
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
        )

    def _ticket_released(self, desc: wire.TicketDesc, label: str) -> None:
        """A ticket handle was released or collected: send ``unlease`` (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self._unlease, desc)
        except (RuntimeError, AttributeError):
            pass

    def _unlease(self, desc: wire.TicketDesc) -> None:
        p = self.peer_by_id(desc.owner)
        if p is None:
            log.debug(
                "%s: not connected to the owner of lease %d; its deadline will end the hold", self.name, desc.lease
            )
            return
        p._spawn(p._answer_quietly(wire.Unlease(desc.lease, desc.token), None))

    async def _redeem_all(self, env: Envelope) -> None:
        """Eager redemption: pulls every ticket of the message, then ends each hold (§7.6).

        Tickets the sender marked ``lazy`` are left for the application to pull on use."""
        for f in env.frames:
            if f.kind != "ticket" or not isinstance(f.view, Ticket) or f.view.desc.lazy:
                continue
            ticket = f.view
            try:
                f.view = await ticket.redeem()
            except Exception as e:
                log.warning("%s: a ticket from %s could not be redeemed: %s", self.name, env.sender.name, e)
                env.error = e
                for g in env.frames:
                    if isinstance(g.view, Ticket):
                        g.view.release()
                return
            finally:
                ticket.release()

    def _holder_disconnected(self, node_id: str, name: str) -> None:
        def drop() -> None:
            if self.peer_by_id(node_id) is None:
                ended = self.leases.drop_holder(node_id)
                if ended:
                    log.info("%s: peer %s gone: its holds on %d ticket leases ended", self.name, name, ended)

        if self.peer_by_id(node_id) is None and not self._closed:
            self.loop.call_later(0.2, drop)

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            n = self.leases.expire()
            if n:
                log.info("%s: %d ticket holds ended by their deadline", self.name, n)

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

    def stats(self) -> dict:
        """What ``handoff.admin.Stats`` carries (spec Appendix A)."""
        shm = self.shm_leases()
        return {
            "node": self.name,
            "ticket_leases": self.ticket_leases(),
            "shm_leases": shm,
            "shm_pool": {"segments": shm["count"], "bytes": shm["bytes"], "idle_segments": 0, "idle_bytes": 0},
            "peers": [[p.name, p.channel] for p in self.peers],
        }


def _check_peer_uid(sock: socket.socket) -> None:
    """Refuses a same-host peer that runs as another user (SO_PEERCRED, §7.1)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise PermissionError(f"refusing a same-host peer running as uid {uid} (we are uid {os.geteuid()}, pid {pid})")

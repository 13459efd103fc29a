"""A connection of the reference node (:class:`Peer`): how messages reach it, and its read loop.

What one peer can make this node hold is bounded (spec §9.1, :mod:`handoff.bounds`):
the read loop admits each message against the node's buffered-bytes budget before it
reads or maps its frames, and stops reading while there is no room; ticket answers
go out through one writer per connection (no task per request), and the loop stops
reading while too many of them wait; shared-memory leases kept for the peer are
capped; warnings about the peer are rate-limited.

The shared-memory leases kept for the peer (:mod:`handoff.shm_leases`) and the writer of
ticket answers (:mod:`handoff.control`) live below this module; what the peer uses of its
node is :class:`PeerNode`. What stays is one connection, sending and reading: the read
loop and the send path share the connection's state (leases, pending requests, the
charge of the message being read), which is why they are one class in one file.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import sys
import time
import weakref
from typing import Any, Optional, Protocol

from . import wire
from handoff.bounds import Bounds
from .budget import Budget
from handoff.codec import OnDemand, encode_body
from .plain import is_plain
from .control import ControlWriter
from handoff.envelope import Envelope, ReceivedFrame
from handoff.errors import HandoffError, PeerClosed, PeerRefused
from .handshake import send_error
from handoff.inbox import ConnectionQueue
from .mapcache import Kept, MapCache
from handoff.outgoing import check_type_name

from .outgoing import check_frames, check_header, clip
from .recvbuf import MIN_POOLED, recv_pool
from handoff.resources import Resources
from .shm_leases import PooledLease, SealedLease, ShmLeases, pooled_copy
from handoff.shm import PooledFrame, SharedFrame
from .shm import COPY_BELOW, map_received, read_received, sealed_copy, segment_info
from handoff.throttle import WarningThrottle
from .ticket_client import TicketClient
from handoff.peer import Peer as PeerBase
from handoff.tickets import Ticket
from .leases import STREAM_DIGEST_MIN, LeaseTable, Refusal, StreamDigest
from .transport import MAX_FDS_PER_READ, Transport
from .wire.framing import header_length_at
from .turns import after_new_input

__all__ = ["Peer", "PeerNode"]

log = logging.getLogger("handoff")

#: Frames at least this large are read into memory that is not zero-filled first (a numpy
#: array, else an anonymous mapping).
_MMAP_FRAME = 1 << 20


#: Frames at least this large are received into memory advised for transparent huge pages
#: where numpy is not there to allocate them (it advises its large arrays so itself).
_HUGE_FRAME = 4 << 20
#: Longest a connection's reader handles messages before it lets the other connections
#: run (seconds). Its socket may hold many messages, each read at once without waiting:
#: without a yield, a peer that pipelines requests would hold the event loop for all of
#: them (16 shared-memory holds took 1.4 ms in one turn), and every other peer's round
#: trip would wait behind them (issue 11).
_READ_SLICE = 100e-6
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _plain_message(type_name: str, value: Any, frame_threshold: int) -> Optional[bytes]:
    """The framed header of a ``msg`` without frames whose body is ``value``, if ``value``
    is plain (:func:`handoff_pure.plain.is_plain`); else ``None`` (then ``encode_body`` walks
    it). The same bytes as ``frame_plain_msg(type_name, encode_body(value).body)``."""
    if is_plain(value, frame_threshold):
        return wire.frame_plain_msg(type_name, wire.packer().pack(value))
    return None


class PeerNode(Protocol):
    """What a connection uses of its node: a :class:`handoff.node.Node`, which sits above
    this module (it makes the peers). Its settings, the budget and bounds every
    connection shares, the owner's lease table, the ticket client, and the calls a
    connection makes when a message arrives or the connection ends."""

    name: str
    node_id: str
    host_id: str
    process_id: str
    listen_addr: Optional[str]
    caps: list
    loop: asyncio.AbstractEventLoop
    bounds: Bounds
    limits: wire.Limits
    #: What this node sends within: the defaults of §9, or its own limits where smaller.
    send_limits: wire.Limits
    per_connection: bool
    redeem: str
    frame_threshold: int
    ticket_threshold: Optional[int]
    shm_threshold: int
    shm_pool: bool
    shm_private: bool
    resources: Resources
    leases: LeaseTable
    _budget: Budget
    _throttle: WarningThrottle
    _tickets: TicketClient
    _closed: bool

    def _spawn(self, coro: Any) -> asyncio.Task: ...

    def _check_type(self, type_name: str) -> None: ...

    async def _deliver(self, env: Envelope) -> None: ...

    def _deliver_now(self, env: Envelope) -> None: ...

    def _delivers_now(self, peer: "Peer") -> bool: ...

    def _remove_peer(self, peer: "Peer") -> None: ...

    def _holder_disconnected(self, node_id: str, name: str) -> None: ...


def _filled(view: memoryview) -> None:
    """The frame read into ``view`` (from :func:`_alloc`) is whole: a pooled buffer may be reused."""
    if len(view) >= MIN_POOLED:
        recv_pool().filled(view)


def _alloc(n: int) -> memoryview:
    if n >= MIN_POOLED:
        # A warm buffer a frame before used: its pages are in place (see handoff.recvbuf).
        view = recv_pool().take(n)
        if view is not None:
            return view
    if n >= _MMAP_FRAME:
        # numpy's allocator (malloc) hands the memory of a large frame that was freed to the
        # next one, whose pages are then in place already; a fresh anonymous mapping faults
        # every page in again (on these machines that is slower than the copy from the socket).
        np = sys.modules.get("numpy")
        if np is not None:
            return memoryview(np.empty(n, dtype=np.uint8))
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)  # private: huge pages may back it, not shmem
        if n >= _HUGE_FRAME and _MADV_HUGEPAGE is not None:
            try:
                m.madvise(_MADV_HUGEPAGE)
            except OSError:  # pragma: no cover - advice only
                pass
        return memoryview(m)
    return memoryview(bytearray(n))


def _own(n: int) -> memoryview:
    """A fresh buffer of its own for a small frame (a numpy array, as Dask's ``host_array``)."""
    np = sys.modules.get("numpy")
    return memoryview(np.empty(n, dtype=np.uint8) if np is not None else bytearray(n))


def _shm_released(peer_ref: "weakref.ref[Peer]", lease: int) -> None:
    """Called when the last view of a received shared frame is gone (any thread)."""
    peer = peer_ref()
    if peer is None or peer.closed:
        return
    try:
        peer.node.loop.call_soon_threadsafe(peer._queue_release, lease)
    except RuntimeError:
        pass  # the event loop is closed


def _kept_released(peer_ref: "weakref.ref[Peer]", kept: Kept, lease: int) -> None:
    """The last view of a frame mapped through a kept mapping is gone (any thread)."""
    peer = peer_ref()
    if peer is None:
        return
    try:
        peer.node.loop.call_soon_threadsafe(peer._kept_done, kept, lease)
    except RuntimeError:
        pass  # the event loop is closed


class Peer(PeerBase):
    """A connected node. Get one from :meth:`Node.connect`, :meth:`Node.peer` or ``envelope.sender``.

    On a node built with ``per_connection=True`` each connection delivers its messages to
    its own queue, taken with :meth:`recv`, instead of the node's inbox."""

    def __init__(self, node: PeerNode, transport: Transport, ident: wire.Ident, channel: str, version: int = 3):
        self.node = node
        self.transport = transport
        #: What the peer said about itself in the handshake (its ident, or its v1 hello's fields).
        self.ident = ident
        #: ``tcp`` or ``shm`` (a Unix socket).
        self.channel = channel
        #: The wire protocol version of the connection (§3): 3, or 2 or 1 with an older peer
        #: that the node accepts.
        self.protocol_version = version
        self.closed = False
        self.pending: dict = {}  # req -> (future, what, bytes expected for a pull or None, whole redemption)
        #: The shared-memory leases this node keeps for the peer (:mod:`handoff.shm_leases`).
        self._shm = ShmLeases()
        self._releases: list = []
        self._release_task: Optional[asyncio.Task] = None
        #: Whole-segment private mappings kept for the next frame (:mod:`handoff.mapcache`).
        self._maps: Optional[MapCache] = MapCache(node.loop)
        self._deliveries: Optional[asyncio.Queue] = None
        self._delivery_task: Optional[asyncio.Task] = None
        self._queued = 0
        #: What the messages in ``_deliveries`` are charged (they wait behind the one redeemed).
        self._queued_charge = 0
        #: Of :attr:`buffered`, the bytes of tickets redeemed on receipt, charged ahead of
        #: their pull (the reader's bounds are raised by them while it waits for answers).
        self.tickets = 0
        #: Bytes of this peer's messages buffered and not yet taken by the application (§9.1).
        self.buffered = 0
        #: How many messages those are.
        self.messages = 0
        self._charge = 0  # of the message being read
        # Ticket answers and other control headers waiting for the writer (one task).
        self._control = ControlWriter(
            self._send_control,
            lambda: self.node.bounds,
            lambda: self.closed,
            node.loop,
            lambda: (self.node.name, self.name),
        )
        self._tasks: set = set()
        self.reader: Optional[asyncio.Task] = None
        self.done = asyncio.Event()
        #: Whether the peer connected to us (we accepted the connection).
        self.accepted = False
        #: This connection's own messages (``per_connection`` nodes), taken by :meth:`recv`.
        self.queue: Optional[ConnectionQueue] = ConnectionQueue() if node.per_connection else None
        self._delivered = False
        self._routes: Optional[tuple] = None

    def __repr__(self) -> str:
        return f"Peer({self.name}, {self.locality}, {self.channel})"

    @property
    def tls(self) -> bool:
        """Whether the connection runs inside TLS (spec §3.1)."""
        return bool(self.transport.tls)

    def fileno(self) -> int:
        """The connection's socket descriptor, to look at (its options, its addresses); the
        node reads and writes it, nothing else may."""
        return self.transport.sock.fileno()

    @property
    def failure(self) -> Optional[OSError]:
        """The ``OSError`` that ended the connection (a reset, ``ETIMEDOUT`` from keepalive
        or a write that made no progress, a broken pipe), or ``None`` while it is open or
        if it closed cleanly or for a protocol reason."""
        return self.transport.failure

    def sockname(self):
        """This end's socket address (``OSError`` once the connection is closed)."""
        return self.transport.sock.getsockname()

    def peername(self):
        """The peer's socket address (``OSError`` once the connection is closed)."""
        return self.transport.sock.getpeername()

    # ------------------------------------------------------------------ sending

    def unix_switch(self, we_offer_shm: bool) -> tuple:
        """Whether this TCP connection moves on to the peer's Unix socket (spec §7.1):
        ``(path, None)``, or ``(None, why)`` when it may not (the reference's own reading of
        the rule the engine applies, ``handoff_proto::peers::unix_switch``)."""
        if self.ident.host != self.node.host_id:
            return None, "it is on another host"
        if not we_offer_shm:
            return None, "this node has shared memory turned off"
        if "shm" not in self.ident.caps or not self.ident.unix:
            return None, "it offers no Unix socket"
        return self.ident.unix, None

    def shm_leases(self) -> dict:
        """Shared-memory leases this node holds for the peer: ``{count, bytes}``."""
        return self._shm.stats()

    @property
    def _leases(self) -> dict:
        """Lease id -> what it keeps, for tests that look inside (:attr:`ShmLeases.kept`)."""
        return self._shm.kept

    def _ticket_wanted(self, n: int, by_ticket: bool) -> bool:
        if n == 0:
            return False
        if by_ticket:
            if "ticket" not in self.ident.caps:
                raise HandoffError(f"{self.name} does not accept tickets (it did not announce 'ticket')")
            return True
        t = self.node.ticket_threshold
        return self.channel == "tcp" and t is not None and n >= t and "ticket" in self.ident.caps

    async def send(self, type_name: str, body: Any, *, by_ticket: bool = False) -> None:
        """Sends a message of type ``type_name`` whose body is ``body`` (usually a dict).

        Buffers in the body (see :mod:`handoff.codec`) travel as frames: over a Unix
        socket those of at least the node's ``shm_threshold`` as shared memory, over TCP
        inline or, with ``by_ticket`` or the node's ``ticket_threshold``, as tickets. An
        :class:`~handoff.codec.OnDemand` buffer goes as a ``lazy`` ticket to a peer that
        takes tickets, on any channel. Route-aware values (:mod:`handoff.route`) are
        encoded for :attr:`route`.
        """
        check_type_name(type_name)
        if self.closed:
            raise PeerClosed(f"the connection to {self.name} is closed")
        limits = self.node.send_limits
        head = _plain_message(type_name, body, self.node.frame_threshold)
        if head is not None:  # no frame, nothing to lease: the header is the message
            await self._send_header_only(head)
            return
        enc = encode_body(body, self.node.frame_threshold, is_frame=_is_node_frame, route=self.route)
        # Before anything is copied or leased for it: would a receiver take these frames? (§9)
        check_frames((_frame_size(v, src) for v, src in zip(enc.frames, enc.sources)), limits, self.name)
        descs: list = []
        inline: list = []
        fds: list = []
        new_shm: list = []
        new_tickets: list = []
        # After the write, whatever it did: descriptors this send opened (sealed copies,
        # duplicates of an application's segments) are closed, and the segments copied
        # for it are unmapped here (the receiver maps them: see handoff_pure.pool).
        close_after: list = []
        copies: list = []
        try:
            for view, source in zip(enc.frames, enc.sources):
                if isinstance(source, Ticket):
                    # Back to its owner, or an XXH3 ticket to a peer that would refuse it (§7.8): the bytes.
                    if source.desc.owner == self.node_id or (
                        source.desc.xxh3 is not None and "xxh3" not in self.ident.caps
                    ):
                        view = await source.redeem()
                    else:
                        descs.append(await self.node._tickets.forward(source, self.node_id))
                        continue
                elif isinstance(source, SharedFrame):
                    view = source.view
                n = view.nbytes
                lazy = isinstance(source, OnDemand) and n > 0 and "ticket" in self.ident.caps
                if lazy or self._ticket_wanted(n, by_ticket):
                    known = source.digest if lazy else None
                    xxh3 = "xxh3" in self.ident.caps
                    lease, token, dg = await self.node.leases.issue(
                        view, self.node_id, known, self.name, xxh3=xxh3, gone=lambda: self.closed
                    )
                    new_tickets.append(lease)
                    descs.append(
                        wire.TicketDesc(
                            n=n,
                            owner=self.node.node_id,
                            addr=self.node.listen_addr,
                            lease=lease,
                            token=token,
                            digest=dg if len(dg) == 32 else None,
                            ttl=int(self.node.leases.ttl * 1000),
                            lazy=lazy,
                            xxh3=dg if len(dg) == 16 else None,
                        )
                    )
                    continue
                shared = None
                fd = -1
                sealed = False
                if isinstance(source, PooledFrame) and source.native_frame is not None:
                    # A segment of the engine's pool, in a process that also runs this
                    # reference: its bytes go (copied below), as any buffer's.
                    source = None
                if self.channel == "shm" and len(fds) < MAX_FDS_PER_READ and n > 0:
                    if isinstance(source, PooledFrame):
                        await self._shm.room(source.size, self.node.bounds, self.name, lambda: self.closed)
                        if source.segment is None:
                            raise ValueError("the pooled frame is closed")
                        source.segment.hold()  # this lease's, let go when it ends
                        shared = PooledLease(source.segment)
                        fd = source.segment.fd
                    elif isinstance(source, SharedFrame):
                        await self._shm.room(source.size, self.node.bounds, self.name, lambda: self.closed)
                        fd = os.dup(source.fd)
                        close_after.append(fd)
                        shared, sealed = SealedLease(source.size), source.sealed
                    elif n >= self.node.shm_threshold and self.node.shm_pool:
                        # Pooled (§7.4): never waits for room; a peer at its cap gets the bytes inline.
                        if self._shm.full(n, self.node.bounds) is None:
                            shared = await pooled_copy(view)
                            fd = shared.segment.fd
                    elif n >= self.node.shm_threshold:
                        await self._shm.room(n, self.node.bounds, self.name, lambda: self.closed)
                        frame = sealed_copy(view)
                        fd, frame.fd = frame.fd, -1
                        close_after.append(fd)
                        shared, sealed = SealedLease(frame.size), True
                if shared is not None:
                    try:
                        # Before sending: the release may come back at once. After every
                        # await above: the connection may have been cleaned up meanwhile,
                        # and then keep() refuses (nothing would end the lease).
                        lease = self._shm.keep(shared)
                    except BaseException:
                        _end_unkept(shared)
                        raise
                    new_shm.append(lease)
                    if isinstance(shared, PooledLease):
                        copies.append(shared)
                        descs.append(wire.Shm(n=n, off=0, size=shared.size, lease=lease, sealed=False))
                    else:
                        descs.append(wire.Shm(n=n, off=0, size=shared.size, lease=lease, sealed=sealed))
                    fds.append(fd)
                    continue
                descs.append(wire.Inline(n))
                inline.append(view)
            check_frames((d.n for d in descs), limits, self.name)
            if descs:
                head = wire.frame_header(wire.encode_header(wire.Msg(type_name, enc.body, descs)))
            else:
                head = wire.frame_plain_msg(type_name, enc.body)
            check_header(len(head) - wire.LEN_PREFIX, limits, self.name)
        except BaseException:
            # Nothing left: what this message had leased for the peer was never promised to it.
            _after_send(close_after, copies)
            self._shm.end(new_shm)
            for lease in new_tickets:
                self.node.leases.withdraw(lease)
            raise
        try:
            await self.transport.send([head] + inline, fds)
        except PeerClosed:
            self.closed = True
            raise
        finally:
            _after_send(close_after, copies)

    def send_now(self, type_name: str, body: Any) -> bool:
        """Sends a message whose body has no buffer that would travel as a frame, at once,
        if nothing else is being written to this peer: ``True`` if it is sent, ``False``
        if it was not (a frame in the body, another write in progress, a full socket, a
        closed connection), and :meth:`send` must send it instead."""
        check_type_name(type_name)
        if self.closed:
            return False
        head = _plain_message(type_name, body, self.node.frame_threshold)
        if head is None:
            enc = encode_body(body, self.node.frame_threshold, is_frame=_is_node_frame, route=self.route)
            if enc.frames:
                return False
            head = wire.frame_plain_msg(type_name, enc.body)
        if len(head) - wire.LEN_PREFIX > self.node.send_limits.max_header_bytes:
            return False  # too large for a receiver: send() says so (MessageTooLarge)
        return self.transport.send_now(head)

    async def send_packed(self, type_name: str, body: bytes) -> None:
        """Sends a message without frames whose body is already msgpack: what
        :func:`handoff.wire.packer` wrote for a value of plain types (no buffer of the
        frame threshold or more, which :meth:`send` would have sent as a frame), so the
        same bytes :meth:`send` would send for it, without walking it again."""
        check_type_name(type_name)
        if self.closed:
            raise PeerClosed(f"the connection to {self.name} is closed")
        await self._send_header_only(wire.frame_plain_msg(type_name, body))

    async def _send_header_only(self, head: bytes) -> None:
        """Writes a message that is its framed header alone (no frame), within the limits."""
        check_header(len(head) - wire.LEN_PREFIX, self.node.send_limits, self.name)
        try:
            await self.transport.send((head,))
        except PeerClosed:
            self.closed = True
            raise

    async def _send_control(self, header, payload: Any = None) -> None:
        if isinstance(header, wire.TicketError):
            header = wire.TicketError(header.req, header.code, clip(header.msg))  # it may quote the peer
        chunks = [wire.frame_header(wire.encode_header(header))]
        if payload is not None and len(payload):
            chunks.append(payload)
        await self.transport.send(chunks)

    # ------------------------------------------------------------------ ticket answers and other control headers

    def _queue_control(self, header, payload: Any = None) -> None:
        """Queues a header (and a ``pulled``'s bytes) for the connection's one control writer."""
        self._control.queue(header, payload)

    def _queue_unlease(self, lease: int, token: bytes) -> bool:
        """Queues our ``unlease`` of ``lease``; ``False`` (dropped: its deadline ends the
        hold) while too many wait unwritten (§9.1)."""
        return self._control.queue_unlease(wire.Unlease(lease, token))

    # ------------------------------------------------------------------ releasing received shm frames

    def _kept_done(self, kept: Kept, lease: int) -> None:
        """A kept mapping's frame is dropped: scrub the mapping first, then release the lease."""
        if self._maps is not None:
            self._maps.done(kept)
        self._queue_release(lease)

    def _queue_release(self, lease: int) -> None:
        if self.closed:
            return
        self._releases.append(lease)
        if self._release_task is None or self._release_task.done():
            self._release_task = self.node.loop.create_task(self._flush_releases())

    async def _flush_releases(self) -> None:
        await asyncio.sleep(0)  # gather the leases dropped together into one message
        while self._releases and not self.closed:
            leases, self._releases = self._releases[:4096], self._releases[4096:]
            try:
                await self._send_control(wire.Release(leases))
            except PeerClosed:
                return

    # ------------------------------------------------------------------ closing

    def abort(self) -> None:
        """Closes the connection at once, without waiting (its reader cleans up after it)."""
        self.closed = True
        self.transport.shutdown()
        self.node._budget.wake()
        self.node.leases.wake()  # a send of ours waiting for lease room gives up
        self._control.wake()
        self._drop_queued()

    async def close(self) -> None:
        """Closes the connection (the peer sees it end); waits for its reader to finish."""
        self.closed = True
        self._drop_queued()
        self.transport.shutdown()
        self.node._budget.wake()  # a reader waiting for room sees the close
        self.node.leases.wake()  # a send of ours waiting for lease room gives up
        self._control.wake()
        if self.reader is not None and self.reader is not asyncio.current_task():
            try:
                await asyncio.wait_for(asyncio.shield(self.done.wait()), 5)
            except asyncio.TimeoutError:
                self.reader.cancel()

    # ------------------------------------------------------------------ receiving

    def _spawn(self, coro) -> None:
        task = self.node.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def read_loop(self) -> None:
        """Reads messages until the connection ends or the peer breaks the protocol."""
        t = self.transport
        limits = self.node.limits
        budget = self.node._budget
        overhead = self.node.bounds.message_overhead
        clock = time.perf_counter
        turn_began, waits = clock(), t.read_waits
        if not t.tls:
            t.on_messages = self._on_messages
        try:
            while True:
                n = await t.read_length(limits)
                if n is None:
                    break
                if t.read_waits != waits:  # it waited for input: a new slice begins
                    turn_began, waits = clock(), t.read_waits
                elif clock() - turn_began >= _READ_SLICE:
                    # The next message was here already (in the transport's buffer or the
                    # socket's) and would be handled without returning to the event loop:
                    # after a slice of work, let what other connections sent meanwhile go
                    # first. (Checked here, once the next message is known to be waiting:
                    # a reader that has none would yield for nothing, a turn per message.)
                    await after_new_input()
                    turn_began, waits = clock(), t.read_waits
                # The header counts against the buffered bounds from the start of its read.
                await budget.admit(self, n + overhead, 0, self._waits_for_answers)
                self._charge = n + overhead
                try:
                    data = await t.read_header_body(n)
                    problem = t.take_fd_error()
                    if problem:
                        raise wire.WireError("bad-shm", f"bad shared-memory descriptor: {problem}")
                    h = wire.decode_header(data, limits)
                    del data
                    if isinstance(h, wire.Msg):
                        await self._on_msg(h)
                    elif isinstance(h, wire.Pulled):
                        budget.release(self, self._charge)
                        self._charge = 0
                        await self._on_pulled(h)
                    elif isinstance(h, (wire.Pull, wire.Forward, wire.Unlease, wire.Renew)):
                        self._on_owner_op(h)
                        if self._control.full():
                            budget.release(self, self._charge)
                            self._charge = 0
                            await self._control.has_room()
                    elif isinstance(h, wire.Forwarded):
                        self._answer(h.req, ("token", h.token))
                    elif isinstance(h, wire.TicketError):
                        self._answer(h.req, ("refused", h.code, h.msg))
                    elif isinstance(h, wire.Release):
                        if not t.unix:
                            raise wire.WireError(
                                "handshake", "handshake failed: a release on a connection without shared memory"
                            )
                        self._shm.end(h.leases)
                    elif isinstance(h, wire.Error):
                        raise PeerRefused(self.name, h.code, h.msg)
                    else:
                        raise wire.WireError(
                            "handshake", f"handshake failed: unexpected {h.kind!r} after the handshake"
                        )
                finally:
                    if self._charge:
                        budget.release(self, self._charge)
                        self._charge = 0
        except wire.WireError as e:
            self._warn("closing connection to %s: %s", self.name, e)
            await send_error(t, e.code, e.message)
        except PeerRefused as e:
            self._warn("peer %s closed the connection: %s [%s]", self.name, e.message, e.code)
        except PeerClosed as e:
            if not self.closed:
                log.debug("%s: connection to %s lost: %s", self.node.name, self.name, e)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug here must not take the node down
            log.exception("%s: error on the connection to %s", self.node.name, self.name)
        finally:
            await self._cleanup()

    def _on_messages(self, data: bytes) -> int:
        """Handles the whole messages without frames at the start of ``data``, which the
        transport received while :meth:`read_loop` waits between messages, and returns the
        bytes it handled: each is admitted and delivered as the reader would, here in the
        loop's readable callback, and the reader is not woken for it. It stops after one slice
        of work (``_READ_SLICE``, as the reader yields after one), and at the first byte of
        anything else — a partial message, one with frames or descriptors, a control
        message, a header the decoder refuses, a message the buffered bounds have no room
        for now, an unknown type — and the reader, woken with the rest, handles it (and
        words any error) as if nothing had come before it."""
        if self.closed or self._queued:
            return 0
        node = self.node
        limits = node.limits
        budget = node._budget
        overhead = node.bounds.message_overhead
        over = bool(self.pending)
        pos, end = 0, len(data)
        clock = time.perf_counter
        began = clock()
        try:
            # At most one slice of work, as the reader takes: what a burst brought beyond it
            # goes to the reader, which resumes after what other connections sent meanwhile.
            while end - pos > wire.LEN_PREFIX and clock() - began < _READ_SLICE:
                start = pos + wire.LEN_PREFIX
                n = header_length_at(data, pos, limits)
                if start + n > end:
                    break
                # Only a header laid out as a frameless msg is decoded here: anything else
                # is the reader's, which decodes it once.
                if not wire.looks_plain(data, start, start + n):
                    break
                h = wire.decode_header(data[start : start + n], limits)
                if type(h) is not wire.Msg or h.f or not node._delivers_now(self):
                    break
                node._check_type(h.t)
                if not budget.admit_now(self, n + overhead, over):
                    break
                env = Envelope(self, h.t, h.b, [])
                env.charge = n + overhead
                node._deliver_now(env)
                pos = start + n
        except wire.WireError:
            pass  # the reader meets it again, and closes the connection over it
        return pos

    async def _cleanup(self) -> None:
        self.transport.on_messages = None
        self.closed = True
        self.node.leases.wake()  # a send of ours waiting for lease room gives up
        drain = self.node.bounds.drain_seconds if self.transport.error_sent else None
        await self.transport.aclose(drain=drain)
        self.node._remove_peer(self)
        pending, self.pending = self.pending, {}
        for fut, *_ in pending.values():
            if not fut.done():
                fut.set_result(("lost", "the connection closed before it answered"))
        # The peer's holds end with its connection to us, unless another one replaced it
        # (a same-host peer that switches from TCP to our Unix socket closes the TCP one
        # right after its new handshake: give that a moment to register).
        self.node._holder_disconnected(self.node_id, self.name)
        self._shm.end_at_close(
            self.transport.peer_pid, not self.node._closed, self.node._spawn, f"{self.node.name}: {self.name}"
        )
        if self._maps is not None:
            self._maps.close()
        self._releases.clear()
        self._control.stop()
        for task in list(self._tasks):
            task.cancel()
        self._control.cancel()
        if self._deliveries is not None:
            # Messages that waited for their tickets are dropped with the connection:
            # give their buffered bytes back.
            while not self._deliveries.empty():
                env = self._deliveries.get_nowait()
                if env is not None:
                    self.node._budget.release_env(env)
            self._queued_charge = 0
            self._deliveries.put_nowait(None)
        if self.queue is not None:
            self.queue.close()  # what arrived stays readable; then recv() raises PeerClosed
        self.done.set()

    def _waits_for_answers(self) -> bool:
        """Whether this node waits for answers from the peer (then its reader may go over the bounds)."""
        return bool(self.pending)

    def _charge_of(self, h: wire.Msg) -> int:
        """Bytes a message buffers beyond its header when it is read: inline frames and shm
        windows (the tickets redeemed on receipt are charged before they are pulled, by
        the delivery loop: §9.1)."""
        return sum(d.n for d in h.f if isinstance(d, (wire.Inline, wire.Shm)))

    async def _on_msg(self, h: wire.Msg) -> None:
        """Admits a message's frames against the buffered bounds, reads or maps them, and
        delivers it (the envelope then carries the message's charge, ``self._charge``)."""
        t = self.transport
        self.node._check_type(h.t)
        if not h.f:  # no frames (most small messages): nothing to admit, map or read
            if t.fds and t.buffered == 0:
                raise wire.WireError(
                    "bad-shm",
                    f"bad shared-memory descriptor: {len(t.fds)} descriptors arrived that no header announced",
                )
            env = Envelope(self, h.t, h.b, [])
            env.charge, self._charge = self._charge, 0
            if self._queued:
                self._queue_delivery(env)
            else:
                await self.node._deliver(env)
            return
        wire.check_carried(h.f, wire.carried_kinds(unix=t.unix, ticket=True))
        more = self._charge_of(h)
        if more:
            await self.node._budget.admit(self, more, self._charge, self._waits_for_answers)
            self._charge += more
        shared = sum(1 for d in h.f if isinstance(d, wire.Shm))
        fds = t.take_fds(shared)
        if fds is None:
            raise wire.WireError(
                "bad-shm",
                f"bad shared-memory descriptor: the message announces {shared} shared segments, "
                "but fewer descriptors arrived",
            )
        frames = []
        try:
            me = weakref.ref(self)
            for d in h.f:
                if isinstance(d, wire.Shm) and 0 < d.n < COPY_BELOW:
                    own = _own(d.n)
                    info = read_received(fds.pop(0), d.size, d.sealed, d.off, own)
                    self._queue_release(d.lease)  # read: the sender may reuse the segment now
                    view = own if self.node.shm_private else own.toreadonly()
                    frames.append(ReceivedFrame("shm", view, d.lease, segment_info(info, d.off)))
                elif isinstance(d, wire.Shm):
                    mapping, start, info = map_received(
                        fds.pop(0), d.size, d.sealed, d.off, d.n, private=self.node.shm_private, keep=self._maps
                    )
                    if mapping is None:  # an empty window: nothing to map, nothing to keep
                        view = memoryview(b"")
                        self._queue_release(d.lease)
                    elif isinstance(mapping, Kept):
                        exporter = mapping.exporter()  # this frame's own: its views keep it
                        fin = weakref.finalize(exporter, _kept_released, me, mapping, d.lease)
                        fin.atexit = False
                        view = memoryview(exporter)[start : start + d.n]
                    else:
                        # The region is unmapped, and the lease released, when the frame's
                        # last view is gone (the region keeps no descriptor).
                        fin = weakref.finalize(mapping, _shm_released, me, d.lease)
                        fin.atexit = False
                        view = mapping.view()[start : start + d.n]
                    frames.append(ReceivedFrame("shm", view, d.lease, segment_info(info, d.off)))
                elif isinstance(d, wire.Inline):
                    view = _alloc(d.n)
                    await t.read_into(view)
                    _filled(view)
                    frames.append(ReceivedFrame("inline", view))
                elif isinstance(d, wire.TicketDesc):
                    frames.append(
                        ReceivedFrame("ticket", Ticket(self.node, d, self.node._tickets.owner_label(d)), d.lease)
                    )
                    self.node._tickets.held(d.owner)
        finally:
            for fd in fds:
                os.close(fd)
        if t.fds and t.buffered == 0:
            raise wire.WireError(
                "bad-shm", f"bad shared-memory descriptor: {len(t.fds)} descriptors arrived that no header announced"
            )
        env = Envelope(self, h.t, h.b, frames)
        env.charge, self._charge = self._charge, 0
        if (self.node.redeem == "eager" and _has_eager_tickets(env)) or self._queued:
            self._queue_delivery(env)
        else:
            await self.node._deliver(env)

    def _queue_delivery(self, env: Envelope) -> None:
        if self._deliveries is None:
            self._deliveries = asyncio.Queue()
            self._delivery_task = self.node.loop.create_task(self._delivery_loop())
            self._tasks.add(self._delivery_task)
        self._queued += 1
        self._queued_charge += env.charge
        self._deliveries.put_nowait(env)  # bounded by the buffered bytes each message is charged
        self.node._budget.poke(self)  # a ticket waiting ahead of it may be alone now

    async def _delivery_loop(self) -> None:
        """Delivers queued messages in order, redeeming their tickets first (eager redemption)."""
        while True:
            env = await self._deliveries.get()
            if env is None:
                return
            self._queued_charge -= env.charge
            delivered = False
            try:
                if self.node.redeem == "eager":
                    await self._reserve_tickets(env)
                    await self.node._tickets.redeem_all(env)
                await self.node._deliver(env)
                delivered = True
            finally:
                self._queued -= 1
                if not delivered:
                    self.node._budget.release_env(env)

    async def _reserve_tickets(self, env: Envelope) -> None:
        """Charges the tickets ``env`` redeems on receipt to this peer before they are
        pulled (§9.1), waiting for room: the delivery waits until the application takes
        this peer's earlier messages, while the reader goes on (so the owner's answers
        still arrive). The messages queued behind it do not count against its being alone,
        so a ticket up to the message limit gets through."""
        need = sum(
            f.view.desc.n
            for f in env.frames
            if f.kind == "ticket" and isinstance(f.view, Ticket) and not f.view.desc.lazy
        )
        if need and env.charge:
            # (Alone: what the peer has buffered is this message and those queued behind it,
            # as they are each time the budget looks.)
            await self.node._budget.admit(self, need, own=lambda: env.charge + self._queued_charge)
            env.charge += need
            env.ticket_charge = need
            self.tickets += need

    async def _on_pulled(self, h: wire.Pulled) -> None:
        entry = self.pending.get(h.req)
        if entry is None or entry[2] != h.n or entry[0].done():
            # Not asked for (or no longer), or not the length asked for: read it through a
            # scratch buffer and drop it, never allocating its announced size (§9.1).
            self._warn(
                "dropping a pulled answer of %d bytes from %s for request %d that %s",
                h.n,
                self.name,
                h.req,
                "this node does not wait for" if entry is None or entry[0].done() else f"asked for {entry[2]} bytes",
            )
            await self.transport.skip(h.n, "pulled bytes")
            return
        view = _alloc(h.n)
        if not entry[3] or h.n < STREAM_DIGEST_MIN:
            await self.transport.read_into(view, "pulled bytes")
            _filled(view)
            self._answer(h.req, ("bytes", view, None))
            return
        # A whole redemption: hashed while it arrives, its digest checked by the node.
        hashing = StreamDigest(view)
        try:
            await self.transport.read_into(view, "pulled bytes", hashing.feed)
        except BaseException:
            hashing.cancel()
            raise
        _filled(view)
        self._answer(h.req, ("bytes", view, hashing.finish()))

    def _answer(self, req: int, result: tuple) -> None:
        entry = self.pending.pop(req, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(result)

    def _on_owner_op(self, h) -> None:
        leases = self.node.leases
        holder = self.node_id
        if isinstance(h, wire.Pull):
            try:
                view = leases.pull(h.lease, holder, h.token, h.off, h.n)
                self._queue_control(wire.Pulled(h.req, h.n), view)
            except Refusal as r:
                self._warn("refused a pull from %s: %s [%s]", self.name, r.message, r.code)
                self._queue_control(wire.TicketError(h.req, r.code, r.message))
        elif isinstance(h, wire.Forward):
            try:
                token = leases.forward(h.lease, holder, h.token, h.to, self.node.node_id)
                self._queue_control(wire.Forwarded(h.req, token))
            except Refusal as r:
                self._warn("refused a forward from %s: %s [%s]", self.name, r.message, r.code)
                self._queue_control(wire.TicketError(h.req, r.code, r.message))
        elif isinstance(h, wire.Unlease):
            try:
                leases.unlease(h.lease, holder, h.token)
            except Refusal as r:
                log.debug("%s: ignored an unlease from %s: %s [%s]", self.node.name, self.name, r.message, r.code)
        elif isinstance(h, wire.Renew):
            try:
                leases.renew(h.lease, holder, h.token)
            except Refusal as r:
                self._warn("ignored a renewal from %s: %s [%s]", self.name, r.message, r.code)


def _has_eager_tickets(env: Envelope) -> bool:
    """Whether a ticket not marked ``lazy`` is still unredeemed (eager redemption pulls those, §7.6)."""
    return any(isinstance(f.view, Ticket) and not f.view.desc.lazy for f in env.frames)


def _end_unkept(shared: Any) -> None:
    """A lease made for a send that was never kept (the connection closed first): nothing
    was sent on it, so a pooled segment is reusable at once."""
    if isinstance(shared, PooledLease):
        shared.close(True)


def _after_send(close_after: list, copies: list) -> None:
    for fd in close_after:
        os.close(fd)
    close_after.clear()
    for c in copies:
        c.sent()
    copies.clear()


def _frame_size(view: Any, source: Any) -> int:
    """The bytes a frame of the body will announce (a ticket's, a segment's or a buffer's)."""
    if isinstance(source, Ticket):
        return source.desc.n
    if isinstance(source, SharedFrame):
        return len(source)
    return view.nbytes


def _is_node_frame(obj: Any) -> bool:
    return isinstance(obj, (SharedFrame, Ticket))

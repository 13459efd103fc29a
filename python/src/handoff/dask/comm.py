"""``HandoffComm``: one Dask comm over one handoff connection.

``write`` serializes with Dask's ``to_frames`` (its ``context``: sender and recipient
handshake info, the negotiated options, and ``context["handoff"]``, the route of this
connection) and sends the frames as ``handoff.dask.Frames`` parts
(:mod:`handoff.dask.frames`); ``read`` takes the parts from this connection's own queue
and deserializes with ``from_frames``. A connection that ended raises what Dask's TCP
comm raises, ``CommClosedError`` with the ``OSError`` that ended it as its cause
(:mod:`handoff.dask.failures`), so that Dask retries or recomputes; anything else that
interrupts a read or a write half-way (a cancellation, a malformed part) aborts the
comm, as Dask's TCP comm does, since the stream is then out of step. ``close()`` first
lets the writes in flight finish (at most the write timeout), as Dask's TCP comm
flushes its stream, so that a ``BatchedSend``'s last message arrives. A Dask frame sent
in pieces (over the frame limit) is joined in Dask's offload thread, not on the loop.
While Dask deserializes what it read, the comm's inbound route is
:meth:`handoff.route.Route.current` (for route-aware types, :mod:`handoff.dask.serialize`).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from typing import Any, Callable, Optional

import dask
from dask.utils import parse_bytes
from distributed.comm.core import Comm, CommClosedError
from distributed.comm.tcp import TCP
from distributed.comm.utils import from_frames, to_frames
from distributed.system import MEMORY_LIMIT
from distributed.utils import offload

from ..errors import HandoffError, PeerClosed
from ..peer import Peer
from ..route import _CURRENT as _CURRENT_ROUTE
from ..cuda import shares_device_memory
from ..wire import packer
from .failures import comm_closed
from .frames import FRAME_COST, TYPE_FRAMES, FramesError, host_bytes, plan_message, unpack_part
from .serialize import FAMILY

__all__ = ["HandoffComm", "counters"]

logger = logging.getLogger("distributed.comm.handoff")

#: Per process: comms opened (by channel), bytes written and read (by channel).
counters: Counter = Counter()
#: The most one Dask message may hold (all its parts), as Dask's TCP comm bounds its
#: buffers (half the memory of the machine): a peer that sends parts without end is cut off.
MAX_MESSAGE_BYTES = int(MEMORY_LIMIT // 2)


def _close_dangling(peer: Peer, release: Optional[Callable[[], None]], label: str) -> None:
    if not peer.closed:
        logger.warning("Closing dangling comm %s", label)
        peer.abort()
    if release is not None:
        release()


def _dangling(peer: Peer, release: Optional[Callable[[], None]], label: str) -> None:
    """A comm was collected without being closed (from any thread): close it on its loop."""
    try:
        peer.node.loop.call_soon_threadsafe(_close_dangling, peer, release, label)
    except RuntimeError:  # the loop is closed: its sockets went with it
        pass


class HandoffComm(Comm):
    """A Dask comm on one handoff connection (a TCP connection, or a Unix socket with
    shared memory to a same-host peer).

    ``route`` (also ``context["handoff"]`` for serializers, and ``extra_info``) says who
    is at each end: ``{"channel", "locality", "local": endpoint, "peer": endpoint}``,
    where an endpoint is ``{node, name, host, proc, pid, lang, caps}`` — the peer's from
    its authenticated handshake."""

    max_shard_size: int = parse_bytes(dask.config.get("distributed.comm.shard"))

    def __init__(
        self,
        peer: Peer,
        local_addr: str,
        peer_addr: str,
        deserialize: bool = True,
        release: Optional[Callable[[], None]] = None,
    ):
        self._closed = False
        super().__init__(deserialize=deserialize)
        #: Writes in flight, and the future a closing comm waits on until there are none.
        self._writes = 0
        self._flushed: Optional[asyncio.Future] = None
        self._peer = peer
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._release = release
        route = peer.route
        self.route = {
            "channel": peer.channel,
            "locality": peer.locality,
            "protocol": peer.protocol_version,
            "local": route.sender.to_dict(),
            "peer": route.recipient.to_dict(),
        }
        self._inbound_route = peer.inbound_route
        #: The peer maps GPU memory by IPC handle on this connection (spec §7.10).
        self._maps_gpu_memory = shares_device_memory(route)
        self._finalizer = weakref.finalize(self, _dangling, peer, release, f"{local_addr} -> {peer_addr}")
        self._finalizer.atexit = False
        counters[f"comms-{peer.channel}"] += 1

    # ------------------------------------------------------------------ who

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    @property
    def peer(self) -> Peer:
        """The handoff connection under this comm."""
        return self._peer

    @property
    def channel(self) -> str:
        """``shm`` (a Unix socket with shared memory) or ``tcp``."""
        return self._peer.channel

    @property
    def same_host(self) -> bool:
        """Whether the peer announced this node's host id (then it may share our memory)."""
        return self._peer.host_id == self._peer.node.host_id

    @property
    def extra_info(self) -> dict:
        return self.route

    def handshake_info(self) -> dict[str, Any]:
        """Dask's handshake info plus ``handoff``: this side's endpoint (the peer's own
        comes from the handoff handshake, in ``route``)."""
        info = super().handshake_info()
        info["handoff"] = self.route["local"]
        return info

    # ------------------------------------------------------------------ messages

    def _context(self) -> dict:
        return {
            "sender": self.local_info,
            "recipient": self.remote_info,
            **self.handshake_options,
            "handoff": self.route,
        }

    def _ended(self, error: Optional[BaseException] = None) -> CommClosedError:
        """What Dask's TCP comm raises for a stream that ended (:func:`comm_closed`)."""
        return comm_closed(self, self._peer.failure, error)

    async def write(self, msg, serializers=None, on_error="message") -> int:
        if self._closed:
            # Known closed (closed here, or a read or write saw the end): no cause, as
            # Dask's TCP comm once it dropped its stream.
            raise CommClosedError(f"in {self}: the comm is closed")
        if self._peer.closed:
            self._mark_closed()
            e = self._ended()
            raise e from e.__cause__
        self._writes += 1
        try:
            return await self._write(msg, serializers, on_error)
        finally:
            self._writes -= 1
            if not self._writes and self._flushed is not None and not self._flushed.done():
                self._flushed.set_result(None)

    async def _write(self, msg, serializers, on_error) -> int:
        peer = self._peer
        if self._maps_gpu_memory and (serializers is None or FAMILY not in serializers):
            # Route-aware types first in the handoff family, whose header Dask reads: there
            # a GPU array's frame is marked to go whole (Dask cuts the frames of its own
            # "dask" family before any comm sees them), as UCX's comms list "cuda" first.
            serializers = (FAMILY, *(serializers or ("dask", "pickle")))
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context=self._context(),
            frame_split_size=self.max_shard_size,
        )
        node = peer.node
        plan = plan_message(
            frames, shm_threshold=node.shm_threshold if peer.channel == "shm" else None, limits=node.send_limits
        )
        try:
            if plan.inline and len(plan.parts) == 1:
                # Small frames only, all in the body: msgpack it at once (what send() would write).
                await peer.send_packed(TYPE_FRAMES, packer().pack(plan.parts[0]))
            else:
                for body in plan.parts:
                    await peer.send(TYPE_FRAMES, body)
        except PeerClosed as e:
            self._mark_closed()
            err = self._ended(e)
            raise err from err.__cause__
        except (HandoffError, OSError) as e:
            # A cap that did not make room in time, a segment that could not be made (out
            # of memory or descriptors): part of the message may be out, the comm is done.
            self.abort()
            err = self._ended(e)
            raise err from err.__cause__
        except BaseException:
            # Part of a message may be out: the stream is out of step (as Dask's TCP comm).
            self.abort()
            raise
        counters[f"bytes-written-{peer.channel}"] += plan.nbytes
        return plan.nbytes

    async def read(self, deserializers=None):
        if self._closed:
            raise CommClosedError(f"in {self}: the comm is closed")
        peer = self._peer
        frames: list = []
        joins: list = []
        total = 0
        try:
            while True:
                env = await peer.recv()
                if env.type_name != TYPE_FRAMES:
                    raise FramesError(f"expected a {TYPE_FRAMES} message, got {env.type_name!r}")
                seen, joined = len(frames), len(joins)
                more = unpack_part(env.body, frames, joins)
                total += host_bytes(frames, seen)
                total += sum(frames[i].nbytes for i in joins[joined:])
                # (Each frame's own cost to this process counts too: an empty one is not free.)
                if total + FRAME_COST * len(frames) > MAX_MESSAGE_BYTES:
                    raise FramesError(
                        f"the message is over {MAX_MESSAGE_BYTES} bytes (half this machine's memory) and not done"
                    )
                if not more:
                    break
        except PeerClosed as e:
            self._mark_closed()
            err = self._ended(e)
            raise err from err.__cause__
        except (FramesError, HandoffError) as e:
            logger.warning("aborting %s: %s", self, e)
            self.abort()
            err = self._ended(e)
            raise err from err.__cause__
        except BaseException:
            self.abort()
            raise
        counters[f"bytes-read-{peer.channel}"] += total
        for i in joins:
            # A frame over the frame limit, in pieces: joined by a copy, off the loop.
            frames[i] = await offload(frames[i].run) if self.allow_offload else frames[i].run()
        try:
            # The inbound route is current while Dask deserializes (Route.use() without the
            # context manager's cost: this runs for every message).
            token = _CURRENT_ROUTE.set(self._inbound_route)
            try:
                return await from_frames(
                    frames, deserialize=self.deserialize, deserializers=deserializers, allow_offload=self.allow_offload
                )
            finally:
                _CURRENT_ROUTE.reset(token)
        except EOFError:
            # Frames garbled or truncated (as Dask's TCP comm does).
            self.abort()
            raise CommClosedError("aborted stream on truncated data") from None

    # ------------------------------------------------------------------ closing

    def _mark_closed(self) -> None:
        self._closed = True
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)  # aborted: nothing to wait for
        if self._finalizer.detach() is not None and self._release is not None:
            self._release()

    async def close(self) -> None:
        """Closes the connection (the peer's reads end with ``CommClosedError``), once the
        writes in flight are done: as Dask's TCP comm flushes its stream before it shuts
        it, so that a message written just before (a ``BatchedSend``'s last) arrives
        whole. The wait is at most the node's write timeout; new writes fail at once."""
        if self._closed:
            return
        peer = self._peer
        self._closed = True
        try:
            if self._writes and not peer.closed:
                self._flushed = peer.node.loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._flushed), peer.node.bounds.write_timeout)
                except asyncio.TimeoutError:
                    logger.info(
                        "closing %s with a write still in flight after %gs", self, peer.node.bounds.write_timeout
                    )
        finally:
            self._mark_closed()
            try:
                await peer.close()
            except Exception:  # closing must not fail
                logger.debug("closing %s", self, exc_info=True)

    def abort(self) -> None:
        """Closes the connection at once."""
        self._peer.abort()
        self._mark_closed()

    def closed(self) -> bool:
        return self._closed or self._peer.closed


# A comm with the semantics of Dask's TCP comm (one ordered stream per comm, the same
# errors when it ends), registered as a virtual subclass so that Dask's own tools that
# wrap a stream comm accept it: ``distributed.utils_test.LockedComm`` (and so
# ``freeze_batched_send`` and ``_LockedCommPool``) asserts ``isinstance(comm, TCP)``,
# which fails Dask's worker tests on handoff:// for that alone. It inherits nothing:
# Dask code that reads TCP's attributes (``comm.stream``) is not written against
# ``isinstance`` checks (none in distributed does).
TCP.register(HandoffComm)

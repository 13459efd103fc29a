"""What a node receives: :class:`Envelope` (sender, type name, body) and its frames.

Envelopes sit below the peers that make them: the sender is a :class:`handoff.peer.Peer`,
of which an envelope reads only ``name``, and ``node.resources`` and ``inbound_route`` to
decode the body.
"""

from __future__ import annotations

from typing import Any, Optional

from .codec import decode_body
from .tickets import Ticket

__all__ = ["Envelope", "ReceivedFrame"]


class ReceivedFrame:
    """One frame of a received message.

    ``kind`` is how it travelled: ``inline`` (bytes read from the stream), ``shm`` (a
    read-only mapping of the sender's segment), ``ticket`` (pulled from its owner; with
    lazy redemption ``view`` is the :class:`~handoff.tickets.Ticket` itself).
    """

    __slots__ = ("kind", "view", "lease", "segment")

    def __init__(self, kind: str, view: Any, lease: Optional[int] = None, segment: Optional[dict] = None):
        self.kind = kind
        self.view = view
        self.lease = lease
        #: For ``shm``: ``{device, inode, offset, size, pool_id, sealed}`` of the mapped segment.
        self.segment = segment

    def __repr__(self) -> str:
        size = len(self.view) if self.view is not None else 0
        return f"ReceivedFrame({self.kind}, {size} bytes)"


class Envelope:
    """A received message: ``sender`` (the :class:`~handoff.peer.Peer`), ``type_name`` and ``body``.

    Buffers in the body are ``memoryview``s of the received frames, with no copy: over a
    Unix socket, views of the sender's shared memory. The sender keeps a shared frame
    alive until the last view of it is gone; :meth:`release` (or leaving a ``with``
    block) lets go of the envelope's own views at once, and the lease is released as
    soon as no other view (a slice, a numpy array) remains.
    """

    #: The engine's ``Received`` behind the envelope, until the application takes it (its
    #: room in the receive budget goes back then); ``None`` elsewhere.
    _received: Any = None

    def __init__(self, sender: Any, type_name: str, body: bytes, frames: list):
        self.sender = sender
        self.type_name = type_name
        self.frames: list = frames
        self.error: Optional[BaseException] = None
        self._body_bytes = body
        self._body: Any = None
        self._decoded = False
        #: Bytes the message is charged against the node's buffered bounds until the
        #: application takes it (§9.1).
        self.charge = 0

    @property
    def body(self) -> Any:
        """The decoded body (dicts, lists, …, ``memoryview`` for buffers); raises if the
        message could not be delivered (a ticket that failed, a body that is not valid)."""
        if not self._decoded:
            self.decode()
        if self.error is not None:
            raise self.error
        return self._body

    def decode(self) -> Optional[Exception]:
        """Decodes the body once; returns the error (also kept in :attr:`error`, where
        :attr:`body` raises it) instead of raising it."""
        if self._decoded:
            return self.error
        node = getattr(self.sender, "node", None)
        resources = getattr(node, "resources", None)
        route = getattr(self.sender, "inbound_route", None)
        try:
            self._body = decode_body(
                self._body_bytes, [f.view for f in self.frames], self.type_name, resources, route=route
            )
        except Exception as e:
            # Kept without its traceback: the frames of a deeply nested decode (and all they
            # refer to) must not live as long as the envelope does.
            self.error = e.with_traceback(None)
        finally:
            self._decoded = True
        return self.error

    def segment_of(self, view: Any) -> Optional[dict]:
        """The shared segment behind a buffer of the body (``None`` if it did not come as shm)."""
        for f in self.frames:
            if f.view is view and f.kind == "shm":
                return f.segment
        return None

    def release(self) -> None:
        """Drops the envelope's views of its frames (and ends the holds of lazy tickets).

        Views the application made from them (slices, numpy arrays) stay valid; a shared
        frame's lease is released when the last of them is gone. A ticket that a data handle
        of the body took over (its fallback) stays with the handle.
        """
        for f in self.frames:
            v = f.view
            if isinstance(v, memoryview):
                try:
                    v.release()
                except BufferError:
                    pass  # something still exports it (a numpy array): it keeps the frame
            elif isinstance(v, Ticket) and not v.adopted:
                v.release()
            f.view = None
        self.frames = []
        self._body = None
        self._body_bytes = b""
        self.error = self.error or _Released()

    def __enter__(self) -> "Envelope":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Envelope({self.type_name} from {self.sender.name}, {len(self.frames)} frames)"


class _Released(Exception):
    def __init__(self) -> None:
        super().__init__("the envelope was released")

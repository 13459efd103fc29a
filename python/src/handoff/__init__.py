"""handoff for Python: the wire format of spec/WIRE.md (versions 1, 2 and 3) and an asyncio node.

Modules, one job each, from the bottom up (python/pyproject.toml's import contracts
keep every import pointing down):

- :mod:`handoff.wire` — sans-IO: preamble, framing, headers, descriptors, limits, auth proof.
- :mod:`handoff.memfd`, :mod:`handoff.pool`, :mod:`handoff.shm` — memfds and their seals,
  the process's pool of reused segments, segments to send and mappings of received ones.
- :mod:`handoff.resources` — resource keys and the node's registry of local objects.
- :mod:`handoff.tickets` — the owner's leases and the holder's :class:`Ticket`.
- :mod:`handoff.buffers` — :class:`Buffer` and :class:`OnDemand`: how a buffer travels.
- :mod:`handoff.data` — data handles: tags bound to local sources, or pulled from the sender.
- :mod:`handoff.route` — routes, and types that encode themselves by route
  (``serialize(obj, source, destination)``); :mod:`handoff.pins` — leases on what such a
  type sends a reference to; :mod:`handoff.spilled` — :class:`SpilledFile`, the example.
- :mod:`handoff.codec` — bodies: Python values ↔ msgpack with out-of-band frames.
- :mod:`handoff.transport` — a connection's socket: buffered reads, frames, SCM_RIGHTS.
- :mod:`handoff.handshake` — preambles, challenges (v1: hellos), proofs, idents, ready.
- :mod:`handoff.envelope` — what a node receives.
- :mod:`handoff.ticket_client` — the holder side of tickets: pull, renew, forward, unlease.
- :mod:`handoff.shm_leases`, :mod:`handoff.control` — a connection's shared-memory leases
  and its writer of ticket answers; :mod:`handoff.peer` — a connection.
- :mod:`handoff.admission`, :mod:`handoff.addresses` — which connections get in; addresses.
- :mod:`handoff.node` — the node: listens, connects, delivers.
- :mod:`handoff.bounds` — what peers can make a node hold (spec §9.1), in one place;
  :mod:`handoff.budget` (buffered bytes, backpressure) and :mod:`handoff.throttle`
  (rate-limited warnings) enforce two of them.
- :mod:`handoff.demo_server` — the demo protocol of Appendix A, served by a node;
  :mod:`handoff.worker` — ``python -m handoff.worker``, its command line.
"""

from .bounds import Bounds
from .codec import Bin, Buffer, OnDemand, as_numpy
from .data import BlobError, BlobHandle, BlobTag, FileDataset, dataset_key
from .envelope import Envelope, ReceivedFrame
from .errors import (
    AuthenticationError,
    CapReached,
    HandoffError,
    MessageTooLarge,
    OwnerLost,
    PeerClosed,
    PeerRefused,
    TicketCorrupt,
    TlsError,
    TicketFailure,
    TicketRefused,
)
from .node import Node
from .native import ext as _ext

if _ext is not None:
    from . import engine_node as _engine_node  # noqa: F401  (registers nodes on the engine with Node)
from .tls import TlsConfig
from .peer import Peer
from .pins import Pin, PinBounds
from .resources import Resource, ResourceError, ResourceKey, Resources
from .route import Endpoint, Route, RouteError
from .spilled import SpilledFile
from .shm import SharedFrame, ShmBuffer
from .tickets import Ticket
from .wire import WireError

__version__ = "0.1.0"

__all__ = [
    "Node",
    "Bounds",
    "Peer",
    "Envelope",
    "ReceivedFrame",
    "Buffer",
    "Bin",
    "OnDemand",
    "Resources",
    "Resource",
    "ResourceKey",
    "ResourceError",
    "BlobHandle",
    "BlobTag",
    "BlobError",
    "FileDataset",
    "dataset_key",
    "Route",
    "Endpoint",
    "RouteError",
    "Pin",
    "PinBounds",
    "SpilledFile",
    "ShmBuffer",
    "SharedFrame",
    "Ticket",
    "as_numpy",
    "WireError",
    "HandoffError",
    "AuthenticationError",
    "PeerRefused",
    "PeerClosed",
    "TicketFailure",
    "TicketRefused",
    "OwnerLost",
    "TicketCorrupt",
    "CapReached",
    "MessageTooLarge",
    "TlsError",
    "TlsConfig",
]

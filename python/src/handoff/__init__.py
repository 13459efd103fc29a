"""handoff for Python: the API of spec/WIRE.md's nodes, on the Rust engine.

Every connection runs on the engine of the compiled extension ``handoff._native``
(:mod:`handoff.engine`, :mod:`handoff.engine_node`). The spec's pure-Python reference
implementation of the connections is the separate package ``handoff_pure``, which this
package never imports (``HANDOFF_ENGINE=0`` selects it, for tests).

Modules, one job each, from the bottom up (python/pyproject.toml's import contracts
keep every import pointing down):

- :mod:`handoff.wire` — the wire format's types: headers and descriptors, limits, the packer
  (the engine reads and writes them; the reference's own reader is ``handoff_pure.wire``).
- :mod:`handoff.memfd`, :mod:`handoff.shm` — memfds and their seals, and the shared
  frames an application sends (pooled ones in the engine's pool of reused segments).
- :mod:`handoff.resources` — resource keys and the node's registry of local objects.
- :mod:`handoff.tickets` — the holder's :class:`Ticket`, and digests.
- :mod:`handoff.buffers` — :class:`Buffer` and :class:`OnDemand`: how a buffer travels.
- :mod:`handoff.shared` — arrays born in shared memory (:func:`shared_arrays`).
- :mod:`handoff.data` — data handles: tags bound to local sources, or pulled from the sender.
- :mod:`handoff.route` — routes, and types that encode themselves by route
  (``serialize(obj, source, destination)``); :mod:`handoff.pins` — leases on what such a
  type sends a reference to; :mod:`handoff.spilled` — :class:`SpilledFile`, the example.
- :mod:`handoff.codec` — bodies: Python values ↔ msgpack with out-of-band frames.
- :mod:`handoff.envelope` — what a node receives; :mod:`handoff.peer` — a connected node.
- :mod:`handoff.node` — the node's API: options, peers, the inbox, delivery;
  :mod:`handoff.engine` and :mod:`handoff.engine_node` — its connections on the engine.
- :mod:`handoff.bounds` — what peers can make a node hold (spec §9.1), in one place;
  :mod:`handoff.throttle` (warnings rate-limited by the engine's limiter) and
  :mod:`handoff.held` (memory held for reuse, and its settings).
- :mod:`handoff.demo_server` — the demo protocol of Appendix A, served by a node;
  :mod:`handoff.worker` — ``python -m handoff.worker``, its command line.
"""

from .bounds import Bounds
from . import cuda
from .codec import Bin, Buffer, OnDemand, as_numpy
from .cuda import CudaArray
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
from .shared import shared_arrays
from . import shared
from .shm import SharedFrame, ShmBuffer
from .tickets import Ticket
from .wire import WireError

__version__ = "0.1.0"

__all__ = [
    "Node",
    "CudaArray",
    "cuda",
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
    "shared_arrays",
    "shared",
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

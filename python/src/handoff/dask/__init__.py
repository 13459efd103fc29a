"""handoff as a Dask comm backend: ``handoff://host:port`` addresses.

Installed with ``pip install 'handoff[dask]'``, registered under the entry-point group
``distributed.comm.backends`` as ``handoff``, so that nothing in Dask changes:
``LocalCluster(protocol="handoff")``, ``Scheduler(protocol="handoff")``, workers and
nannies given a ``handoff://`` scheduler address, ``dask scheduler --protocol handoff``,
``dask worker handoff://HOST:PORT`` and ``DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME=handoff``.

Design, and why:

- **A comm is a handoff connection.** Dask opens many comms between two processes
  (its connection pools), concurrently, each an ordered stream that closes on its own;
  so each is its own connection with its own handshake, and its messages go to its own
  queue (``Node(per_connection=True)``, ``Peer.recv``), bounded by the node's buffered
  bytes like everything a node receives; closing the comm closes the connection.
  Multiplexing comms on one connection would need per-stream flow control (one slow
  reader would stall every comm sharing its connection) and a close protocol of its
  own; a handshake costs a few round trips, once per pooled comm.
- **Nodes.** Each listener is a node (its TCP port is the address's port; it accepts
  same-host peers on its own Unix socket); a process's outgoing comms come from one
  connector node per event loop, closed with its last comm (:mod:`handoff.dask.nodes`).
- **Same host.** A connector that reaches a listener with its own host id switches to
  the listener's Unix socket (§7.1) and remembers it for that address. Frames from
  ``shm-threshold`` (1 MiB) go as shared-memory segments from the process's pool
  (the engine's, ``handoff_proto::shm``, written with ``pwrite``; smaller ones inline on the socket) and
  arrive as private writable mappings (copy-on-write), which Dask's deserializers
  keep without a copy; the shards of one buffer travel as one segment so that they
  arrive as slices of one mapping, which Dask joins without a copy
  (:mod:`handoff.dask.frames`). A segment goes back to the sender's pool when the
  receiver drops its last view, or when the receiving process dies; a comm closed
  under views the receiver keeps retires the segment instead. With ``kept-map-bytes``
  set (0 by default), the receiving connection keeps the mapping of a segment whose views
  are gone (its own writes scrubbed off), so that the next frame the sender sends in that
  segment arrives with its pages mapped already (``handoff_pure.mapcache``, on the reference node).
  Another host: TCP, the frames inline, received into fresh writable buffers (on the
  engine, its frames, handed to Dask as arrays with no base over the bytes read: Dask's
  deserializers keep them without a copy).
- **Addresses.** ``listen_address`` is the bound ``host:port``; a wildcard listener is
  advertised as ``default_host`` or ``get_ip()``, as Dask's TCP. A Unix comm has no
  port: its connecting side is ``handoff://HOST:0``, both ends agree on it through the
  ``Open`` message.
- **Identity and the route.** Every connection is authenticated with the cluster secret
  (``distributed.comm.handoff.secret``, ``secret-file``, or ``$HANDOFF_SECRET``; a peer
  without it is refused) and carries the host id. ``comm.route`` (and
  ``context["handoff"]`` for serializers, ``handshake_info()["handoff"]`` for the peer)
  says who is at each end: node, host, process, pid, language, capabilities, locality
  and channel — what a destination-aware serializer needs. Types registered with
  :func:`handoff.route.register` get it, as a :class:`handoff.route.Route`, through
  :mod:`handoff.dask.serialize` (the ``handoff`` serialization family, also dispatched
  by Dask's ``dask`` family); :class:`handoff.SpilledFile` travels to a same-host worker
  as its path under a pin (:mod:`handoff.pins`), to others as its bytes.
- **TLS.** Dask's own TLS settings apply (``distributed.comm.tls.*``, or a
  ``distributed.security.Security`` with TLS files given to the scheduler, workers and
  client): the contexts Dask passes in ``connection_args`` run every TCP connection of a
  listener's or connector's node inside TLS (spec §3.1), same-host Unix comms excepted;
  ``require_encryption`` without a context fails rather than talk plain text
  (:mod:`handoff.dask.security`).

Configuration: ``distributed.comm.handoff`` (``handoff.yaml``: secret, secret-file,
host-id, shm, shm-threshold, pool-idle-bytes, pool-idle-seconds, kept-map-bytes,
kept-map-seconds, the timeouts, max-frame-bytes). :func:`stats` counts this process's comms
and bytes by channel and shows its segment pool.

Memory (:mod:`handoff.dask.memory`): a sender unmaps a segment once it is written, so a
shared page counts in one process's RSS (the receiver's), not in both; what is held only
for reuse (the pool's idle segments, 1 GiB at most; the kept mappings, 1 GiB) is given
back after 10 s idle and at once when a worker nears Dask's spill, pause or terminate
threshold; the shared bytes reach the scheduler as the worker metric ``handoff``. A
mapped segment keeps no descriptor, so a worker holding thousands of received frames
needs none for them.

Failures: a comm whose peer died, reset, closed or timed out raises what Dask's TCP
comm raises (``CommClosedError`` caused by the ``OSError``, :mod:`handoff.dask.failures`);
TCP connections have keepalive and ``TCP_USER_TIMEOUT`` from
``distributed.comm.timeouts.tcp``; ``close()`` lets writes in flight finish.

Limits: a single frame over 4 GiB (a pickled buffer Dask does not shard) travels in
pieces that are joined by a copy, in Dask's offload thread (not on the event loop); a Unix comm's connecting end is ``handoff://HOST:0``;
the Python wire code makes a small message's round trip between two workers 1.15–1.25×
that of Dask's TCP comm (a task's round trip from a client is level with TCP's); a Dask
process keeps no received mapping once its arrays are gone unless ``kept-map-bytes`` says
(kept ones hold their segments' memory in the receiver's RSS until their timer or memory
pressure gives them back).
"""

from __future__ import annotations

from .. import held, native, pins
from ..node import engine_default
from . import config  # noqa: F401  (registers the configuration defaults)
from . import serialize  # noqa: F401  (registers the serialization family)
from . import data  # noqa: F401  (registers dataset objects as route-aware types)
from .backend import HandoffBackend
from .comm import HandoffComm, counters
from .connector import HandoffConnector
from .listener import HandoffListener

__all__ = ["HandoffBackend", "HandoffComm", "HandoffConnector", "HandoffListener", "stats"]


def _pool_stats() -> dict:
    """The pool this process's nodes send from: the engine's, for nodes on the engine, else
    the reference's (tests), from :mod:`handoff.held`."""
    if engine_default() and native.ext is not None:
        return native.ext.segment_pool_stats()
    return held.holder.pool_stats() or {}


def stats() -> dict:
    """This process's comms and bytes by channel, its pool of shared segments, the pins
    its nodes keep for peers (:func:`handoff.pins.stats`), and which implementation it
    runs (``native``: whether the extension is in use; ``native_reason``: why, see
    :mod:`handoff.native`)."""
    return {
        "counters": dict(counters),
        "pool": _pool_stats(),
        "pins": pins.stats(),
        "native": native.ENABLED,
        "native_reason": native.REASON,
    }

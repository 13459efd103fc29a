"""handoff_pure: the pure-Python reference implementation of spec/WIRE.md's connections.

``handoff`` runs every connection on the Rust engine (``handoff._native``). This package
is the spec's second, independent implementation of the same connections, kept to check
the engine against: the vectors, the interop tests against Rust nodes and the hostile
suite run on it. It builds on ``handoff``'s API (``handoff.Node``'s options, its peers,
envelopes, codec, routes, resources, pins and errors), and ``handoff`` never imports it:
``HANDOFF_ENGINE=0`` (tests only) makes ``handoff.Node(...)`` build :class:`Node` by name.

Modules, one job each, from the bottom up:

- :mod:`handoff_pure.msgpack_read`, :mod:`handoff_pure.body` — the reader of bodies (the
  engine's is ``handoff._native.BodyReader``).
- :mod:`handoff_pure.transport` — a connection's socket: buffered reads, frames, SCM_RIGHTS.
- :mod:`handoff_pure.nonces`, :mod:`handoff_pure.handshake` — preambles, challenges
  (v1: hellos), proofs, idents, ready, and the dialer's nonces.
- :mod:`handoff_pure.admission` — which connections get in.
- :mod:`handoff_pure.budget` — buffered bytes and backpressure (§9.1).
- :mod:`handoff_pure.shm`, :mod:`handoff_pure.mapcache`, :mod:`handoff_pure.recvbuf` —
  sealed copies, checks and mappings of received segments, kept mappings, warm receive
  buffers; :mod:`handoff_pure.shm_leases` — a connection's shared-memory leases.
- :mod:`handoff_pure.leases`, :mod:`handoff_pure.ticket_client` — the owner's ticket
  leases, and the holder side of tickets: pull, renew, forward, unlease.
- :mod:`handoff_pure.control` — a connection's writer of ticket answers.
- :mod:`handoff_pure.peer` — a connection; :mod:`handoff_pure.node` — the node.
"""

from handoff import codec as _codec
from handoff import held as _held

from . import body as _body
from . import mapcache as _mapcache
from .node import Node
from .peer import Peer
from .pool import pool as _pool
from .recvbuf import recv_pool as _recv_pool

__all__ = ["Node", "Peer"]


if _codec._reader is None:  # no extension: bodies are read by the reference's reader
    _codec._reader = _body.read


class _Held(_held.Holder):
    """What the reference holds for reuse (its pool, kept mappings and receive buffers),
    counted and given back by ``handoff.dask.memory``."""

    def held(self) -> dict:
        p = _pool().stats()
        return {
            "pool-busy": p["bytes"] - p["idle_bytes"],
            "pool-idle": p["idle_bytes"],
            "pool-fds": p["fds"],
            "kept-idle": _mapcache.idle_bytes(),
            "recv-idle": _recv_pool().stats()["idle_bytes"],
        }

    def give_back(self) -> None:
        _pool().trim()
        _mapcache.trim_all()
        _recv_pool().clear()

    def pool_stats(self) -> dict:
        return _pool().stats()

    def configure_pool(self, idle_bytes, idle_seconds) -> None:
        if idle_bytes is not None:
            _pool().max_idle_bytes = idle_bytes
        if idle_seconds is not None:
            _pool().idle_seconds = idle_seconds


_held.holder = _Held()

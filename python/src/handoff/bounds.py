"""The bounds of a node (spec §9.1): what all of a peer's messages, connections and
requests together can make a node hold, in one place.

The per-message limits of §9 (header, frame and message sizes) are
:class:`handoff.wire.Limits`; these are the bounds *across* messages. Their defaults
are the reference's, the same in Rust and in Python. A node takes them as
``Node(..., bounds=Bounds(...))``; ``python -m handoff.worker`` sets the main ones from
its command line (``--max-buffered-bytes-per-peer`` …).

| What a peer can grow | Field | Default | When it is reached |
|---|---|---|---|
| handshakes in progress (accepted connections) | ``max_handshakes`` | 256 | the oldest is closed with ``error {code: "overloaded"}`` |
| established connections | ``max_connections`` | 1024 | a new one gets ``overloaded`` after the preambles |
| time to complete a handshake | ``handshake_timeout`` | 10 s | ``error {code: "timeout"}`` |
| header bytes before the handshake completes | ``handshake_header_bytes`` | 64 KiB | ``header-too-large`` |
| silence inside a message | ``progress_timeout`` | 30 s | ``error {code: "timeout"}`` |
| a write that makes no progress | ``write_timeout`` | 120 s | the connection closes; only its sends fail (long on purpose: a busy receiver's backpressure is not a dead peer) |
| bytes buffered for one peer | ``max_buffered_bytes_per_peer`` | 1 GiB | stop reading that connection |
| bytes buffered for all peers | ``max_buffered_bytes`` | 4 GiB | stop reading, across connections |
| bytes any peer may buffer whatever all hold | ``min_buffered_bytes_per_peer`` | 1 MiB | — (its guaranteed share: admitted even past the total) |
| messages buffered for one peer | ``max_buffered_messages_per_peer`` | 64 (Rust: 1024) | stop reading that connection |
| descriptors waiting on one Unix connection | ``max_pending_fds`` | 128 | ``bad-shm`` |
| ``pulled`` answers being written to one connection | ``max_pulls_in_flight`` | 64 | stop reading that connection |
| other ticket answers queued for one connection | ``max_control_queued`` | 1024 | stop reading that connection |
| holds on one ticket lease | ``max_holders_per_lease`` | 64 live, 64 remembered as expired | ``ticket-error`` ``too-many-holders``; the oldest expired are forgotten |
| bytes pinned by ticket leases | ``max_ticket_bytes`` / ``max_ticket_bytes_per_peer`` | 16 GiB / 8 GiB | the send waits ``lease_wait`` (30 s), then fails |
| shared-memory leases held for one peer | ``max_shm_bytes_per_peer`` / ``max_shm_leases_per_peer`` | 8 GiB / 65 536 | the send waits ``lease_wait``, then fails |
| dials to reach owners of tickets, at once | ``max_owner_dials`` | 16 | the next waits, within its pull timeout |
| connections dialed to reach owners of tickets, kept open | ``max_owner_connections`` | 64 | before another owner is dialed, the one unused longest is closed, if it has no request outstanding or made in the last 100 ms and no ticket of its owner is held here; if none can close, the redemption fails at once (``OwnerLost``) |
| pins (leases on files and other referenced objects, :mod:`handoff.pins`) kept for one peer / in all | ``PinBounds.max_pins_per_peer`` / ``max_pins`` (the node's ``pins=``) | 1024 / 65 536; unclaimed ones end after 60 s | the send fails with ``CapReached`` (Dask's family sends the bytes) |
| warnings logged about one peer | ``warnings_per_period`` per ``warning_period`` | 10 per 10 s | the rest are counted, reported once per period |
| warnings logged about all peers | ``warnings_in_all_per_period`` per ``warning_period`` | 100 per 10 s | the same (a peer with many connections does not multiply its share) |

Buffered bytes are counted from the moment a message's header starts to be read until
the application takes the envelope (:meth:`handoff.node.Node.recv`): the header, inline
frames, ``shm`` windows and the bytes of tickets redeemed on receipt, plus
``message_overhead`` bytes per message for its bookkeeping (so that a flood of tiny
messages is bounded too). A message is admitted when it fits, or alone when nothing
else of that peer (for the total: of any peer) is buffered, so a message up to the
message limit always gets through. The bytes of a ``pulled`` this node asked for are
not held back by these bounds (they are bounded by its own requests); one it did not
ask for, or of another length, is read into a small scratch buffer and dropped.

After it sends an ``error`` a node shuts down its writing side, then reads and drops
what still arrives for at most ``drain_seconds`` or ``drain_bytes`` (§11.3).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Bounds", "DEFAULT_BOUNDS", "KIB", "MIB", "GIB"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


_MAY_BE_ZERO = frozenset({"message_overhead", "drain_seconds", "drain_bytes"})


@dataclass(frozen=True)
class Bounds:
    """The bounds of a node (spec §9.1); see the module's table. Times are in seconds."""

    max_handshakes: int = 256
    max_connections: int = 1024
    handshake_timeout: float = 10.0
    handshake_header_bytes: int = 64 * KIB
    progress_timeout: float = 30.0
    write_timeout: float = 120.0
    max_buffered_bytes_per_peer: int = 1 * GIB
    max_buffered_bytes: int = 4 * GIB
    min_buffered_bytes_per_peer: int = 1 * MIB
    #: Lower than Rust's 1024: each message costs more CPU to read in pure Python, and a
    #: reader that runs far ahead of the application takes turns of the event loop from
    #: every other connection (a flood spread over many connections, spec §9.1).
    max_buffered_messages_per_peer: int = 64
    message_overhead: int = 1 * KIB
    max_pending_fds: int = 128
    max_pulls_in_flight: int = 64
    max_control_queued: int = 1024
    max_holders_per_lease: int = 64
    max_ticket_bytes: int = 16 * GIB
    max_ticket_bytes_per_peer: int = 8 * GIB
    max_shm_bytes_per_peer: int = 8 * GIB
    max_shm_leases_per_peer: int = 65536
    lease_wait: float = 30.0
    max_owner_dials: int = 16
    max_owner_connections: int = 64
    warnings_per_period: int = 10
    warning_period: float = 10.0
    warnings_in_all_per_period: int = 100
    drain_seconds: float = 1.0
    drain_bytes: int = 1 * MIB

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value is None or value < 0 or (value == 0 and name not in _MAY_BE_ZERO):
                raise ValueError(f"Bounds.{name} must be positive, got {value!r}")


DEFAULT_BOUNDS = Bounds()

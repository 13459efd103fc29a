"""The bounds of a node (spec §9.1): what all of a peer's messages, connections and
requests together can make a node hold, in one place.

The per-message limits of §9 are :class:`handoff.wire.Limits`; these are the bounds
*across* messages, with the reference's defaults. A node takes them as
``Node(..., bounds=Bounds(...))``; ``python -m handoff.worker`` sets the main ones from its
command line. What each bounds, its default, its worker flag and what happens when it is
reached: ``python/LIMITS.md``.
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
    """The bounds of a node (spec §9.1), each explained in ``python/LIMITS.md``. Times are in seconds."""

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

"""Errors of the runtime (the wire format's own is ``handoff.wire.WireError``)."""

from __future__ import annotations

from typing import Optional

from .wire import WireError

__all__ = [
    "HandoffError",
    "WireError",
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
]


class HandoffError(Exception):
    """Base class of the runtime's errors."""


class AuthenticationError(HandoffError):
    """The handshake failed on the cluster secret (``auth-failed``), on our side or the peer's."""

    code = "auth-failed"


class PeerRefused(HandoffError):
    """The peer sent ``error`` and closed the connection."""

    def __init__(self, peer: str, code: str, message: str):
        super().__init__(f"{peer} refused: {message} [{code}]")
        self.peer, self.code, self.message = peer, code, message


class PeerClosed(HandoffError):
    """The connection to the peer is closed."""


class TicketFailure(HandoffError):
    """A ticket could not be redeemed; names the owner and the lease (spec §7.6)."""

    def __init__(self, owner: str, lease: int, message: str):
        super().__init__(message)
        self.owner, self.lease = owner, lease


class TicketRefused(TicketFailure):
    """The owner answered ``ticket-error`` (``unknown-lease``, ``bad-token``, ``expired``, ``out-of-range``)."""

    def __init__(self, owner: str, lease: int, what: str, code: str, message: str):
        super().__init__(owner, lease, f"the owner {owner} refused the {what} of lease {lease}: {message} [{code}]")
        self.code, self.what = code, what


class OwnerLost(TicketFailure):
    """The owner could not be reached, closed the connection, or did not answer in time."""

    def __init__(self, owner: str, lease: int, length: int, reason: str):
        super().__init__(owner, lease, f"ticket for lease {lease} ({length} bytes) is lost: owner {owner}: {reason}")
        self.reason = reason


class TicketCorrupt(TicketFailure):
    """The pulled bytes do not match the ticket's BLAKE3 digest."""

    def __init__(self, owner: str, lease: int):
        super().__init__(
            owner, lease, f"the bytes of lease {lease} pulled from {owner} do not match the ticket's digest"
        )


class CapReached(HandoffError):
    """A send waited for room under one of the node's caps (leases pinned for a peer,
    spec §7.4, §7.9, §9.1) and none appeared in time; says which cap, how much is
    pinned and for whom."""


class MessageTooLarge(HandoffError, ValueError):
    """A send that a receiver with the default limits (or this node's smaller ones) would
    have to refuse (spec §9): a header, a frame count, a frame or a message too large. It
    fails locally, before any byte of it is written, and the connection carries on.
    ``code`` is the error the receiver would have raised (``header-too-large``,
    ``too-many-frames``, ``frame-too-large``, ``message-too-large``), ``limit`` the limit."""

    def __init__(self, message: str, code: str, limit: int):
        super().__init__(message)
        self.code, self.limit = code, limit


class TlsError(HandoffError):
    """TLS between hosts (spec §3.1) failed: a certificate that does not verify (expired,
    not yet valid, not signed by a trusted CA, another name), a peer that refused ours or
    sent none, a peer without TLS, or a node that requires TLS refusing a plain
    connection (``tls-required``). The message says which, and what to fix; ``code`` is
    the wire code when a peer sent one (``tls-required``), else ``None``."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.code = code

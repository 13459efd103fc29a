"""The error of the wire format: bad input from a peer, with its stable code (spec §11)."""

from __future__ import annotations

__all__ = ["WireError", "malformed"]


class WireError(Exception):
    """Bad input from a peer, with the stable code of spec §11 (``truncated``, ``bad-magic``, …)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


def malformed(message: str) -> WireError:
    """A ``malformed-header`` error (spec §6 rules 1–5 and 7, §7, the fixed header limits of §9)."""
    return WireError("malformed-header", f"malformed header: {message}")

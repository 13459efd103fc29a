"""The error of the wire format: bad input from a peer, with its stable code (spec §11)."""

from __future__ import annotations

__all__ = ["WireError"]


class WireError(Exception):
    """Bad input from a peer, with the stable code of spec §11 (``truncated``, ``bad-magic``, …)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message

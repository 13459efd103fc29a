"""The nonces a node recently sent as a dialer (spec §5.7 step 3).

Every relayed version-3 handshake starts with a dialer's proof: an acceptor proves only
after the dialer did. So to relay one of a node's own handshakes back into it — the
attack of §5.8 where a node is made to dial an attacker, who dials the node back and
crosses the challenges so that the node's own dialer proof verifies on a connection it
accepted — the attacker must present, as its challenge there, a nonce the node sent as a
dialer. No transcript can reveal that relay; remembering those nonces does. The set is
the node's own: two nodes, in one process or not, legitimately see each other's dialer
nonces when one dials the other.

How long: a proof written on a dialed connection can verify on an accepted one only while
both handshakes are in progress, so a nonce is kept for a window of twice the node's
handshake timeout (20 s with the defaults), then forgotten.

Bound (§9.1): the set holds what the node itself dialed in that window — a peer that has
not proven the secret cannot make a node dial — and at most :data:`MAX_REMEMBERED`
nonces; past that the oldest is forgotten first. Thread-safe.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time

__all__ = ["DialerNonces", "MAX_REMEMBERED"]

#: Most dialer nonces a node remembers at once (§9.1).
MAX_REMEMBERED = 65536


class DialerNonces:
    """The nonces one node sent as a dialer within its window (``window`` seconds)."""

    def __init__(self, window: float):
        self.window = window
        self._lock = threading.Lock()
        self._order: collections.deque = collections.deque()  # (forget at, nonce), oldest first
        self._set: set = set()

    def _forget(self, now: float) -> None:
        while self._order and (self._order[0][0] <= now or len(self._order) > MAX_REMEMBERED):
            _, nonce = self._order.popleft()
            self._set.discard(nonce)

    def fresh(self, dialing: bool) -> bytes:
        """A fresh random nonce for a challenge; one sent as a dialer is remembered."""
        nonce = secrets.token_bytes(32)
        if dialing:
            now = time.monotonic()
            with self._lock:
                if nonce not in self._set:
                    self._set.add(nonce)
                    self._order.append((now + self.window, nonce))
                self._forget(now)
        return nonce

    def sent_as_dialer(self, nonce: bytes) -> bool:
        """Whether ``nonce`` is one this node sent as a dialer within the window."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            return bytes(nonce) in self._set

    def __len__(self) -> int:
        with self._lock:
            self._forget(time.monotonic())
            return len(self._set)

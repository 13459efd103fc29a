"""The headers (spec §6) and descriptors (§7) the Python API names, as dataclasses: a
ticket's description, an identity, a message. The engine encodes headers itself; their
canonical maps (§2), and the rest of §6 and §7, are the pure-Python reference's
(``handoff_pure.wire``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

__all__ = ["Ident", "Msg", "TicketDesc"]


@dataclass
class TicketDesc:
    n: int
    owner: str
    lease: int
    token: bytes
    #: BLAKE3 of the whole buffer (32 bytes), or ``None`` when the ticket carries :attr:`xxh3`.
    digest: bytes | None
    ttl: int
    addr: str | None = None
    #: The sender asks the receiver to pull only on use, never on receipt (§7.5); written only when true.
    lazy: bool = False
    #: XXH3-128 of the whole buffer (16 bytes, canonical big-endian), in place of ``digest``: sent
    #: only to a peer that announced ``xxh3`` (§7.5).
    xxh3: bytes | None = None
    kind: ClassVar[str] = "ticket"


@dataclass
class Ident:
    """Version 2: the sender's identity, sent once it verified the peer's proof (§5.4, §6.9).

    The fields of a :class:`Hello` but ``v`` and ``nonce``, in the same order.
    """

    node: str
    name: str
    host: str
    pid: int
    proc: str
    lang: str
    impl: str
    caps: list
    listen: str | None = None
    unix: str | None = None
    kind: ClassVar[str] = "ident"


@dataclass
class Msg:
    t: str
    b: bytes
    f: list = field(default_factory=list)
    kind: ClassVar[str] = "msg"

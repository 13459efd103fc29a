"""The headers (spec §6) and descriptors (§7) the Python API names, as dataclasses with their
canonical maps (§2): a ticket's description, an identity, a message. The rest of §6 and §7 is
the pure-Python reference's (``handoff_pure.wire.headers``)."""

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

    def to_map(self) -> dict:
        m: dict = {"k": "ticket", "n": self.n, "owner": self.owner}
        if self.addr is not None:
            m["addr"] = self.addr
        m.update(lease=self.lease, token=bytes(self.token))
        if self.xxh3 is not None:
            m["xxh3"] = bytes(self.xxh3)
        else:
            m["digest"] = bytes(self.digest)
        m["ttl"] = self.ttl
        if self.lazy:
            m["lazy"] = True
        return m


def _identity_map(kind: str, who, middle: dict) -> dict:
    """A hello's or an ident's map, in the order of §6.1 and §6.9: the identity fields up
    to ``impl``, then ``middle`` (the kind's own fields and ``caps``), then the optional
    addresses."""
    m = {
        "k": kind,
        "node": who.node,
        "name": who.name,
        "host": who.host,
        "pid": who.pid,
        "proc": who.proc,
        "lang": who.lang,
        "impl": who.impl,
        **middle,
    }
    if who.listen is not None:
        m["listen"] = who.listen
    if who.unix is not None:
        m["unix"] = who.unix
    return m


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

    def to_map(self) -> dict:
        return _identity_map("ident", self, {"caps": list(self.caps)})


@dataclass
class Msg:
    t: str
    b: bytes
    f: list = field(default_factory=list)
    kind: ClassVar[str] = "msg"

    def to_map(self) -> dict:
        return {"k": "msg", "t": self.t, "b": self.b, "f": [d.to_map() for d in self.f]}

"""The headers (spec §6) and descriptors (§7) of the pure-Python reference, as dataclasses
with their canonical maps (§2), beside those the Python API names (:mod:`handoff.wire.headers`:
``TicketDesc``, ``Ident``, ``Msg``, whose maps are :func:`handoff_pure.wire.encode.to_map`'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from handoff.wire.headers import Ident, Msg, TicketDesc

__all__ = [
    "DESCRIPTOR_KINDS",
    "HEADER_KINDS",
    "TCP_KINDS",
    "TICKET_OPS",
    "UNIX_KINDS",
    "UNIX_KINDS_WITH_CUDA",
    "Auth",
    "Challenge",
    "Cuda",
    "Descriptor",
    "Error",
    "Forward",
    "Forwarded",
    "Header",
    "Hello",
    "Inline",
    "Pull",
    "Pulled",
    "Ready",
    "Release",
    "Renew",
    "Shm",
    "Tag",
    "TicketError",
    "Unlease",
    "hello_of",
]  # fmt: skip


def identity_map(kind: str, who, middle: dict) -> dict:
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


# --------------------------------------------------------------------------- descriptors (§7)


@dataclass
class Inline:
    n: int
    kind: ClassVar[str] = "inline"

    def to_map(self) -> dict:
        return {"k": "inline", "n": self.n}


@dataclass
class Shm:
    n: int
    off: int
    size: int
    lease: int
    sealed: bool = False
    kind: ClassVar[str] = "shm"

    def to_map(self) -> dict:
        return {"k": "shm", "n": self.n, "off": self.off, "size": self.size, "lease": self.lease, "sealed": self.sealed}


@dataclass
class Cuda:
    """A range of the sender's GPU memory (spec §7.10): ``n`` bytes at ``off`` of the allocation
    that the CUDA IPC handle ``ipc`` (64 bytes) names, on the device whose UUID is ``device``
    (16 bytes); the sender keeps it under ticket lease ``lease``, held with ``token`` until the
    receiver releases it or the connection ends."""

    n: int
    off: int
    lease: int
    token: bytes
    ipc: bytes
    device: bytes
    kind: ClassVar[str] = "cuda"

    def to_map(self) -> dict:
        return {
            "k": "cuda", "n": self.n, "off": self.off, "lease": self.lease, "token": bytes(self.token),
            "ipc": bytes(self.ipc), "device": bytes(self.device),
        }  # fmt: skip


@dataclass
class Tag:
    key: str
    kind: ClassVar[str] = "tag"

    @property
    def n(self) -> int:
        return 0

    def to_map(self) -> dict:
        return {"k": "tag", "key": self.key}


Descriptor = Inline | Shm | TicketDesc | Cuda | Tag
DESCRIPTOR_KINDS = ("inline", "shm", "ticket", "cuda", "tag")

#: The descriptor kinds each channel carries (§7), for a receiver that announced ``ticket``.
TCP_KINDS = frozenset({"inline", "ticket"})
UNIX_KINDS = frozenset({"inline", "shm", "ticket"})
#: A Unix socket to a receiver that also announced ``cuda`` (§7.10); TCP never carries it.
UNIX_KINDS_WITH_CUDA = UNIX_KINDS | {"cuda"}

# --------------------------------------------------------------------------- headers (§6)


@dataclass
class Hello:
    """Version 1's first handshake message: the sender's identity, the version and a nonce (§6.1)."""

    node: str
    name: str
    host: str
    pid: int
    proc: str
    lang: str
    impl: str
    v: int
    caps: list
    nonce: bytes
    listen: str | None = None
    unix: str | None = None
    kind: ClassVar[str] = "hello"

    def to_map(self) -> dict:
        return identity_map("hello", self, {"v": self.v, "caps": list(self.caps), "nonce": bytes(self.nonce)})

    def ident(self) -> Ident:
        """The identity fields of this hello, as a version-2 ``ident`` carries them."""
        return Ident(
            self.node, self.name, self.host, self.pid, self.proc, self.lang, self.impl, list(self.caps),
            listen=self.listen, unix=self.unix,
        )  # fmt: skip


@dataclass
class Challenge:
    """Version 2's first handshake message: the version and a nonce, nothing about the sender (§6.8)."""

    v: int
    nonce: bytes
    kind: ClassVar[str] = "challenge"

    def to_map(self) -> dict:
        return {"k": "challenge", "v": self.v, "nonce": bytes(self.nonce)}


def hello_of(ident: Ident, v: int, nonce: bytes) -> Hello:
    """The version-1 hello of an identity, for version ``v`` with ``nonce``."""
    return Hello(
        ident.node, ident.name, ident.host, ident.pid, ident.proc, ident.lang, ident.impl, v, list(ident.caps), nonce,
        listen=ident.listen, unix=ident.unix,
    )  # fmt: skip


@dataclass
class Auth:
    mac: bytes
    kind: ClassVar[str] = "auth"

    def to_map(self) -> dict:
        return {"k": "auth", "mac": bytes(self.mac)}


@dataclass
class Ready:
    kind: ClassVar[str] = "ready"

    def to_map(self) -> dict:
        return {"k": "ready"}


@dataclass
class Error:
    code: str
    msg: str
    kind: ClassVar[str] = "error"

    def to_map(self) -> dict:
        return {"k": "error", "code": self.code, "msg": self.msg}


@dataclass
class Release:
    leases: list
    kind: ClassVar[str] = "release"

    def to_map(self) -> dict:
        return {"k": "release", "leases": list(self.leases)}


@dataclass
class Pull:
    req: int
    lease: int
    token: bytes
    off: int
    n: int
    kind: ClassVar[str] = "pull"

    def to_map(self) -> dict:
        return {
            "k": "pull",
            "req": self.req,
            "lease": self.lease,
            "token": bytes(self.token),
            "off": self.off,
            "n": self.n,
        }


@dataclass
class Pulled:
    req: int
    n: int
    kind: ClassVar[str] = "pulled"

    def to_map(self) -> dict:
        return {"k": "pulled", "req": self.req, "n": self.n}


@dataclass
class Forward:
    req: int
    lease: int
    token: bytes
    to: str
    kind: ClassVar[str] = "forward"

    def to_map(self) -> dict:
        return {"k": "forward", "req": self.req, "lease": self.lease, "token": bytes(self.token), "to": self.to}


@dataclass
class Forwarded:
    req: int
    token: bytes
    kind: ClassVar[str] = "forwarded"

    def to_map(self) -> dict:
        return {"k": "forwarded", "req": self.req, "token": bytes(self.token)}


@dataclass
class TicketError:
    req: int
    code: str
    msg: str
    kind: ClassVar[str] = "ticket-error"

    def to_map(self) -> dict:
        return {"k": "ticket-error", "req": self.req, "code": self.code, "msg": self.msg}


@dataclass
class Unlease:
    lease: int
    token: bytes
    kind: ClassVar[str] = "unlease"

    def to_map(self) -> dict:
        return {"k": "unlease", "lease": self.lease, "token": bytes(self.token)}


@dataclass
class Renew:
    lease: int
    token: bytes
    kind: ClassVar[str] = "renew"

    def to_map(self) -> dict:
        return {"k": "renew", "lease": self.lease, "token": bytes(self.token)}


Header = (
    Hello | Challenge | Ident | Auth | Ready | Msg | Error | Release
    | Pull | Pulled | Forward | Forwarded | TicketError | Unlease | Renew
)  # fmt: skip
TICKET_OPS = (Pull, Pulled, Forward, Forwarded, TicketError, Unlease, Renew)
#: The header kinds of versions 1, 2 and 3: v1 uses ``hello``, v2 and v3 ``challenge`` and
#: ``ident`` in its place (v3 adds no kind). The decoder knows them all; which may arrive when
#: is the handshake's check (§5.1, §5.4, §5.7).
HEADER_KINDS = ("hello", "challenge", "ident", "auth", "ready", "msg", "error", "release") + tuple(
    c.kind for c in TICKET_OPS
)

"""The handoff wire format, version 1 (spec/WIRE.md), sans I/O.

Everything here works on bytes in memory: the preamble (§3), message framing (§4),
the handshake's headers and the authentication proof (§5), every header kind (§6),
frame descriptors (§7), limits (§9) and the error codes (§11). The node
(``handoff.node``) does the reading and writing around it.

Decoding follows the order of checks of §11.2, so that the first failing check names
the error, exactly as the test vectors expect. Encoding writes the canonical form of
§2 (smallest encodings, keys in the order of §6/§7, optional keys omitted), so that
the bytes equal the reference's.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Optional, Sequence, Union

import msgpack

from .msgpack_read import DepthError, MsgpackError, Pairs, unpack_one

# --------------------------------------------------------------------------- errors


class WireError(Exception):
    """Bad input from a peer, with the stable code of spec §11 (``truncated``, ``bad-magic``, …)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message


def _malformed(message: str) -> WireError:
    return WireError("malformed-header", f"malformed header: {message}")


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts (spec §9); every limit is inclusive."""

    max_header_bytes: int = 16 << 20
    max_frames: int = 1024
    max_frame_bytes: int = 4 << 30
    max_message_bytes: int = 16 << 30


DEFAULT_LIMITS = Limits()

#: Nesting limits of §9 (every array, map and ext value is one level, the outermost included).
MAX_HEADER_DEPTH = 15
MAX_BODY_DEPTH = 127

# --------------------------------------------------------------------------- preamble (§3)

MAGIC = b"HANDOFF\x00"
PREAMBLE_LEN = 16
MIN_VERSION = 1
MAX_VERSION = 1
_PREAMBLE = struct.Struct(">8sHHI")


@dataclass(frozen=True)
class Preamble:
    min_version: int = MIN_VERSION
    max_version: int = MAX_VERSION
    flags: int = 0

    def encode(self) -> bytes:
        return _PREAMBLE.pack(MAGIC, self.min_version, self.max_version, self.flags)

    @staticmethod
    def decode(data: bytes) -> "Preamble":
        """Decodes 16 bytes: ``truncated``, ``bad-magic``, ``handshake`` (empty version range)."""
        if len(data) < PREAMBLE_LEN:
            raise WireError(
                "truncated", f"truncated input: preamble needs {PREAMBLE_LEN} bytes, only {len(data)} present"
            )
        magic, lo, hi, flags = _PREAMBLE.unpack_from(data, 0)
        if magic != MAGIC:
            raise WireError(
                "bad-magic",
                f"bad preamble: expected magic {MAGIC!r}, got {bytes(magic)!r} (is the peer a handoff node?)",
            )
        if lo == 0 or lo > hi:
            raise WireError("handshake", f"handshake failed: preamble announces an empty version range {lo}..={hi}")
        return Preamble(lo, hi, flags)

    def negotiate(self, peer: "Preamble") -> int:
        """The highest version both speak, else ``unsupported-version``."""
        chosen = min(self.max_version, peer.max_version)
        if chosen < max(self.min_version, peer.min_version):
            raise WireError(
                "unsupported-version",
                f"no common protocol version: we speak {self.min_version}..={self.max_version}, "
                f"the peer speaks {peer.min_version}..={peer.max_version}",
            )
        return chosen


OUR_PREAMBLE = Preamble()

# --------------------------------------------------------------------------- authentication (§5.3)

AUTH_CONTEXT = b"handoff-v1-auth\x00"


def proof(secret: bytes, own_hello: bytes, peer_hello: bytes) -> bytes:
    """HMAC-SHA256(secret, context | len | own hello | len | peer hello): the 32-byte ``auth.mac``."""
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(AUTH_CONTEXT)
    mac.update(struct.pack(">I", len(own_hello)))
    mac.update(own_hello)
    mac.update(struct.pack(">I", len(peer_hello)))
    mac.update(peer_hello)
    return mac.digest()


def verify(secret: bytes, peer_mac: bytes, peer_hello: bytes, own_hello: bytes) -> None:
    """Checks the peer's proof in constant time; raises ``auth-failed``."""
    expected = proof(secret, peer_hello, own_hello)
    if not hmac.compare_digest(expected, bytes(peer_mac)):
        raise WireError(
            "auth-failed",
            "authentication failed: the peer's proof does not match our cluster secret (wrong secret?)",
        )


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
class TicketDesc:
    n: int
    owner: str
    lease: int
    token: bytes
    digest: bytes
    ttl: int
    addr: Optional[str] = None
    #: The sender asks the receiver to pull only on use, never on receipt (§7.5); written only when true.
    lazy: bool = False
    kind: ClassVar[str] = "ticket"

    def to_map(self) -> dict:
        m: dict = {"k": "ticket", "n": self.n, "owner": self.owner}
        if self.addr is not None:
            m["addr"] = self.addr
        m.update(lease=self.lease, token=bytes(self.token), digest=bytes(self.digest), ttl=self.ttl)
        if self.lazy:
            m["lazy"] = True
        return m


@dataclass
class Tag:
    key: str
    kind: ClassVar[str] = "tag"

    @property
    def n(self) -> int:
        return 0

    def to_map(self) -> dict:
        return {"k": "tag", "key": self.key}


Descriptor = Union[Inline, Shm, TicketDesc, Tag]
DESCRIPTOR_KINDS = ("inline", "shm", "ticket", "tag")

#: The descriptor kinds each channel carries (§7), for a receiver that announced ``ticket``.
TCP_KINDS = frozenset({"inline", "ticket"})
UNIX_KINDS = frozenset({"inline", "shm", "ticket"})

# --------------------------------------------------------------------------- headers (§6)


@dataclass
class Hello:
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
    listen: Optional[str] = None
    unix: Optional[str] = None
    kind: ClassVar[str] = "hello"

    def to_map(self) -> dict:
        m = {
            "k": "hello",
            "node": self.node,
            "name": self.name,
            "host": self.host,
            "pid": self.pid,
            "proc": self.proc,
            "lang": self.lang,
            "impl": self.impl,
            "v": self.v,
            "caps": list(self.caps),
            "nonce": bytes(self.nonce),
        }
        if self.listen is not None:
            m["listen"] = self.listen
        if self.unix is not None:
            m["unix"] = self.unix
        return m


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
class Msg:
    t: str
    b: bytes
    f: list = field(default_factory=list)
    kind: ClassVar[str] = "msg"

    def to_map(self) -> dict:
        return {"k": "msg", "t": self.t, "b": self.b, "f": [d.to_map() for d in self.f]}


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


Header = Union[Hello, Auth, Ready, Msg, Error, Release, Pull, Pulled, Forward, Forwarded, TicketError, Unlease, Renew]
TICKET_OPS = (Pull, Pulled, Forward, Forwarded, TicketError, Unlease, Renew)
HEADER_KINDS = ("hello", "auth", "ready", "msg", "error", "release") + tuple(c.kind for c in TICKET_OPS)

# --------------------------------------------------------------------------- encoding (§2)


def packer() -> msgpack.Packer:
    """A msgpack packer that writes the canonical form of §2 (bin for bytes, str8, float64)."""
    return msgpack.Packer(use_bin_type=True, use_single_float=False, autoreset=True, strict_types=False)


def encode_header(header: Header) -> bytes:
    """The header's msgpack bytes (without the length prefix), canonical."""
    return packer().pack(header.to_map())


def frame_header(header_bytes: bytes) -> bytes:
    """``u32 BE length | header``: what goes on the stream before the inline frames."""
    return struct.pack(">I", len(header_bytes)) + header_bytes


def encode_message(header: Header, frames: Iterable[bytes] = ()) -> bytes:
    """A whole message in one byte string (for small messages and tests)."""
    return frame_header(encode_header(header)) + b"".join(bytes(f) for f in frames)


# --------------------------------------------------------------------------- decoding (§4, §6, §7, §9)

LEN_PREFIX = 4


def header_length(prefix: bytes, limits: Limits = DEFAULT_LIMITS) -> int:
    """Checks a header's length prefix (§11.2 step 1): ``header-too-large``, then zero."""
    (n,) = struct.unpack(">I", bytes(prefix[:4]))
    if n > limits.max_header_bytes:
        raise WireError("header-too-large", f"header of {n} bytes exceeds the limit of {limits.max_header_bytes} bytes")
    if n == 0:
        raise _malformed("header length is zero")
    return n


# Type checks of known keys (§6 rule 2). A v1 receiver knows, in a header, the keys of
# §6.1–§6.7 and, in a descriptor, the keys of §7 (as the reference reads them).
_STR, _BIN, _BOOL = "str", "bin", "bool"
_U16, _U32, _U64 = ("u", 16), ("u", 32), ("u", 64)
_LIST_STR, _LIST_U64, _LIST_DESC = ("list", _STR), ("list", _U64), ("list", "desc")

HEADER_KEYS: dict = {
    "k": _STR,
    "t": _STR,
    "b": _BIN,
    "f": _LIST_DESC,
    "node": _STR,
    "name": _STR,
    "host": _STR,
    "pid": _U32,
    "proc": _STR,
    "lang": _STR,
    "impl": _STR,
    "v": _U16,
    "caps": _LIST_STR,
    "nonce": _BIN,
    "listen": _STR,
    "unix": _STR,
    "leases": _LIST_U64,
    "mac": _BIN,
    "code": _STR,
    "msg": _STR,
    "req": _U64,
    "lease": _U64,
    "token": _BIN,
    "off": _U64,
    "n": _U64,
    "to": _STR,
}

DESCRIPTOR_KEYS: dict = {
    "k": _STR,
    "n": _U64,
    "off": _U64,
    "size": _U64,
    "lease": _U64,
    "sealed": _BOOL,
    "key": _STR,
    "owner": _STR,
    "addr": _STR,
    "token": _BIN,
    "digest": _BIN,
    "ttl": _U64,
    "lazy": _BOOL,
}


def _type_ok(value: Any, typ: Any) -> bool:
    if typ == _STR:
        return type(value) is str
    if typ == _BIN:
        return type(value) is bytes
    if typ == _BOOL:
        return type(value) is bool
    if isinstance(typ, tuple) and typ[0] == "u":
        return type(value) is int and 0 <= value < (1 << typ[1])
    if isinstance(typ, tuple) and typ[0] == "list":
        return type(value) is list and all(_type_ok(v, typ[1]) for v in value)
    raise AssertionError(typ)


def _describe(value: Any) -> str:
    if isinstance(value, Pairs):
        return "a map"
    if value is None:
        return "nil"
    return {bool: "a bool", int: "an integer", float: "a float", str: "a str", bytes: "a bin", list: "an array"}.get(
        type(value), type(value).__name__
    )


def _typed_map(pairs: Any, known: dict, what: str) -> dict:
    """Rules 1–3 of §6 for one map: it is a map, no key twice, known keys of the right type.

    Returns the known keys whose value is not nil (nil counts as absent).
    """
    if not isinstance(pairs, Pairs):
        raise _malformed(f"{what} is {_describe(pairs)}, not a msgpack map")
    seen: set = set()
    out: dict = {}
    for key, value in pairs:
        if type(key) is not str:
            continue  # not a key any version defines (keys are str, §2): ignored, as the reference does
        if key in seen:
            raise _malformed(f"{what} has the key {key!r} twice")
        seen.add(key)
        typ = known.get(key)
        if typ is None or value is None:
            continue
        if typ == _LIST_DESC:
            if type(value) is not list:
                raise _malformed(f"{what}: key 'f' must be an array of descriptors, got {_describe(value)}")
            out[key] = [_typed_map(d, DESCRIPTOR_KEYS, f"frame {i}: descriptor") for i, d in enumerate(value)]
            continue
        if not _type_ok(value, typ):
            raise _malformed(f"{what}: key {key!r} has the wrong type ({_describe(value)})")
        out[key] = value
    return out


def _require(fields: dict, key: str, kind: str) -> Any:
    value = fields.get(key)
    if value is None:
        raise _malformed(f"{kind!r} header lacks field {key!r}")
    return value


def _bytes32(fields: dict, key: str, where: str) -> bytes:
    value = fields.get(key)
    if value is None:
        raise _malformed(f"{where} lacks field {key!r}")
    if len(value) != 32:
        raise _malformed(f"{where}: {key} must be 32 bytes, got {len(value)}")
    return value


def _descriptor(index: int, d: dict) -> Descriptor:
    kind = d.get("k")
    if kind is None:
        raise _malformed(f'frame {index}: descriptor lacks field "k"')
    if kind not in DESCRIPTOR_KINDS:
        raise WireError("unknown-descriptor", f"frame {index}: unknown descriptor kind {kind!r}")
    where = f"frame {index}: {kind!r} descriptor"
    if kind == "tag":
        key = d.get("key")
        if key is None:
            raise _malformed(f"{where} lacks field 'key'")
        return Tag(key)
    n = d.get("n")
    if n is None:
        raise _malformed(f"{where} lacks field 'n'")
    if kind == "inline":
        return Inline(n)
    if kind == "shm":
        off = d.get("off")
        if off is None:
            raise _malformed(f"{where} lacks field 'off'")
        size = d.get("size")
        if size is None:
            raise _malformed(f"{where} lacks field 'size'")
        if off + n > size:
            raise _malformed(f"frame {index}: shm window {off}+{n} exceeds the segment size {size}")
        lease = d.get("lease")
        if lease is None:
            raise _malformed(f"{where} lacks field 'lease'")
        return Shm(n, off, size, lease, bool(d.get("sealed", False)))
    # ticket
    owner = d.get("owner")
    if owner is None:
        raise _malformed(f"{where} lacks field 'owner'")
    lease = d.get("lease")
    if lease is None:
        raise _malformed(f"{where} lacks field 'lease'")
    token = _bytes32(d, "token", where)
    digest = _bytes32(d, "digest", where)
    ttl = d.get("ttl")
    if ttl is None:
        raise _malformed(f"{where} lacks field 'ttl'")
    return TicketDesc(
        n=n,
        owner=owner,
        lease=lease,
        token=token,
        digest=digest,
        ttl=ttl,
        addr=d.get("addr"),
        lazy=d.get("lazy", False),
    )


def _check_size(index: int, n: int, total: int, limits: Limits) -> int:
    if n > limits.max_frame_bytes:
        raise WireError(
            "frame-too-large", f"frame {index} of {n} bytes exceeds the limit of {limits.max_frame_bytes} bytes"
        )
    total += n
    if total > limits.max_message_bytes:
        raise WireError(
            "message-too-large", f"message of {total} bytes exceeds the limit of {limits.max_message_bytes} bytes"
        )
    return total


def decode_header(data: Any, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Decodes and validates one header (the bytes after the length prefix), §11.2 steps 2–3."""
    try:
        raw, _end = unpack_one(data, max_depth=MAX_HEADER_DEPTH, pairs=True, lenient_str=True)
    except DepthError as e:
        raise _malformed(str(e)) from None
    except MsgpackError as e:
        raise _malformed(f"not a msgpack map: {e}") from None
    h = _typed_map(raw, HEADER_KEYS, "the header")
    kind = h.get("k")
    if kind is None:
        raise _malformed('header lacks field "k"')
    if kind == "msg":
        t = _require(h, "t", kind)
        b = _require(h, "b", kind)
        descs = h.get("f") or []
        if len(descs) > limits.max_frames:
            raise WireError("too-many-frames", f"message has {len(descs)} frames, the limit is {limits.max_frames}")
        frames = []
        total = 0
        for i, d in enumerate(descs):
            desc = _descriptor(i, d)
            total = _check_size(i, desc.n, total, limits)
            frames.append(desc)
        return Msg(t, b, frames)
    if kind == "hello":
        nonce = h.get("nonce")
        if nonce is None:
            raise _malformed("'hello' header lacks field 'nonce'")
        if len(nonce) != 32:
            raise _malformed(f"hello nonce must be 32 bytes, got {len(nonce)}")
        args = [_require(h, key, kind) for key in ("node", "name", "host", "pid", "proc", "lang", "impl", "v", "caps")]
        return Hello(*args, nonce=nonce, listen=h.get("listen"), unix=h.get("unix"))
    if kind == "auth":
        mac = _require(h, "mac", kind)
        if len(mac) != 32:
            raise _malformed(f"auth mac must be 32 bytes, got {len(mac)}")
        return Auth(mac)
    if kind == "ready":
        return Ready()
    if kind == "release":
        return Release(_require(h, "leases", kind))
    if kind == "error":
        return Error(_require(h, "code", kind), _require(h, "msg", kind))
    if kind == "pull":
        req, lease = _require(h, "req", kind), _require(h, "lease", kind)
        token = _bytes32(h, "token", "'pull' header")
        return Pull(req, lease, token, _require(h, "off", kind), _require(h, "n", kind))
    if kind == "pulled":
        op = Pulled(_require(h, "req", kind), _require(h, "n", kind))
        _check_size(0, op.n, 0, limits)
        return op
    if kind == "forward":
        req, lease = _require(h, "req", kind), _require(h, "lease", kind)
        token = _bytes32(h, "token", "'forward' header")
        return Forward(req, lease, token, _require(h, "to", kind))
    if kind == "forwarded":
        req = _require(h, "req", kind)
        return Forwarded(req, _bytes32(h, "token", "'forwarded' header"))
    if kind == "ticket-error":
        return TicketError(_require(h, "req", kind), _require(h, "code", kind), _require(h, "msg", kind))
    if kind == "unlease":
        lease = _require(h, "lease", kind)
        return Unlease(lease, _bytes32(h, "token", "'unlease' header"))
    if kind == "renew":
        lease = _require(h, "lease", kind)
        return Renew(lease, _bytes32(h, "token", "'renew' header"))
    raise WireError("unknown-kind", f"unknown message kind {kind!r}")


def check_carried(descriptors: Sequence[Descriptor], carried: Iterable[str]) -> None:
    """§11.2 step 5: the first descriptor of a kind this connection cannot carry → ``unsupported-descriptor``."""
    carried = frozenset(carried)
    for i, d in enumerate(descriptors):
        if d.kind not in carried:
            raise WireError(
                "unsupported-descriptor", f"frame {i}: descriptor kind {d.kind!r} is not supported on this connection"
            )


def carried_kinds(unix: bool, ticket: bool = True) -> frozenset:
    """The descriptor kinds a receiver carries on a TCP connection or a Unix socket (§7)."""
    kinds = UNIX_KINDS if unix else TCP_KINDS
    return kinds if ticket else kinds - {"ticket"}


@dataclass
class DecodedMessage:
    header: Header
    #: The inline frames' bytes (for a ``pulled``: the bytes that follow it), zero-copy views.
    frames: list
    #: Bytes of the input the message used.
    consumed: int
    #: The exact header bytes (for the authentication proof and the JSON view).
    header_bytes: bytes = b""


def decode_message(data: Any, limits: Limits = DEFAULT_LIMITS, carried: Iterable[str] = TCP_KINDS) -> DecodedMessage:
    """Decodes one whole message from the front of ``data`` (the vectors, tests, fuzzing).

    Checks everything §11.2 lists from the bytes alone except the type-name lookup and
    file descriptors: steps 1–3, 5, and the inline frames' lengths (``truncated``).
    """
    view = memoryview(data).cast("B")
    if len(view) < LEN_PREFIX:
        raise WireError("truncated", f"truncated input: header length needs 4 bytes, only {len(view)} present")
    n = header_length(view[:4], limits)
    if len(view) - LEN_PREFIX < n:
        raise WireError("truncated", f"truncated input: header needs {n} bytes, only {len(view) - LEN_PREFIX} present")
    header_bytes = bytes(view[LEN_PREFIX : LEN_PREFIX + n])
    header = decode_header(header_bytes, limits)
    pos = LEN_PREFIX + n
    frames = []
    if isinstance(header, Pulled):
        if len(view) - pos < header.n:
            raise WireError(
                "truncated", f"truncated input: pulled bytes need {header.n} bytes, only {len(view) - pos} present"
            )
        frames.append(view[pos : pos + header.n])
        pos += header.n
    elif isinstance(header, Msg):
        check_carried(header.f, carried)
        for d in header.f:
            if not isinstance(d, Inline):
                continue
            if len(view) - pos < d.n:
                raise WireError(
                    "truncated", f"truncated input: frame needs {d.n} bytes, only {len(view) - pos} present"
                )
            frames.append(view[pos : pos + d.n])
            pos += d.n
    return DecodedMessage(header, frames, pos, header_bytes)


def unpack_header_value(header_bytes: bytes) -> Any:
    """The header as a generic msgpack value (maps as ``Pairs``), for views and debugging."""
    value, _ = unpack_one(header_bytes, max_depth=MAX_HEADER_DEPTH, pairs=True, lenient_str=True)
    return value

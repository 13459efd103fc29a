"""Decoding headers and messages (spec §4, §6, §7, §9), in the order of checks of §11.2."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..msgpack_read import DepthError, MsgpackError, Pairs, unpack_one
from .errors import WireError
from .errors import malformed as _malformed
from .framing import LEN_PREFIX, header_length
from .headers import (
    DESCRIPTOR_KINDS,
    TCP_KINDS,
    UNIX_KINDS,
    Auth,
    Descriptor,
    Error,
    Forward,
    Forwarded,
    Header,
    Hello,
    Inline,
    Msg,
    Pull,
    Pulled,
    Ready,
    Release,
    Renew,
    Shm,
    Tag,
    TicketDesc,
    TicketError,
    Unlease,
)
from .limits import DEFAULT_LIMITS, MAX_HEADER_DEPTH, Limits

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

"""Decoding headers and messages (spec §4, §6, §7, §9), in the order of checks of §11.2.

A header is read in two passes over its bytes, with the strict cursor of
:mod:`handoff_pure.wire.reader`; nothing is built before the whole header is known to be
well formed, and only what the kind needs is built after:

1. **Structure** (§11.2 step 2, all ``malformed-header``): one map that ends exactly at
   the end of the header (rule 1); every key of it and of every descriptor map a str of
   valid UTF-8 (rule 2), none twice (rule 4), at most 64 entries (rule 5); every key the
   receiver knows type-checked whatever the kind, nil counting as absent (rule 3, the type
   table, fixed lengths, the lengths of the identity fields of §5.2); every other value only stepped over, within the nesting and
   value limits of §9. The known keys' values are kept (scalars and short arrays); ``f``
   is checked but not kept, unless the kind is already known to be ``msg`` and its length
   is within the frame limit.
2. **The kind** (step 3): ``k``, then the kind's fields in the order of its table. For a
   ``msg``: ``t``, ``b``, the frame count (``too-many-frames``), then each descriptor in
   order (§7): its kind, its fields, its size against the limits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..msgpack_read import unpack_one
from handoff.wire.errors import WireError
from .identity import MAX_CAP_BYTES, MAX_CAPS, field_problem
from .framing import LEN_PREFIX, header_length, malformed
from .headers import (
    DESCRIPTOR_KINDS,
    TCP_KINDS,
    UNIX_KINDS,
    UNIX_KINDS_WITH_CUDA,
    Auth,
    Challenge,
    Cuda,
    Descriptor,
    Error,
    Forward,
    Forwarded,
    Header,
    Hello,
    Ident,
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
from handoff.wire.limits import DEFAULT_LIMITS, Limits
from .limits import MAX_HEADER_DEPTH
from .reader import Cursor

__all__ = [
    "DESCRIPTOR_KEYS",
    "HEADER_KEYS",
    "DecodedMessage",
    "carried_kinds",
    "check_carried",
    "decode_header",
    "decode_message",
    "unpack_header_value",
]

# --------------------------------------------------------------------------- the type table (§6, §7)


def _list_of(read: Callable, what: str) -> Callable:
    """A reader of ``[T]``: an array (of a header key, so at level 2) whose every element is a T (not nil)."""

    def read_list(cur: Cursor, key: str) -> list | None:
        n = cur.array_header(key, 2)
        if n is None:
            return None
        out = []
        for _ in range(n):
            v = read(cur, key)
            if v is None:
                raise malformed(f"{key} must be an array of {what}, not one holding nil")
            out.append(v)
        return out

    return read_list


def _bounded_str(key: str) -> Callable:
    """A reader of an identity field's type (§5.2): a str of at most its bound in UTF-8
    bytes. The bound is part of the type, as a fixed length is: checked whatever the kind."""

    def read_bounded(cur: Cursor, name: str) -> str | None:
        value = cur.str_(name)
        if value is not None:
            problem = field_problem(key, value)
            if problem is not None:
                raise malformed(f"{problem} (spec §5.2)")
        return value

    return read_bounded


def _read_caps(cur: Cursor, key: str) -> list | None:
    """``caps``: an array of at most 32 strs of at most 64 bytes each (§5.2), none nil."""
    n = cur.array_header(key, 2)
    if n is None:
        return None
    if n > MAX_CAPS:
        raise malformed(f"caps has {n} entries, at most {MAX_CAPS} are allowed (spec §5.2)")
    out = []
    for i in range(n):
        v = cur.str_(key)
        if v is None:
            raise malformed(f"{key} must be an array of str, not one holding nil")
        if len(v) * 4 > MAX_CAP_BYTES and len(v.encode()) > MAX_CAP_BYTES:
            raise malformed(f"caps entry {i} is {len(v.encode())} bytes long, at most {MAX_CAP_BYTES} are allowed")
        out.append(v)
    return out


#: The keys a receiver knows in a header (§6.1–§6.9) and the reader of each one's type: the
#: same in versions 1, 2 and 3 (``challenge`` and ``ident`` use keys of ``hello``, typed
#: alike; the identity fields with their lengths, §5.2). ``f`` (None here) is read by
#: :func:`_map_fields`.
HEADER_KEYS: dict = {
    "k": Cursor.str_,
    "t": Cursor.str_,
    "b": Cursor.bin_,
    "f": None,
    "node": _bounded_str("node"),
    "name": _bounded_str("name"),
    "host": _bounded_str("host"),
    "pid": Cursor.u32,
    "proc": _bounded_str("proc"),
    "lang": _bounded_str("lang"),
    "impl": _bounded_str("impl"),
    "v": Cursor.u16,
    "caps": _read_caps,
    "nonce": Cursor.bin32_,
    "listen": _bounded_str("listen"),
    "unix": _bounded_str("unix"),
    "leases": _list_of(Cursor.u64, "integers"),
    "mac": Cursor.bin32_,
    "code": Cursor.str_,
    "msg": Cursor.str_,
    "req": Cursor.u64,
    "lease": Cursor.u64,
    "token": Cursor.bin32_,
    "off": Cursor.u64,
    "n": Cursor.u64,
    "to": Cursor.str_,
}

#: The keys a receiver knows in a frame descriptor (§7; ``ipc`` and ``device``, §7.10),
#: whatever the descriptor's kind.
DESCRIPTOR_KEYS: dict = {
    "k": Cursor.str_,
    "n": Cursor.u64,
    "off": Cursor.u64,
    "size": Cursor.u64,
    "lease": Cursor.u64,
    "sealed": Cursor.bool_,
    "key": Cursor.str_,
    "owner": Cursor.str_,
    "addr": Cursor.str_,
    "token": Cursor.bin32_,
    "digest": Cursor.bin32_,
    "xxh3": Cursor.bin16_,
    "ttl": Cursor.u64,
    "lazy": Cursor.bool_,
    "ipc": Cursor.bin64_,
    "device": Cursor.bin16_,
}

# The same, looked up by a key's raw bytes (keys compare byte for byte, rule 4): (name, reader).
_HEADER_BY_RAW = {k.encode(): (k, r) for k, r in HEADER_KEYS.items()}
_DESCRIPTOR_BY_RAW = {k.encode(): (k, r) for k, r in DESCRIPTOR_KEYS.items()}

# --------------------------------------------------------------------------- pass 1: structure


def _map_fields(cur: Cursor, depth: int, known: dict, what: str, max_frames: int = 0) -> tuple[dict, tuple | None]:
    """One header map (level 1) or descriptor map (level 3): rules 2–5 and the type table.

    Returns its known keys that are not nil and, for the key ``f`` of a header, ``(offset,
    count, fields of each descriptor or None)``: its descriptors are checked here, but kept
    only if the kind is already known to be ``msg`` (``k`` came first, as encoders write it)
    and there are at most ``max_frames`` of them.
    """
    n = cur.map_header(what, depth)
    seen = set()
    fields: dict = {}
    frames = None
    for _ in range(n):
        raw = cur.key(what)  # a str (rule 2), compared byte for byte (rule 4)
        if raw in seen:
            raise malformed(f"{what} has the key {raw.decode('utf-8', 'replace')!r} twice")
        seen.add(raw)
        entry = known.get(raw)
        if entry is None:  # not a key a v1 receiver knows: valid UTF-8, and its value stepped over
            cur.check_utf8(raw, what)
            cur.skip(depth)
            continue
        name, read = entry
        if read is not None:  # the value, of the key's type; nil is absent (rule 3)
            value = read(cur, name)
            if value is not None:
                fields[name] = value
            continue
        # f: an array (level 2) of descriptor maps (level 3), checked whatever the kind.
        at = cur.pos
        count = cur.array_header("key 'f'", 2)
        if count is None:
            continue
        keep = count <= max_frames and fields.get("k") == "msg"
        descs = [] if keep else None
        for i in range(count):
            d = _descriptor_fields(cur, i)
            if keep:
                descs.append(d)
        frames = (at, count, descs)
    return fields, frames


def _descriptor_fields(cur: Cursor, index: int) -> dict:
    """One element of ``f`` (a map at level 3); returns its known keys that are not nil."""
    try:
        return _map_fields(cur, 3, _DESCRIPTOR_BY_RAW, "the descriptor")[0]
    except WireError as e:  # say which frame (built only on failure)
        raise malformed(f"frame {index}: {e.message.removeprefix('malformed header: ')}") from None


def _structure(buf: bytes, limits: Limits) -> tuple[dict, tuple | None]:
    """Pass 1 over the whole header (§11.2 step 2): one map that ends exactly at the end (rule 1).

    Returns the header's known keys that are not nil, and for ``f``: ``(offset, count,
    fields of each descriptor or None)``, or None if ``f`` is absent.
    """
    cur = Cursor(buf, max_values=limits.max_header_values)
    cur.count(1)  # the header map itself
    fields, frames = _map_fields(cur, 1, _HEADER_BY_RAW, "the header", limits.max_frames)
    if not cur.at_end():
        raise malformed(f"{cur.end - cur.pos} bytes left over after the header map")
    return fields, frames


# --------------------------------------------------------------------------- pass 2: the kind


def _require(fields: dict, key: str, kind: str) -> Any:
    value = fields.get(key)
    if value is None:
        raise malformed(f"{kind!r} header lacks field {key!r}")
    return value


def _bytes32(fields: dict, key: str, where: str) -> bytes:
    value = fields.get(key)
    if value is None:
        raise malformed(f"{where} lacks field {key!r}")
    if len(value) != 32:  # already checked as part of the type; kept for the order of §11.2
        raise malformed(f"{where}: {key} must be 32 bytes, got {len(value)}")
    return value


def _descriptor(index: int, d: dict) -> Descriptor:
    """§7 validation of one descriptor's fields, in list order."""
    kind = d.get("k")
    if kind is None:
        raise malformed(f'frame {index}: descriptor lacks field "k"')
    if kind not in DESCRIPTOR_KINDS:
        raise WireError("unknown-descriptor", f"frame {index}: unknown descriptor kind {kind!r}")
    where = f"frame {index}: {kind!r} descriptor"
    if kind == "tag":
        key = d.get("key")
        if key is None:
            raise malformed(f"{where} lacks field 'key'")
        return Tag(key)
    n = d.get("n")
    if n is None:
        raise malformed(f"{where} lacks field 'n'")
    if kind == "inline":
        return Inline(n)
    if kind == "cuda":
        return _cuda(index, n, d, where)
    if kind == "shm":
        off = d.get("off")
        if off is None:
            raise malformed(f"{where} lacks field 'off'")
        size = d.get("size")
        if size is None:
            raise malformed(f"{where} lacks field 'size'")
        if off + n > size:
            raise malformed(f"frame {index}: shm window {off}+{n} exceeds the segment size {size}")
        lease = d.get("lease")
        if lease is None:
            raise malformed(f"{where} lacks field 'lease'")
        return Shm(n, off, size, lease, d.get("sealed", False))
    # ticket
    owner = d.get("owner")
    if owner is None:
        raise malformed(f"{where} lacks field 'owner'")
    lease = d.get("lease")
    if lease is None:
        raise malformed(f"{where} lacks field 'lease'")
    token = _bytes32(d, "token", where)
    digest, xxh3 = d.get("digest"), d.get("xxh3")
    if digest is None and xxh3 is None:
        raise malformed(f"{where} lacks field 'digest'")
    if digest is not None and xxh3 is not None:
        raise malformed(f"{where} has both 'digest' and 'xxh3'; a ticket carries one")
    if digest is not None:
        digest = _bytes32(d, "digest", where)
    ttl = d.get("ttl")
    if ttl is None:
        raise malformed(f"{where} lacks field 'ttl'")
    return TicketDesc(
        n=n,
        owner=owner,
        lease=lease,
        token=token,
        digest=digest,
        ttl=ttl,
        addr=d.get("addr"),
        lazy=d.get("lazy", False),
        xxh3=None if xxh3 is None else bytes(xxh3),
    )


#: A ``cuda`` descriptor's fields after ``n``, all required, checked in this order (§7.10).
_CUDA_FIELDS = ("off", "lease", "token", "ipc", "device")


def _cuda(index: int, n: int, d: dict, where: str) -> Cuda:
    """§7.10: a ``cuda`` descriptor's fields after ``n`` (their lengths are part of their
    types, checked by pass 1), then its range ``off + n`` within u64."""
    for key in _CUDA_FIELDS:
        if key not in d:
            raise malformed(f"{where} lacks field {key!r}")
    off = d["off"]
    if off + n >= 1 << 64:
        raise malformed(f"frame {index}: cuda range {off}+{n} overflows")
    return Cuda(n, off, d["lease"], d["token"], d["ipc"], d["device"])


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


def _msg(buf: bytes, h: dict, frames: tuple | None, limits: Limits) -> Msg:
    t = _require(h, "t", "msg")
    b = _require(h, "b", "msg")
    out: list = []
    if frames is None:
        return Msg(t, b, out)
    at, count, descs = frames
    if count > limits.max_frames:
        raise WireError("too-many-frames", f"message has {count} frames, the limit is {limits.max_frames}")
    if descs is None:  # f came before k: read it again, now that the kind is known
        cur = Cursor(buf, at)
        cur.array_header("key 'f'", 2)
        descs = [_descriptor_fields(cur, i) for i in range(count)]
    total = 0
    for i, d in enumerate(descs):
        desc = _descriptor(i, d)
        total = _check_size(i, desc.n, total, limits)
        out.append(desc)
    return Msg(t, b, out)


_HELLO_FIELDS = ("node", "name", "host", "pid", "proc", "lang", "impl", "v", "caps")
_IDENT_FIELDS = ("node", "name", "host", "pid", "proc", "lang", "impl", "caps")


_PLAIN_MSG_HEAD = b"\x84\xa1k\xa3msg\xa1t"  # {"k": "msg", "t": ...
_PLAIN_MSG_TAIL = b"\xa1f\x90"  # ..., "f": []}


def looks_plain(buf: bytes, start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` begins and ends as a frameless ``msg`` header laid out as
    encoders write it: a check of a few bytes before :func:`decode_header` is worth
    calling where only such headers are wanted (it decides)."""
    return (
        end - start > len(_PLAIN_MSG_HEAD) + len(_PLAIN_MSG_TAIL)
        and buf.startswith(_PLAIN_MSG_HEAD, start)
        and buf.endswith(_PLAIN_MSG_TAIL, start, end)
    )


def _plain_msg(buf: bytes) -> Msg | None:
    """A ``msg`` header without frames laid out exactly as encoders write it — a map of
    ``k``, ``t``, ``b``, ``f`` in that order, ``t`` a str and ``b`` a bin each with its
    length in the shortest form, ``f`` empty, nothing after — or ``None``.

    Every such header passes every check of the two passes (one map of four distinct
    str keys, each value of its key's type, ten msgpack values, two levels), and they
    would read it as this ``Msg``; anything else, valid or not, is ``None`` and goes
    through them (which decide, and word the error)."""
    pos = len(_PLAIN_MSG_HEAD)
    end = len(buf) - len(_PLAIN_MSG_TAIL)
    m = buf[pos]
    if 0xA0 <= m <= 0xBF:
        n, pos = m & 0x1F, pos + 1
    elif m == 0xD9 and pos + 1 < end and buf[pos + 1] >= 32:
        n, pos = buf[pos + 1], pos + 2
    else:
        return None
    if pos + n + 2 > end:
        return None
    try:
        t = buf[pos : pos + n].decode("utf-8")
    except UnicodeDecodeError:
        return None
    pos += n
    if buf[pos : pos + 2] != b"\xa1b":
        return None
    pos += 2
    m = buf[pos] if pos < end else -1
    if m == 0xC4 and pos + 1 < end:
        n, pos = buf[pos + 1], pos + 2
    elif m == 0xC5 and pos + 2 < end:
        n, pos = int.from_bytes(buf[pos + 1 : pos + 3], "big"), pos + 3
        if n < 1 << 8:
            return None
    elif m == 0xC6 and pos + 4 < end:
        n, pos = int.from_bytes(buf[pos + 1 : pos + 5], "big"), pos + 5
        if n < 1 << 16:
            return None
    else:
        return None
    if pos + n != end:
        return None
    return Msg(t, buf[pos:end], [])


def decode_header(data: Any, limits: Limits = DEFAULT_LIMITS) -> Header:
    """Decodes and validates one header (the bytes after the length prefix), §11.2 steps 2–3."""
    buf = data if type(data) is bytes else bytes(data)
    if looks_plain(buf, 0, len(buf)) and limits.max_header_values >= 16:
        plain = _plain_msg(buf)
        if plain is not None:
            return plain
    return decode_header_strict(buf, limits)


def decode_header_strict(data: Any, limits: Limits = DEFAULT_LIMITS) -> Header:
    """:func:`decode_header` through its two passes alone, without the path for plain
    ``msg`` headers (the fuzz targets and tests check that both read every header alike)."""
    buf = data if type(data) is bytes else bytes(data)
    h, frames = _structure(buf, limits)
    if h.get("k") == "msg":
        return _msg(buf, h, frames, limits)
    return _kind(h, limits)


def _kind(h: dict, limits: Limits) -> Header:
    """Pass 2 for every kind but ``msg``: ``k``, then the kind's fields in the order of its table."""
    kind = h.get("k")
    if kind is None:
        raise malformed('header lacks field "k"')
    if kind == "hello":
        nonce = _bytes32(h, "nonce", "'hello' header")
        args = [_require(h, key, kind) for key in _HELLO_FIELDS]
        return Hello(*args, nonce=nonce, listen=h.get("listen"), unix=h.get("unix"))
    if kind == "challenge":
        v = _require(h, "v", kind)
        return Challenge(v, _bytes32(h, "nonce", "'challenge' header"))
    if kind == "ident":
        args = [_require(h, key, kind) for key in _IDENT_FIELDS]
        return Ident(*args, listen=h.get("listen"), unix=h.get("unix"))
    if kind == "auth":
        return Auth(_bytes32(h, "mac", "'auth' header"))
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


# --------------------------------------------------------------------------- after the header


def check_carried(descriptors: Sequence[Descriptor], carried: Iterable[str]) -> None:
    """§11.2 step 5: the first descriptor of a kind this connection cannot carry → ``unsupported-descriptor``."""
    carried = frozenset(carried)
    for i, d in enumerate(descriptors):
        if d.kind not in carried:
            raise WireError(
                "unsupported-descriptor", f"frame {i}: descriptor kind {d.kind!r} is not supported on this connection"
            )


def carried_kinds(unix: bool, ticket: bool = True, cuda: bool = False) -> frozenset:
    """The descriptor kinds a receiver carries on a TCP connection or a Unix socket (§7);
    ``cuda`` only on a Unix socket, by a receiver that announced ``cuda`` (§7.10)."""
    kinds = (UNIX_KINDS_WITH_CUDA if cuda else UNIX_KINDS) if unix else TCP_KINDS
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

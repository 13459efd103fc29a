"""The field types of the messages of spec Appendix A, checked on a decoded body.

A body whose fields do not have the types Appendix A gives is ``bad-body``: the node
reports it and keeps serving, and the request gets no answer (the Rust reference's
typed decoding does the same). So a ``Ping`` whose ``seq`` is a str is not echoed.

Only what the worker (``python -m handoff.worker``) receives is described here. Fields
a body has beyond these are ignored; a missing field is an error unless it may be nil.
"""

from __future__ import annotations

from typing import Any, Callable

from .msgpack_values import BadStr
from .tickets import Ticket
from .wire import WireError

__all__ = ["check", "FIELDS"]

_U64_END = 1 << 64


def _uint(v: Any) -> bool:
    return type(v) is int and 0 <= v < _U64_END


def _float64(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _str(v: Any) -> bool:
    return type(v) is str


def _bin(v: Any) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview)) and not isinstance(v, BadStr)


def _buffer(v: Any) -> bool:
    # A frame (a memoryview of the received bytes, or a ticket not redeemed yet), or per
    # §8.2 a bin or an array of integers 0-255.
    if _bin(v) or isinstance(v, Ticket):
        return True
    if type(v) is list:
        return all(type(x) is int and 0 <= x <= 255 for x in v)
    try:
        memoryview(v)
    except TypeError:
        return False
    return not isinstance(v, (str, BadStr))


def _nil_or(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def nil_or(v: Any) -> bool:
        return v is None or check(v)

    nil_or.may_be_absent = True  # type: ignore[attr-defined]
    nil_or.inner = check  # type: ignore[attr-defined]
    return nil_or


def _bool(v: Any) -> bool:
    return type(v) is bool


#: ``Held.segment``: map {device, inode, offset, size uint, pool_id nil or uint, sealed bool}.
_SEGMENT = {"device": _uint, "inode": _uint, "offset": _uint, "size": _uint, "sealed": _bool}


def _segment(v: Any) -> bool:
    if type(v) is not dict:
        return False
    if not all(k in v and ok(v[k]) for k, ok in _SEGMENT.items()):
        return False
    return v.get("pool_id") is None or _uint(v["pool_id"])


def _handle(v: Any) -> bool:
    from .data import BlobHandle  # the data layer sits above this module

    return isinstance(v, BlobHandle)


_NAMES = {
    _uint: "uint",
    _float64: "float64",
    _str: "str",
    _bin: "bin",
    _buffer: "Buffer",
    _segment: "map {device, inode, offset, size uint, pool_id nil or uint, sealed bool}",
    _handle: "data handle",
}

#: Type name -> (field, check) for each field Appendix A gives it, in order.
FIELDS: dict[str, tuple[tuple[str, Callable[[Any], bool]], ...]] = {
    "handoff.demo.Payload": (("id", _uint), ("digest", _buffer), ("data", _buffer), ("prepare_seconds", _float64)),
    "handoff.demo.SendRequest": (("id", _uint), ("bytes", _uint)),
    "handoff.bench.Ping": (("seq", _uint), ("data", _bin)),
    "handoff.bench.Blob": (("seq", _uint), ("data", _buffer)),
    "handoff.demo.Hold": (("id", _uint), ("data", _buffer)),
    "handoff.demo.Held": (("id", _uint), ("holder", _str), ("bytes", _uint), ("segment", _nil_or(_segment))),
    "handoff.demo.Release": (("id", _uint),),
    "handoff.demo.Forward": (("id", _uint), ("to", _str), ("data", _buffer)),
    "handoff.demo.BlobWork": (("id", _uint), ("blob", _handle), ("digest", _bin)),
    "handoff.admin.StatsRequest": (),
}


def _describe(check: Callable[[Any], bool]) -> str:
    inner = getattr(check, "inner", None)
    if inner is not None:
        return f"nil or {_NAMES.get(inner, '?')}"
    return _NAMES.get(check, "?")


def _kind(v: Any) -> str:
    if isinstance(v, BadStr):
        return "str (not UTF-8)"
    if v is None:
        return "nil"
    return type(v).__name__


def check(type_name: str, body: Any) -> None:
    """Raises ``WireError`` ``bad-body`` if ``body`` (decoded) lacks a field of
    ``type_name`` or has one of the wrong type; types not in :data:`FIELDS` pass."""
    fields = FIELDS.get(type_name)
    if fields is None:
        return
    if type(body) is not dict:
        raise WireError("bad-body", f"a {type_name} body must be a map, got {_kind(body)}")
    for name, ok in fields:
        if name not in body:
            if getattr(ok, "may_be_absent", False):
                continue
            raise WireError("bad-body", f"a {type_name} body lacks the field {name!r}")
        v = body[name]
        if not ok(v):
            raise WireError("bad-body", f"{type_name}: the field {name!r} must be {_describe(ok)}, got {_kind(v)}")

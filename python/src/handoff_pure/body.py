"""The reference's reader of bodies (spec §2, §8): what ``handoff._native.BodyReader`` does
for the engine, in Python, on the same contract (``handoff.codec._reader``, which this
package sets where the extension is not in use).

Two passes of one reading: a body without ext values is read by the ``msgpack`` package
(C) and its nesting checked on the result (:func:`_plain_body`); anything else, valid or
not, goes through the strict reader (:func:`handoff_pure.msgpack_read.unpack_one`), which
resolves frame references and resource keys and words any fault.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import msgpack

from handoff.codec import EXT_FRAME_REF
from handoff.msgpack_values import Ext
from handoff.resources import EXT_RESOURCE_KEY, ResourceKey
from handoff.route import MARKER
from handoff.wire import MAX_BODY_DEPTH, MAX_HASHED_KEYS

from .msgpack_read import MsgpackError, too_deep, unpack_one

__all__ = ["read"]

_INDEX = struct.Struct(">I")
_MARKER_BYTES = MARKER.encode()
_PLAIN_LEAVES = frozenset((str, bytes, int, float, bool, type(None)))


class _NotPlain(Exception):
    """The fast reader met something only the strict one handles (see :func:`_plain_body`)."""


class _TooDeep(Exception):
    """The fast reader read a body whose only fault is nesting deeper than ``MAX_BODY_DEPTH``
    (see :func:`_plain_body`): the strict reader would say just that, so it need not run."""


class _Fault(Exception):
    """A body's fault found by the strict reader's hook: ``(code, detail)``."""


def _no_ext(code: int, payload: bytes) -> Any:
    raise _NotPlain


def _plain_body(body: Any) -> Any:
    """A body without ext values, read by the ``msgpack`` package (C), or ``_NotPlain``.

    Only where it gives what the strict reader gives: no ext value (frame references,
    resource keys and the timestamp type -1, which ``msgpack`` reads itself, are the
    strict reader's), map keys str or bin, str valid UTF-8, nothing after the value,
    maps and arrays nested at most ``MAX_BODY_DEPTH`` deep (checked on the result);
    later duplicate keys win in both. Anything else, valid or not, raises ``_NotPlain``
    and the strict reader decides (with its own error, if any).

    Raises ``_TooDeep`` where the strict reader refuses the body too: the C reader read
    the whole body and found only the nesting wrong (checked on the result). This keeps a peer that sends deep
    bodies from costing the node the strict reader's ~200 µs each (issue 11)."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext)
    except Exception:
        # (StackError too: the C reader checks a count against the whole body, not the bytes
        # left, so the fault may be another; the strict reader stops at depth 128 anyway.)
        raise _NotPlain from None
    stack = [(value, 1)]
    leaves = _PLAIN_LEAVES
    while stack:
        v, depth = stack.pop()
        t = type(v)
        if t is dict:
            if depth > MAX_BODY_DEPTH:
                raise _TooDeep
            for x in v.values():
                if type(x) in leaves:
                    continue
                stack.append((x, depth + 1))
        elif t is list:
            if depth > MAX_BODY_DEPTH:
                raise _TooDeep
            for x in v:
                if type(x) in leaves:
                    continue
                stack.append((x, depth + 1))
        elif t not in leaves:
            raise _NotPlain
    return value


def read(body: Any, frames: Sequence[Any], fast: bool = True) -> tuple:
    """``(value, marked, keys_seen)`` of ``body``, as ``handoff._native.BodyReader.read``
    gives it; ``ValueError((code, detail))`` at the first fault in document order.
    ``fast=False`` skips the C pass (the tests and the fuzz target check both read alike)."""
    raw = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    marked = _MARKER_BYTES in raw  # (a map with the key; decode_routed finds none otherwise)
    if fast and not frames:
        try:
            return _plain_body(body), marked, False
        except _NotPlain:
            pass
        except _TooDeep:
            raise ValueError("bad-body", str(too_deep(MAX_BODY_DEPTH))) from None
    count = len(frames)
    keys_seen = False

    def hook(code: int, payload: bytes) -> Any:
        nonlocal keys_seen
        if code == EXT_RESOURCE_KEY:
            try:
                key = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise _Fault("bad-body", f"a resource key that is not UTF-8 ({payload.hex()})") from None
            keys_seen = True
            return ResourceKey(key)
        if code != EXT_FRAME_REF:
            return Ext(code, payload)
        if len(payload) != 4:
            raise _Fault("bad-body", f"frame reference payload must be 4 bytes, got {len(payload)}")
        (index,) = _INDEX.unpack(payload)
        if index >= count:
            raise _Fault("bad-frame-ref", f"body refers to frame {index}, but the message has {count} frames")
        return frames[index]

    try:
        value, _ = unpack_one(
            body, max_depth=MAX_BODY_DEPTH, ext_hook=hook, lenient_str=True, max_hashed_keys=MAX_HASHED_KEYS
        )
    except MsgpackError as e:
        raise ValueError("bad-body", str(e)) from None
    except _Fault as f:
        raise ValueError(*f.args) from None
    return value, marked, keys_seen

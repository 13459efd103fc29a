"""Which bodies the reference packs without walking them: values of plain types only, which
``handoff.codec.encode_body``'s walk would leave as they are (the extension's ``PlainCodec``
decides the same in Rust, and the tests hold the two to each other)."""

from __future__ import annotations

from typing import Any

from handoff.codec import Bin
from handoff.route import _by_type
from handoff.wire import MAX_BODY_DEPTH

__all__ = ["is_plain"]

_PLAIN_SCALARS = frozenset((type(None), bool, float, str))
_CONTAINERS = frozenset((dict, list, tuple))
_INT_MIN, _INT_END = -(1 << 63), 1 << 64


def is_plain(value: Any, frame_threshold: int) -> bool:
    """Whether the walk of ``encode_body`` would leave ``value`` as it is, so that msgpack
    may pack it directly: only dicts, lists and tuples (exactly those types) of None,
    bool, float, str, int within msgpack's range and bytes under ``frame_threshold`` or
    :class:`~handoff.codec.Bin` (exactly those types, unless a route codec claims them),
    nested at most ``MAX_BODY_DEPTH`` deep. Anything else is left to the walk (which
    decides, and words the error). The bytes are the same either way: the walk turns a
    tuple into a list and a ``Bin`` into bytes, which msgpack packs alike."""
    stack = [(value, 1)]
    scalars, containers = _PLAIN_SCALARS, _CONTAINERS
    while stack:
        v, depth = stack.pop()
        if depth > MAX_BODY_DEPTH:
            return False
        t = type(v)
        if t in scalars:
            continue
        if t is int:
            if not _INT_MIN <= v < _INT_END:
                return False
        elif t is bytes or t is Bin:
            if t is bytes and len(v) >= frame_threshold:
                return False
            # codec_for(v): a codec of its type or of a base class (Bin's are bytes, object).
            if _by_type and (t in _by_type or bytes in _by_type or object in _by_type):
                return False
        elif t in containers:
            if t is dict:
                for k, x in v.items():
                    stack.append((k, depth + 1))
                    stack.append((x, depth + 1))
            else:
                for x in v:
                    stack.append((x, depth + 1))
        else:
            return False
    return True

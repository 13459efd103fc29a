"""Message bodies (spec §8): Python values to msgpack plus out-of-band frames, and back.

Encoding walks a value (dicts, lists, tuples, str, int, float, bool, None, bytes-like
objects, numpy arrays) and replaces every *buffer* by a frame reference (msgpack ext
type 1, a 4-byte big-endian frame index), collecting the buffer as a frame; the
frames then travel beside the body (inline, as shared memory or as tickets). What is
a buffer: a :class:`Buffer`, a numpy array, and any other bytes-like object of at least
``frame_threshold`` bytes (smaller ones are written into the body as msgpack bin).
An :class:`OnDemand` buffer goes to a peer that takes tickets as a ``lazy`` ticket
(§7.5). A :class:`~handoff.resources.Resource` or
:class:`~handoff.resources.ResourceKey` becomes a resource key (msgpack ext type 2, the
key in UTF-8, §8.3), and a :class:`~handoff.data.BlobHandle` a data handle (§8.5). A
value of a route-aware type (:mod:`handoff.route`) is encoded by its registered encoder
for the route it takes, as the map ``{"handoff.route": NAME, "h": HEADER, "f": FRAMES}``
(its frames out of band, whatever their size).

Decoding turns frame references back into the received frames (``memoryview``s over
the bytes that were read, or over a shared-memory mapping: no copy), and maps into
dicts. Given the receiving node's :class:`~handoff.resources.Resources`, it binds
every resource key to that node's object, and turns data handles into
:class:`~handoff.data.BlobHandle` objects. Given the inbound route, it decodes
route-aware values with their registered decoders.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, Callable, Optional, Sequence

import msgpack

from .buffers import Buffer, OnDemand, as_bytes_view
from .buffers import is_ndarray as _is_ndarray
from .data import BlobHandle, is_handle_map
from .errors import HandoffError
from .msgpack_values import BadStr, Ext
from .resources import EXT_RESOURCE_KEY, Resource, ResourceKey, Resources
from .route import _CURRENT, MARKER, Route, _by_name, _by_type, RouteError, codec_for, decode_value, encode_value
from .cuda import CudaArray, is_cuda_array
from .native import ext as _native
from .wire import MAX_BODY_DEPTH, MAX_HASHED_KEYS, WireError, packer

__all__ = [
    "EXT_FRAME_REF",
    "EXT_RESOURCE_KEY",
    "DEFAULT_FRAME_THRESHOLD",
    "Buffer",
    "OnDemand",
    "Bin",
    "EncodedBody",
    "encode_body",
    "decode_body",
    "as_bytes_view",
    "as_numpy",
]

#: The msgpack extension type of a frame reference (§8.2).
EXT_FRAME_REF = 1

#: Bytes-like values at least this large go out of band as frames; smaller ones as bin.
DEFAULT_FRAME_THRESHOLD = 1024

_INDEX = struct.Struct(">I")


def _numpy():
    try:
        import numpy

        return numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return None


class Bin(bytes):
    """Bytes that always go in the body as msgpack bin, whatever their size (a field that
    the type's schema declares ``bin``, such as ``handoff.bench.Ping.data``)."""

    __slots__ = ()


class EncodedBody:
    """A value encoded for the wire: the msgpack body and its frames (flat byte views)."""

    __slots__ = ("body", "frames", "sources")

    def __init__(self, body: bytes, frames: list, sources: list):
        self.body = body
        #: One flat ``memoryview`` per frame, in frame-index order.
        self.frames = frames
        #: The objects the frames came from (a ``ShmBuffer``, a lazy ticket …), same order.
        self.sources = sources


_INT_END = 1 << 64


#: The extension's packer of bodies (``None`` on the pure path): of a value of plain types
#: only, and of one that is plain but for frames (bytes over the threshold,
#: :class:`Buffer`), the same bytes as the walk of :func:`encode_body`, in one pass in Rust.
_PLAIN = _native.PlainCodec(Bin, MAX_BODY_DEPTH, Buffer, MAX_HASHED_KEYS) if _native is not None else None
#: The types the extension packs itself: while a route codec claims one (or every object),
#: the walk runs instead, which asks it.
_NATIVE_TYPES = frozenset((type(None), bool, int, float, str, bytes, Bin, Buffer, dict, list, tuple, object))


def _plain_native(frame_threshold: Any) -> bool:
    """Whether the extension may pack bodies now: not while a route codec claims a type it
    packs, and only for a threshold it takes (a whole number of bytes; the pure path takes
    any number)."""
    return (
        _PLAIN is not None
        and type(frame_threshold) is int
        and 0 <= frame_threshold < _INT_END
        and not (_by_type and not _NATIVE_TYPES.isdisjoint(_by_type))
    )


def pack_framed(value: Any, frame_threshold: int = DEFAULT_FRAME_THRESHOLD) -> Optional[EncodedBody]:
    """:func:`encode_body`'s result, from the extension in one call, for a value that is
    plain but for frames (bytes over the threshold, :class:`Buffer`) or plain with none;
    ``None`` otherwise (encode it with :func:`encode_body`)."""
    return _framed_native(value, frame_threshold) if _plain_native(frame_threshold) else None


def _framed_native(value: Any, frame_threshold: int) -> Optional[EncodedBody]:
    """:func:`encode_body`'s result from the extension for a value that is plain but for
    frames, or ``None`` (then the walk runs)."""
    got = _PLAIN.pack_framed(value, frame_threshold)
    if got is None:
        return None
    body, sources = got
    if not sources:
        return EncodedBody(body, [], sources)
    frames: list = []
    for source in sources:
        try:
            frames.append(as_bytes_view(source))
        except TypeError:
            frames.append(None)  # as the walk: the node plans it (or says what it cannot send)
    return EncodedBody(body, frames, sources)


def _key(walked: Any) -> Any:
    """A walked map key as a key again: a tuple's walk is a list, which msgpack packs as the
    same array (as the extension packs a tuple key)."""
    return tuple(_key(x) for x in walked) if isinstance(walked, list) else walked


def encode_body(
    value: Any,
    frame_threshold: int = DEFAULT_FRAME_THRESHOLD,
    is_frame: Optional[Callable[[Any], bool]] = None,
    route: Optional[Route] = None,
    fast: bool = True,
) -> EncodedBody:
    """Encodes ``value``: buffers become frames (depth-first, in serialization order).

    ``is_frame(obj)`` may claim other objects (the node's shared buffers and tickets) as
    frames (never an exact ``bytes`` or :class:`Buffer`, which are frames, or not, by
    themselves); their view is taken with ``as_bytes_view`` unless they are not bytes-like.
    ``route`` is the route the value takes (:meth:`Route.current` while it is encoded):
    route-aware types are encoded for it (without one, for :data:`handoff.route.UNKNOWN`).
    A registered type that is a dict, list or tuple is encoded as such.

    The extension packs a value of plain types only as it is (dicts, lists and tuples of
    None, bool, int, float, str and small bytes); ``fast=False`` always walks it (the tests
    check that both give the same bytes).
    """
    if fast and _plain_native(frame_threshold):
        framed = _framed_native(value, frame_threshold)
        if framed is not None:
            return framed
    frames: list = []
    sources: list = []
    hashed = [0]  # map keys that are tuples or floats (at most MAX_HASHED_KEYS, §9)

    def frame(obj: Any, source: Any) -> msgpack.ExtType:
        index = len(frames)
        try:
            frames.append(as_bytes_view(obj))
        except TypeError:
            frames.append(None)  # not bytes-like (a ticket placeholder): the node plans it
        sources.append(source)
        return msgpack.ExtType(EXT_FRAME_REF, _INDEX.pack(index))

    def walk(v: Any, depth: int) -> Any:
        if depth > MAX_BODY_DEPTH:
            raise ValueError(f"value nests deeper than {MAX_BODY_DEPTH} levels")
        if v is None or isinstance(v, (bool, int, float, str)):
            if type(v) is int and not (-(1 << 63) <= v < (1 << 64)):
                raise OverflowError(f"integer {v} does not fit msgpack (i64 or u64)")
            return v
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if isinstance(k, (tuple, float)):
                    hashed[0] += 1
                    if hashed[0] > MAX_HASHED_KEYS:
                        raise ValueError(
                            f"more than {MAX_HASHED_KEYS} map keys are tuples or floats: a Python peer refuses "
                            "such a body, whose keys' hashes are not randomized (spec §9)"
                        )
                out[_key(walk(k, depth + 1))] = walk(x, depth + 1)
            return out
        if isinstance(v, (list, tuple)):
            return [walk(x, depth + 1) for x in v]
        if isinstance(v, (Resource, ResourceKey)):
            return msgpack.ExtType(EXT_RESOURCE_KEY, v.encode())
        codec = codec_for(v)
        if codec is not None:
            name, fields, parts = encode_value(v, route)
            wrapped = {MARKER: name, **fields}
            if "h" in fields:
                wrapped["f"] = [Buffer(p) for p in parts]
            return walk(wrapped, depth)
        if is_frame is not None and is_frame(v):
            return frame(v, v)
        if isinstance(v, OnDemand):
            return frame(v.data, v)
        if isinstance(v, Buffer):
            return frame(v.data, v.data)
        if isinstance(v, Bin):
            return bytes(v)
        if isinstance(v, (bytes, bytearray, memoryview)):
            view = as_bytes_view(v)
            if view.nbytes >= frame_threshold:
                return frame(view, v)
            return bytes(view) if not isinstance(v, bytes) else v
        if _is_ndarray(v):
            return frame(v, v)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(v, np.generic):
            return v.item()
        if isinstance(v, msgpack.ExtType):
            return v
        if is_cuda_array(v):  # GPU memory: by its IPC handle or as a host copy, by route (§7.10)
            return walk(CudaArray(v), depth)
        to_wire = getattr(v, "__handoff_wire__", None)
        if to_wire is not None:  # a data handle or its tag: encoded as the map it travels as
            return walk(to_wire(), depth)
        try:
            view = memoryview(v)
        except TypeError:
            raise TypeError(f"cannot encode a {type(v).__name__} in a handoff body") from None
        return walk(view, depth)

    token = _CURRENT.set(route) if route is not None else None
    try:
        tree = walk(value, 1)
    finally:
        if token is not None:
            _CURRENT.reset(token)
        # ``walk`` refers to itself: empty its cell, or every call would leave a reference
        # cycle holding the frames (memoryviews, which the cyclic collector may meet while
        # they are still exported, and fail to clear).
        walk = frame = hashed = None  # noqa: F841
    body = packer().pack(tree)
    return EncodedBody(body, frames, sources)


#: A reader of whole bodies: ``read(body, frames) -> (value, marked, keys_seen)`` (frame
#: references resolved to ``frames[index]``; ``marked``: some map has the key
#: :data:`~handoff.route.MARKER`; ``keys_seen``: a resource key is in it), raising
#: ``ValueError((code, detail))`` at the first fault. The extension's
#: (``handoff._native.BodyReader``), every node's where it is in use; without it, ``None``
#: until the pure-Python reference (``handoff_pure``, never imported here) puts its own.
_reader: Optional[Callable[[Any, Sequence[Any]], tuple]] = (
    _native.BodyReader(MAX_BODY_DEPTH, MARKER, ResourceKey, Ext, BadStr, MAX_HASHED_KEYS).read
    if _native is not None
    else None
)


def decode_body(
    body: Any,
    frames: Sequence[Any],
    type_name: str = "?",
    resources: Optional[Resources] = None,
    route: Optional[Route] = None,
) -> Any:
    """Decodes a body; each frame reference becomes ``frames[index]`` (the object itself).

    Raises ``WireError`` ``bad-body`` (not msgpack, nesting deeper than 127, a frame
    reference whose payload is not 4 bytes, a resource key that is not UTF-8, a map used
    as a map key) or ``bad-frame-ref`` (an index the message does not have), at the first
    problem in document order. Other ext types are returned as
    :class:`~handoff.msgpack_values.Ext`, and a str that is not UTF-8 as
    :class:`~handoff.msgpack_values.BadStr` (bytes), as the reference's generic reader
    keeps it. Bytes after the value are not looked at.

    Resource keys (ext type 2) become :class:`~handoff.resources.ResourceKey`. With the
    receiving node's ``resources``, each is then bound to that node's object
    (:class:`~handoff.resources.Resource`; ``unknown-resource`` if it cannot be), except in
    a data handle (a map with a resource key ``catalog`` and a map ``tag``), which becomes a
    :class:`~handoff.data.BlobHandle` that falls back on the sender's bytes (§8.5).

    Route-aware values (maps under the key ``handoff.route``) are decoded, innermost first,
    by their registered decoders with ``route`` (the inbound route: the peer sends, this
    node receives); one that cannot be raises :class:`~handoff.route.RouteError`.
    """
    read = _reader
    if read is None:
        raise HandoffError(
            "no reader of bodies: the extension handoff._native is not in use, and the pure-Python reference "
            "(handoff_pure, for tests) was not imported"
        )
    try:
        value, marked, keys_seen = read(body, frames)
    except ValueError as e:
        if len(e.args) != 2 or e.args[0] not in ("bad-body", "bad-frame-ref"):
            raise
        code, detail = e.args
        if code == "bad-body":
            detail = f"cannot decode body of type {type_name!r}: {detail}"
        raise WireError(code, detail) from None
    if keys_seen and resources is not None:
        value = bind_resources(value, resources)
    return decode_routed(value, route) if marked and _by_name else value


def decode_routed(value: Any, route: Optional[Route]) -> Any:
    """Decodes the route-aware values in a decoded body (innermost first), see :func:`decode_body`."""

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        if not isinstance(v, dict):
            return v
        v = {k: walk(x, depth + 1) for k, x in v.items()}
        name = v.get(MARKER)
        if not isinstance(name, str):
            return v
        frames = v.get("f", [])
        if not isinstance(frames, list):
            raise RouteError(f"a {name} whose frames 'f' are not a list")
        return decode_value(name, v, frames, route)

    return walk(value, 0)


def bind_resources(value: Any, resources: Resources) -> Any:
    """Binds the resource keys in a decoded body to ``resources`` (in document order), and
    turns data handles into :class:`~handoff.data.BlobHandle`; see :func:`decode_body`."""

    def walk(v: Any) -> Any:
        if isinstance(v, ResourceKey):
            return resources.bind(v.key)
        if isinstance(v, dict):
            if is_handle_map(v):
                return BlobHandle.from_wire(v, resources)
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)


def as_numpy(view: Any, dtype: Any = "uint8", shape: Any = None):
    """A numpy array over a received frame, without copying (read-only for shared memory)."""
    np = _numpy()
    if np is None:  # pragma: no cover
        raise RuntimeError("numpy is not installed (pip install 'handoff[numpy]')")
    array = np.frombuffer(view, dtype=dtype)
    if shape is not None:
        array = array.reshape(shape)
    return array

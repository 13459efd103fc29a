"""Routes and route-aware types: the ``serialize(obj, source, destination)`` of the first seed.

A :class:`Route` says who sends a value and who receives it — each an :class:`Endpoint`
(node id, name, host id, process id, pid, language, capabilities, as the handshake told
them) — how near the two are (``locality``: ``same-process``, ``same-host`` or
``remote``, spec §1) and what carries it (``channel``: ``tcp`` or ``shm``). It mirrors
the Rust reference's ``handoff::Route`` (``from``/``to`` there are ``sender``/``recipient``
here, Dask's words; ``node_id``, ``host_id``, ``process_id``, ``language``,
``capabilities`` are ``node``, ``host``, ``proc``, ``lang``, ``caps``, the handshake's).
While a node encodes a value for a peer, or decodes one from it, :meth:`Route.current`
returns the route (as ``Route::current()`` does in Rust).

A type becomes route-aware by registering an encoder and a decoder::

    def encode(obj, route):            # -> (header, frames)
        if route.locality == "same-host":
            return {"path": obj.path}, []
        return {}, [obj.view()]        # frames: bytes-like buffers, sent out of band

    def decode(header, frames, route):  # -> the object
        ...

    handoff.route.register(MyType, encode, decode, name="mylib.MyType")

``header`` is any value a handoff body (or Dask's msgpack header) can hold — dicts,
lists, str, int, float, bool, None, small bytes; ``frames`` are bytes-like objects that
travel out of band (never copied into the header: inline on TCP, shared memory on the
same host). A value with **no route** — encoded outside a handoff connection, such as
Dask's ``tcp://`` comms or its spilling to disk — gets :data:`UNKNOWN`, whose locality
is ``remote``: the encoder then falls back to its self-contained form.

**Same process.** On a same-process route the registry does not call the encoder (unless
``same_process="encode"``): the object itself is parked in a table of this process and
only its key travels; the decoder on the other side — in this same process — takes the
very object back. Parked objects are bounded (:data:`MAX_PARKED`, each for at most
:data:`PARK_SECONDS` if nobody takes it; beyond, ``CapReached``).

**Where this is used.** On handoff's own nodes, :meth:`handoff.peer.Peer.send` encodes a
registered type anywhere in a body as the map ``{"handoff.route": NAME, "h": HEADER,
"f": [FRAME REFS]}`` (or ``{"handoff.route": NAME, "parked": KEY, "proc": PROCESS ID}``
in one process) — an ordinary body map (spec §8.1), so no wire change — and the
receiving node's :class:`~handoff.envelope.Envelope` decodes it with the registered
decoder and the inbound route. Inside Dask, :mod:`handoff.dask.serialize` registers the
same encoders as a serialization family (and through ``dask_serialize``), with the route
built from Dask's ``context``. This module does not import Dask.

Decoders must treat the header and frames as input from a peer: check every field and
raise an exception that says what is wrong (it becomes :class:`RouteError` for that value
only); never allocate by a size the peer announced. :class:`handoff.spilled.SpilledFile`
is the worked example: its path to a same-host peer (under a lease, :mod:`handoff.pins`),
its bytes to a remote one.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from . import identity
from .errors import CapReached, HandoffError

__all__ = [
    "SAME_PROCESS",
    "SAME_HOST",
    "REMOTE",
    "Endpoint",
    "Route",
    "UNKNOWN",
    "RouteCodec",
    "RouteError",
    "register",
    "unregister",
    "codec_for",
    "on_register",
    "encode_value",
    "decode_value",
    "MARKER",
    "MAX_PARKED",
    "PARK_SECONDS",
    "parked",
    "locality_between",
]

SAME_PROCESS = "same-process"
SAME_HOST = "same-host"
REMOTE = "remote"
_LOCALITIES = (SAME_PROCESS, SAME_HOST, REMOTE)

#: The key that marks a route-aware value in a handoff body.
MARKER = "handoff.route"
#: At most this many objects wait, parked, for a same-process receiver to take them.
MAX_PARKED = 4096
#: A parked object nobody took within this many seconds is dropped.
PARK_SECONDS = 60.0


class RouteError(HandoffError):
    """A route-aware value that cannot be encoded or decoded: names the type, the route and why."""


@dataclass(frozen=True)
class Endpoint:
    """One end of a route: what a node said about itself in the handshake (§5.2)."""

    #: Random node id, 32 hex characters.
    node: str
    #: Human-readable node name.
    name: str = ""
    #: Host identity: equal ones share memory and files.
    host: str = ""
    #: Random id of the node's process instance.
    proc: str = ""
    #: The process id, as the node announced it.
    pid: Optional[int] = None
    #: Implementation language (``python``, ``rust``, …).
    lang: str = ""
    #: Capabilities the node announced (``inline``, ``shm``, ``ticket``).
    caps: tuple = ()

    def to_dict(self) -> dict:
        """As ``comm.route`` of :mod:`handoff.dask` writes an endpoint."""
        return {
            "node": self.node,
            "name": self.name,
            "host": self.host,
            "proc": self.proc,
            "pid": self.pid,
            "lang": self.lang,
            "caps": list(self.caps),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Endpoint":
        """From an endpoint dict (``comm.route["local"]``, ``["peer"]``)."""
        return cls(
            node=str(d.get("node", "")),
            name=str(d.get("name", "")),
            host=str(d.get("host", "")),
            proc=str(d.get("proc", "")),
            pid=d.get("pid") if isinstance(d.get("pid"), int) else None,
            lang=str(d.get("lang", "")),
            caps=tuple(str(c) for c in d.get("caps") or ()),
        )


def locality_between(a: Endpoint, b: Endpoint) -> str:
    """``remote`` (host ids differ), ``same-process`` (process ids equal) or ``same-host``."""
    if a.host != b.host:
        return REMOTE
    return SAME_PROCESS if a.proc == b.proc else SAME_HOST


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("handoff_route", default=None)


@dataclass(frozen=True)
class Route:
    """The route of one value: sender, recipient, their locality and the channel.

    ``sender`` and ``recipient`` are ``None`` only in :data:`UNKNOWN` (no handoff
    connection: ``known`` is false, locality ``remote``)."""

    sender: Optional[Endpoint]
    recipient: Optional[Endpoint]
    #: ``same-process``, ``same-host`` or ``remote``.
    locality: str = REMOTE
    #: ``tcp`` or ``shm`` (a Unix socket with shared memory); ``None`` if unknown.
    channel: Optional[str] = None
    #: The connection's wire protocol version, if known.
    protocol: Optional[int] = None

    def __post_init__(self) -> None:
        if self.locality not in _LOCALITIES:
            raise ValueError(f"locality is one of {', '.join(_LOCALITIES)}, not {self.locality!r}")

    @property
    def known(self) -> bool:
        """Whether both ends are known (the value goes over a handoff connection)."""
        return self.sender is not None and self.recipient is not None

    @property
    def same_host(self) -> bool:
        """Whether both ends share the host (same host or same process)."""
        return self.locality != REMOTE

    def reversed(self) -> "Route":
        """The route back: the recipient sends, the sender receives."""
        return Route(self.recipient, self.sender, self.locality, self.channel, self.protocol)

    @staticmethod
    def current() -> Optional["Route"]:
        """The route of the value being encoded or decoded (in this thread or task), if any."""
        return _CURRENT.get()

    @contextlib.contextmanager
    def use(self) -> Iterator["Route"]:
        """Makes this the current route inside the ``with`` block (restored afterwards)."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    @classmethod
    def outbound(cls, peer: Any) -> "Route":
        """The route of what this node sends to ``peer``, a :class:`handoff.peer.Peer`
        (read for its ``node``, ``ident``, ``channel`` and ``protocol_version``; routes sit
        below peers, which make them)."""
        node = peer.node
        ours = Endpoint(node.node_id, node.name, node.host_id, node.process_id, os.getpid(), "python", tuple(node.caps))
        h = peer.ident
        theirs = Endpoint(h.node, h.name, h.host, h.proc, h.pid, h.lang, tuple(h.caps))
        return cls(ours, theirs, locality_between(ours, theirs), peer.channel, peer.protocol_version)

    @classmethod
    def from_dict(cls, d: dict, inbound: bool = False) -> "Route":
        """From a route dict as :mod:`handoff.dask` puts it in ``comm.route`` and
        ``context["handoff"]`` (``local``, ``peer``, ``locality``, ``channel``, ``protocol``);
        ``inbound`` for what the local end receives."""
        local = Endpoint.from_dict(d.get("local") or {})
        peer = Endpoint.from_dict(d.get("peer") or {})
        locality = d.get("locality") if d.get("locality") in _LOCALITIES else locality_between(local, peer)
        route = cls(local, peer, locality, d.get("channel"), d.get("protocol"))
        return route.reversed() if inbound else route

    def __str__(self) -> str:
        if not self.known:
            return "an unknown route"
        return f"{self.sender.name or self.sender.node[:12]} -> {self.recipient.name or self.recipient.node[:12]} ({self.locality}, {self.channel})"


#: The route of a value encoded or decoded outside a handoff connection: ``remote``.
UNKNOWN = Route(None, None, REMOTE, None, None)


# ------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class RouteCodec:
    """A registered route-aware type: its name on the wire, its encoder and its decoder."""

    type: type
    name: str
    encode: Callable[[Any, Route], tuple]
    decode: Callable[[Any, list, Route], Any]
    #: ``object``: on a same-process route the object itself travels (parked); ``encode``:
    #: the encoder is called for that route too.
    same_process: str = "object"


_lock = threading.Lock()
_by_type: dict = {}
_by_name: dict = {}
_listeners: list = []


def register(
    type_: type,
    encode: Callable[[Any, Route], tuple],
    decode: Callable[[Any, list, Route], Any],
    *,
    name: Optional[str] = None,
    same_process: str = "object",
) -> RouteCodec:
    """Registers a route-aware type (and its subclasses, unless they register their own).

    ``encode(obj, route) -> (header, frames)``; ``decode(header, frames, route) -> obj``,
    where ``route`` is the route the value travels (:data:`UNKNOWN` without a handoff
    connection). ``name`` (default ``module.QualName``) names the type on the wire: the
    same in every process, as type names are (§10). Registering a type again replaces it.
    """
    if not isinstance(type_, type):
        raise TypeError(f"register() takes a type, not {type_!r}")
    if same_process not in ("object", "encode"):
        raise ValueError("same_process is 'object' or 'encode'")
    name = name or f"{type_.__module__}.{type_.__qualname__}"
    if not isinstance(name, str) or not name:
        raise ValueError("a route-aware type needs a non-empty name")
    codec = RouteCodec(type_, name, encode, decode, same_process)
    with _lock:
        other = _by_name.get(name)
        if other is not None and other.type is not type_:
            raise ValueError(f"the name {name!r} is registered for {other.type.__qualname__} already")
        old = _by_type.get(type_)
        if old is not None:
            _by_name.pop(old.name, None)
        _by_type[type_] = codec
        _by_name[name] = codec
        listeners = list(_listeners)
    for listener in listeners:
        listener(codec)
    return codec


def unregister(type_or_name: Any) -> None:
    """Forgets a registered type (by type or name)."""
    with _lock:
        codec = _by_name.get(type_or_name) if isinstance(type_or_name, str) else _by_type.get(type_or_name)
        if codec is not None:
            _by_type.pop(codec.type, None)
            _by_name.pop(codec.name, None)


def on_register(listener: Callable[[RouteCodec], None]) -> None:
    """Calls ``listener(codec)`` for every type registered so far and every later one
    (how :mod:`handoff.dask.serialize` registers them with Dask)."""
    with _lock:
        _listeners.append(listener)
        known = list(_by_type.values())
    for codec in known:
        listener(codec)


def codec_for(obj: Any) -> Optional[RouteCodec]:
    """The codec of ``obj``'s type (or of the nearest registered base class), if any."""
    if not _by_type:
        return None
    t = type(obj)
    codec = _by_type.get(t)
    if codec is not None:
        return codec
    for base in t.__mro__[1:]:
        codec = _by_type.get(base)
        if codec is not None:
            return codec
    return None


# ------------------------------------------------------------------ same process: the object itself

_parked: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()


def _park(obj: Any) -> str:
    now = time.monotonic()
    with _lock:
        while _parked:
            key, (_, deadline) = next(iter(_parked.items()))
            if deadline > now:
                break
            del _parked[key]
        if len(_parked) >= MAX_PARKED:
            raise CapReached(
                f"{len(_parked)} objects wait for a receiver in this process, the most allowed ({MAX_PARKED}); "
                f"each is dropped {PARK_SECONDS:g} s after it was sent if nobody decodes it"
            )
        key = secrets.token_hex(16)
        _parked[key] = (obj, now + PARK_SECONDS)
    return key


def _unpark(key: Any, proc: Any, name: str) -> Any:
    if proc != identity.process_id():
        raise RouteError(f"a {name} parked in another process ({proc!r}) reached this one: it cannot be taken here")
    with _lock:
        entry = _parked.pop(key, None) if isinstance(key, str) else None
    if entry is None:
        raise RouteError(
            f"the {name} parked for this message is gone: taken already, or not taken within {PARK_SECONDS:g} s"
        )
    return entry[0]


def parked() -> int:
    """How many objects wait for a same-process receiver."""
    with _lock:
        return len(_parked)


# ------------------------------------------------------------------ encoding and decoding


def encode_value(obj: Any, route: Optional[Route] = None) -> tuple:
    """Encodes a registered value for ``route`` (default: the current one, else
    :data:`UNKNOWN`): returns ``(name, fields, frames)`` where ``fields`` is ``{"h": header}``,
    or ``{"parked": key, "proc": process id}`` for the object itself in this process."""
    codec = codec_for(obj)
    if codec is None:
        raise RouteError(f"{type(obj).__qualname__} is not a registered route-aware type")
    route = route or Route.current() or UNKNOWN
    if route.locality == SAME_PROCESS and codec.same_process == "object":
        return codec.name, {"parked": _park(obj), "proc": identity.process_id()}, []
    with route.use():
        result = codec.encode(obj, route)
    try:
        header, frames = result
        frames = list(frames)
    except (TypeError, ValueError):
        raise RouteError(f"the encoder of {codec.name} must return (header, frames), got {type(result).__name__}")
    return codec.name, {"h": header}, frames


def decode_value(name: Any, fields: dict, frames: list, route: Optional[Route] = None) -> Any:
    """Decodes what :func:`encode_value` made (``fields`` may hold other keys, ignored).

    Raises :class:`RouteError` for an unknown name, a malformed value, or a decoder that
    refused the header or frames (the decoder's own message is kept)."""
    if not isinstance(name, str):
        raise RouteError(f"a route-aware value names its type with a str, got {type(name).__name__}")
    codec = _by_name.get(name)
    if codec is None:
        known = ", ".join(sorted(_by_name)) or "none"
        raise RouteError(f"unknown route-aware type {name!r}; this process registered: {known}")
    if "parked" in fields:
        return _unpark(fields.get("parked"), fields.get("proc"), name)
    if "h" not in fields:
        raise RouteError(f"a {name} without a header")
    route = route or Route.current() or UNKNOWN
    try:
        with route.use():
            return codec.decode(fields["h"], list(frames), route)
    except RouteError:
        raise
    except Exception as e:
        raise RouteError(f"cannot decode a {name} from {route}: {e}") from e

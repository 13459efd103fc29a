"""Pins: leases on local objects that are not buffers (a file on disk, a device buffer),
which a route-aware encoder (:mod:`handoff.route`) keeps for a receiver it sent a reference
to. A pin ends when the holder releases it, when the holder's last connection to the owner
ends, or ``claim_timeout`` after a send it never decoded; claims and releases travel as
ordinary ``handoff.pin.Update`` messages (no wire change), bounded by :class:`PinBounds`.
The design in full: ``docs/python.md``, "Spilled files and pins, in detail".
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from . import wire
from .errors import CapReached
from .route import Route, RouteError

__all__ = [
    "TYPE_UPDATE",
    "DISCONNECT_GRACE",
    "PinBounds",
    "DEFAULT_PIN_BOUNDS",
    "PinTable",
    "Pin",
    "pin",
    "hold",
    "node_by_id",
    "stats",
]

#: The message a holder sends its pins' owner: ``{"claim": [ids], "release": [ids]}``.
TYPE_UPDATE = "handoff.pin.Update"
#: How long after a holder's last connection ended its pins end (a same-host peer that
#: switches to our Unix socket closes its TCP connection right after: §7.1).
DISCONNECT_GRACE = 0.2


@dataclass(frozen=True)
class PinBounds:
    """What holders can make an owner keep (see the module's doc)."""

    max_pins_per_peer: int = 1024
    max_pins: int = 65536
    claim_timeout: float = 60.0
    max_ids_per_update: int = 4096

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value is None or value <= 0:
                raise ValueError(f"PinBounds.{name} must be positive, got {value!r}")

    @property
    def max_update_bytes(self) -> int:
        """The largest body an update of at most ``max_ids_per_update`` ids in each list can
        have (9 bytes of msgpack per id, 64 for the map and its keys): a larger one is
        ignored before it is decoded, so that decoding it costs no node more than that."""
        return 2 * 9 * self.max_ids_per_update + 64


DEFAULT_PIN_BOUNDS = PinBounds()


class _Entry:
    __slots__ = ("holder", "keep", "on_end", "deadline", "what", "created")

    def __init__(self, holder: str, keep: Any, on_end: Optional[Callable[[], None]], deadline: float, what: str):
        self.holder = holder
        self.keep = keep
        self.on_end = on_end
        self.deadline: Optional[float] = deadline  # None once claimed
        self.what = what
        self.created = time.monotonic()


class PinTable:
    """The pins a node keeps as an owner (thread-safe: Dask may encode in a worker thread)."""

    def __init__(self, bounds: PinBounds = DEFAULT_PIN_BOUNDS, name: str = ""):
        self.bounds = bounds
        self.name = name
        self._lock = threading.Lock()
        self._pins: dict = {}  # id -> _Entry
        self._by_holder: dict = {}  # holder node id -> set of ids
        self._next = 1
        #: Since the node started: pins issued, and how they ended.
        self.counts = {"issued": 0, "released": 0, "dropped": 0, "expired": 0, "refused": 0}

    def pin(self, holder: str, keep: Any, *, on_end: Optional[Callable[[], None]] = None, what: str = "") -> int:
        """Keeps ``keep`` for ``holder`` (a node id); returns the pin id. ``on_end()`` is
        called once when the pin ends. Raises ``CapReached`` beyond the bounds."""
        b = self.bounds
        with self._lock:
            mine = self._by_holder.get(holder)
            reason = None
            if mine is not None and len(mine) >= b.max_pins_per_peer:
                reason = f"it holds {len(mine)} pins, the most one peer may (PinBounds.max_pins_per_peer)"
            elif len(self._pins) >= b.max_pins:
                reason = f"{len(self._pins)} pins are held in all, the most allowed (PinBounds.max_pins)"
            if reason is not None:
                self.counts["refused"] += 1
                raise CapReached(
                    f"node {self.name} cannot pin {what or 'an object'} for {holder[:12]}: {reason}; "
                    "pins end when the holder releases what it decoded, or disconnects"
                )
            pin_id = self._next
            self._next += 1
            self._pins[pin_id] = _Entry(holder, keep, on_end, time.monotonic() + b.claim_timeout, what)
            self._by_holder.setdefault(holder, set()).add(pin_id)
            self.counts["issued"] += 1
        return pin_id

    def _take(self, ids, holder: Optional[str] = None) -> tuple:
        """Removes pins (those of ``holder`` only, if given): (ended entries, unknown count)."""
        ended = []
        unknown = 0
        with self._lock:
            for pin_id in ids:
                e = self._pins.get(pin_id)
                if e is None or (holder is not None and e.holder != holder):
                    unknown += 1
                    continue
                del self._pins[pin_id]
                mine = self._by_holder.get(e.holder)
                if mine is not None:
                    mine.discard(pin_id)
                    if not mine:
                        del self._by_holder[e.holder]
                ended.append(e)
        return ended, unknown

    @staticmethod
    def _finish(ended: list) -> None:
        # Outside the lock: ending a pin may run finalizers (a file is deleted).
        for e in ended:
            on_end, e.on_end, e.keep = e.on_end, None, None
            if on_end is not None:
                on_end()

    def claim(self, holder: str, ids) -> int:
        """The holder decoded these: they no longer expire. Returns how many were unknown."""
        unknown = 0
        with self._lock:
            for pin_id in ids:
                e = self._pins.get(pin_id)
                if e is None or e.holder != holder:
                    unknown += 1
                else:
                    e.deadline = None
        return unknown

    def release(self, holder: str, ids) -> int:
        """The holder is done with these. Returns how many were unknown (or not its own)."""
        ended, unknown = self._take(ids, holder)
        self.counts["released"] += len(ended)
        self._finish(ended)
        return unknown

    def drop_holder(self, holder: str) -> int:
        """Ends every pin of ``holder`` (its connections are gone); returns how many."""
        with self._lock:
            ids = list(self._by_holder.get(holder, ()))
        ended, _ = self._take(ids)
        self.counts["dropped"] += len(ended)
        self._finish(ended)
        return len(ended)

    def expire(self) -> int:
        """Ends the pins not claimed within ``claim_timeout``; returns how many."""
        now = time.monotonic()
        with self._lock:
            late = [i for i, e in self._pins.items() if e.deadline is not None and e.deadline < now]
        ended, _ = self._take(late)
        self.counts["expired"] += len(ended)
        self._finish(ended)
        return len(ended)

    def end_all(self) -> None:
        """Ends every pin (the node closes)."""
        with self._lock:
            ids = list(self._pins)
        ended, _ = self._take(ids)
        self.counts["dropped"] += len(ended)
        self._finish(ended)

    def count(self, holder: Optional[str] = None) -> int:
        """Live pins, of one holder or in all."""
        with self._lock:
            return len(self._by_holder.get(holder, ())) if holder is not None else len(self._pins)

    def stats(self) -> dict:
        """``{count, claimed, holders, oldest_seconds}`` and the counts since the node started."""
        now = time.monotonic()
        with self._lock:
            entries = list(self._pins.values())
            holders = len(self._by_holder)
        return {
            "count": len(entries),
            "claimed": sum(1 for e in entries if e.deadline is None),
            "holders": holders,
            "oldest_seconds": max((now - e.created for e in entries), default=0.0),
            **self.counts,
        }

    def on_update(self, holder: str, body: Any) -> Optional[str]:
        """Applies a holder's ``handoff.pin.Update``; returns what was wrong with it, if anything."""
        if not isinstance(body, dict) or not set(body) <= {"claim", "release"}:
            return "its body is not a map of 'claim' and 'release'"
        lists = []
        for key in ("claim", "release"):
            ids = body.get(key, [])
            if not isinstance(ids, list):
                return f"{key!r} is not a list of pin ids (integers)"
            if len(ids) > self.bounds.max_ids_per_update:
                return f"{len(ids)} ids in {key!r}, over the {self.bounds.max_ids_per_update} one update may hold"
            if not all(type(i) is int for i in ids):
                return f"{key!r} is not a list of pin ids (integers)"
            lists.append(ids)
        unknown = self.claim(holder, lists[0]) + self.release(holder, lists[1])
        if unknown:
            return f"{unknown} pin ids it does not hold (ended already, or never issued to it)"
        return None


# ------------------------------------------------------------------ holder side


class PinNode(Protocol):
    """What pins use of a node: a :class:`handoff.node.Node` (pins sit below nodes, which
    keep a :class:`PinTable` and a :class:`PinOutbox` and register here when they start)."""

    node_id: str
    loop: Any
    pins: PinTable
    _pin_out: "PinOutbox"
    _closed: bool

    def peer_by_id(self, node_id: str) -> Any: ...


class PinOutbox:
    """A holder node's claims and releases, sent batched to each owner (loop thread only)."""

    def __init__(self, node: "PinNode"):
        self.node = node
        self._out: dict = {}  # owner -> ([claims], [releases])
        self._scheduled = False

    def add(self, owner: str, kind: str, pin_id: int) -> None:
        box = self._out.get(owner)
        if box is None:
            box = self._out[owner] = ([], [])
        box[0 if kind == "claim" else 1].append(pin_id)
        if not self._scheduled:
            self._scheduled = True
            self.node.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        out, self._out = self._out, {}
        step = self.node.pins.bounds.max_ids_per_update
        for owner, (claims, releases) in out.items():
            peer = self.node.peer_by_id(owner)
            if peer is None or peer.closed:
                continue  # no connection: the owner ends our pins itself (DISCONNECT_GRACE)
            for i in range(0, max(len(claims), len(releases)), step):
                body = wire.packer().pack({"claim": claims[i : i + step], "release": releases[i : i + step]})
                peer._queue_control(wire.Msg(TYPE_UPDATE, body, []))


def _post(node_ref: "weakref.ref[PinNode]", owner: str, kind: str, pin_id: int) -> None:
    """Queues a claim or a release from any thread (a finalizer, Dask's offload thread)."""
    node = node_ref()
    if node is None or node._closed:
        return
    try:
        node.loop.call_soon_threadsafe(node._pin_out.add, owner, kind, pin_id)
    except (RuntimeError, AttributeError):
        pass  # the loop is closed: so are the connections, and the owner ends the pins


class Pin:
    """A pin this node holds: its owner keeps something for it until :meth:`release`
    (or until this handle is garbage-collected). Made by :func:`hold`, which claims it."""

    def __init__(self, node: "PinNode", owner: str, pin_id: int):
        self.owner = owner
        self.id = pin_id
        ref = weakref.ref(node)
        _post(ref, owner, "claim", pin_id)
        self._finalizer = weakref.finalize(self, _post, ref, owner, "release", pin_id)
        self._finalizer.atexit = False

    def release(self) -> None:
        """Tells the owner this node is done (once; later calls do nothing)."""
        self._finalizer()

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"Pin({self.id} of {self.owner[:12]}{', released' if self.released else ''})"


# ------------------------------------------------------------------ for encoders and decoders

_nodes: "weakref.WeakValueDictionary[str, PinNode]" = weakref.WeakValueDictionary()


def register_node(node: "PinNode") -> None:
    """Called by a node when it starts: routes name nodes by id."""
    _nodes[node.node_id] = node


def unregister_node(node: "PinNode") -> None:
    if _nodes.get(node.node_id) is node:
        del _nodes[node.node_id]


def node_by_id(node_id: Any) -> Optional["PinNode"]:
    """The started, open node of this process with this id, if any."""
    node = _nodes.get(node_id) if isinstance(node_id, str) else None
    return node if node is not None and not node._closed else None


def pin(route: "Route", keep: Any, *, on_end: Optional[Callable[[], None]] = None, what: str = "") -> dict:
    """For an encoder: keeps ``keep`` on the sending node for the route's recipient, and
    returns the reference to put in the header: ``{"owner", "pin", "to"}`` (node ids and
    the pin id). Raises ``CapReached`` beyond the bounds, ``RouteError`` without a route."""
    node = node_by_id(route.sender.node) if route.known else None
    if node is None:
        raise RouteError(f"no node of this process sends on {route}: nothing can keep {what or 'the object'}")
    pin_id = node.pins.pin(route.recipient.node, keep, on_end=on_end, what=what)
    return {"owner": route.sender.node, "pin": pin_id, "to": route.recipient.node}


def hold(ref: Any, route: "Route") -> Optional[Pin]:
    """For a decoder: the :class:`Pin` of a reference :func:`pin` made, if this node is the
    holder it was made for (then claimed); ``None`` if the value reached this node another
    way (forwarded by a node that did not decode it, or decoded outside a connection) —
    the owner then ends the pin after ``claim_timeout``. Raises ``ValueError`` for a
    malformed reference."""
    if not isinstance(ref, dict):
        raise ValueError("the lease is missing (no 'owner', 'pin' and 'to')")
    owner, pin_id, to = ref.get("owner"), ref.get("pin"), ref.get("to")
    if not isinstance(owner, str) or not isinstance(to, str) or type(pin_id) is not int or not 0 < pin_id < 1 << 63:
        raise ValueError(f"a malformed lease: {ref!r:.200}")
    if not route.known or route.recipient.node != to or route.sender.node != owner:
        return None
    node = node_by_id(to)
    if node is None:
        return None
    return Pin(node, owner, pin_id)


def stats() -> dict:
    """The pins every open node of this process keeps, added up: ``{count, holders, nodes}``."""
    count = holders = 0
    nodes = 0
    for node in list(_nodes.values()):
        if node._closed:
            continue
        s = node.pins.stats()
        count += s["count"]
        holders += s["holders"]
        nodes += 1
    return {"count": count, "holders": holders, "nodes": nodes}

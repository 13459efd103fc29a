"""Resources (spec §8.3–§8.4): node-local objects that values refer to by key.

Some values cannot travel: a storage driver, a cache, a catalog, a connection pool.
A value that refers to one travels as the resource's *key* — msgpack extension type 2
(:data:`EXT_RESOURCE_KEY`) whose payload is the key in UTF-8 — and the receiver binds
the key to its *own* object of that name: from its registry (:class:`Resources`, one
per node: ``node.resources``), or through a resolver that opens it on demand. A key the
receiver cannot bind fails the decode with :class:`ResourceError`, code
``unknown-resource``, which names the key, the node and the keys the node has.

Sending: put a :class:`Resource` (a key and the local object) or a bare
:class:`ResourceKey` in a body. Receiving: the node's decoder turns every resource key
into a :class:`Resource` bound to this node's object (data handles, §8.5, bind their
``catalog`` key themselves: see :mod:`handoff.data`). Decoding without a registry
(``decode_body(..., resources=None)``) leaves keys as unbound :class:`ResourceKey`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .wire import WireError

__all__ = ["EXT_RESOURCE_KEY", "ResourceKey", "Resource", "Resources", "ResourceError"]

#: The msgpack extension type of a resource key in a body (§8.3).
EXT_RESOURCE_KEY = 2


def _quote(text: str) -> str:
    """A key in double quotes, with quotes and backslashes escaped (as the reference's ``{:?}``)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ResourceKey:
    """A resource key as it travels: msgpack ext type 2 with the key in UTF-8, not bound to anything."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        if not isinstance(key, str):
            raise TypeError(f"a resource key is a str, not {type(key).__name__}")
        self.key = key

    def encode(self) -> bytes:
        """The ext payload: the key in UTF-8."""
        return self.key.encode("utf-8")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ResourceKey) and type(other) is type(self) and other.key == self.key

    def __hash__(self) -> int:
        return hash((ResourceKey, self.key))

    def __repr__(self) -> str:
        return f"ResourceKey({self.key!r})"


class Resource:
    """A reference to a node-local object: it travels as ``key`` and is received bound to
    the receiver's own object under that key.

    ``value`` is the local object; attribute access falls through to it, so a received
    ``Resource`` can be used like the object itself (``query["pool"].connect()``).
    """

    __slots__ = ("key", "value")

    def __init__(self, key: str, value: Any):
        if not isinstance(key, str):
            raise TypeError(f"a resource key is a str, not {type(key).__name__}")
        self.key = key
        self.value = value

    def encode(self) -> bytes:
        return self.key.encode("utf-8")

    def __getattr__(self, name: str) -> Any:
        if name in Resource.__slots__:  # not set yet (while unpickling)
            raise AttributeError(name)
        return getattr(self.value, name)

    def __repr__(self) -> str:
        return f"Resource({self.key!r})"


class ResourceError(WireError):
    """A resource key could not be bound (``unknown-resource``).

    ``kind`` is ``unknown`` (neither the registry nor a resolver knows the key),
    ``failed`` (a resolver knows it but could not open it: ``reason``) or ``wrong-type``
    (the object under the key is not what the value asked for: ``expected``).
    ``available`` lists the keys the node has.
    """

    def __init__(
        self,
        kind: str,
        key: str,
        node: str,
        available: Iterable[str] = (),
        reason: Optional[str] = None,
        expected: Optional[str] = None,
        detail: Optional[str] = None,
    ):
        self.kind, self.key, self.node = kind, key, node
        self.available = list(available)
        self.reason, self.expected = reason, expected
        if kind == "failed":
            text = f"resource {_quote(key)} on node {_quote(node)} could not be opened: {reason}"
        elif kind == "wrong-type":
            text = f"resource {_quote(key)} on node {_quote(node)} is not a {expected}"
        else:
            has = ", ".join(self.available) if self.available else "no resources"
            text = f"no resource {_quote(key)} on node {_quote(node)} (it has: {has})"
        if detail:
            text = f"{text}; {detail}"
        super().__init__("unknown-resource", text)


class _Resolver:
    __slots__ = ("resolve", "keys")

    def __init__(self, resolve: Callable[[str], Any], keys: Callable[[], Iterable[str]]):
        self.resolve = resolve
        self.keys = keys


class Resources:
    """A node's registry of local resources, by key (``node.resources``).

    ``insert(key, obj)`` registers an object; ``add_resolver(fn)`` adds a function asked,
    in the order added, for keys the registry does not hold: it returns the object for a
    key it knows, ``None`` for one it does not (the next resolver is asked), or raises for
    a key it knows but cannot open. An object with ``resolve(key)`` (and optionally
    ``keys()``) works as a resolver too.
    """

    def __init__(self, owner: str = ""):
        self._owner = owner
        self._entries: dict[str, Any] = {}
        self._resolvers: list[_Resolver] = []

    @property
    def owner(self) -> str:
        """The node whose registry this is (named in errors)."""
        return self._owner

    def insert(self, key: str, value: Any) -> None:
        """Registers ``value`` under ``key``, replacing what was there."""
        if not isinstance(key, str):
            raise TypeError(f"a resource key is a str, not {type(key).__name__}")
        self._entries[key] = value

    def remove(self, key: str) -> bool:
        """Removes the resource under ``key``; values already bound keep it. True if there was one."""
        return self._entries.pop(key, None) is not None

    def add_resolver(self, resolver: Any, keys: Optional[Iterable[str] | Callable[[], Iterable[str]]] = None) -> None:
        """Adds a resolver (a function ``key -> object | None``, or an object with ``resolve``).

        ``keys`` — a list, or a function returning one — says which keys it can open, for
        error messages and :meth:`keys` (patterns such as ``"pool:*"`` are fine); by default
        the resolver's own ``keys()`` if it has one, else none.
        """
        resolve = getattr(resolver, "resolve", None) or resolver
        if not callable(resolve):
            raise TypeError("a resolver is a function key -> object | None, or has a resolve(key) method")
        if keys is None:
            own = getattr(resolver, "keys", None)
            listing: Callable[[], Iterable[str]] = own if callable(own) else (lambda: ())
        elif callable(keys):
            listing = keys
        else:
            fixed = list(keys)
            listing = lambda: fixed  # noqa: E731
        self._resolvers.append(_Resolver(resolve, listing))

    def keys(self) -> list:
        """Every key: registered ones and those the resolvers can open; sorted, no repeats."""
        out = set(self._entries)
        for r in self._resolvers:
            try:
                out.update(r.keys())
            except Exception:  # a listing that fails must not hide the error being reported
                pass
        return sorted(out)

    def get(self, key: str, expected: Optional[type] = None) -> Any:
        """The object under ``key``: from the registry, else the first resolver that knows it.

        Raises :class:`ResourceError` (``unknown-resource``) if none does, if a resolver
        fails to open it, or if ``expected`` is given and the object is not one.
        """
        if key in self._entries:
            value = self._entries[key]
        else:
            value = None
            for r in list(self._resolvers):
                try:
                    value = r.resolve(key)
                except Exception as e:
                    raise ResourceError("failed", key, self._owner, reason=str(e) or type(e).__name__) from e
                if value is not None:
                    break
            if value is None:
                raise ResourceError("unknown", key, self._owner, self.keys())
        if expected is not None and not isinstance(value, expected):
            raise ResourceError("wrong-type", key, self._owner, expected=expected.__name__)
        return value

    def bind(self, key: str, expected: Optional[type] = None) -> Resource:
        """A :class:`Resource` for ``key`` bound to this node's object (see :meth:`get`)."""
        return Resource(key, self.get(key, expected))

    def __repr__(self) -> str:
        return f"Resources({self._owner!r}, keys={self.keys()})"

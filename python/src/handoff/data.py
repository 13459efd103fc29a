"""Data handles (spec §8.5): a dataset object that travels as a tag the receiver binds to
its own storage, with the sender's bytes as a lazy ticket to fall back on.

On the wire a handle is a map::

    {"catalog": <resource key "dataset:<uuid>">,
     "tag": {"dataset": uuid, "name": …, "path": …, "size": …, "digest": …, "version": …},
     "fallback": <frame reference to a lazy ticket>}        # optional

The receiver binds ``catalog`` in its resources (``node.resources``) to read the object
itself: to the node's catalog, served with :meth:`handoff.datasets.Catalog.serve`
(``Data.toml``, as in the Rust reference), or to a local source the application
registered (:class:`FileDataset`, or any object with ``read(tag, start, end)``)::

    Catalog.load("Data.toml").serve(node.resources)
    node.resources.insert(dataset_key(uuid), FileDataset("/data/big.bin"))

Otherwise — or when the local source fails — the handle pulls the bytes from the sender
through the fallback ticket (the "RemoteBlob" fallback): :attr:`BlobHandle.last_origin` is
then ``remote-blob`` and :attr:`BlobHandle.fallback_reason` says why. With neither a
binding nor a fallback, decoding fails with ``unknown-resource``, naming the dataset.

Sending: :meth:`BlobHandle.from_bytes` offers bytes this node has as a handle (the tag
plus the bytes as an on-demand ticket); a received handle sent on forwards its ticket.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .buffers import OnDemand
from .errors import HandoffError
from .native import required
from .resources import ResourceError, ResourceKey, Resources
from .tickets import Ticket, digest
from .wire import WireError

__all__ = [
    "ORIGINS",
    "BlobTag",
    "BlobHandle",
    "BlobError",
    "BlobRangeError",
    "FileDataset",
    "dataset_key",
    "is_handle_map",
]

#: Where a handle's bytes came from (§8.5): a local file read in place, this node's storage,
#: its cache, a cache shared with a same-host node that had fetched it, or the sender.
ORIGINS = ("read-in-place", "storage", "cache", "shared-cache", "remote-blob")

#: The prefix of the resource keys of datasets.
DATASET_PREFIX = "dataset:"


def dataset_key(uuid: str) -> str:
    """The resource key under which a receiver answers for a dataset: ``dataset:<uuid lower-case>``."""
    return DATASET_PREFIX + uuid.lower()


class BlobError(HandoffError):
    """A data handle could not be read."""


class BlobRangeError(BlobError, IndexError):
    """A range outside the object."""


def _opt(m: dict, key: str, typ: type, what: str) -> Any:
    v = m.get(key)
    if v is not None and (type(v) is not typ):
        raise ValueError(f"data handle tag: {key!r} must be {what}, got {type(v).__name__}")
    return v


@dataclass(frozen=True)
class BlobTag:
    """What a data handle says about its object: no bytes, no driver, no cache.

    ``dataset`` the dataset's uuid; ``name`` its name at the sender (for messages);
    ``path`` the object's path within the dataset (``""`` for a Blob dataset); ``size``
    in bytes, ``digest`` (BLAKE3, lower-case hex) and ``version`` (ETag or version id) if
    the sender knew them.
    """

    dataset: str
    name: Optional[str] = None
    path: str = ""
    size: Optional[int] = None
    digest: Optional[str] = None
    version: Optional[str] = None

    def to_map(self) -> dict:
        """The tag map, keys in the reference's order, unknown fields omitted (``path`` always written)."""
        m: dict = {"dataset": self.dataset}
        if self.name is not None:
            m["name"] = self.name
        m["path"] = self.path
        for key in ("size", "digest", "version"):
            v = getattr(self, key)
            if v is not None:
                m[key] = v
        return m

    __handoff_wire__ = to_map

    @classmethod
    def from_map(cls, m: Any) -> "BlobTag":
        if not isinstance(m, dict):
            raise ValueError("data handle: 'tag' is not a map")
        dataset = m.get("dataset")
        if type(dataset) is not str:
            raise ValueError("data handle tag: 'dataset' (the dataset's uuid) is missing or not a str")
        size = m.get("size")
        if size is not None and (type(size) is not int or size < 0):
            raise ValueError("data handle tag: 'size' must be a non-negative integer")
        return cls(
            dataset=dataset,
            name=_opt(m, "name", str, "a str"),
            path=_opt(m, "path", str, "a str") or "",
            size=size,
            digest=_opt(m, "digest", str, "a str"),
            version=_opt(m, "version", str, "a str"),
        )

    def describe(self) -> str:
        """``name/path`` (or the uuid when there is no name), for messages."""
        name = self.name or self.dataset
        return f"{name}/{self.path}" if self.path else name


def is_handle_map(m: Any) -> bool:
    """Whether a decoded map is a data handle: a resource key ``catalog`` and a map ``tag``
    with a str ``dataset`` (unknown keys beside them are ignored, as the reference does)."""
    return (
        isinstance(m, dict)
        and isinstance(m.get("catalog"), ResourceKey)
        and isinstance(m.get("tag"), dict)
        and isinstance(m["tag"].get("dataset"), str)
    )


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


class BlobHandle:
    """A data handle: bound to a local source of this node when it has the dataset, with
    the sender's bytes to fall back on when it does not or its source fails.

    Receive one in a body; send one (or :meth:`from_bytes`) in a body. Reads go to the
    local source first; :attr:`last_origin` says which path the bytes took.
    """

    def __init__(
        self,
        tag: BlobTag,
        source: Any = None,
        fallback: Any = None,
        reason: Optional[str] = None,
        key: Optional[str] = None,
    ):
        self.tag = tag
        #: The resource key it travels under (``dataset:<uuid>``).
        self.key = key or dataset_key(tag.dataset)
        #: The local object the key bound to, if this node has the dataset.
        self.source = source
        self._fallback = fallback
        self._reason = reason
        self._origin: Optional[str] = None

    # ------------------------------------------------------------------ making one

    @classmethod
    def from_bytes(
        cls,
        data: Any,
        dataset: str,
        *,
        name: Optional[str] = None,
        path: str = "",
        version: Optional[str] = None,
    ) -> "BlobHandle":
        """A handle to send for bytes this node has: the tag (with the size and BLAKE3
        digest of ``data``) and the bytes as an on-demand (``lazy``) ticket."""
        dg = digest(data)
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        tag = BlobTag(dataset=dataset, name=name, path=path, size=len(view), digest=dg.hex(), version=version)
        return cls(tag, fallback=OnDemand(data, dg))

    @classmethod
    def from_wire(cls, m: dict, resources: Optional[Resources] = None) -> "BlobHandle":
        """A received handle map (see :func:`is_handle_map`), bound to ``resources`` if it can be.

        Raises ``unknown-resource`` if it can neither be bound nor fall back on the sender,
        ``bad-body`` if the map is not a handle (a ``tag`` of the wrong shape, a
        ``fallback`` that is not a frame).
        """
        key = m["catalog"].key
        try:
            tag = BlobTag.from_map(m["tag"])
        except ValueError as e:
            raise WireError("bad-body", f"cannot decode a data handle: {e}") from None
        fallback = m.get("fallback")
        if fallback is not None and not isinstance(fallback, (Ticket, memoryview, bytes, bytearray)):
            raise WireError("bad-body", "cannot decode a data handle: 'fallback' is not a frame reference")
        if resources is None:
            why = f"no resources to bind {key!r} (decoded outside a node)"
            source = None
        else:
            try:
                source = resources.get(key)
                why = None
                if not callable(getattr(source, "read", None)):
                    raise ResourceError(
                        "wrong-type",
                        key,
                        resources.owner,
                        expected="data source (an object with read(tag, start, end))",
                    )
            except ResourceError as e:
                if fallback is None:
                    raise ResourceError(
                        e.kind,
                        e.key,
                        e.node,
                        e.available,
                        reason=e.reason,
                        expected=e.expected,
                        detail=f"{tag.describe()}: and the sender sent no fallback "
                        "(it had not fetched the object, or this node takes no tickets)",
                    ) from None
                source, why = None, e.message
        if isinstance(fallback, Ticket):
            fallback.adopted = True
        handle = cls(tag, source=source, fallback=fallback, key=key)
        if source is None:
            handle._reason = f"this node cannot open the dataset: {why}"
        return handle

    def __handoff_wire__(self) -> dict:
        """The map it travels as; the fallback goes on as the ticket (forwarded) or the bytes (offered on demand)."""
        m: dict = {"catalog": ResourceKey(self.key), "tag": self.tag.to_map()}
        fb = self._fallback
        if isinstance(fb, Ticket) and fb.released:
            fb = None
        if isinstance(fb, (memoryview, bytes, bytearray)):
            fb = OnDemand(fb)
        if fb is not None:
            m["fallback"] = fb
        return m

    # ------------------------------------------------------------------ what it is

    @property
    def has_fallback(self) -> bool:
        """Whether the sender's bytes can still be had (a fallback ticket is held, or the bytes are here)."""
        fb = self._fallback
        return fb is not None and not (isinstance(fb, Ticket) and fb.released)

    @property
    def fallback_reason(self) -> Optional[str]:
        """Why the bytes come (or would come) from the sender rather than this node, if they do."""
        return self._reason

    @property
    def last_origin(self) -> Optional[str]:
        """Where the bytes came from on the last read: one of :data:`ORIGINS`, or ``None`` before any."""
        return self._origin

    def __repr__(self) -> str:
        return f"BlobHandle({self.tag.describe()}, bound={self.source is not None}, fallback={self.has_fallback})"

    # ------------------------------------------------------------------ reading

    def _use_fallback(self, cause: Optional[BaseException]) -> Any:
        fb = self._fallback if self.has_fallback else None
        if fb is None:
            if cause is not None:
                if isinstance(cause, BlobError):
                    raise cause
                raise BlobError(f"{self.tag.describe()}: {cause}") from cause
            raise BlobError(
                f"{self.tag.describe()}: this node cannot read it ({self._reason or 'not bound'}) "
                "and the sender sent no fallback"
            )
        if cause is not None:
            self._reason = f"this node's storage failed: {cause}"
        return fb

    def _local_ok(self, origin: str) -> None:
        """After a whole read from this node's own source, the fallback is not needed: let it go,
        so the sender can end its lease."""
        self._origin = origin
        fb, self._fallback = self._fallback, None
        if isinstance(fb, Ticket):
            fb.release()

    def _source_origin(self) -> str:
        origin = getattr(self.source, "origin", None)
        return origin if origin in ORIGINS else "read-in-place"

    async def _read_source(self, start: int, end: Optional[int]) -> tuple:
        """Reads from the local source: the bytes and where they came from. A source with
        ``read_with_origin`` (a catalog's dataset) says so per read; else its ``origin``."""
        with_origin = getattr(self.source, "read_with_origin", None)
        if callable(with_origin):
            data, origin = await _maybe_await(with_origin(self.tag, start, end))
            return data, origin if origin in ORIGINS else self._source_origin()
        return await _maybe_await(self.source.read(self.tag, start, end)), self._source_origin()

    async def size(self) -> int:
        """The object's size in bytes: from the local source, the tag, or the fallback."""
        if self.source is not None and callable(getattr(self.source, "size", None)):
            try:
                return int(await _maybe_await(self.source.size(self.tag)))
            except Exception as e:
                if not self.has_fallback:
                    raise BlobError(f"{self.tag.describe()}: {e}") from e
        if self.tag.size is not None:
            return self.tag.size
        return len(self._use_fallback(None))

    async def read_all(self) -> Any:
        """The whole object: from this node's source, else pulled from the sender (digest checked)."""
        cause: Optional[BaseException] = None
        if self.source is not None:
            try:
                data, origin = await self._read_source(0, None)
                if self.tag.digest is not None and digest(data).hex() != self.tag.digest.lower():
                    raise BlobError(f"the content of {self.tag.describe()} does not match the tag's digest")
                self._local_ok(origin)
                return data
            except Exception as e:
                cause = e
        fb = self._use_fallback(cause)
        if isinstance(fb, Ticket):
            try:
                data = await fb.redeem()
            except Exception as e:
                raise BlobError(
                    f"{self.tag.describe()}: pulling the bytes from the sender failed ({self._reason}): {e}"
                ) from e
        else:
            # Every reader gets the same received bytes (a frame read off the socket is
            # writable): read-only, so that none changes what the next one reads.
            data = fb.toreadonly() if type(fb) is memoryview else fb
        self._origin = "remote-blob"
        return data

    async def read_range(self, start: int, end: int) -> Any:
        """Bytes ``start .. end``: from this node's source, else only that range from the sender."""
        if start < 0 or end < start:
            raise BlobRangeError(f"{self.tag.describe()}: bad range {start}..{end}")
        cause: Optional[BaseException] = None
        if self.source is not None:
            try:
                data, self._origin = await self._read_source(start, end)
                return data
            except BlobRangeError:
                raise
            except Exception as e:
                cause = e
        fb = self._use_fallback(cause)
        size = len(fb)
        if end > size:
            raise BlobRangeError(f"{self.tag.describe()}: range {start}..{end} is outside its {size} bytes")
        if isinstance(fb, Ticket):
            try:
                data = await fb.read(start, end - start)
            except Exception as e:
                raise BlobError(
                    f"{self.tag.describe()}: pulling the bytes from the sender failed ({self._reason}): {e}"
                ) from e
        else:
            data = memoryview(fb).toreadonly()[start:end]
        self._origin = "remote-blob"
        return data

    def release(self) -> None:
        """Lets go of the fallback (ends this node's hold on the sender's ticket)."""
        fb, self._fallback = self._fallback, None
        if isinstance(fb, Ticket):
            fb.release()


class FileDataset:
    """A local source for a dataset: a file (a Blob dataset) or a directory (a BlobTree
    dataset), read in place. Register it under the dataset's key::

        node.resources.insert(dataset_key(uuid), FileDataset("/data/images"))

    A tag's ``path`` is joined to the directory; ``..``, absolute paths and symlinks that
    lead out of the tree are refused.
    """

    origin = "read-in-place"

    def __init__(self, path: Any):
        self.root = Path(path)

    def file(self, tag: BlobTag) -> Path:
        """The file the tag names, checked as a ``FileSystem`` dataset's paths are (by
        ``handoff-data``, the Rust data layer: one rule for both languages)."""
        local_file = required("handoff.FileDataset").data_local_file
        return Path(local_file(tag.describe(), str(self.root), tag.path, BlobError))

    def size(self, tag: BlobTag) -> int:
        return self.file(tag).stat().st_size

    def read(self, tag: BlobTag, start: int = 0, end: Optional[int] = None) -> bytes:
        """Bytes ``start .. end`` of the tag's file (``end=None``: to its end)."""
        f = self.file(tag)
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if end is None:
                end = size
            elif end > size:
                raise BlobRangeError(f"{tag.describe()}: range {start}..{end} is outside its {size} bytes")
            fh.seek(start)
            return fh.read(end - start)

    def __repr__(self) -> str:
        return f"FileDataset({str(self.root)!r})"

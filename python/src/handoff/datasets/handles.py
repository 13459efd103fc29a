"""Lazy handles to a dataset's objects: :class:`Blob` (one object) and :class:`BlobTree` (a
folder or prefix of them), on ``handoff-data``'s. Nothing is read until asked; paths inside a
tree are checked there (``..`` that leaves it, absolute paths, symlinks out of a local tree).

:class:`DatasetSource` is what a received data handle binds to on a node that serves its
catalog (:meth:`handoff.datasets.Catalog.serve`): the handle's reads then go to this node's
cache (``cache``, or ``shared-cache`` for the content its tag's digest names) or storage
(``storage``), or its files read in place (``read-in-place``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ..data import BlobRangeError, BlobTag
from ..tickets import digest
from .native import call, native

__all__ = ["Blob", "BlobTree", "DataSet", "DatasetSource", "Entry", "Storage"]


class Storage:
    """Where a dataset's bytes are: ``identity`` (what the cache keys them by, as the Rust
    CLI spells it) and ``location`` (a path, a url, or the catalog's embedded data)."""

    __slots__ = ("identity", "location")

    def __init__(self, identity: str, location: str):
        self.identity, self.location = identity, location

    def __repr__(self) -> str:
        return f"Storage({self.identity!r})"


class DataSet:
    """One dataset of a catalog, as written and checked: ``name``, ``uuid``, ``description``,
    ``kind`` (``"Blob"`` or ``"BlobTree"``), ``driver``, ``available`` (this build reads its
    driver), ``invalid_name`` (why its name breaks DataSets.jl's rule, if it does: such a
    dataset is listed and cannot be opened), ``storage`` (``[datasets.storage]`` as written)
    and ``source`` (:class:`Storage`; ``None`` when the driver is not available)."""

    def __init__(self, info: Any):
        self._info = info
        self.name: str = info.name
        self.uuid: str = info.uuid
        self.description: Optional[str] = info.description
        self.kind: str = info.kind
        self.driver: str = info.driver
        self.available: bool = info.available
        self.invalid_name: Optional[str] = info.invalid_name
        self.source = Storage(info.identity, info.location) if self.available else None

    @property
    def storage(self) -> Dict[str, Any]:
        return json.loads(self._info.storage_json)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, DataSet) and (self.uuid, self.name, self.driver) == (
            other.uuid,
            other.name,
            other.driver,
        )

    def __hash__(self) -> int:
        return hash((self.uuid, self.name))

    def __repr__(self) -> str:
        return f"DataSet({self.name!r}, {self.uuid}, {self.kind}, {self.driver})"


class Entry:
    """An entry of a tree: its path relative to the tree, and a file's size; a folder (only a
    listing of one level has them, as DataSets.jl's ``readdir``) has ``is_dir`` and no size."""

    __slots__ = ("path", "size", "is_dir")

    def __init__(self, path: str, size: Optional[int], is_dir: bool = False):
        self.path, self.size, self.is_dir = path, size, is_dir

    @property
    def shown(self) -> str:
        """The path as a listing shows it: a folder's with a final ``/``."""
        return self.path + "/" if self.is_dir else self.path

    def __repr__(self) -> str:
        return f"Entry({self.path!r}, is_dir=True)" if self.is_dir else f"Entry({self.path!r}, {self.size})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Entry) and (self.path, self.size, self.is_dir) == (
            other.path,
            other.size,
            other.is_dir,
        )


def _in_place(dataset: DataSet) -> str:
    return "read-in-place" if dataset.driver == "FileSystem" else "storage"


class Blob:
    """One object of a dataset: nothing is read until asked. ``tag`` is the tag it was opened
    from (:meth:`Catalog.open_tag`), whose size and digest what is read is checked against."""

    def __init__(self, handle: Any, tag: Optional[BlobTag] = None):
        self._handle = handle
        self.dataset = DataSet(handle.dataset)
        self.path: str = handle.path
        self.tag = tag
        self._range_origin: Optional[str] = None
        #: Size and BLAKE3 (hex) of the content, once this handle has read it whole: a tag
        #: made from it then carries them, so that a receiver can find the content by digest.
        self.known_size: Optional[int] = None
        self.known_digest: Optional[str] = None

    @property
    def last_origin(self) -> Optional[str]:
        """Where the last read's bytes came from: ``read-in-place``, ``storage``, ``cache`` or
        ``shared-cache`` (:data:`handoff.data.ORIGINS`)."""
        return self._range_origin or self._handle.last_origin

    def __repr__(self) -> str:
        where = f"/{self.path}" if self.path else ""
        return f"Blob({self.dataset.name}{where})"

    async def size(self) -> int:
        """The object's size in bytes (asks storage; nothing else is read)."""
        return await call(self._handle.size)

    async def read_all(self) -> bytes:
        """The whole object; checked against the tag's size and digest if it came with one."""
        data = await call(self._handle.read_all)
        self._range_origin = None
        known = self._handle.tag()
        self.known_size = len(data)
        self.known_digest = known.get("digest") or digest(data).hex()
        return data

    async def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``start .. end`` only (the cache fetches only the blocks they touch)."""
        if type(start) is not int or type(end) is not int or start < 0 or end < start:
            raise BlobRangeError(f"dataset {self.dataset.name}: bad range {start!r}..{end!r}")
        data = await call(self._handle.read_range, start, end)
        self._range_origin = self._handle.last_origin or _in_place(self.dataset)
        return data

    async def describe(self, with_digest: bool = True) -> BlobTag:
        """The tag to send for this blob: dataset uuid and name, path, size, version, and
        (``with_digest``: reading the object once) its BLAKE3 digest, so that a receiver can
        check what it reads and find it in a shared cache by digest."""
        if with_digest:
            await self.read_all()
        tag = BlobTag.from_map(await call(self._handle.describe))
        if with_digest and tag.digest is None:
            tag = BlobTag(tag.dataset, tag.name, tag.path, tag.size, self.known_digest, tag.version)
        return tag


class BlobTree:
    """A folder (or prefix) of a ``BlobTree`` dataset: lists its files and opens them."""

    def __init__(self, handle: Any):
        self._handle = handle
        self.dataset = DataSet(handle.dataset)
        self.path: str = handle.path

    def __repr__(self) -> str:
        where = f"/{self.path}" if self.path else ""
        return f"BlobTree({self.dataset.name}{where})"

    def blob(self, rel: str) -> Blob:
        """The file ``rel`` below this folder (``..`` may not leave the dataset)."""
        return Blob(self._handle.blob(rel))

    def tree(self, rel: str) -> "BlobTree":
        """The folder ``rel`` below this one."""
        return BlobTree(self._handle.join(rel))

    async def list(self) -> List[Entry]:
        """The files and folders directly in this folder, sorted by path (a folder's
        :class:`Entry` has ``is_dir`` and no size), as DataSets.jl's ``readdir``."""
        return [Entry(path, size, is_dir) for path, is_dir, size in await call(self._handle.list)]

    async def walk(self) -> List[Entry]:
        """Every file below this folder, recursively, sorted by path."""
        return [Entry(path, size, is_dir) for path, is_dir, size in await call(self._handle.walk)]


def opened(handle: Any) -> Any:
    """The :class:`Blob` or :class:`BlobTree` for what the extension opened."""
    return BlobTree(handle) if isinstance(handle, native.DataTree) else Blob(handle)


class DatasetSource:
    """A dataset of this node's catalog as a data handle's local source (spec §8.5): a
    received tag binds to it, and the handle reads through it."""

    def __init__(self, catalog: Any, dataset: DataSet):
        self.catalog = catalog
        self.dataset = dataset
        self.origin = _in_place(dataset)

    def __repr__(self) -> str:
        return f"DatasetSource({self.dataset.name})"

    async def size(self, tag: BlobTag) -> int:
        return await self.catalog.open_tag(tag).size()

    async def read(self, tag: BlobTag, start: int = 0, end: Optional[int] = None) -> bytes:
        data, _ = await self.read_with_origin(tag, start, end)
        return data

    async def read_with_origin(self, tag: BlobTag, start: int = 0, end: Optional[int] = None) -> Tuple[bytes, str]:
        """The bytes and where they came from (``storage``, ``cache``, ``shared-cache`` or
        ``read-in-place``)."""
        blob = self.catalog.open_tag(tag)
        if start == 0 and end is None:
            data = await blob.read_all()
        else:
            data = await blob.read_range(start, await blob.size() if end is None else end)
        return data, blob.last_origin or self.origin

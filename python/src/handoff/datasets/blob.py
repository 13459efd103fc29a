"""Lazy handles to a dataset's objects: :class:`Blob` (one object) and :class:`BlobTree`
(a folder or prefix of them). Nothing is read until asked; paths inside a tree are
checked (:mod:`handoff.datasets.paths`).

:class:`DatasetSource` is what a received data handle binds to on a node that serves its
catalog (:meth:`handoff.datasets.Catalog.serve`): the handle's reads then go to this
node's cache (``cache``, or ``shared-cache`` for the content its tag's digest names) or
storage (``storage``), or its files read in place (``read-in-place``).
"""

from __future__ import annotations

import asyncio
from typing import List, Optional, Tuple

from ..data import BlobError, BlobRangeError, BlobTag
from ..tickets import digest
from . import paths
from .cache import Cache, CachedFile
from .dataset import DataSet
from .stores import Entry

__all__ = ["Blob", "BlobTree", "DatasetSource"]


def _origin(dataset: DataSet) -> str:
    return "read-in-place" if dataset.source.local is not None else "storage"


class Blob:
    """One object of a dataset: the dataset's own object (``path`` empty, a ``Blob``
    dataset) or a file of a ``BlobTree`` dataset. Reads go to the dataset's storage, through
    the catalog's cache when it has one (spec/CACHE.md); local files are read in place."""

    def __init__(self, dataset: DataSet, path: str = "", tag: Optional[BlobTag] = None, cache: Optional[Cache] = None):
        self.dataset = dataset
        self.path = path
        #: What the sender said of this object, for a blob bound from a received tag: its
        #: size and digest are checked against what this node reads.
        self.tag = tag
        self.cache = cache
        self.last_origin: Optional[str] = None
        #: Size and BLAKE3 (hex) of the content, once this handle has read it whole: a tag
        #: made from it then carries them, so that a receiver can find the content by digest.
        self.known_size: Optional[int] = None
        self.known_digest: Optional[str] = None

    def _cached(self) -> bool:
        return self.cache is not None and self.dataset.source.local is None

    async def _whole(self) -> Tuple[CachedFile, str]:
        """The whole object from the cache, pinned, and its origin: the content a tag's
        digest names (``shared-cache``: another process, or node, fetched it), a cached
        version (``cache``), or a download (``storage``)."""
        want = self.tag.digest if self.tag is not None else None
        if want is not None:
            f = await asyncio.to_thread(self.cache.open_digest, want.lower())
            if f is not None:
                return f, "shared-cache"
        source = self.dataset.source
        return await self.cache.object(
            source.store,
            source.identity,
            source.object_path(self.path),
            self.dataset.name,
            expect_digest=want,
            key_path=source.key_path(self.path),
        )

    def __repr__(self) -> str:
        where = f"/{self.path}" if self.path else ""
        return f"Blob({self.dataset.name}{where})"

    def _check_local(self) -> None:
        if self.path and self.dataset.source.local is not None:
            paths.check_local_symlinks(self.dataset.name, self.dataset.source.local, self.path)

    async def size(self) -> int:
        """The object's size in bytes (asks storage; nothing else is read)."""
        self._check_local()
        return await self.dataset.source.size(self.dataset.name, self.path)

    async def read_all(self) -> bytes:
        """The whole object; checked against the tag's size and digest if it came with one."""
        self._check_local()
        origin = _origin(self.dataset)
        if self._cached():
            f, origin = await self._whole()
            with f:
                data = await asyncio.to_thread(f.read)
            dg = f.digest  # the cache checked the content against its name
        else:
            data = await self.dataset.source.read(self.dataset.name, self.path)
            dg = digest(data).hex()
        if self.tag is not None:
            if self.tag.size is not None and len(data) != self.tag.size:
                raise BlobError(
                    f"dataset {self.dataset.name}: {self.path or 'its object'} has {len(data)} bytes here, "
                    f"the sender's tag says {self.tag.size}"
                )
            if self.tag.digest is not None and dg != self.tag.digest.lower():
                raise BlobError(
                    f"dataset {self.dataset.name}: {self.path or 'its object'} differs here from the sender's "
                    f"(BLAKE3 {dg}, the tag says {self.tag.digest})"
                )
        self.last_origin = origin
        self.known_size, self.known_digest = len(data), dg
        return data

    async def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``start .. end`` only (a ranged request to storage)."""
        if start < 0 or end < start:
            raise BlobRangeError(f"dataset {self.dataset.name}: bad range {start}..{end}")
        self._check_local()
        size = await self.size()
        if end > size:
            raise BlobRangeError(
                f"dataset {self.dataset.name}: range {start}..{end} is outside {self.path or 'its object'} ({size} bytes)"
            )
        if self._cached():
            # Only from content cached whole (this peer keeps no blocks): else a ranged GET.
            f = None
            if self.tag is not None and self.tag.digest is not None:
                f = await asyncio.to_thread(self.cache.open_digest, self.tag.digest.lower())
            if f is not None:
                with f:
                    data = await asyncio.to_thread(f.read, start, end)
                self.last_origin = "shared-cache"
                return data
        data = await self.dataset.source.read(self.dataset.name, self.path, start, end)
        self.last_origin = _origin(self.dataset)
        return data

    async def describe(self, with_digest: bool = True) -> BlobTag:
        """The tag to send for this blob: dataset uuid and name, path, size, and (reading the
        object once) its BLAKE3 digest, so that a receiver can check what it reads."""
        if with_digest:
            data = await self.read_all()
            return BlobTag(
                dataset=self.dataset.uuid,
                name=self.dataset.name,
                path=self.path,
                size=len(data),
                digest=digest(data).hex(),
            )
        return BlobTag(dataset=self.dataset.uuid, name=self.dataset.name, path=self.path, size=await self.size())


class BlobTree:
    """A folder (or prefix) of a ``BlobTree`` dataset: lists its files and opens them."""

    def __init__(self, dataset: DataSet, path: str = "", cache: Optional[Cache] = None):
        self.dataset = dataset
        self.path = path
        self.cache = cache

    def __repr__(self) -> str:
        where = f"/{self.path}" if self.path else ""
        return f"BlobTree({self.dataset.name}{where})"

    def _rel(self, rel: str) -> str:
        joined = paths.join(self.dataset.name, self.path, rel)
        if self.dataset.source.local is not None and joined:
            paths.check_local_symlinks(self.dataset.name, self.dataset.source.local, joined)
        return joined

    def blob(self, rel: str) -> Blob:
        """The file ``rel`` below this folder (``..`` may not leave the dataset)."""
        joined = self._rel(rel)
        if not joined:
            raise paths.BadPath(self.dataset.name, rel, "names the tree itself, not a file in it")
        return Blob(self.dataset, joined, cache=self.cache)

    def tree(self, rel: str) -> "BlobTree":
        """The folder ``rel`` below this one."""
        return BlobTree(self.dataset, self._rel(rel), self.cache)

    async def list(self) -> List[Entry]:
        """The files and folders directly in this folder, sorted by path (a folder's
        :class:`~handoff.datasets.stores.Entry` has ``is_dir`` and no size), as DataSets.jl's
        ``readdir`` and the Rust reference's ``BlobTree::list``."""
        return await self.dataset.source.list(self.dataset.name, self.path, recursive=False)

    async def walk(self) -> List[Entry]:
        """Every file below this folder, recursively, sorted by path."""
        return await self.dataset.source.list(self.dataset.name, self.path, recursive=True)


class DatasetSource:
    """A dataset of this node's catalog as a data handle's local source (spec §8.5): a
    received tag binds to it, and the handle reads through it."""

    def __init__(self, catalog, dataset: DataSet):
        self.catalog = catalog
        self.dataset = dataset
        self.origin = _origin(dataset)

    def __repr__(self) -> str:
        return f"DatasetSource({self.dataset.name})"

    def _blob(self, tag: BlobTag) -> Blob:
        return self.catalog.open_tag(tag)

    async def size(self, tag: BlobTag) -> int:
        return await self._blob(tag).size()

    async def read(self, tag: BlobTag, start: int = 0, end: Optional[int] = None) -> bytes:
        data, _ = await self.read_with_origin(tag, start, end)
        return data

    async def read_with_origin(self, tag: BlobTag, start: int = 0, end: Optional[int] = None) -> Tuple[bytes, str]:
        """The bytes and where they came from (``storage`` or ``read-in-place``)."""
        blob = self._blob(tag)
        if start == 0 and end is None:
            data = await blob.read_all()
        else:
            data = await blob.read_range(start, await blob.size() if end is None else end)
        return data, blob.last_origin or self.origin

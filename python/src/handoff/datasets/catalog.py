"""Catalogs: DataSets.jl's ``Data.toml`` (``data_config_version`` 0 or 1), read by
``handoff-data``, the Rust data layer the CLI runs, so that both languages agree on every
catalog:

- ``FileSystem``: a local ``path`` (``@__DIR__`` is the catalog's folder), read in place;
- ``TomlDataStorage``: the bytes in the catalog, base64, a blob or a tree of folders;
- ``ObjectStore`` (handoff's): a ``url`` and ``[datasets.storage.options]`` (S3, HTTP, ...).

``type`` is ``Blob`` or ``BlobTree`` (or the newer ``File`` and ``FileTree``). A dataset
whose driver handoff does not have does not stop the catalog from loading: it is listed,
and opening it says which drivers exist. Datasets may share a name or a uuid, as
DataSets.jl allows; a lookup by a shared one is refused, naming the datasets. A dataset whose
name breaks DataSets.jl's rule is listed too, and opening it says why it cannot be.

Lookups take DataSets.jl's specs, ``name[?query][#fragment]``: ``a_tree_example#1.csv`` is
the file ``1.csv`` of the tree ``a_tree_example``. A stack of catalogs searched in order (as
Julia's ``JULIA_DATASETS_PATH``) is a :class:`CatalogStack`.

A node serves its catalog with :meth:`Catalog.serve`: a data handle it receives (spec §8.5)
then binds to the dataset of the same uuid and reads it itself, else falls back on the
sender's bytes with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..data import DATASET_PREFIX, BlobTag
from .handles import Blob, BlobTree, DataSet, DatasetSource, opened
from .native import call, native

__all__ = [
    "DRIVERS",
    "NAME_RULE",
    "Cache",
    "Catalog",
    "CatalogStack",
    "DataSpec",
    "Selection",
    "StackEntry",
    "check_name",
    "parse_spec",
    "paths_of",
]

#: The storage drivers this build reads (``driver = ...``).
DRIVERS: Tuple[str, ...] = tuple(native.DATA_DRIVERS)

#: DataSets.jl's rule for dataset names, in words.
NAME_RULE: str = native.DATA_NAME_RULE


def check_name(name: str) -> Optional[str]:
    """Why ``name`` breaks DataSets.jl's rule for dataset names, or ``None``."""
    return native.data_check_name(name)


@dataclass(frozen=True)
class DataSpec:
    """A parsed DataSets.jl spec: ``name`` (or uuid), the ``query`` decoded (``None`` without
    ``?``) and the ``fragment`` decoded (``None`` without ``#``)."""

    name: str
    query: Optional[Dict[str, str]] = None
    fragment: Optional[str] = None

    @property
    def bare(self) -> bool:
        """A name alone: no query and no fragment."""
        return self.query is None and self.fragment is None


def parse_spec(spec: str) -> DataSpec:
    """Parses ``name[?query][#fragment]`` as DataSets.jl does (:class:`InvalidSpec` if not one)."""
    return DataSpec(*native.data_parse_spec(spec))


def paths_of(value: str) -> List[Path]:
    """The catalog files of a ``:``-separated list, as Julia splits ``JULIA_DATASETS_PATH``: an
    empty entry is the default ``~/.julia/datasets/Data.toml`` (when it exists), and a folder
    means its ``Data.toml``."""
    return [Path(p) for p in native.data_paths_of(value)]


class Cache:
    """A cache folder (spec/CACHE.md) that object-store reads go through, shared with the other
    processes of either language that open it: one download per object, checked by BLAKE3.
    ``directory`` defaults to ``$HANDOFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/handoff/data``,
    else ``~/.cache/handoff/data``; ``max_bytes`` caps it; ``offline`` fails what it lacks."""

    def __init__(self, directory: Any = None, max_bytes: Optional[int] = None, offline: bool = False):
        self._cache = native.DataCache(None if directory is None else str(directory), max_bytes, offline)
        self.dir = Path(self._cache.dir)

    @property
    def stats(self) -> Dict[str, int]:
        """This process's counters: hits, misses, gets, heads, bytes_fetched, evictions, corrupt."""
        return self._cache.stats()

    def __repr__(self) -> str:
        return f"Cache({str(self.dir)!r})"


class Selection:
    """A dataset found by a spec, with the spec's query and fragment; its other attributes
    (``name``, ``uuid``, ``kind``, ...) are the dataset's."""

    __slots__ = ("dataset", "query", "fragment")

    def __init__(self, dataset: DataSet, query: Optional[Dict[str, str]], fragment: Optional[str]):
        self.dataset, self.query, self.fragment = dataset, query, fragment

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"Selection({self.dataset.name!r}, query={self.query!r}, fragment={self.fragment!r})"


def _selection(found: Tuple[Any, Any, Any]) -> Selection:
    info, query, fragment = found
    return Selection(DataSet(info), query, fragment)


class _Lookups:
    """What a catalog and a stack of them both answer: specs to datasets, blobs and trees,
    received tags to blobs, and resource keys to sources."""

    def __init__(self, handle: Any, cache: Cache):
        self._handle = handle
        #: The cache that object-store reads go through.
        self.cache = cache
        #: Every dataset, in search order (a loaded catalog does not change).
        self._all: List[DataSet] = [DataSet(info) for _, info, _ in handle.entries()]

    def dataset(self, spec: str) -> Selection:
        """The dataset a spec (``name[?query][#fragment]``) names by its name or uuid, with the
        spec's query and fragment."""
        return _selection(self._handle.dataset(spec))

    def blob(self, spec: str) -> Blob:
        """A lazy handle to a ``Blob`` dataset, or (with a fragment) to a file of a ``BlobTree``
        dataset; nothing is read yet (:meth:`open` checks that the file exists)."""
        return Blob(self._handle.blob(spec))

    def tree(self, spec: str) -> BlobTree:
        """A lazy handle to a ``BlobTree`` dataset, or (with a fragment) to a folder of it."""
        return BlobTree(self._handle.tree(spec))

    async def open(self, spec: str) -> Any:
        """What DataSets.jl's ``open(dataset(project, spec))`` gives: the :class:`Blob` or the
        :class:`BlobTree` the spec names; a fragment selects a file or a folder of a tree, and
        one that names neither fails, naming it."""
        return opened(await call(self._handle.open, spec))

    def open_tag(self, tag: BlobTag) -> Blob:
        """Binds a tag received from another node: the dataset of its uuid, the path checked;
        the size and digest it carries are checked on reading."""
        handle = self._handle.open_tag(tag.dataset, tag.path, tag.name, tag.size, tag.digest, tag.version)
        return Blob(handle, tag)

    def resolve(self, key: str) -> Optional[DatasetSource]:
        """The local source for a dataset resource key (``dataset:<uuid>``), or ``None``."""
        if not key.startswith(DATASET_PREFIX):
            return None
        uuid = key[len(DATASET_PREFIX) :]
        for ds in self._all:
            if ds.uuid == uuid and ds.invalid_name is None and ds.available:
                return DatasetSource(self, ds)
        return None

    def keys(self) -> List[str]:
        """The resource keys this answers for."""
        return sorted({DATASET_PREFIX + d.uuid for d in self._all if d.available and d.invalid_name is None})

    def serve(self, resources: Any) -> Any:
        """Answers for these datasets in ``resources`` (a node's): received data handles then
        bind here (spec §8.5)."""
        resources.add_resolver(self)
        return self


class Catalog(_Lookups):
    """A loaded catalog: datasets by name and uuid, opened as lazy handles."""

    def __init__(self, handle: Any, cache: Cache):
        super().__init__(handle, cache)
        self.file = Path(handle.files()[0])
        self.datasets: List[DataSet] = self._all

    @classmethod
    def load(cls, file: Any, cache: Optional[Cache] = None) -> "Catalog":
        """Reads and checks a catalog file; reads of its object-store datasets go through
        ``cache`` (default: :class:`Cache`'s default folder)."""
        cache = cache or Cache()
        return cls(native.DataCatalogs.load(str(file), cache._cache), cache)

    @classmethod
    def parse(cls, text: str, file: Any, cache: Optional[Cache] = None) -> "Catalog":
        """Parses catalog text as if read from ``file`` (whose folder is ``@__DIR__``)."""
        cache = cache or Cache()
        return cls(native.DataCatalogs.parse(text, str(Path(file).absolute()), cache._cache), cache)

    def find(self, key: str) -> Optional[DataSet]:
        """The dataset with this name or uuid, ``None`` if none has it; a shared key raises
        :class:`Ambiguous`, a dataset whose name breaks the rule :class:`InvalidName`."""
        info = self._handle.find(key)
        return None if info is None else DataSet(info)

    def __repr__(self) -> str:
        return f"Catalog({str(self.file)!r}, {len(self.datasets)} datasets)"


@dataclass
class StackEntry:
    """One dataset of a stack, the catalog file it comes from, and the catalog whose dataset of
    the same name a lookup finds first when that is another one."""

    catalog: Path
    dataset: DataSet
    shadowed_by: Optional[Path] = None


class CatalogStack(_Lookups):
    """Catalogs searched in order (the first is searched first), as DataSets.jl's stack of
    ``JULIA_DATASETS_PATH``: a spec is looked up in the first catalog that has its name."""

    def __init__(self, handle: Any, cache: Cache):
        super().__init__(handle, cache)
        self.catalogs: List[Catalog] = [Catalog(c, cache) for c in handle.each()]

    @classmethod
    def load(cls, paths: Iterable[Any], cache: Optional[Cache] = None) -> "CatalogStack":
        """Loads each catalog file (or folder holding a ``Data.toml``) in order, all with ``cache``."""
        cache = cache or Cache()
        return cls(native.DataCatalogs.stack([str(p) for p in paths], cache._cache), cache)

    @classmethod
    def from_list(cls, value: str, cache: Optional[Cache] = None) -> "CatalogStack":
        """The stack a ``:``-separated list names (as ``$HANDOFF_CATALOG`` gives it)."""
        return cls.load(paths_of(value), cache)

    def locate(self, spec: str) -> Tuple[Catalog, Selection]:
        """The first catalog that has the spec's name or uuid, and what it found."""
        index, found = self._handle.locate(spec)
        return self.catalogs[index], _selection(found)

    def entries(self) -> List[StackEntry]:
        """Every dataset of every catalog in search order, each with the catalog that shadows
        it, if one does."""
        return [
            StackEntry(Path(file), DataSet(info), None if by is None else Path(by))
            for file, info, by in self._handle.entries()
        ]

    def __repr__(self) -> str:
        return f"CatalogStack({[str(c.file) for c in self.catalogs]!r})"

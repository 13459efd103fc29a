"""Catalogs: DataSets.jl's ``Data.toml`` (``data_config_version`` 0 or 1), read as it is, with
the same drivers and the same meaning of urls and options as the Rust reference.

- ``FileSystem``: a local ``path`` (``@__DIR__`` is the catalog's folder), read in place;
- ``TomlDataStorage``: the bytes in the catalog, base64 (:mod:`handoff.datasets.embedded`);
- ``ObjectStore`` (handoff's): a ``url`` and ``[datasets.storage.options]``
  (:mod:`handoff.datasets.stores`).

``type`` is ``Blob`` or ``BlobTree`` (or the newer ``File`` and ``FileTree``). A dataset
whose driver handoff does not have does not stop the catalog from loading: it is listed,
and opening it says which drivers exist. Datasets may share a name or a uuid, as
DataSets.jl allows; a lookup by a shared one is refused, naming the datasets. A dataset whose
name breaks DataSets.jl's rule (:mod:`handoff.datasets.names`) is listed too, and opening it
says why it cannot be.

Lookups take DataSets.jl's specs, ``name[?query][#fragment]`` (:mod:`handoff.datasets.spec`):
``a_tree_example#1.csv`` is the file ``1.csv`` of the tree ``a_tree_example``. A stack of
catalogs searched in order is a :class:`handoff.datasets.stack.CatalogStack`.

A node serves its catalog with :meth:`Catalog.serve`: a data handle it receives (spec
§8.5) then binds to the dataset of the same uuid and reads it itself, else falls back on
the sender's bytes with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ..data import DATASET_PREFIX, BlobError, BlobTag
from . import embedded, paths
from .blob import Blob, BlobTree, DatasetSource
from .cache import Cache
from .dataset import DataSet
from .names import check_name
from .selection import Selection
from .spec import InvalidSpec, parse_spec
from .stores import Source, local, open_url

import tomllib

__all__ = [
    "Catalog",
    "DataSet",
    "CatalogError",
    "DRIVERS",
    "DriverUnavailable",
    "Ambiguous",
    "NoSuchDataset",
    "InvalidName",
    "InvalidSpec",
    "NoSuchPath",
    "open_selected",
]

#: The storage drivers this peer reads (``driver = ...``), as in the Rust reference.
DRIVERS = ("FileSystem", "TomlDataStorage", "ObjectStore")

_KINDS = {"Blob": "Blob", "File": "Blob", "BlobTree": "BlobTree", "FileTree": "BlobTree"}


class CatalogError(BlobError):
    """A problem in a catalog file: it names the file and, where there is one, the dataset."""


class NoSuchDataset(CatalogError):
    """No dataset has the name or uuid asked for."""


class Ambiguous(CatalogError):
    """Several datasets have the name or uuid asked for."""


class DriverUnavailable(CatalogError):
    """The dataset's storage driver is not one this peer has."""


class InvalidName(CatalogError):
    """The dataset's name breaks DataSets.jl's rule: it is listed, and cannot be opened."""


class NoSuchPath(CatalogError):
    """A spec's fragment names no file or folder of the tree (or a fragment was given for a Blob)."""


def _check_uuid(s: str) -> Optional[str]:
    if len(s) != 36:
        return None
    for i, c in enumerate(s):
        if i in (8, 13, 18, 23):
            if c != "-":
                return None
        elif c not in "0123456789abcdefABCDEF":
            return None
    return s.lower()


def _expand_dir(raw: str, folder: Path) -> Path:
    if raw.startswith("@__DIR__"):
        p = folder / raw[len("@__DIR__") :].lstrip("/\\")
    else:
        p = Path(raw)
    return p if p.is_absolute() else folder / p


class Catalog:
    """A loaded catalog: datasets by name and uuid, opened as lazy handles."""

    def __init__(self, file: Path, datasets: List[DataSet], cache: Optional[Cache] = None):
        self.file = file
        self.datasets = datasets
        #: The cache that object-store reads go through (``None``: straight to storage).
        self.cache = cache

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, file: Any, cache: Optional[Cache] = None) -> "Catalog":
        """Reads and checks a catalog file; reads of its object-store datasets go through
        ``cache`` (spec/CACHE.md, shared with other processes of either language)."""
        path = Path(file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise CatalogError(f"cannot read catalog {path}: {e.strerror or e}") from None
        return cls.parse(text, path, cache)

    @classmethod
    def parse(cls, text: str, file: Any, cache: Optional[Cache] = None) -> "Catalog":
        """Parses catalog text as if read from ``file`` (whose folder is ``@__DIR__``)."""
        path = Path(file).absolute()
        try:
            root = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise CatalogError(f"catalog {path} is not valid TOML: {e}") from None
        # Version 0 (DataSets.jl <= 0.2.3) has the structure of version 1, which added '/' in names
        # and [[drivers]]: DataSets.jl reads both with one parser, and so does handoff.
        version = root.get("data_config_version")
        # An integer: 1.0 is a float in TOML, which the Rust reference refuses too.
        if type(version) is not int or version not in (0, 1):
            found = "missing" if version is None else _toml_repr(version)
            raise CatalogError(
                f"catalog {path}: data_config_version is {found}; handoff reads DataSets.jl catalogs of versions 0 and 1"
            )
        entries = root.get("datasets", [])
        if not isinstance(entries, list):
            raise CatalogError(f"catalog {path}, dataset (catalog): datasets must be an array of tables ([[datasets]])")
        return cls(path, [_parse_dataset(path, i, e) for i, e in enumerate(entries)], cache)

    # ------------------------------------------------------------------ lookups

    def _only(self, key: str, matches) -> Optional[DataSet]:
        found = [d for d in self.datasets if matches(d)]
        if len(found) > 1:
            names = ", ".join(f"{d.name} ({d.uuid})" for d in found)
            raise Ambiguous(
                f"catalog {self.file}: {key!r} names several datasets: {names}; use a name or uuid that only one has"
            )
        return found[0] if found else None

    def find(self, key: str) -> Optional[DataSet]:
        """The dataset with this name or uuid, ``None`` if none has it; a shared key raises
        :class:`Ambiguous`, a dataset whose name breaks the rule :class:`InvalidName`."""
        lower = key.lower()
        ds = self._only(key, lambda d: d.name == key or d.uuid == lower)
        if ds is not None:
            self._openable(ds)
        return ds

    def _openable(self, ds: DataSet) -> DataSet:
        if ds.invalid_name is not None:
            raise InvalidName(
                f"catalog {self.file}: dataset {_quote(ds.name)} ({ds.uuid}) cannot be opened: {ds.invalid_name}"
            )
        return ds

    def dataset(self, spec: str) -> Selection:
        """The dataset a spec (``name[?query][#fragment]``) names by its name or uuid, with the
        spec's query and fragment (:class:`~handoff.datasets.selection.Selection`)."""
        parsed = parse_spec(spec)
        ds = self.find(parsed.name)
        if ds is None:
            known = ", ".join(d.name for d in self.datasets) or "no datasets"
            raise NoSuchDataset(f"catalog {self.file}: no dataset named or with uuid {parsed.name!r}; it has: {known}")
        return Selection(ds, parsed)

    def _available(self, ds: DataSet) -> DataSet:
        if not ds.available:
            raise DriverUnavailable(
                f"catalog {self.file}, dataset {ds.name}: its storage driver {ds.driver!r} is not available here; "
                f"this peer reads: {', '.join(DRIVERS)}"
            )
        return ds

    def _kind(self, ds: DataSet, wanted: str) -> None:
        if ds.kind != wanted:
            raise CatalogError(f"dataset {ds.name} is a {ds.kind}, not a {wanted}")

    def blob(self, spec: str) -> Blob:
        """A lazy handle to a ``Blob`` dataset, or (with a fragment) to a file of a ``BlobTree``
        dataset; nothing is read yet (:meth:`open` checks that the file exists)."""
        sel = self.dataset(spec)
        ds = self._available(sel.dataset)
        if ds.kind == "Blob":
            if sel.fragment is not None:
                raise _fragment_of_blob(ds, sel.fragment)
            return Blob(ds, cache=self.cache)
        if sel.fragment is None:
            self._kind(ds, "Blob")
        return BlobTree(ds, cache=self.cache).blob(sel.fragment)

    def tree(self, spec: str) -> BlobTree:
        """A lazy handle to a ``BlobTree`` dataset, or (with a fragment) to a folder of it."""
        sel = self.dataset(spec)
        ds = self._available(sel.dataset)
        self._kind(ds, "BlobTree")
        root = BlobTree(ds, cache=self.cache)
        return root if sel.fragment is None else root.tree(sel.fragment)

    async def open(self, spec: str):
        """What DataSets.jl's ``open(dataset(project, spec))`` gives: the :class:`Blob` or the
        :class:`BlobTree` the spec names; a fragment selects a file or a folder of a tree, and
        one that names neither fails, naming it."""
        sel = self.dataset(spec)
        return await open_selected(self._available(sel.dataset), sel.fragment, self.cache)

    def open_tag(self, tag: BlobTag) -> Blob:
        """Binds a tag received from another node to this catalog: the dataset of its uuid,
        the path checked; the size and digest it carries are checked on reading."""
        lower = tag.dataset.lower()
        ds = self._only(tag.dataset, lambda d: d.uuid == lower)
        if ds is None:
            raise NoSuchDataset(
                f"tag names dataset {tag.dataset} ({tag.name or 'no name given'}) but catalog {self.file} has no "
                "such uuid; add it to the catalog (same uuid) or fetch the bytes from the sender"
            )
        self._openable(ds)
        self._available(ds)
        if not tag.path:
            self._kind(ds, "Blob")
            return Blob(ds, "", tag, self.cache)
        self._kind(ds, "BlobTree")
        rel = paths.normalize(ds.name, tag.path)
        if ds.source.local is not None:
            paths.check_local_symlinks(ds.name, ds.source.local, rel)
        return Blob(ds, rel, tag, self.cache)

    # ------------------------------------------------------------------ serving

    def resolve(self, key: str) -> Optional[DatasetSource]:
        """The local source for a dataset resource key (``dataset:<uuid>``), or ``None``."""
        if not key.startswith(DATASET_PREFIX):
            return None
        uuid = key[len(DATASET_PREFIX) :]
        ds = self._only(uuid, lambda d: d.uuid == uuid)
        if ds is None or ds.invalid_name is not None:
            return None
        return DatasetSource(self, self._available(ds))

    def keys(self) -> List[str]:
        """The resource keys this catalog answers for."""
        return sorted({DATASET_PREFIX + d.uuid for d in self.datasets if d.available and d.invalid_name is None})

    def serve(self, resources) -> "Catalog":
        """Answers for this catalog's datasets in ``resources`` (a node's): received data
        handles then bind here (spec §8.5)."""
        resources.add_resolver(self)
        return self

    def __repr__(self) -> str:
        return f"Catalog({str(self.file)!r}, {len(self.datasets)} datasets)"


def _field(file: Path, label: str, name: str, problem: str) -> CatalogError:
    return CatalogError(f"catalog {file}, dataset {label}: {name} {problem}")


def _string(file: Path, label: str, table: dict, key: str, prefix: str = "") -> str:
    v = table.get(key)
    if v is None:
        raise _field(file, label, prefix + key, "is missing")
    if not isinstance(v, str):
        raise _field(file, label, prefix + key, "must be a string")
    if not v:
        raise _field(file, label, prefix + key, "is empty")
    return v


def _parse_dataset(file: Path, index: int, entry: Any) -> DataSet:
    position = f"#{index + 1}"
    if not isinstance(entry, dict):
        raise _field(file, position, "[[datasets]]", "must be a table")
    name = _string(file, position, entry, "name")
    label = f"{position} ({name})"
    raw_uuid = _string(file, label, entry, "uuid")
    uuid = _check_uuid(raw_uuid)
    if uuid is None:
        raise _field(file, label, "uuid", f"{raw_uuid!r} is not a uuid (like b498f769-a7f6-4f67-8d74-40b770398f26)")
    description = entry.get("description")
    if description is not None and not isinstance(description, str):
        raise _field(file, label, "description", "must be a string")
    storage = entry.get("storage")
    if storage is None:
        raise _field(file, label, "storage", "is missing: add a [datasets.storage] table")
    if not isinstance(storage, dict):
        raise _field(file, label, "storage", "must be a table ([datasets.storage])")
    type_name = _string(file, label, storage, "type", "storage.")
    kind = _KINDS.get(type_name)
    if kind is None:
        raise _field(file, label, "storage.type", f'is {type_name!r}; use "Blob" or "BlobTree"')
    driver = _string(file, label, storage, "driver", "storage.")
    source: Optional[Source] = None
    try:
        if driver == "FileSystem":
            source = local(_expand_dir(_string(file, label, storage, "path", "storage."), file.parent))
        elif driver == "TomlDataStorage":
            try:
                content = embedded.parse(kind, storage.get("data"))
            except ValueError as e:
                raise _field(file, label, "storage.data", str(e)) from None
            source = _embedded_source(content)
        elif driver == "ObjectStore":
            url = _string(file, label, storage, "url", "storage.")
            options = storage.get("options", {})
            if not isinstance(options, dict):
                raise _field(file, label, "storage.options", "must be a table")
            opts: Dict[str, str] = {}
            for k, v in options.items():
                if isinstance(v, bool):
                    opts[k] = "true" if v else "false"
                elif isinstance(v, (str, int, float)):
                    opts[k] = str(v)
                else:
                    raise _field(file, label, f"storage.options.{k}", "must be a string, number or boolean")
            try:
                source = open_url(url, opts)
            except ValueError as e:
                raise CatalogError(f"catalog {file}, dataset {label}: cannot configure storage {url}: {e}") from None
    except CatalogError:
        raise
    return DataSet(name, uuid, description, kind, driver, storage, source, check_name(name))


def _quote(s: str) -> str:
    import json

    return json.dumps(s, ensure_ascii=False)


def _toml_repr(v: Any) -> str:
    """A value as TOML writes it (as the Rust reference names a bad version)."""
    return _quote(v) if isinstance(v, str) else str(v)


def _fragment_of_blob(ds: DataSet, fragment: str) -> NoSuchPath:
    return NoSuchPath(f"dataset {ds.name} is a Blob: a fragment (#{fragment}) selects a path only inside a BlobTree")


async def open_selected(ds: DataSet, fragment: Optional[str], cache: Optional[Cache]):
    """Opens a selected dataset: the whole of it, or what the fragment names in a tree."""
    if ds.kind == "Blob":
        if fragment is not None:
            raise _fragment_of_blob(ds, fragment)
        return Blob(ds, cache=cache)
    root = BlobTree(ds, cache=cache)
    if fragment is None:
        return root
    rel = root._rel(fragment)
    if not rel:
        return root
    kind = await ds.source.kind_of(ds.name, rel)
    if kind == "Blob":
        return Blob(ds, rel, cache=cache)
    if kind == "BlobTree":
        return BlobTree(ds, rel, cache)
    names = await ds.source.top_level(ds.name)
    raise NoSuchPath(
        f"dataset {ds.name}: the fragment {_quote(fragment)} is no file or folder of the tree; its top level has: "
        f"{', '.join(names) or 'nothing'}"
    )


def _embedded_source(content: embedded.Content) -> Source:
    import obstore
    from obstore.store import MemoryStore

    store = MemoryStore()
    if isinstance(content, bytes):
        obstore.put(store, "blob", content)
        root = "blob"
    else:
        for path, data in content.items():
            obstore.put(store, f"tree/{path}", data)
        root = "tree"
    return Source(embedded.identity(content), store=store, root=root)

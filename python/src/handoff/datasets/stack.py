"""A stack of catalogs searched in order, as DataSets.jl's ``StackedDataProject`` that Julia
builds from ``JULIA_DATASETS_PATH``; the same rules as the Rust reference
(``handoff_data::stack``).

A name (or uuid) is looked up in each catalog in turn and the first catalog that has it
answers: a dataset of that name further down is *shadowed*. What that catalog says is final (a
name its datasets share is refused there as ambiguous).

A path list (``$HANDOFF_CATALOG``) is ``:``-separated: each entry a ``Data.toml`` or a folder
holding one, ``~`` the home folder; ``@`` is the active Julia project (the ``Data.toml`` beside
``$JULIA_PROJECT``, skipped when unset) and an empty entry ``~/.julia/datasets/Data.toml``
(skipped when absent). Any other entry must exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

from ..data import BlobTag
from .blob import Blob, BlobTree, DatasetSource
from .cache import Cache
from .catalog import Catalog, NoSuchDataset, open_selected
from .dataset import DataSet
from .selection import Selection
from .spec import parse_spec

__all__ = ["CatalogStack", "StackEntry", "paths_of"]


def paths_of(value: str) -> List[Path]:
    """The catalog files a ``:``-separated list names (see the module's docs)."""
    home = Path(os.environ["HOME"]) if "HOME" in os.environ else None
    out: List[Path] = []
    for entry in value.split(":"):
        if entry == "":
            if home is not None and (home / ".julia/datasets/Data.toml").exists():
                out.append(home / ".julia/datasets/Data.toml")
        elif entry == "@":
            project = os.environ.get("JULIA_PROJECT")
            if project:
                p = Path(project)
                out.append((p if p.is_dir() else p.parent) / "Data.toml")
        elif home is not None and (entry == "~" or entry.startswith("~/")):
            out.append(home / entry[2:])
        else:
            out.append(Path(entry))
    return out


@dataclass
class StackEntry:
    """One dataset of a stack, the catalog file it comes from, and the catalog whose dataset of
    the same name a lookup finds first when that is another one."""

    catalog: Path
    dataset: DataSet
    shadowed_by: Optional[Path] = None


class CatalogStack:
    """Catalogs searched in order (the first is searched first)."""

    def __init__(self, catalogs: Iterable[Catalog]):
        self.catalogs: List[Catalog] = list(catalogs)

    @classmethod
    def load(cls, paths: Iterable[Any], cache: Optional[Cache] = None) -> "CatalogStack":
        """Loads each catalog file (or folder holding a ``Data.toml``), in order, with ``cache``."""
        catalogs = []
        for p in paths:
            p = Path(p)
            catalogs.append(Catalog.load(p / "Data.toml" if p.is_dir() else p, cache))
        return cls(catalogs)

    @classmethod
    def from_list(cls, value: str, cache: Optional[Cache] = None) -> "CatalogStack":
        """Loads the catalogs a ``:``-separated list (``$HANDOFF_CATALOG``) names."""
        paths = paths_of(value)
        if not paths:
            raise NoSuchDataset(f"the catalog list {value!r} names no catalog file")
        return cls.load(paths, cache)

    def locate(self, spec: str) -> Tuple[Catalog, Selection]:
        """The first catalog that has the spec's name or uuid, and what it found."""
        parsed = parse_spec(spec)
        for catalog in self.catalogs:
            ds = catalog.find(parsed.name)
            if ds is not None:
                return catalog, Selection(ds, parsed)
        files = ":".join(str(c.file) for c in self.catalogs) or "(no catalogs)"
        names: List[str] = []
        for c in self.catalogs:
            names += [d.name for d in c.datasets if d.name not in names]
        raise NoSuchDataset(
            f"no dataset named or with uuid {parsed.name!r} in the catalogs {files}; they have: "
            f"{', '.join(names) or 'no datasets'}"
        )

    def dataset(self, spec: str) -> Selection:
        """The dataset a spec names (DataSets.jl's ``dataset(stack, spec)``)."""
        return self.locate(spec)[1]

    def blob(self, spec: str) -> Blob:
        """A lazy :class:`Blob` (see :meth:`Catalog.blob`) from the first catalog that has the name."""
        return self.locate(spec)[0].blob(spec)

    def tree(self, spec: str) -> BlobTree:
        """A lazy :class:`BlobTree` (see :meth:`Catalog.tree`) from the first catalog that has the name."""
        return self.locate(spec)[0].tree(spec)

    async def open(self, spec: str):
        """What a spec opens to (see :meth:`Catalog.open`), from the first catalog that has the name."""
        catalog, sel = self.locate(spec)
        return await open_selected(catalog._available(sel.dataset), sel.fragment, catalog.cache)

    def open_tag(self, tag: BlobTag) -> Blob:
        """Binds a received tag to the first catalog that has its dataset's uuid."""
        lower = tag.dataset.lower()
        for catalog in self.catalogs:
            if any(d.uuid == lower for d in catalog.datasets):
                return catalog.open_tag(tag)
        files = ":".join(str(c.file) for c in self.catalogs)
        raise NoSuchDataset(
            f"tag names dataset {tag.dataset} ({tag.name or 'no name given'}) but catalogs {files} have no such "
            "uuid; add it to a catalog (same uuid) or fetch the bytes from the sender"
        )

    def resolve(self, key: str) -> Optional[DatasetSource]:
        """The local source for a dataset resource key, from the first catalog that has it."""
        for catalog in self.catalogs:
            found = catalog.resolve(key)
            if found is not None:
                return found
        return None

    def keys(self) -> List[str]:
        """The resource keys the catalogs answer for."""
        return sorted({k for c in self.catalogs for k in c.keys()})

    def serve(self, resources) -> "CatalogStack":
        """Answers for the stack's datasets in ``resources`` (a node's), the first catalog first."""
        resources.add_resolver(self)
        return self

    def entries(self) -> List[StackEntry]:
        """Every dataset of every catalog in search order, each with the catalog that shadows it."""
        first: dict = {}
        out = []
        for c in self.catalogs:
            for d in c.datasets:
                owner = first.setdefault(d.name, c.file)
                out.append(StackEntry(c.file, d, owner if owner != c.file else None))
        return out

    @property
    def cache(self) -> Optional[Cache]:
        """The first catalog's cache (a stack opened with :meth:`load` shares one)."""
        return self.catalogs[0].cache if self.catalogs else None

    def __repr__(self) -> str:
        return f"CatalogStack({[str(c.file) for c in self.catalogs]!r})"

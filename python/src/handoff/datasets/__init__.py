"""Datasets in the Python peer: DataSets.jl catalogs (``Data.toml``) with the drivers and
url meanings of the Rust reference, lazy :class:`Blob` / :class:`BlobTree` handles, and the
binding of received data handles to this node's own storage (spec §8.5)::

    from handoff.datasets import Catalog

    catalog = Catalog.load("Data.toml", Cache("/var/cache/handoff")).serve(node.resources)
    blob = catalog.blob("a_text_file")        # lazy: nothing read yet
    head = await blob.read_range(0, 16)
    csv = await catalog.open("a_tree_example#1.csv")   # DataSets.jl's specs: a file of a tree

A stack of catalogs searched in order (Julia's ``JULIA_DATASETS_PATH``) is a
:class:`CatalogStack`.

Object stores go through ``obstore`` (the Python binding of the ``object_store`` crate the
Rust reference uses): install the extra ``handoff[data]``.
"""

from .blob import Blob, BlobTree, DatasetSource
from .cache import Cache, CachedFile
from .catalog import (
    DRIVERS,
    Ambiguous,
    Catalog,
    CatalogError,
    DataSet,
    DriverUnavailable,
    InvalidName,
    NoSuchDataset,
    NoSuchPath,
)
from .names import NAME_RULE, check_name
from .paths import BadPath
from .selection import Selection
from .spec import DataSpec, InvalidSpec, parse_spec
from .stack import CatalogStack, StackEntry
from .stores import Entry, StorageError

__all__ = [
    "Ambiguous",
    "BadPath",
    "Blob",
    "BlobTree",
    "Cache",
    "CachedFile",
    "Catalog",
    "CatalogError",
    "CatalogStack",
    "DataSpec",
    "DataSet",
    "DatasetSource",
    "DRIVERS",
    "DriverUnavailable",
    "Entry",
    "InvalidName",
    "InvalidSpec",
    "NAME_RULE",
    "NoSuchDataset",
    "NoSuchPath",
    "Selection",
    "StackEntry",
    "StorageError",
    "check_name",
    "parse_spec",
]

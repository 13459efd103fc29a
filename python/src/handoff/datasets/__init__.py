"""Datasets in the Python peer: DataSets.jl catalogs (``Data.toml``), lazy :class:`Blob` /
:class:`BlobTree` handles, the shared cache, and the binding of received data handles to this
node's own storage (spec §8.5)::

    from handoff.datasets import Cache, Catalog

    catalog = Catalog.load("Data.toml", Cache("/var/cache/handoff")).serve(node.resources)
    blob = catalog.blob("a_text_file")        # lazy: nothing read yet
    head = await blob.read_range(0, 16)
    csv = await catalog.open("a_tree_example#1.csv")   # DataSets.jl's specs: a file of a tree

A stack of catalogs searched in order (Julia's ``JULIA_DATASETS_PATH``) is a
:class:`CatalogStack`.

All of it runs on ``handoff-data`` through the extension: the Rust CLI's implementation of
catalogs, specs, names, stores (``object_store``: S3, HTTP, ...) and the cache, so that the
two languages cannot disagree on a catalog. Its reads are awaited from asyncio.
"""

from .catalog import (
    DRIVERS,
    NAME_RULE,
    Cache,
    Catalog,
    CatalogStack,
    DataSpec,
    Selection,
    StackEntry,
    check_name,
    parse_spec,
    paths_of,
)
from .errors import (
    Ambiguous,
    BadPath,
    CatalogError,
    DriverUnavailable,
    InvalidName,
    InvalidSpec,
    NoSuchDataset,
    NoSuchPath,
    StorageError,
)
from .handles import Blob, BlobTree, DataSet, DatasetSource, Entry, Storage

__all__ = [
    "Ambiguous",
    "BadPath",
    "Blob",
    "BlobTree",
    "Cache",
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
    "Storage",
    "StorageError",
    "check_name",
    "parse_spec",
    "paths_of",
]

"""Datasets in the Python peer: DataSets.jl catalogs (``Data.toml``) with the drivers and
url meanings of the Rust reference, lazy :class:`Blob` / :class:`BlobTree` handles, and the
binding of received data handles to this node's own storage (spec §8.5)::

    from handoff.datasets import Catalog

    catalog = Catalog.load("Data.toml", Cache("/var/cache/handoff")).serve(node.resources)
    blob = catalog.blob("a_text_file")        # lazy: nothing read yet
    head = await blob.read_range(0, 16)

Object stores go through ``obstore`` (the Python binding of the ``object_store`` crate the
Rust reference uses): install the extra ``handoff[data]``.
"""

from .blob import Blob, BlobTree, DatasetSource
from .cache import Cache, CachedFile
from .catalog import DRIVERS, Ambiguous, Catalog, CatalogError, DataSet, DriverUnavailable, NoSuchDataset
from .paths import BadPath
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
    "DataSet",
    "DatasetSource",
    "DRIVERS",
    "DriverUnavailable",
    "Entry",
    "NoSuchDataset",
    "StorageError",
]

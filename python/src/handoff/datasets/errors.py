"""The exceptions of :mod:`handoff.datasets`. Each error of the Rust data layer
(``handoff-data``, which the extension runs) arrives as one of them, with its words."""

from __future__ import annotations

from ..data import BlobError, BlobRangeError
from .native import native

__all__ = [
    "Ambiguous",
    "BadPath",
    "CatalogError",
    "DriverUnavailable",
    "InvalidName",
    "InvalidSpec",
    "NoSuchDataset",
    "NoSuchPath",
    "StorageError",
]


class CatalogError(BlobError):
    """A catalog cannot be read, or a lookup in it fails (it names the file and the dataset)."""


class NoSuchDataset(CatalogError):
    """No dataset has the name or uuid asked for (or a received tag's uuid)."""


class Ambiguous(CatalogError):
    """Several datasets share the name or uuid asked for."""


class DriverUnavailable(CatalogError):
    """The dataset's storage driver is not one this build reads."""


class InvalidName(CatalogError):
    """The dataset's name breaks DataSets.jl's rule: it is listed and cannot be opened."""


class NoSuchPath(CatalogError):
    """A spec's fragment names no file or folder of the tree (or selects in a Blob)."""


class BadPath(BlobError):
    """A path that leaves the tree, is absolute, or names nothing a tree can hold."""


class InvalidSpec(BlobError, ValueError):
    """A string that is not a DataSets.jl spec, ``name[?query][#fragment]``."""


class StorageError(BlobError):
    """A storage request, or the cache's file system, failed (it names the dataset, store and path)."""


_KINDS = {
    "catalog": CatalogError,
    "ambiguous": Ambiguous,
    "driver-unavailable": DriverUnavailable,
    "invalid-spec": InvalidSpec,
    "invalid-name": InvalidName,
    "no-such-path": NoSuchPath,
    "no-such-dataset": NoSuchDataset,
    "bad-path": BadPath,
    "range": BlobRangeError,
    "storage": StorageError,
    "blob": BlobError,
}


def _exception(kind: str, message: str) -> BaseException:
    return _KINDS.get(kind, BlobError)(message)


native.data_set_errors(_exception)

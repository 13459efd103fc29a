"""What a dataset spec selects (:class:`Selection`): the dataset with the spec's query and
fragment, as DataSets.jl's ``dataset(project, spec)`` adds its ``dataspec``."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .dataset import DataSet
from .spec import DataSpec

__all__ = ["Selection"]


class Selection:
    """A dataset found by a spec, with the spec's query and fragment; its other attributes
    (``name``, ``uuid``, ``kind``, ...) are the dataset's."""

    __slots__ = ("dataset", "spec")

    def __init__(self, dataset: DataSet, spec: DataSpec):
        self.dataset = dataset
        self.spec = spec

    @property
    def query(self) -> Optional[Dict[str, str]]:
        """The spec's query, decoded (``None`` without ``?``)."""
        return self.spec.query

    @property
    def fragment(self) -> Optional[str]:
        """The spec's fragment, decoded (``None`` without ``#``)."""
        return self.spec.fragment

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"Selection({self.dataset.name!r}, query={self.query!r}, fragment={self.fragment!r})"

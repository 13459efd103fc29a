"""One dataset of a catalog (:class:`DataSet`): its entry as written, and its opened storage.

The bottom of :mod:`handoff.datasets`: the handles (:mod:`handoff.datasets.blob`) read a
dataset, the catalog (:mod:`handoff.datasets.catalog`) parses and opens them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .stores import Source

__all__ = ["DataSet"]


@dataclass
class DataSet:
    """One dataset of a catalog, as written, and its opened storage."""

    name: str
    uuid: str
    description: Optional[str]
    kind: str  # "Blob" or "BlobTree"
    driver: str
    #: ``[datasets.storage]`` as written (keys handoff does not use included).
    storage: Dict[str, Any]
    #: The opened storage; ``None`` when the driver is not available here.
    source: Optional[Source] = field(repr=False, default=None)
    #: Why the name breaks DataSets.jl's rule (:mod:`handoff.datasets.names`), if it does: such
    #: a dataset is listed and cannot be opened.
    invalid_name: Optional[str] = None

    @property
    def available(self) -> bool:
        """Whether this peer can read it (its driver is one of :data:`handoff.datasets.catalog.DRIVERS`)."""
        return self.source is not None

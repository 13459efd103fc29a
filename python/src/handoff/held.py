"""Memory held for reuse by a node implementation other than the engine.

The engine's own (its segment pool, mappings and warm receive buffers) is read through the
extension (:mod:`handoff.dask.memory`). Another implementation, such as the pure-Python
reference ``handoff_pure`` (tests only), puts its own :class:`Holder` in :data:`holder`
when it is imported, so that :mod:`handoff.dask.memory` counts what it holds and gives it
back without importing it.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Holder", "holder"]


class Holder:
    """What an implementation holds for reuse (this one: nothing). ``held()`` returns bytes
    by kind (keys of :func:`handoff.dask.memory.shared_bytes`), ``give_back()`` frees them
    (from any thread); ``pool_stats()`` is its own pool of segments to send from, if it has
    one (as ``handoff._native.segment_pool_stats`` says it), and ``configure_pool(idle_bytes,
    idle_seconds)`` bounds that pool (``None`` leaving one as it is)."""

    def held(self) -> dict:
        return {}

    def give_back(self) -> None:
        pass

    def pool_stats(self) -> Optional[dict]:
        return None

    def configure_pool(self, idle_bytes: Optional[int], idle_seconds: Optional[float]) -> None:
        pass


#: The implementation other than the engine whose memory is counted (none by default).
holder = Holder()

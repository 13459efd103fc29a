"""Memory held only for reuse by implementations that register it.

The engine's own (its segment pool, mappings and warm receive buffers) is read through
the extension (:mod:`handoff.dask.memory`); an implementation above this package, such
as the pure-Python reference ``handoff_pure``, registers what it holds here when it is
imported, so that :mod:`handoff.dask.memory` counts it and gives it back without
importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["Holder", "register", "held", "give_back", "configure_pools", "pool_stats"]


@dataclass(frozen=True)
class Holder:
    """What one implementation holds for reuse: ``held()`` returns bytes by kind (keys of
    :func:`handoff.dask.memory.shared_bytes`) and ``give_back()`` frees them (from any
    thread). How much an implementation keeps is each node's setting (``Node(kept_map_bytes=...)``)."""

    held: Callable[[], dict]
    give_back: Callable[[], None]
    #: Its pool of segments to send from, if it has its own: what it holds (as
    #: ``handoff._native.segment_pool_stats`` says it), and how it is bounded
    #: (``configure_pool(idle_bytes, idle_seconds)``, ``None`` leaving one as it is).
    pool_stats: Optional[Callable[[], dict]] = None
    configure_pool: Optional[Callable[[Optional[int], Optional[float]], None]] = None


_holders: list = []


def register(holder: Holder) -> None:
    """Counts ``holder`` from now on (once per process; a second registration is ignored)."""
    if holder not in _holders:
        _holders.append(holder)


def held() -> dict:
    """The bytes every registered implementation holds, summed by kind."""
    total: dict = {}
    for holder in _holders:
        for key, n in holder.held().items():
            total[key] = total.get(key, 0) + n
    return total


def give_back() -> None:
    """Frees what every registered implementation holds only for reuse."""
    for holder in _holders:
        holder.give_back()


def pool_stats() -> Optional[dict]:
    """The segment pool of the first registered implementation that has one, else ``None``."""
    for holder in _holders:
        if holder.pool_stats is not None:
            return holder.pool_stats()
    return None


def configure_pools(idle_bytes: Optional[int], idle_seconds: Optional[float]) -> None:
    """Bounds the idle segments of every registered implementation's pool."""
    for holder in _holders:
        if holder.configure_pool is not None:
            holder.configure_pool(idle_bytes, idle_seconds)

"""Memory held only for reuse by implementations that register it, and its settings.

The engine's own (its segment pool, mappings and warm receive buffers) is read through
the extension (:mod:`handoff.dask.memory`); an implementation above this package, such
as the pure-Python reference ``handoff_pure``, registers what it holds here when it is
imported, so that :mod:`handoff.dask.memory` counts it and gives it back without
importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["Holder", "register", "held", "give_back", "keep_mappings"]


@dataclass(frozen=True)
class Holder:
    """What one implementation holds for reuse: ``held()`` returns bytes by kind (keys of
    :func:`handoff.dask.memory.shared_bytes`), ``give_back()`` frees them (from any
    thread), and ``keep(bytes, seconds)`` sets how much of received segments it keeps
    mapped for the next frame (``None``: leave as is)."""

    held: Callable[[], dict]
    give_back: Callable[[], None]
    keep: Optional[Callable[[Optional[int], Optional[float]], None]] = None


_holders: list = []
#: The last :func:`keep_mappings`, applied to holders registered after it.
_keep: tuple = (None, None)


def register(holder: Holder) -> None:
    """Counts ``holder`` from now on (once per process; a second registration is ignored),
    and applies the last :func:`keep_mappings` to it."""
    if holder not in _holders:
        _holders.append(holder)
        if holder.keep is not None and _keep != (None, None):
            holder.keep(*_keep)


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


def keep_mappings(n_bytes: Optional[int], seconds: Optional[float]) -> None:
    """How many bytes of received segments, and for how long, implementations that keep
    mappings for the next frame keep (the engine keeps none)."""
    global _keep
    _keep = (
        n_bytes if n_bytes is not None else _keep[0],
        seconds if seconds is not None else _keep[1],
    )
    for holder in _holders:
        if holder.keep is not None:
            holder.keep(n_bytes, seconds)

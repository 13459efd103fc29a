"""The reference's warnings about one peer, rate-limited (spec §9.1: 10 per 10 s, then a
count), in Python (the engine's are ``handoff.throttle``'s, on ``handoff_proto::log_limit``).

A peer that sends a flood of bad requests must not fill the node's log: each source
(a peer's name, or the address of a connection that has not finished its handshake)
gets ``limit`` warnings per ``period``, and all sources together ``total`` (100, as in the
Rust reference: a peer that opens many connections does not multiply its share); the rest
are counted and reported in one line when the period is over (at the next warning about
that source, or at :meth:`flush`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["WarningThrottle"]

#: Sources remembered at most (the oldest quiet ones are forgotten first).
_MAX_SOURCES = 4096


class WarningThrottle:
    def __init__(self, log: logging.Logger, limit: int = 10, period: float = 10.0, prefix: str = "", total: int = 100):
        self.log = log
        self.limit = limit
        self.period = period
        self.prefix = prefix
        self.total = total
        self._sources: dict = {}  # source -> [window start, logged, suppressed]
        self._all = [0.0, 0, 0]  # every source together: [window start, logged, suppressed]

    def warn(self, source: str, fmt: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Logs ``fmt % args`` unless ``source`` had its share this period; returns whether it logged."""
        now = time.monotonic()
        entry = self._sources.get(source)
        if entry is None or now - entry[0] >= self.period:
            if entry is not None:
                self._report(source, entry)
            if entry is None and len(self._sources) >= _MAX_SOURCES:
                self.flush(force=True)
            entry = self._sources[source] = [now, 0, 0]
        if entry[1] < self.limit and self._all_allow(now):
            entry[1] += 1
            self.log.log(level, self.prefix + fmt, *args)
            return True
        entry[2] += 1
        return False

    def _all_allow(self, now: float) -> bool:
        every = self._all
        if now - every[0] >= self.period:
            if every[2]:
                self.log.warning(
                    "%s%d more warnings in %.0f s were not logged (at most %d in all)",
                    self.prefix,
                    every[2],
                    self.period,
                    self.total,
                )
            self._all = every = [now, 0, 0]
        if every[1] < self.total:
            every[1] += 1
            return True
        every[2] += 1
        return False

    def _report(self, source: str, entry: list) -> None:
        if entry[2]:
            self.log.warning(
                "%s%d more warnings about %s in %.0f s were not logged", self.prefix, entry[2], source, self.period
            )
            entry[2] = 0

    def flush(self, force: bool = False) -> None:
        """Reports the counts of periods that are over, and forgets sources that went quiet."""
        now = time.monotonic()
        for source, entry in list(self._sources.items()):
            if force or now - entry[0] >= self.period:
                self._report(source, entry)
                del self._sources[source]

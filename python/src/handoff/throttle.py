"""Warnings about one peer, rate-limited (spec §9.1): ``limit`` per ``period`` about one
source (a peer's name, or the address of a connection that has not finished its
handshake), and ``total`` about all of them together, so that a peer that sends a flood of
bad requests cannot fill the node's log, nor one that opens many connections multiply its
share. The limits are the engine's (``handoff_proto::log_limit``, through
``handoff._native.LogLimits``), as the Rust node keeps them: what was kept quiet is counted,
and the next warning that gets through says how many.
"""

from __future__ import annotations

import logging
from typing import Any

from . import native

__all__ = ["WarningThrottle"]


class WarningThrottle:
    def __init__(self, log: logging.Logger, limit: int = 10, period: float = 10.0, prefix: str = "", total: int = 100):
        self.log = log
        self.prefix = prefix
        self._limits = native.required("the node's rate-limited warnings").LogLimits(limit, period, total)

    def warn(self, source: str, fmt: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Logs ``fmt % args`` unless ``source`` had its share this period (or all sources
        had theirs); returns whether it logged."""
        quiet = self._limits.allow(source)
        if quiet is None:
            return False
        if quiet:
            fmt, args = fmt + " (%d more warnings were not logged before this one)", (*args, quiet)
        self.log.log(level, self.prefix + fmt, *args)
        return True

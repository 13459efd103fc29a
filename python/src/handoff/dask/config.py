"""The ``distributed.comm.handoff`` section of Dask's configuration, and what a node is built from.

Its defaults (``handoff.yaml`` beside this module) are registered with
``dask.config.update_defaults`` when the backend is imported, the way Dask's extensions
register theirs, so ``dask.config.get("distributed.comm.handoff.secret")`` works in every
process that loads the backend. The secret is looked up in this order: ``secret``,
``secret-file``, the environment variable ``HANDOFF_SECRET``; none means the empty secret
(every node without one can connect).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import dask.config
import yaml
from dask.utils import parse_bytes

__all__ = ["Settings", "settings", "SECTION"]

SECTION = "distributed.comm.handoff"

with open(Path(__file__).with_name("handoff.yaml")) as _f:
    dask.config.update_defaults(yaml.safe_load(_f))


@dataclass(frozen=True)
class Settings:
    """What the nodes of this process are built with (read when a node is created)."""

    secret: bytes = b""
    host_id: Optional[str] = None
    shm: bool = True
    shm_threshold: int = 64 * 1024
    pool_idle_bytes: Optional[int] = None
    kept_map_bytes: Optional[int] = None


def _get(key: str, default=None):
    return dask.config.get(f"{SECTION}.{key}", default=default)


def _secret() -> bytes:
    value = _get("secret")
    if value not in (None, ""):
        return str(value).encode()
    path = _get("secret-file")
    if path:
        try:
            return Path(os.path.expanduser(str(path))).read_bytes().rstrip()
        except OSError as e:
            raise ValueError(f"cannot read {SECTION}.secret-file {path!r}: {e.strerror or e}") from None
    return os.environ.get("HANDOFF_SECRET", "").encode()


def settings() -> Settings:
    """The current settings, from ``distributed.comm.handoff`` (and the environment)."""
    threshold = _get("shm-threshold", "64KiB")
    idle = _get("pool-idle-bytes")
    kept = _get("kept-map-bytes")
    return Settings(
        secret=_secret(),
        host_id=_get("host-id") or None,
        shm=bool(_get("shm", True)),
        shm_threshold=parse_bytes(threshold) if isinstance(threshold, str) else int(threshold),
        pool_idle_bytes=None if idle in (None, "") else parse_bytes(idle) if isinstance(idle, str) else int(idle),
        kept_map_bytes=None if kept in (None, "") else parse_bytes(kept) if isinstance(kept, str) else int(kept),
    )

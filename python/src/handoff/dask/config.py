"""The ``distributed.comm.handoff`` section of Dask's configuration, and what a node is built from.

Its defaults (``handoff.yaml`` beside this module) are registered with
``dask.config.update_defaults`` when the backend is imported, the way Dask's extensions
register theirs, so ``dask.config.get("distributed.comm.handoff.secret")`` works in every
process that loads the backend. The secret is looked up in this order: ``secret``,
``secret-file``, the environment variable ``HANDOFF_SECRET``; none means the empty secret
(every node without one can connect).

``accept-v2`` and ``accept-v1`` (default off) let the nodes of the process also accept
peers of the older protocol versions, while a cluster upgrades: in versions 1 and 2 a
peer without the secret can authenticate by reflecting the nodes' own proofs (spec
WIRE.md §5.6), so turn them on only for the upgrade, inside a network you trust.
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
    #: Also accept peers that speak only protocol version 2 (spec §3; dangerous, §5.6).
    accept_v2: bool = False
    #: Also accept peers that speak only protocol version 1 (and 2; dangerous, §5.4, §5.6).
    accept_v1: bool = False


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
        accept_v2=_flag("accept-v2"),
        accept_v1=_flag("accept-v1"),
    )


def _flag(key: str) -> bool:
    """A bool option: ``true``/``false`` (YAML), or the strings Dask's environment variables give."""
    value = _get(key, False)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("", "0", "false", "no", "off", "none", "null"):
            return False
        raise ValueError(f"{SECTION}.{key} is a bool (true or false), got {value!r}")
    return bool(value)

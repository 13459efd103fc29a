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

Time: every TCP connection gets keepalive and ``TCP_USER_TIMEOUT`` from Dask's own
``distributed.comm.timeouts.tcp`` (as Dask's TCP comm does), so that a peer whose host
lost power fails its comms within that timeout. ``progress-timeout`` (silence inside a
message) and ``write-timeout`` (a write that makes no progress) bound the rest; empty:
the node's defaults (:class:`handoff.bounds.Bounds`). ``max-frame-bytes`` lowers the
size of one handoff frame (default: the wire format's 4 GiB, §9): a Dask frame above it
travels in pieces joined by a copy off the event loop (:mod:`handoff.dask.frames`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

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
    shm_threshold: int = 1 << 20
    pool_idle_bytes: Optional[int] = None
    kept_map_bytes: Optional[int] = None
    #: Seconds an idle pooled segment, and an idle kept mapping, waits before it is given back.
    pool_idle_seconds: Optional[float] = None
    kept_map_seconds: Optional[float] = None
    #: Also accept peers that speak only protocol version 2 (spec §3; dangerous, §5.6).
    accept_v2: bool = False
    #: Also accept peers that speak only protocol version 1 (and 2; dangerous, §5.4, §5.6).
    accept_v1: bool = False
    #: Seconds for keepalive and ``TCP_USER_TIMEOUT`` (``distributed.comm.timeouts.tcp``).
    tcp_timeout: Optional[float] = None
    #: Seconds of silence inside a message, and of a write without progress (``None``: defaults).
    progress_timeout: Optional[float] = None
    write_timeout: Optional[float] = None
    #: The largest handoff frame this process sends and takes (``None``: the wire's 4 GiB).
    max_frame_bytes: Optional[int] = None
    #: NumPy arrays from this size are born in shared memory where a listener starts.
    shared_arrays: bool = True
    shared_arrays_min_bytes: int = 1 << 20


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
    threshold = _get("shm-threshold", "1MiB")
    return Settings(
        secret=_secret(),
        host_id=_get("host-id") or None,
        shm=bool(_get("shm", True)),
        shm_threshold=parse_bytes(threshold) if isinstance(threshold, str) else int(threshold),
        pool_idle_bytes=_size(_get("pool-idle-bytes")),
        kept_map_bytes=_size(_get("kept-map-bytes")),
        pool_idle_seconds=_seconds(_get("pool-idle-seconds"), f"{SECTION}.pool-idle-seconds", zero=True),
        kept_map_seconds=_seconds(_get("kept-map-seconds"), f"{SECTION}.kept-map-seconds", zero=True),
        accept_v2=_flag("accept-v2"),
        accept_v1=_flag("accept-v1"),
        tcp_timeout=_seconds(
            dask.config.get("distributed.comm.timeouts.tcp", default=None), "distributed.comm.timeouts.tcp"
        ),
        progress_timeout=_seconds(_get("progress-timeout"), f"{SECTION}.progress-timeout"),
        write_timeout=_seconds(_get("write-timeout"), f"{SECTION}.write-timeout"),
        max_frame_bytes=_size(_get("max-frame-bytes")),
        shared_arrays=_flag("shared-arrays", True),
        shared_arrays_min_bytes=_size(_get("shared-arrays-min-bytes")) or (1 << 20),
    )


def _seconds(value, key: str, zero: bool = False) -> Optional[float]:
    """A duration (``30s``, ``2 minutes``, a number of seconds), or ``None`` if empty;
    positive, or also 0 with ``zero``."""
    if value in (None, ""):
        return None
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (ValueError, TypeError, KeyError):
        seconds = None
    if seconds is None or seconds < 0 or (seconds == 0 and not zero):
        kind = "a duration of 0 or more" if zero else "a positive duration"
        raise ValueError(f"{key} is {kind}, got {value!r}")
    return float(seconds)


def _size(value) -> Optional[int]:
    if value in (None, ""):
        return None
    return parse_bytes(value) if isinstance(value, str) else int(value)


def _flag(key: str, default: bool = False) -> bool:
    """A bool option: ``true``/``false`` (YAML), or the strings Dask's environment variables give."""
    value = _get(key, default)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("", "0", "false", "no", "off", "none", "null"):
            return False
        raise ValueError(f"{SECTION}.{key} is a bool (true or false), got {value!r}")
    return bool(value)

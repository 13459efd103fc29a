"""Who a node is (spec §5.2): node ids, the process id, the host id, the runtime directory
(§7.1) and the keepalive plan of a TCP timeout, as the engine computes them
(``handoff_proto::identity``, ``handoff_sys::same_host``, ``handoff_proto::bounds``), so
that Python and Rust nodes on one host agree. The pure-Python reference's own derivation
is ``handoff_pure.identity``."""

from __future__ import annotations

from pathlib import Path

from . import native

__all__ = ["random_id", "process_id", "host_id", "runtime_dir", "keepalive_plan"]


def _ext():
    """The extension (loaded at the first call: ``import handoff`` works without it)."""
    return native.required("the node's identity")


def random_id() -> str:
    """128 random bits as 32 lower-case hex characters (a node id)."""
    return _ext().random_id()


def process_id() -> str:
    """The random id of this process instance, shared by all its nodes (new after a fork)."""
    return _ext().process_id()


def host_id() -> str:
    """The host identity (§5.2): ``$HANDOFF_HOST_ID`` if set and not empty, else derived from
    the machine id, the boot id and this process's network namespace, so that processes in
    different network namespaces (containers, the hosts of ``scripts/netlab``) count as
    different hosts."""
    return _ext().host_id()


def runtime_dir() -> Path:
    """The folder of this user's node sockets: ``$HANDOFF_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/handoff``, else ``/tmp/handoff-UID``; mode 0700, owned by us
    (``PermissionError`` if another user owns it)."""
    return Path(_ext().runtime_dir())


def keepalive_plan(timeout: float) -> tuple[int, int, int]:
    """``(idle, interval, probes)`` in whole seconds for a TCP connection that must notice a
    silent peer within ``timeout`` seconds (Dask's derivation,
    ``handoff_proto::bounds::keepalive_plan``); ``ValueError`` under 11 s, where none exists."""
    return _ext().keepalive_plan(timeout)

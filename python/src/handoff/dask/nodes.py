"""The handoff nodes of a Dask process: one per listener, and one shared by its connectors.

Every Dask listener (a scheduler's, a worker's, a nanny's) is a node of its own: its TCP
port is the port of the ``handoff://host:port`` address, and it accepts same-host peers
on its own Unix socket. Connections a process opens (``distributed.comm.connect``, which
knows nothing of the server that calls it) come from one *connector node* per event
loop, shared by every comm it opens and closed when its last comm closes. Two nodes, not
one, because a process may connect to its own listener (a scheduler and its workers in
one process, as in ``gen_cluster``), and a node never connects to itself (§5.1).

Every node is built from :func:`handoff.dask.config.settings`: the cluster secret, the
host id, shared memory on or off and its threshold, the older protocol versions it
accepts (``accept-v2``, ``accept-v1``: none by default), the timeouts (keepalive and
``TCP_USER_TIMEOUT`` from ``distributed.comm.timeouts.tcp``; ``progress-timeout`` and
``write-timeout``), the largest frame; and with the TLS of Dask's
``connection_args`` (:mod:`handoff.dask.security`): a connector node per loop, settings
and client context; it delivers each connection's messages to that connection (one comm, one stream), sends from the process's pool of
shared segments, and maps what it receives private and writable (Dask's deserializers
keep a writable frame as it is; a read-only one they copy).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import weakref
from typing import Callable, Optional

from .. import held, native
from ..bounds import DEFAULT_BOUNDS
from ..node import Node
from ..tls import TlsConfig
from ..wire import DEFAULT_LIMITS
from ..peer import Peer
from .config import Settings
from .frames import TYPE_FRAMES, TYPE_OPEN

__all__ = ["make_node", "connector_node", "ConnectorLease", "spawn", "BOUNDS"]

#: The bounds of a Dask node: the defaults (§9.1), but for established connections. Every
#: comm is a connection, and a scheduler holds several per worker and client (its batched
#: stream and a pool of rpc comms), so 1024 would cap a cluster at a few hundred workers;
#: the process's file-descriptor limit binds first, as it does for Dask's TCP comms.
BOUNDS = dataclasses.replace(DEFAULT_BOUNDS, max_connections=16384)


def spawn(loop: asyncio.AbstractEventLoop, make) -> Optional[asyncio.Task]:
    """Runs ``make()`` (a coroutine function) as a task of ``loop`` if it still runs, else nothing."""
    if loop.is_closed():
        return None
    coro = make()
    try:
        return loop.create_task(coro)
    except RuntimeError:  # the loop is shutting down
        coro.close()
        return None


#: Received segments a Dask process keeps mapped when neither ``kept-map-bytes`` nor
#: ``$HANDOFF_SHM_KEEP_BYTES`` says: none. A kept mapping counts in the worker's RSS, which
#: Dask's memory manager reads, for a gain only when one segment carries array after
#: array; Dask's workloads send new data each time (``bench/dask_workloads.py``: with 1 GiB
#: kept, worker peaks were 1.09–1.29× tcp://'s; with none, at most 0.99×).
KEPT_MAP_BYTES = 0


def make_node(
    settings: Settings,
    role: str,
    listen: Optional[str] = None,
    on_accept: Optional[Callable[[Peer], None]] = None,
    tls: Optional[TlsConfig] = None,
) -> Node:
    """A node for a Dask listener (``listen``, ``on_accept``) or for connecting (neither),
    with ``tls`` on its TCP connections if given."""
    if native.ENABLED:  # the engine's pool (the process's)
        native.ext.configure_segment_pool(settings.pool_idle_bytes, settings.pool_idle_seconds)
    kept = settings.kept_map_bytes
    if kept is None and "HANDOFF_SHM_KEEP_BYTES" not in os.environ:
        kept = KEPT_MAP_BYTES
    bounds = BOUNDS
    if settings.progress_timeout is not None:
        bounds = dataclasses.replace(bounds, progress_timeout=settings.progress_timeout)
    if settings.write_timeout is not None:
        bounds = dataclasses.replace(bounds, write_timeout=settings.write_timeout)
    limits = DEFAULT_LIMITS
    if settings.max_frame_bytes is not None:
        limits = dataclasses.replace(limits, max_frame_bytes=min(limits.max_frame_bytes, settings.max_frame_bytes))
    node = Node(
        f"dask-{role}-{os.getpid()}",
        host_id=settings.host_id,
        secret=settings.secret,
        listen=listen,
        shm=settings.shm,
        shm_threshold=settings.shm_threshold,
        types=(TYPE_OPEN, TYPE_FRAMES),
        per_connection=True,
        on_accept=on_accept,
        shm_pool=True,
        shm_private=True,
        bounds=bounds,
        limits=limits,
        tls=tls,
        tcp_timeout=settings.tcp_timeout,
        kept_map_bytes=kept,
        kept_map_seconds=settings.kept_map_seconds,
        accept_v1=settings.accept_v1,
        accept_v2=settings.accept_v2,
    )
    # Where the reference runs (tests): its own pool, put in handoff.held once the node loaded it.
    held.holder.configure_pool(settings.pool_idle_bytes, settings.pool_idle_seconds)
    return node


class _Shared:
    __slots__ = ("node", "refs")

    def __init__(self, node: Node):
        self.node = node
        self.refs = 0


# event loop -> {(settings, client TLS context, server name) -> the connector node of that loop}
_connectors: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()
_closing: set = set()


class ConnectorLease:
    """A connector node held for one comm; :meth:`release` once, when the comm is closed."""

    __slots__ = ("node", "_shared", "_key", "_loop")

    def __init__(self, shared: _Shared, key: tuple, loop: asyncio.AbstractEventLoop):
        self.node = shared.node
        self._shared = shared
        self._key = key
        self._loop = loop

    def release(self) -> None:
        shared, self._shared = self._shared, None
        if shared is None:
            return
        shared.refs -= 1
        if shared.refs > 0:
            return
        per_loop = _connectors.get(self._loop)
        if per_loop is not None and per_loop.get(self._key) is shared:
            del per_loop[self._key]
        task = spawn(self._loop, shared.node.close)
        if task is not None:
            _closing.add(task)
            task.add_done_callback(_closing.discard)


async def connector_node(settings: Settings, tls: Optional[TlsConfig] = None) -> ConnectorLease:
    """The connector node of the running loop for these settings and this TLS, started,
    held once. Dask makes a client context once per connection pool (``rpc``), so a
    process has a handful of them: one node each."""
    loop = asyncio.get_running_loop()
    per_loop = _connectors.setdefault(loop, {})
    key = (settings, tls.client, tls.server_name) if tls is not None else (settings, None, None)
    shared = per_loop.get(key)
    if shared is None or shared.node._closed:
        shared = per_loop[key] = _Shared(make_node(settings, "connect", tls=tls))
    shared.refs += 1
    lease = ConnectorLease(shared, key, loop)
    try:
        await shared.node.start()  # without a TCP listener this does not wait: no race
    except BaseException:
        lease.release()
        raise
    return lease

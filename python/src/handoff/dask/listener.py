"""``HandoffListener``: a Dask listener is a handoff node that listens on ``host:port``.

Its address is ``handoff://host:port``, its node's TCP port; a wildcard host (``0.0.0.0``,
``::`` or none) binds every address and is advertised, as Dask's TCP listener does, as
``default_host`` if the server gave one, else ``distributed.utils.get_ip()``. Same-host
peers reach its Unix socket (announced in the handshake). Each accepted connection
becomes a comm when its first message arrives — a ``handoff.dask.Open`` with the
addresses the connector uses — and then goes through Dask's handshake
(``Listener.on_connection``) to the server's handler. ``stop()`` stops accepting;
established comms carry on, and the node closes with the last of them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from typing import Optional

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import BaseListener, CommClosedError
from distributed.comm.utils import ensure_concrete_host

from .. import shared
from ..errors import PeerClosed
from ..addresses import split_host_port, strip_scheme
from ..node import Node, engine_default
from ..peer import Peer
from . import memory
from .comm import HandoffComm
from .config import settings
from .frames import TYPE_OPEN
from .nodes import make_node, spawn
from .security import tls_from_connection_args

__all__ = ["HandoffListener", "PREFIX"]

logger = logging.getLogger("distributed.comm.handoff")

PREFIX = "handoff://"
#: How long an accepted connection may take to say which addresses it uses.
_OPEN_TIMEOUT = 10.0


#: What an address a same-host peer claims in its ``Open`` may be: ``handoff://`` and a
#: host (a name, or an IPv4 or bracketed IPv6 address) with its port, at most 300
#: characters, nothing else (it goes into Dask's structures and its log lines).
_CLAIMED_ADDRESS = re.compile(r"handoff://[A-Za-z0-9.\-_\[\]:%]{1,290}")


def _address(value, fallback: str) -> str:
    """An address a peer claimed in its ``Open`` if it is a ``handoff://host:port`` of
    :data:`_CLAIMED_ADDRESS`'s form, else ``fallback``."""
    if isinstance(value, str) and _CLAIMED_ADDRESS.fullmatch(value):
        try:
            parse_host_port(value[len(PREFIX) :])
            return value
        except ValueError:
            pass
    return fallback


class HandoffListener(BaseListener):
    """Listens on ``handoff://host:port``, with TLS on TCP if Dask's ``connection_args``
    carry an ``ssl_context`` (:mod:`handoff.dask.security`); other keyword arguments are ignored."""

    prefix = PREFIX

    def __init__(
        self,
        address: str,
        comm_handler,
        deserialize: bool = True,
        allow_offload: bool = True,
        default_host: Optional[str] = None,
        default_port: int = 0,
        **connection_args,
    ):
        super().__init__()
        self.ip, self.port = parse_host_port(address, default_port)
        self.tls = tls_from_connection_args(connection_args, server=True)
        self.default_host = default_host
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self.node: Optional[Node] = None
        self._bound: Optional[tuple] = None
        self._stopped = False
        self._comms = 0
        self._tasks: set = set()

    async def start(self) -> None:
        host = self.ip or "0.0.0.0"
        listen = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        config = settings()
        node = make_node(config, "listen", listen=listen, on_accept=self._accepted, tls=self.tls)
        await node.start()
        if config.shared_arrays and config.shm:
            share_arrays(config.shared_arrays_min_bytes)
        self.node = node
        self._bound = split_host_port(strip_scheme(node.listen_addr, "tcp://"))

    def stop(self) -> None:
        self._stopped = True
        node = self.node
        if node is None:
            return
        node.stop_listening()
        self._close_node_if_idle()

    def _close_node_if_idle(self) -> None:
        node = self.node
        if node is not None and self._stopped and self._comms == 0 and not node._closed:
            task = spawn(node.loop, node.close)
            if task is not None:
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _comm_closed(self) -> None:
        self._comms -= 1
        self._close_node_if_idle()

    def get_host_port(self) -> tuple:
        """The bound ``(host, port)``."""
        if self._bound is None:
            raise ValueError("invalid operation on non-started HandoffListener")
        return self._bound

    @property
    def listen_address(self) -> str:
        return self.prefix + unparse_host_port(*self.get_host_port())

    @property
    def contact_address(self) -> str:
        host, port = self.get_host_port()
        host = ensure_concrete_host(host, default_host=self.default_host)
        return self.prefix + unparse_host_port(host, port)

    # ------------------------------------------------------------------ accepting

    def _accepted(self, peer: Peer) -> None:
        task = peer.node.loop.create_task(self._handle(peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, peer: Peer) -> None:
        try:
            env = await peer.recv(_OPEN_TIMEOUT)
            body = env.body if env.type_name == TYPE_OPEN else None
        except (PeerClosed, asyncio.TimeoutError, Exception) as e:
            logger.info("handoff connection from %s ended before it opened a comm: %s", peer.name, e)
            peer.abort()
            return
        if not isinstance(body, dict):
            logger.warning("handoff connection from %s did not open a comm; closing it", peer.name)
            peer.abort()
            return
        if self._stopped:
            # stop() came after the connection was accepted: nobody would handle it.
            peer.abort()
            return
        if peer.channel == "tcp":
            try:
                peer_addr = self.prefix + unparse_host_port(*peer.peername()[:2])
                local_addr = self.prefix + unparse_host_port(*peer.sockname()[:2])
            except OSError:  # it closed already
                peer.abort()
                return
        else:
            peer_addr = _address(body.get("from"), self.prefix + "127.0.0.1:0")
            local_addr = _address(body.get("to"), self.contact_address)
        self._comms += 1
        comm = HandoffComm(peer, local_addr, peer_addr, self.deserialize, release=self._comm_closed)
        comm.allow_offload = self.allow_offload
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.info("Connection from %s closed before handshake completed", peer_addr)
            return
        result = self.comm_handler(comm)
        if inspect.isawaitable(result):
            await result


def share_arrays(min_bytes: int) -> None:
    """Makes NumPy arrays of at least ``min_bytes`` born in shared memory in this process
    (``distributed.comm.handoff.shared-arrays``). Called where a listener starts, inside
    the server's start-up: the context that its tasks inherit (Dask runs a task in a copy
    of its worker's context), as a preload's ``dask_setup`` would be. Without the engine
    or NumPy, arrays stay where they are, with a warning that says why."""
    if not engine_default():
        return
    try:
        import numpy  # noqa: F401
    except ImportError:
        return
    try:
        shared.install(min_bytes)
    except (ImportError, RuntimeError, ValueError) as e:
        logger.warning("arrays are not born in shared memory in this process: %s", e)
        return
    # Dask's memory readings count each shared byte once, in the process that made it.
    memory.install()

"""``HandoffConnector``: opens a comm to ``handoff://host:port``.

It dials the listener's TCP port from the process's connector node
(:mod:`handoff.dask.nodes`). A same-host listener (equal host ids) that offers its Unix
socket is reached through it: the node switches from TCP as the spec says (§7.1), and
the socket is remembered per address, so that the next comm to that address dials the
socket straight away (its handshake proves it is still the same node; otherwise it is
forgotten and TCP is dialed again). The first message on the connection is
``handoff.dask.Open`` with the addresses this comm uses at both ends.

Errors: what cannot reach the listener (refused, unreachable, a handshake that fails or
is refused as ``overloaded``) raises ``CommClosedError`` with the ``OSError`` as its
cause, as Dask's TCP connector does (a name that does not resolve: ``socket.gaierror``,
as there), which Dask retries until its connect timeout; a wrong cluster secret or a TLS failure (a certificate that
does not verify, a listener that requires TLS when this side has none, or the reverse)
raises ``FatalCommClosedError``, which it does not retry. Dask's TLS settings
(``ssl_context``, ``require_encryption``, ``server_hostname`` of ``connection_args``) are
honoured (:mod:`handoff.dask.security`); other keyword arguments are ignored. A connect
cancelled once the connection is up (a ``wait_for`` that ran out) closes it at once,
instead of leaving the listener to wait for its ``Open``.
"""

from __future__ import annotations

import logging
import socket

from distributed.comm.addressing import parse_host_port, unparse_host_port
from distributed.comm.core import Connector, FatalCommClosedError

from ..errors import AuthenticationError, HandoffError, PeerClosed, PeerRefused, TlsError
from ..node import Node
from ..peer import Peer
from ..wire import WireError
from .comm import HandoffComm
from .config import SECTION, settings
from .failures import comm_closed
from .frames import TYPE_OPEN
from .listener import PREFIX
from .nodes import connector_node
from .security import tls_from_connection_args

__all__ = ["HandoffConnector"]

logger = logging.getLogger("distributed.comm.handoff")

# (address, our host id) -> (node id, unix:// address) of a same-host listener reached before
_unix_routes: dict = {}


def _local_address(peer: Peer, host: str) -> str:
    if peer.channel == "tcp":
        return PREFIX + unparse_host_port(*peer.sockname()[:2])
    # A Unix socket has no port: the host this side reaches the listener from, port 0.
    return PREFIX + unparse_host_port(host, 0)


async def _dial(node: Node, address: str, host: str, port: int) -> Peer:
    key = (address, node.host_id)
    route = _unix_routes.get(key) if node.shm else None
    if route is not None:
        node_id, unix = route
        try:
            peer = await node.connect(unix)
        except (OSError, HandoffError) as e:
            logger.debug("the Unix socket of %s is gone (%s); dialing TCP", address, e)
            _unix_routes.pop(key, None)
        else:
            if peer.node_id == node_id:
                return peer
            _unix_routes.pop(key, None)
            peer.abort()
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    peer = await node.connect("tcp://" + target)
    if peer.channel == "shm" and peer.ident.unix:
        _unix_routes[key] = (peer.node_id, peer.ident.unix)
    return peer


class HandoffConnector(Connector):
    """Connects to ``handoff://`` listeners."""

    async def connect(self, address: str, deserialize: bool = True, **connection_args) -> HandoffComm:
        host, port = parse_host_port(address)
        tls = tls_from_connection_args(connection_args, server=False)
        lease = await connector_node(settings(), tls)
        peer = None
        try:
            try:
                peer = await _dial(lease.node, address, host, port)
            except AuthenticationError as e:
                raise FatalCommClosedError(
                    f"handoff://{address}: {e} (both sides need the same {SECTION}.secret)"
                ) from None
            except TlsError as e:
                raise FatalCommClosedError(f"handoff://{address}: {e}") from None
            except PeerRefused as e:
                if e.code == "auth-failed":
                    raise FatalCommClosedError(f"handoff://{address}: {e}") from None
                err = comm_closed(f"handoff://{address}", None, e)
                raise err from err.__cause__
            except socket.gaierror:
                raise
            except (PeerClosed, HandoffError, WireError, OSError) as e:
                err = comm_closed(f"handoff://{address}", None, e)
                raise err from err.__cause__
            try:
                local = _local_address(peer, host)
                await peer.send(TYPE_OPEN, {"from": local, "to": PREFIX + address})
            except (PeerClosed, OSError) as e:
                err = comm_closed(f"handoff://{address}", peer.failure, e)
                raise err from err.__cause__
        except BaseException:
            # Failed or cancelled: nobody else holds the connection (or the node for it).
            if peer is not None:
                peer.abort()
            lease.release()
            raise
        return HandoffComm(peer, local, PREFIX + address, deserialize, release=lease.release)

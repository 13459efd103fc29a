"""What the pure-Python reference decides about addresses: whether an address is a node's own
(its ticket client must never dial its own node, §9.1), who is at the other end of a
same-host socket (§7.1), and the file name of a node's socket. The engine decides the first
two in ``handoff_proto::peers``, the last in ``handoff_sys::same_host::listen``."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from typing import Optional

from handoff.addresses import split_host_port, strip_scheme

__all__ = ["LOCAL_HOSTS", "is_own_address", "check_peer_uid", "sanitize_name"]

LOCAL_HOSTS = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_own_address(listen_addr: Optional[str], host: str, port: int) -> bool:
    """Whether ``host:port`` is the listen address ``listen_addr`` (``tcp://…``) or plainly reaches it."""
    if listen_addr is None:
        return False
    own_host, own_port = split_host_port(strip_scheme(listen_addr, "tcp://"))
    if port != own_port:
        return False
    if host == own_host:
        return True

    def local(h: str) -> bool:
        if h.lower() in LOCAL_HOSTS:
            return True
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            return False
        return ip.is_loopback or ip.is_unspecified

    # A node that listens on a loopback or every address is reached by any local one.
    return local(own_host) and local(host)


def check_peer_uid(sock: socket.socket) -> int:
    """Refuses a same-host peer that runs as another user (SO_PEERCRED, §7.1); returns its pid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        raise PermissionError(f"refusing a same-host peer running as uid {uid} (we are uid {os.geteuid()}, pid {pid})")
    return pid


def sanitize_name(name: str) -> str:
    """A node name made safe for a file name (at most 32 of ``[A-Za-z0-9_-]``)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "_" for c in name)[:32]

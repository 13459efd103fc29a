"""Addresses: ``tcp://HOST:PORT`` and ``unix://PATH`` as nodes write them. Plain functions
with no state, below the node (which listens and connects). Whether an address is a node's
own, and who is at the other end of a same-host socket, the engine decides
(``handoff_proto::peers``); the pure-Python reference: ``handoff_pure.addresses``.
"""

from __future__ import annotations

import re
import socket

__all__ = ["split_host_port", "strip_scheme", "tcp_socket"]


def split_host_port(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6HOST]:PORT`` as ``(host, port)``, the port at most 65535;
    ``ValueError`` otherwise."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d{1,5})|([^:]+):(\d{1,5})", addr)
    if not m or int(m.group(2) or m.group(4)) > 65535:
        raise ValueError(f"not a host:port address: {addr!r}")
    return (m.group(1) or m.group(3), int(m.group(2) or m.group(4)))


def tcp_socket(addr: str) -> tuple:
    """A non-blocking TCP socket for ``[tcp://]HOST:PORT`` (IPv6 hosts in brackets), and
    the ``(host, port)`` to connect it to or bind it on; ``ValueError`` for anything else."""
    host, port = split_host_port(strip_scheme(addr, "tcp://"))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock, (host, port)


def strip_scheme(addr: str, scheme: str) -> str:
    """``addr`` without its leading ``scheme`` (such as ``tcp://``), if it has one."""
    return addr[len(scheme) :] if addr.startswith(scheme) else addr

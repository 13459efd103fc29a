"""Dask's TLS settings for ``handoff://``: the TLS of a node from Dask's ``connection_args``.

Dask passes every listener and connector its ``connection_args``: with
``distributed.comm.tls.*`` set, or a ``distributed.security.Security`` with TLS files, they
hold ``ssl_context`` (a server context for a listener, a client context for a connector)
and ``require_encryption``. A node uses the context as given (Dask's client contexts check
the chain, not the name: its clusters are addressed by IP) for its TCP connections (spec
§3.1); same-host peers on the Unix socket need none. With ``require_encryption`` and no
context, nothing is sent in plain text: the listener or connector fails at once.
"""

from __future__ import annotations

import ssl
from typing import Optional

from ..tls import TlsConfig

__all__ = ["tls_from_connection_args"]


def tls_from_connection_args(connection_args: dict, server: bool) -> Optional[TlsConfig]:
    """The node's TLS for Dask's ``connection_args`` (``server``: a listener's), or ``None``
    for plain TCP; ``RuntimeError`` if encryption is required and no TLS context is given."""
    ctx = connection_args.get("ssl_context")
    if ctx is None:
        if connection_args.get("require_encryption"):
            raise RuntimeError(
                "encryption required by Dask configuration (require_encryption), but no TLS context was given "
                "for handoff://: set distributed.comm.tls.ca-file and the certificate and key of each role "
                "(distributed.comm.tls.scheduler/worker/client.cert and .key), or pass a "
                "Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=..., ...)"
            )
        return None
    if not isinstance(ctx, ssl.SSLContext):
        raise TypeError(
            f"handoff:// expects an ssl.SSLContext as ssl_context (check the TLS configuration), got {ctx!r}"
        )
    if server:
        return TlsConfig(server=ctx)
    return TlsConfig(client=ctx, server_name=connection_args.get("server_hostname") or None)

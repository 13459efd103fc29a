"""TLS between hosts (spec §3.1): a node's configuration, and the words of a refusal.

A node configured with a :class:`TlsConfig` runs every TCP connection inside TLS (the
Unix socket of same-host peers never does). Both sides are authenticated: the accepting
side asks for the connecting side's certificate, and the connecting side checks the
accepting side's chain and name (the host part of the address it dialed, or
:attr:`TlsConfig.server_name`). TLS changes no byte of the wire format: the preambles,
the handshake and every message run inside it unchanged.

A node on the engine runs TLS on rustls, in Rust, from the PEM of :class:`TlsConfig`
(which says what failed in its own words); the pure-Python reference runs it on Python's
``ssl`` from the config's contexts (``handoff_pure.tls``: the handshake on the event loop
and what an :class:`ssl.SSLError` means).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Optional, Union

from .errors import TlsError

__all__ = [
    "TlsConfig",
    "required_by",
    "refused_plain",
]

_Path = Union[str, "os.PathLike[str]"]


@dataclass
class TlsConfig:
    """A node's TLS: a context for the connections it accepts (``server``), one for those
    it opens (``client``), and the name to expect in the accepting side's certificate
    instead of the host part of the dialed address (``server_name``).

    Either context may be ``None``: a node without a ``server`` context refuses the TCP
    connections it accepts, one without a ``client`` context cannot connect over TCP.
    :meth:`from_files` builds both for mutual TLS; ready-made contexts (such as Dask's,
    from its ``Security``) are used as given."""

    server: Optional[ssl.SSLContext] = None
    client: Optional[ssl.SSLContext] = None
    server_name: Optional[str] = None
    #: The PEM files the contexts were built from (:meth:`from_files`): certificate chain,
    #: key and CA. A node on the Rust engine, whose TLS is rustls, loads them itself; it
    #: cannot use contexts built otherwise.
    files: Optional[tuple] = None
    #: Or the PEM itself, as bytes: certificate chain, key and CA (what Dask's ``Security``
    #: names for the contexts it made, :mod:`handoff.dask.security`).
    pem: Optional[tuple] = None
    #: Whether a connecting node checks that the accepting node's certificate names the
    #: host it dialed (or :attr:`server_name`), or its chain only (Dask's contexts: its
    #: nodes are dialed by IP address).
    check_name: bool = True
    #: The oldest TLS version allowed: ``"1.2"`` (1.2 and 1.3) or ``"1.3"``. A node on the
    #: engine keeps it (rustls); the Python implementation keeps its contexts' own.
    min_version: str = "1.2"

    @classmethod
    def from_files(cls, cert_chain: _Path, key: _Path, ca: _Path, server_name: Optional[str] = None) -> "TlsConfig":
        """Mutual TLS from PEM files: this node's certificate chain and private key, and the
        CA (or CAs) it trusts for its peers' certificates. TLS 1.2 at least; the accepting
        side requires a certificate, the connecting side checks the chain and the name."""
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.verify_mode = ssl.CERT_REQUIRED
        # No session tickets: nodes keep their connections, and tickets would be the only
        # bytes TLS sends after its handshake on its own.
        server.num_tickets = 0
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
        for ctx in (server, client):
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_cert_chain(os.fspath(cert_chain), os.fspath(key))
            except (OSError, ssl.SSLError) as e:
                raise TlsError(
                    f"cannot load this node's certificate chain {os.fspath(cert_chain)!r} with its key "
                    f"{os.fspath(key)!r}: {e} (PEM files; the key must be the certificate's)"
                ) from None
            try:
                ctx.load_verify_locations(cafile=os.fspath(ca))
            except (OSError, ssl.SSLError) as e:
                raise TlsError(f"cannot load the CA certificates {os.fspath(ca)!r}: {e} (a PEM file)") from None
        files = (os.fspath(cert_chain), os.fspath(key), os.fspath(ca))
        return cls(server=server, client=client, server_name=server_name, files=files)


def required_by(label: str, message: str) -> TlsError:
    """What a plain node raises when ``label`` requires TLS and refused it (``tls-required``)."""
    return TlsError(
        f"{label} requires TLS and refused this plain connection: {message} [tls-required]; "
        "turn TLS on for this node (Node(tls=TlsConfig.from_files(cert, key, ca)), or the worker's "
        "--tls-cert, --tls-key and --tls-ca)",
        code="tls-required",
    )


def refused_plain(label: str) -> TlsError:
    """What the node that refused a plain peer logs."""
    return TlsError(
        f"{label} connected without TLS, and this node requires it: answered tls-required "
        "(the peer needs TLS on: a certificate, its key and the cluster's CA)"
    )

"""Dask's TLS settings for ``handoff://``: the TLS of a node from Dask's ``connection_args``.

Dask passes every listener and connector its ``connection_args``: with
``distributed.comm.tls.*`` set, or a ``distributed.security.Security`` with TLS files, they
hold ``ssl_context`` (a server context for a listener, a client context for a connector)
and ``require_encryption``. A node uses the context as given (Dask's client contexts check
the chain, not the name: its clusters are addressed by IP) for its TCP connections (spec
§3.1); same-host peers on the Unix socket need none. A node on the Rust engine runs TLS on
rustls, which cannot use an ``ssl`` context: it loads the PEM that the ``Security`` behind
the context names (found by the context, among the process's Dask servers and clients),
and checks the chain only, as Dask does. With ``require_encryption`` and no
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
    pem = _pem_of(_settings_behind(ctx))
    if pem is not None and not _same_cas(pem[2], ctx):
        pem = None  # (settings that name other CAs than the context trusts: not its own)
    # What the engine keeps of the context's policy: Dask's contexts check the chain, not
    # the name (check_hostname off), and its tls.min-version may be 1.3.
    policy = {
        "pem": pem,
        "check_name": bool(ctx.check_hostname),
        "min_version": "1.3" if ctx.minimum_version == ssl.TLSVersion.TLSv1_3 else "1.2",
    }
    if server:
        return TlsConfig(server=ctx, **policy)
    return TlsConfig(client=ctx, server_name=connection_args.get("server_hostname") or None, **policy)


#: Dask's servers and clients, and the role their TLS settings are for.
_ROLES = (("Scheduler", "scheduler"), ("Worker", "worker"), ("Nanny", "worker"), ("Client", "client"))


def _settings_behind(ctx: ssl.SSLContext) -> Optional[dict]:
    """The TLS settings of the Dask ``Security`` that made ``ctx`` (``ca_file``, ``cert``,
    ``key``: paths, or PEM text), found among this process's live schedulers, workers,
    nannies and clients; ``None`` for a context made otherwise.

    An ``ssl.SSLContext`` cannot give back its certificate and key, and a node on the Rust
    engine runs TLS on rustls: it loads the PEM those settings name. A connector's context
    is the one its Dask owner keeps (``connection_args``); a listener's is made for the
    ``listen`` call alone, and is known by the certificate it presents."""
    import distributed

    owners = [
        (owner, role)
        for cls_name, role in _ROLES
        for owner in list(getattr(getattr(distributed, cls_name), "_instances", ()))
    ]
    for owner, role in owners:
        args = getattr(owner, "connection_args", None)
        if isinstance(args, dict) and args.get("ssl_context") is ctx:
            return owner.security.get_tls_config_for_role(role)
    presented = _presented_certificate(ctx)
    if presented is None:
        return None
    seen: set = set()
    for owner, _ in owners:
        security = owner.security
        if id(security) in seen:
            continue
        seen.add(id(security))
        for role in ("scheduler", "worker", "client"):
            settings = security.get_tls_config_for_role(role)
            if settings.get("cert") and _first_certificate(settings["cert"]) == presented:
                return settings
    return None


def _presented_certificate(ctx: ssl.SSLContext) -> Optional[bytes]:
    """The certificate (DER) a server context presents: the first flight of a TLS handshake
    run in memory against a client that checks nothing (it needs no certificate of its own
    to see the server's)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    try:
        near = client.wrap_bio(c_in, c_out, server_side=False)
        far = ctx.wrap_bio(s_in, s_out, server_side=True)
    except (ssl.SSLError, ValueError):
        return None
    for _ in range(8):
        for end in (near, far):
            try:
                end.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except (ssl.SSLError, ValueError):
                pass  # the server refuses a client without a certificate: its certificate came first
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        try:
            der = near.getpeercert(binary_form=True)
        except ValueError:  # the handshake has not reached the certificate yet
            der = None
        if der:
            return der
    return None


def _certificates(text: str) -> list:
    """The certificates (DER) of a PEM text, in order."""
    marker, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    found = []
    at = text.find(marker)
    while at >= 0:
        stop = text.index(end, at) + len(end)
        found.append(ssl.PEM_cert_to_DER_cert(text[at:stop]))
        at = text.find(marker, stop)
    return found


def _first_certificate(cert: str) -> Optional[bytes]:
    """The first certificate (DER) of a PEM chain: a file's path, or the PEM text."""
    try:
        text = cert if "\n" in cert else open(cert, encoding="ascii").read()
        return next(iter(_certificates(text)), None)
    except (OSError, ValueError):
        return None


def _same_cas(ca_pem: bytes, ctx: ssl.SSLContext) -> bool:
    """Whether ``ca_pem`` holds the CA certificates ``ctx`` trusts."""
    return set(_certificates(ca_pem.decode("ascii", "replace"))) == set(ctx.get_ca_certs(binary_form=True))


def _pem_of(settings: Optional[dict]) -> Optional[tuple]:
    """The PEM of ``settings`` as bytes: (certificate chain, key, CA); a key of ``None`` is
    in the certificate's file, as Dask allows."""
    if settings is None or not settings.get("cert") or not settings.get("ca_file"):
        return None

    def pem(value: str) -> bytes:
        if "\n" in value:  # the PEM itself, as Security takes it too
            return value.encode()
        with open(value, "rb") as f:
            return f.read()

    cert = pem(settings["cert"])
    key = pem(settings["key"]) if settings.get("key") else cert
    return cert, key, pem(settings["ca_file"])

"""The reference node's TLS (spec §3.1) on Python's ``ssl``: the TLS handshake on the
event loop, and what a failed handshake means, said so that its reader knows what to fix.

It wraps a socket in a context of :class:`handoff.tls.TlsConfig`, drives the handshake
with the loop's reader and writer callbacks (no thread, no blocking call) and turns an
:class:`ssl.SSLError` into a :class:`~handoff.errors.TlsError` that names the cause. The
node decides when to call it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Optional

from handoff.errors import TlsError
from handoff.tls import refused_plain, required_by

__all__ = [
    "wrap",
    "run_handshake",
    "peek_first_byte",
    "explain",
    "PREAMBLE_FIRST_BYTE",
    "TLS_HANDSHAKE_BYTE",
    "TLS_REQUIRED_MESSAGE",
    "refused_plain",
    "required_by",
]

#: The message of the ``error`` a node that requires TLS sends a plain peer (vector
#: ``error-tls-required``; the engine sends the same words, ``handoff_proto::tls``).
TLS_REQUIRED_MESSAGE = "this node requires TLS: connect with TLS on (a certificate, its key and the cluster's CA)"
#: The first byte of a TLS client's first record (a handshake record).
TLS_HANDSHAKE_BYTE = 0x16
#: The first byte of a preamble (``H`` of the magic).
PREAMBLE_FIRST_BYTE = 0x48

#: What to set to fix each side's configuration, in the words of both APIs.
_HOW_TO_TRUST = "the CA this node trusts (TlsConfig.from_files(ca=...), --tls-ca)"
_HOW_TO_NAME = "the name to expect (TlsConfig(server_name=...), --tls-server-name)"


def wrap(ctx: ssl.SSLContext, sock: socket.socket, server_side: bool, server_hostname: Optional[str]) -> ssl.SSLSocket:
    """``sock`` (connected, non-blocking) as a TLS socket whose handshake has not started;
    the TLS socket takes over the descriptor (``sock`` is detached)."""
    return ctx.wrap_socket(
        sock,
        server_side=server_side,
        server_hostname=None if server_side else server_hostname,
        do_handshake_on_connect=False,
    )


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def _wait(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    fut = loop.create_future()
    if write:
        loop.add_writer(fd, _wake, fut)
    else:
        loop.add_reader(fd, _wake, fut)
    try:
        await fut
    finally:
        try:
            if write:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)
        except (ValueError, OSError):
            pass


async def run_handshake(sock: ssl.SSLSocket) -> None:
    """Drives the TLS handshake of a non-blocking ``sock`` to its end, waiting on the loop.

    Unbounded in time: the caller bounds it (the node's handshake timeout). Raises what
    :mod:`ssl` raises; :func:`explain` says what it means."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            await _wait(loop, fd, False)
        except ssl.SSLWantWriteError:
            await _wait(loop, fd, True)


async def peek_first_byte(sock: socket.socket) -> Optional[int]:
    """The first byte the peer sent, left in the socket (``None``: it closed first).

    Unbounded in time: the caller bounds it."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            await _wait(loop, sock.fileno(), False)
            continue
        return data[0] if data else None


# OpenSSL's verify codes (X509_V_ERR_*) that this module explains.
_EXPIRED = 10
_NOT_YET_VALID = 9
_UNTRUSTED = {2, 18, 19, 20, 21, 24, 27, 28}
_NAME_MISMATCH = {62, 63, 64}

# Reasons of a record that is not TLS: the peer answered in plain text.
_NOT_TLS = {
    "WRONG_VERSION_NUMBER",
    "PACKET_LENGTH_TOO_LONG",
    "RECORD_LAYER_FAILURE",
    "UNKNOWN_PROTOCOL",
    "HTTP_REQUEST",
}


def _alert(reason: str) -> Optional[str]:
    """What an alert the peer sent says about our certificate, or ``None`` if it is no alert."""
    if "ALERT" not in reason:
        return None
    if reason.endswith("UNKNOWN_CA"):
        return f"it does not trust the CA that signed our certificate; give it {_HOW_TO_TRUST}, or us a certificate signed by the cluster's CA"
    if reason.endswith("CERTIFICATE_EXPIRED"):
        return "it says our certificate has expired (or is not valid yet by its clock); renew it"
    if reason.endswith("CERTIFICATE_REQUIRED"):
        return "it requires a certificate and we sent none; give this node its certificate and key"
    if reason.endswith(("BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "UNSUPPORTED_CERTIFICATE", "DECRYPT_ERROR")):
        return "it refused our certificate; check that the certificate is signed by the cluster's CA and is valid now"
    if reason.endswith(("PROTOCOL_VERSION", "HANDSHAKE_FAILURE", "INSUFFICIENT_SECURITY")):
        return "it shares no TLS version or cipher with this node (TLS 1.2 at least on both)"
    return f"it sent the alert {reason}"


def explain(err: BaseException, peer: str, server_side: bool, name: Optional[str] = None) -> TlsError:
    """A :class:`TlsError` that says why the TLS handshake with ``peer`` failed and what to fix.

    ``server_side``: whether this node accepted the connection (it then checked the
    connecting peer's certificate); ``name``: the name a connecting node checked."""
    whose = "the certificate the connecting peer presented" if server_side else f"the certificate of {peer}"
    if isinstance(err, ssl.SSLCertVerificationError):
        code = err.verify_code
        detail = err.verify_message
        if code == _EXPIRED:
            msg = f"{whose} has expired ({detail}); renew it (and check both hosts' clocks)"
        elif code == _NOT_YET_VALID:
            msg = f"{whose} is not valid yet ({detail}); check both hosts' clocks, or wait for its start date"
        elif code in _NAME_MISMATCH:
            msg = (
                f"{whose} does not name {name!r}, the name this node checked ({detail}); issue it with "
                f"{name!r} among its subject alternative names (an IP or DNS entry), or set {_HOW_TO_NAME}"
            )
        elif code in _UNTRUSTED:
            msg = (
                f"{whose} is not signed by a CA this node trusts ({detail}); give the peer a certificate "
                f"signed by the cluster's CA, or give this node {_HOW_TO_TRUST}"
            )
        else:
            msg = f"{whose} does not verify: {detail}"
        return TlsError(f"TLS with {peer}: {msg}")
    if isinstance(err, ssl.SSLError):
        reason = getattr(err, "reason", None) or ""
        if reason in _NOT_TLS:
            if server_side:
                return TlsError(f"TLS with {peer}: the connecting peer did not start a TLS handshake ({reason})")
            return TlsError(
                f"TLS with {peer}: the peer does not speak TLS: it answered in plain text ({reason}); "
                "turn TLS on there as well (a node without TLS), or off here"
            )
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return TlsError(
                f"TLS with {peer}: the connecting peer sent no certificate, and this node requires one; "
                "give it a certificate signed by the cluster's CA, and its key"
            )
        said = _alert(reason)
        if said is not None:
            return TlsError(f"TLS with {peer}: the peer refused the TLS handshake: {said} [{reason}]")
        if isinstance(err, ssl.SSLEOFError):
            return _closed(peer, server_side, err)
        return TlsError(f"TLS with {peer}: the TLS handshake failed: {err}")
    if isinstance(err, (ConnectionError, EOFError)):
        return _closed(peer, server_side, err)
    return TlsError(f"TLS with {peer}: the TLS handshake failed: {err}")


def _closed(peer: str, server_side: bool, err: BaseException) -> TlsError:
    if server_side:
        return TlsError(f"TLS with {peer}: the connecting peer closed the connection during the TLS handshake ({err})")
    return TlsError(
        f"TLS with {peer}: the peer closed the connection during the TLS handshake ({err}); it may not "
        "have TLS on, or it refused our certificate (its log says which)"
    )

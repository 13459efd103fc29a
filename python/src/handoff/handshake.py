"""The connection handshake (spec §5.1): preambles, hellos, proofs of the secret, ready.

Symmetric: each side sends before it waits on the previous read, so it cannot deadlock.
On any failure the peer is told why (an ``error`` message, best effort) unless it was
the peer that sent an ``error``.

Before the handshake completes a side accepts little (§5.1): headers of at most the
handshake header limit (64 KiB, ``OurSide.limits``), no file descriptors (``bad-shm``),
a hello whose ``caps`` include ``inline``; the node may refuse the connection after the
preambles (``overloaded``, ``OurSide.admit``) and refuses, in step 6, a node id that is
already connected from another process (``OurSide.check_peer``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from typing import Callable, Optional

from . import wire
from .errors import AuthenticationError, PeerClosed, PeerRefused
from .transport import Transport

__all__ = ["OurSide", "handshake", "send_error", "IMPLEMENTATION"]

IMPLEMENTATION = "handoff-py/0.1.0"


@dataclass
class OurSide:
    node_id: str
    name: str
    host_id: str
    process_id: str
    caps: list
    secret: bytes
    limits: wire.Limits
    listen: Optional[str] = None
    unix: Optional[str] = None
    #: Called after the preambles: ``(code, message)`` refuses the connection, ``None`` admits it.
    admit: Optional[Callable[[], Optional[tuple]]] = None
    #: Called in step 6 with the peer's verified hello: a message refuses it (``handshake``).
    check_peer: Optional[Callable[[wire.Hello], Optional[str]]] = None


async def send_error(transport: Transport, code: str, message: str) -> None:
    """Sends an ``error`` message, best effort (a second at most), before the connection closes."""
    data = wire.encode_message(wire.Error(code, message))
    transport.error_sent = True
    try:
        await asyncio.wait_for(transport.send([data]), 1.0)
    except Exception:
        pass


async def _fail(transport: Transport, err: wire.WireError) -> None:
    await send_error(transport, err.code, err.message)
    if err.code == "auth-failed":
        raise AuthenticationError(
            f"authentication failed with {transport.label}: the peer's proof does not match our cluster secret "
            "(wrong secret?)"
        ) from err
    raise err


async def _check_fds(transport: Transport) -> None:
    """File descriptors that came with handshake bytes are ``bad-shm`` (§5.1)."""
    problem = transport.take_fd_error()
    if problem is None and transport.fds_arrived_by(transport.consumed):
        problem = "file descriptors arrived before the connection was established"
    if problem is not None:
        transport.close_fds()
        await _fail(transport, wire.WireError("bad-shm", f"bad shared-memory descriptor: {problem}"))


async def _read(transport: Transport, limits: wire.Limits, step: str):
    try:
        data = await transport.read_header(limits)
    except wire.WireError as e:
        await _fail(transport, e)
    if data is None:
        raise PeerClosed(f"{transport.label} closed the connection during the handshake (waiting for {step})")
    await _check_fds(transport)
    try:
        return data, wire.decode_header(data, limits)
    except wire.WireError as e:
        await _fail(transport, e)


async def _expect(transport: Transport, header, step: str) -> None:
    if isinstance(header, wire.Error):
        if header.code == "auth-failed":
            raise AuthenticationError(
                f"authentication failed: {transport.label} refused our proof: {header.msg} [auth-failed] "
                "(do both sides use the same cluster secret?)"
            )
        raise PeerRefused(transport.label, header.code, header.msg)
    await _fail(
        transport, wire.WireError("handshake", f"handshake failed: expected {step}, got a {header.kind!r} header")
    )


async def handshake(transport: Transport, ours: OurSide) -> tuple[wire.Hello, bytes]:
    """Runs the handshake; returns the peer's hello and its exact header bytes."""
    # Version 1 only, as before: this handshake sends hellos (version 2 comes in its own commit).
    await transport.send([wire.V1_ONLY.encode()])
    try:
        peer_preamble = wire.Preamble.decode(await transport.read_preamble())
        version = wire.V1_ONLY.negotiate(peer_preamble)
    except wire.WireError as e:
        await _fail(transport, e)
    await _check_fds(transport)
    if ours.admit is not None:
        refusal = ours.admit()
        if refusal is not None:
            await _fail(transport, wire.WireError(*refusal))

    nonce = secrets.token_bytes(32)
    hello = wire.Hello(
        node=ours.node_id,
        name=ours.name,
        host=ours.host_id,
        pid=os.getpid(),
        proc=ours.process_id,
        lang="python",
        impl=IMPLEMENTATION,
        v=version,
        caps=list(ours.caps),
        nonce=nonce,
        listen=ours.listen,
        unix=ours.unix,
    )
    own_hello = wire.encode_header(hello)
    await transport.send([wire.frame_header(own_hello)])

    # Until the connection is established, headers are bounded by the handshake limit (§5.1, §9).
    limits = ours.limits.during_handshake()
    peer_hello_bytes, peer_hello = await _read(transport, limits, "hello")
    if not isinstance(peer_hello, wire.Hello):
        await _expect(transport, peer_hello, "hello")
    if peer_hello.nonce == nonce:
        await _fail(
            transport,
            wire.WireError("handshake", "handshake failed: the peer echoed our own nonce (a reflected handshake)"),
        )
    if peer_hello.v != version:
        await _fail(
            transport,
            wire.WireError(
                "handshake",
                f"handshake failed: peer's hello says version {peer_hello.v}, the preambles chose {version}",
            ),
        )
    if "inline" not in peer_hello.caps:
        await _fail(
            transport,
            wire.WireError(
                "handshake",
                f"handshake failed: the peer's hello announces capabilities {peer_hello.caps!r} without 'inline', "
                "which every v1 node announces",
            ),
        )

    mac = wire.proof(ours.secret, own_hello, peer_hello_bytes)
    await transport.send([wire.encode_message(wire.Auth(mac))])
    _, peer_auth = await _read(transport, limits, "auth")
    if not isinstance(peer_auth, wire.Auth):
        await _expect(transport, peer_auth, "auth")
    try:
        wire.verify(ours.secret, peer_auth.mac, peer_hello_bytes, own_hello)
    except wire.WireError as e:
        await _fail(transport, e)
    if ours.check_peer is not None:
        reason = ours.check_peer(peer_hello)
        if reason is not None:
            await _fail(transport, wire.WireError("handshake", f"handshake failed: {reason}"))

    await transport.send([wire.encode_message(wire.Ready())])
    _, ready = await _read(transport, limits, "ready")
    if not isinstance(ready, wire.Ready):
        await _expect(transport, ready, "ready")
    return peer_hello, peer_hello_bytes

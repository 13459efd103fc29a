"""The connection handshake: preambles, the sequence of the negotiated version, ready.

Version 2 (spec §5.4, the default): challenges, proofs over both preambles and both
challenges (§5.5), and only then the idents, so that a peer that has not proven the
secret learns nothing about this node but a nonce. Version 1 (§5.1): hellos, which carry
the identity before any proof, then proofs over them; run only with a peer that speaks
nothing newer, when the node accepts v1 peers (``OurSide.preamble``).

Symmetric: each side sends before it waits on the previous read, so it cannot deadlock.
On any failure the peer is told why (an ``error`` message, best effort) unless it was
the peer that sent an ``error``; an ``error`` sent before the peer's proof is verified
names neither this node nor its addresses.

Before the handshake completes a side accepts little (§5.1): headers of at most the
handshake header limit (64 KiB, ``OurSide.limits``), no file descriptors (``bad-shm``),
a peer whose ``caps`` include ``inline``; the node may refuse the connection after the
preambles (``overloaded``, ``OurSide.admit``) and refuses, before ``ready``, a node id that
is already connected from another process (``OurSide.check_peer``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from typing import Callable, Optional

from . import wire
from .errors import AuthenticationError, PeerClosed, PeerRefused, TlsError
from .transport import Transport

__all__ = ["OurSide", "Handshaken", "handshake", "send_error", "IMPLEMENTATION"]

IMPLEMENTATION = "handoff-py/0.1.0"


@dataclass
class Handshaken:
    """What the handshake learnt about the peer."""

    #: What the peer said about itself: its v2 ident, or its v1 hello's identity fields.
    ident: wire.Ident
    #: The protocol version the preambles chose.
    version: int


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
    #: Called before ``ready`` with the peer's verified identity (its ident, or its hello's
    #: fields in v1): a message refuses it (``handshake``).
    check_peer: Optional[Callable[[wire.Ident], Optional[str]]] = None
    #: The preamble we send: version 2 only by default, 1..=2 to accept v1 peers (§3).
    preamble: wire.Preamble = wire.OUR_PREAMBLE


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
        if header.code == "tls-required":
            raise TlsError(
                f"{transport.label} requires TLS and refused this plain connection: {header.msg} [tls-required]; "
                "turn TLS on for this node (Node(tls=TlsConfig.from_files(cert, key, ca)), or the worker's "
                "--tls-cert, --tls-key and --tls-ca)",
                code="tls-required",
            )
        raise PeerRefused(transport.label, header.code, header.msg)
    await _fail(
        transport, wire.WireError("handshake", f"handshake failed: expected {step}, got a {header.kind!r} header")
    )


def _fail_with(code: str, message: str) -> wire.WireError:
    return wire.WireError(code, f"handshake failed: {message}" if code == "handshake" else message)


async def _check_caps(transport: Transport, caps: list) -> None:
    """The check on the peer's capabilities (v1: on its hello, step 3; v2: on its ident, step 7)."""
    if "inline" not in caps:
        await _fail(
            transport,
            _fail_with(
                "handshake", f"the peer announces capabilities {caps!r} without 'inline', which every node announces"
            ),
        )


async def _check_nonce_and_version(transport: Transport, what: str, nonce: bytes, v: int, ours: bytes, version: int):
    """Step 3: a reflected nonce, then the version (§5.1, §5.4)."""
    if nonce == ours:
        await _fail(transport, _fail_with("handshake", "the peer echoed our own nonce (a reflected handshake)"))
    if v != version:
        await _fail(
            transport, _fail_with("handshake", f"peer's {what} says version {v}, the preambles chose {version}")
        )


async def _v1(transport: Transport, ours: OurSide, ident: wire.Ident, limits: wire.Limits) -> wire.Ident:
    """Version 1, steps 2–5 (§5.1): hellos, then proofs over them; returns the peer's identity."""
    nonce = secrets.token_bytes(32)
    own_hello = wire.encode_header(ident.hello(1, nonce))
    await transport.send([wire.frame_header(own_hello)])
    peer_hello_bytes, peer_hello = await _read(transport, limits, "hello")
    if not isinstance(peer_hello, wire.Hello):
        await _expect(transport, peer_hello, "hello")
    await _check_nonce_and_version(transport, "hello", peer_hello.nonce, peer_hello.v, nonce, 1)
    await _check_caps(transport, peer_hello.caps)

    mac = wire.proof(ours.secret, own_hello, peer_hello_bytes)
    await transport.send([wire.encode_message(wire.Auth(mac))])
    _, peer_auth = await _read(transport, limits, "auth")
    if not isinstance(peer_auth, wire.Auth):
        await _expect(transport, peer_auth, "auth")
    try:
        wire.verify(ours.secret, peer_auth.mac, peer_hello_bytes, own_hello)
    except wire.WireError as e:
        await _fail(transport, e)
    return peer_hello.ident()


async def _v2(
    transport: Transport, ours: OurSide, ident: wire.Ident, limits: wire.Limits, preambles: tuple
) -> wire.Ident:
    """Version 2, steps 2–7 (§5.4): challenges, proofs, then idents; returns the peer's ident."""
    own_preamble, peer_preamble = preambles
    nonce = secrets.token_bytes(32)
    own_challenge = wire.encode_header(wire.Challenge(2, nonce))
    await transport.send([wire.frame_header(own_challenge)])
    peer_challenge_bytes, peer_challenge = await _read(transport, limits, "challenge")
    if not isinstance(peer_challenge, wire.Challenge):
        await _expect(transport, peer_challenge, "challenge")
    await _check_nonce_and_version(transport, "challenge", peer_challenge.nonce, peer_challenge.v, nonce, 2)

    mac = wire.proof_v2(ours.secret, own_preamble, peer_preamble, own_challenge, peer_challenge_bytes)
    await transport.send([wire.encode_message(wire.Auth(mac))])
    _, peer_auth = await _read(transport, limits, "auth")
    if not isinstance(peer_auth, wire.Auth):
        await _expect(transport, peer_auth, "auth")
    try:
        wire.verify_v2(ours.secret, peer_auth.mac, peer_preamble, own_preamble, peer_challenge_bytes, own_challenge)
    except wire.WireError as e:
        await _fail(transport, e)

    # The peer proved the secret: now, and only now, say who we are.
    await transport.send([wire.encode_message(ident)])
    _, peer_ident = await _read(transport, limits, "ident")
    if not isinstance(peer_ident, wire.Ident):
        await _expect(transport, peer_ident, "ident")
    await _check_caps(transport, peer_ident.caps)
    return peer_ident


async def handshake(transport: Transport, ours: OurSide) -> Handshaken:
    """Runs the handshake; returns what the peer said about itself and the version."""
    own_preamble = ours.preamble.encode()
    await transport.send([own_preamble])
    peer_preamble = b""
    try:
        peer_preamble = bytes(await transport.read_preamble())
        version = ours.preamble.negotiate(wire.Preamble.decode(peer_preamble))
    except wire.WireError as e:
        if e.code == "bad-magic" and peer_preamble[:1] == b"\x16":
            # A TLS handshake record (§3.1): say so, in the log and to the peer.
            e = wire.WireError(
                "bad-magic",
                f"{e.message}; the first byte 0x16 starts a TLS handshake: the peer speaks TLS and this node "
                "has no TLS (turn TLS on here too, or off there)",
            )
        await _fail(transport, e)
    await _check_fds(transport)
    if ours.admit is not None:
        refusal = ours.admit()
        if refusal is not None:
            await _fail(transport, wire.WireError(*refusal))

    ident = wire.Ident(
        node=ours.node_id,
        name=ours.name,
        host=ours.host_id,
        pid=os.getpid(),
        proc=ours.process_id,
        lang="python",
        impl=IMPLEMENTATION,
        caps=list(ours.caps),
        listen=ours.listen,
        unix=ours.unix,
    )
    # Until the connection is established, headers are bounded by the handshake limit (§5.1, §9).
    limits = ours.limits.during_handshake()
    if version == 1:
        peer = await _v1(transport, ours, ident, limits)
    else:
        peer = await _v2(transport, ours, ident, limits, (own_preamble, peer_preamble[:16]))
    if ours.check_peer is not None:
        reason = ours.check_peer(peer)
        if reason is not None:
            await _fail(transport, _fail_with("handshake", reason))

    await transport.send([wire.encode_message(wire.Ready())])
    _, ready = await _read(transport, limits, "ready")
    if not isinstance(ready, wire.Ready):
        await _expect(transport, ready, "ready")
    return Handshaken(peer, version)

"""The connection handshake: preambles, the sequence of the negotiated version, ready.

Version 3 (spec §5.7, the default): challenges, then proofs bound to the role of each
side and to the whole transcript — the dialer proves first, the acceptor only after it
verified the dialer's proof, over it — and only then the idents. A peer that merely
connects gets no value computed with the secret, and no proof of one role or connection
verifies as another's. A peer challenge that carries a nonce this node recently sent as
a dialer (one of its own dialed handshakes relayed back into it, :mod:`handoff.nonces`)
is refused. Version 2
(§5.4): challenges, symmetric proofs over both preambles and both challenges (§5.5),
then the idents; version 1 (§5.1): hellos, which carry the identity before any proof,
then proofs over them. Both are run only with a peer that speaks nothing newer, when the
node accepts them (``OurSide.preamble``): their proofs can be reflected (§5.6).

Each side sends before it waits on the previous read, so it cannot deadlock. On any
failure the peer is told why (an ``error`` message, best effort) unless it was the peer
that sent an ``error``, or the peer's whole preamble has not arrived (§3: nothing but our
preamble goes to a peer that has not shown it speaks this format); an ``error`` sent
before the peer's proof is verified names neither this node nor its addresses.

Before the handshake completes a side accepts little (§5.1): headers of at most the
handshake header limit (64 KiB, ``OurSide.limits``), reads of exactly the handshake's
bytes and no file descriptors (the kernel closes them unopened, ``bad-shm`` at once: see
:class:`~handoff.transport.Transport`), a peer whose ``caps`` include ``inline``; the node
may refuse the connection after the preambles (``overloaded``, ``OurSide.admit``) and
refuses, before ``ready``, a node id that is already connected from another process
(``OurSide.check_peer``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import dataclass
from typing import Callable, Optional

from . import tls as tls_layer
from . import wire
from handoff.errors import AuthenticationError, PeerClosed, PeerRefused
from .nonces import DialerNonces
from .outgoing import clip
from .transport import Transport

__all__ = ["OurSide", "Handshaken", "handshake", "send_error", "own_ident", "IMPLEMENTATION"]

#: What a Python node says it is in its ident (``impl``, §5.2).
IMPLEMENTATION = "handoff-py/0.1.0"


def own_ident(
    node_id: str, name: str, host_id: str, process_id: str, caps, listen: Optional[str], unix: Optional[str]
) -> wire.Ident:
    """What a node of this implementation says about itself in an ident (§5.2)."""
    return wire.Ident(
        node=node_id,
        name=name,
        host=host_id,
        pid=os.getpid(),
        proc=process_id,
        lang="python",
        impl=IMPLEMENTATION,
        caps=list(caps),
        listen=listen,
        unix=unix,
    )


@dataclass
class Handshaken:
    """What the handshake learnt about the peer."""

    #: What the peer said about itself: its ident (v2, v3), or its v1 hello's identity fields.
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
    #: The preamble we send: version 3 only by default; 2..=3 to accept v2 peers, 1..=3 to
    #: accept v1 peers too (§3).
    preamble: wire.Preamble = wire.OUR_PREAMBLE
    #: Our role on this connection (§1): ``True`` if we accepted it from a listening socket
    #: (the acceptor), ``False`` if we dialed it (the dialer). Version 3 depends on it (§5.7).
    accepted: bool = False
    #: The nonces this node recently sent as a dialer (version 3, §5.7 step 3); ``None``
    #: remembers and checks none.
    dialer_nonces: Optional[DialerNonces] = None

    def ident(self) -> wire.Ident:
        """What this side says about itself in an ident (§5.2)."""
        return own_ident(self.node_id, self.name, self.host_id, self.process_id, self.caps, self.listen, self.unix)


async def send_error(transport: Transport, code: str, message: str, *, before_preamble: bool = False) -> None:
    """Sends an ``error`` message, best effort (a second at most), before the connection closes.

    Nothing is sent to a peer whose whole preamble has not arrived (§3, §11.3): it has not
    shown that it speaks this format. ``before_preamble`` sends it all the same: only for
    the ``tls-required`` answer of §3.1, which a node that requires TLS gives a plain peer
    on the first byte of its preamble."""
    if not (transport.preamble_received or before_preamble):
        return
    data = wire.encode_message(wire.Error(code, clip(message)))  # it may quote the peer: keep it small
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


async def _in_time(transport: Transport) -> None:
    """Fails the handshake with ``timeout`` if its deadline has passed: what is read after it
    is not acted on, whichever of the read and the timer came first (§5.7)."""
    deadline = transport.handshake_deadline
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        await _fail(transport, wire.WireError("timeout", "the handshake did not complete in time"))


async def _read(transport: Transport, limits: wire.Limits, step: str):
    """One handshake message: its exact header bytes and the decoded header. The transport
    reads exactly its bytes and fails at once on file descriptors (§5.1)."""
    try:
        data = await transport.read_header(limits)
    except wire.WireError as e:
        await _fail(transport, e)
    await _in_time(transport)
    if data is None:
        raise PeerClosed(f"{transport.label} closed the connection during the handshake (waiting for {step})")
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
            raise tls_layer.required_by(transport.label, header.msg)
        raise PeerRefused(transport.label, header.code, header.msg)
    await _fail(
        transport, wire.WireError("handshake", f"handshake failed: expected {step}, got a {header.kind!r} header")
    )


def _fail_with(code: str, message: str) -> wire.WireError:
    return wire.WireError(code, f"handshake failed: {message}" if code == "handshake" else message)


async def _check_caps(transport: Transport, caps: list) -> None:
    """The check on the peer's capabilities (v1: on its hello, step 3; v2, v3: on its ident)."""
    if "inline" not in caps:
        await _fail(
            transport,
            _fail_with(
                "handshake", f"the peer announces capabilities {caps!r} without 'inline', which every node announces"
            ),
        )


async def _check_nonce_and_version(
    transport: Transport, what: str, nonce: bytes, v: int, ours: bytes, version: int, dialed=None
) -> None:
    """Step 3, in this order: a reflected nonce; in version 3 a nonce this node sent as a
    dialer (``dialed``, §5.7: one of its own dialed handshakes relayed back into it); then
    the version."""
    if nonce == ours:
        await _fail(transport, _fail_with("handshake", "the peer echoed our own nonce (a reflected handshake)"))
    if dialed is not None and dialed.sent_as_dialer(nonce):
        await _fail(
            transport,
            _fail_with(
                "handshake",
                f"the peer's {what} carries a nonce this node sent when it dialed a peer "
                "(one of its own handshakes relayed back to it)",
            ),
        )
    if v != version:
        await _fail(
            transport, _fail_with("handshake", f"peer's {what} says version {v}, the preambles chose {version}")
        )


async def _read_auth(transport: Transport, limits: wire.Limits) -> bytes:
    _, peer_auth = await _read(transport, limits, "auth")
    if not isinstance(peer_auth, wire.Auth):
        await _expect(transport, peer_auth, "auth")
    return peer_auth.mac


async def _verify(transport: Transport, check: Callable[[], None]) -> None:
    try:
        check()
    except wire.WireError as e:
        await _fail(transport, e)


async def _v1(transport: Transport, ours: OurSide, ident: wire.Ident, limits: wire.Limits, nonce: bytes):
    """Version 1, steps 2–5 (§5.1): hellos, then proofs over them; returns the peer's identity."""
    own_hello = wire.encode_header(wire.hello_of(ident, 1, nonce))
    await transport.send([wire.frame_header(own_hello)])
    peer_hello_bytes, peer_hello = await _read(transport, limits, "hello")
    if not isinstance(peer_hello, wire.Hello):
        await _expect(transport, peer_hello, "hello")
    await _check_nonce_and_version(transport, "hello", peer_hello.nonce, peer_hello.v, nonce, 1)
    await _check_caps(transport, peer_hello.caps)

    mac = wire.proof(ours.secret, own_hello, peer_hello_bytes)
    await transport.send([wire.encode_message(wire.Auth(mac))])
    peer_mac = await _read_auth(transport, limits)
    await _verify(transport, lambda: wire.verify(ours.secret, peer_mac, peer_hello_bytes, own_hello))
    return peer_hello.ident()


async def _challenges(transport: Transport, limits: wire.Limits, version: int, nonce: bytes, dialed=None) -> tuple:
    """Steps 2–3 of versions 2 and 3: our challenge out, the peer's in and checked; returns
    both as header bytes, ours first."""
    own_challenge = wire.encode_header(wire.Challenge(version, nonce))
    await transport.send([wire.frame_header(own_challenge)])
    peer_bytes, peer_challenge = await _read(transport, limits, "challenge")
    if not isinstance(peer_challenge, wire.Challenge):
        await _expect(transport, peer_challenge, "challenge")
    await _check_nonce_and_version(
        transport, "challenge", peer_challenge.nonce, peer_challenge.v, nonce, version, dialed
    )
    return own_challenge, peer_bytes


async def _idents(transport: Transport, ident: wire.Ident, limits: wire.Limits) -> wire.Ident:
    """After the peer's proof verified: our ident out, the peer's in (caps checked)."""
    await transport.send([wire.encode_message(ident)])
    _, peer_ident = await _read(transport, limits, "ident")
    if not isinstance(peer_ident, wire.Ident):
        await _expect(transport, peer_ident, "ident")
    await _check_caps(transport, peer_ident.caps)
    return peer_ident


async def _v2(
    transport: Transport, ours: OurSide, ident: wire.Ident, limits: wire.Limits, preambles: tuple, nonce: bytes
) -> wire.Ident:
    """Version 2, steps 2–7 (§5.4): challenges, proofs, then idents; returns the peer's ident."""
    own_preamble, peer_preamble = preambles
    own_challenge, peer_challenge = await _challenges(transport, limits, 2, nonce)
    mac = wire.proof_v2(ours.secret, own_preamble, peer_preamble, own_challenge, peer_challenge)
    await transport.send([wire.encode_message(wire.Auth(mac))])
    peer_mac = await _read_auth(transport, limits)
    await _verify(
        transport,
        lambda: wire.verify_v2(ours.secret, peer_mac, peer_preamble, own_preamble, peer_challenge, own_challenge),
    )
    # The peer proved the secret: now, and only now, say who we are.
    return await _idents(transport, ident, limits)


async def _v3(
    transport: Transport, ours: OurSide, ident: wire.Ident, limits: wire.Limits, preambles: tuple
) -> wire.Ident:
    """Version 3, steps 2–6 (§5.7), by role; returns the peer's ident."""
    own_preamble, peer_preamble = preambles
    dialed = ours.dialer_nonces
    # Step 2: a dialer's nonce is remembered for the node's window.
    nonce = dialed.fresh(not ours.accepted) if dialed is not None else secrets.token_bytes(32)
    own_challenge, peer_challenge = await _challenges(transport, limits, 3, nonce, dialed)
    secret = ours.secret
    if ours.accepted:
        # The acceptor proves second, over the dialer's proof, and only once it verified it.
        transcript = wire.transcript_v3(peer_preamble, own_preamble, peer_challenge, own_challenge)
        dialer_mac = await _read_auth(transport, limits)
        await _verify(transport, lambda: wire.verify_dialer_proof(secret, dialer_mac, transcript))
        mac = wire.acceptor_proof(secret, transcript, dialer_mac)
        await transport.send([wire.encode_message(wire.Auth(mac))])
    else:
        transcript = wire.transcript_v3(own_preamble, peer_preamble, own_challenge, peer_challenge)
        mac = wire.dialer_proof(secret, transcript)
        await transport.send([wire.encode_message(wire.Auth(mac))])
        acceptor_mac = await _read_auth(transport, limits)
        await _verify(transport, lambda: wire.verify_acceptor_proof(secret, acceptor_mac, transcript, mac))
    # The peer proved the secret: now, and only now, say who we are.
    return await _idents(transport, ident, limits)


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
    await _in_time(transport)
    if ours.admit is not None:
        refusal = ours.admit()
        if refusal is not None:
            await _fail(transport, wire.WireError(*refusal))

    ident = ours.ident()
    # Until the connection is established, headers are bounded by the handshake limit (§5.1, §9).
    limits = wire.during_handshake(ours.limits)
    preambles = (own_preamble, peer_preamble[:16])
    if version == 1:
        peer = await _v1(transport, ours, ident, limits, secrets.token_bytes(32))
    elif version == 2:
        peer = await _v2(transport, ours, ident, limits, preambles, secrets.token_bytes(32))
    else:
        peer = await _v3(transport, ours, ident, limits, preambles)
    if ours.check_peer is not None:
        reason = ours.check_peer(peer)
        if reason is not None:
            await _fail(transport, _fail_with("handshake", reason))

    await transport.send([wire.encode_message(wire.Ready())])
    _, ready = await _read(transport, limits, "ready")
    if not isinstance(ready, wire.Ready):
        await _expect(transport, ready, "ready")
    transport.established()
    return Handshaken(peer, version)

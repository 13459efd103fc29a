"""Small helpers shared by the tests."""

from __future__ import annotations

import array
import asyncio
import os
import secrets
import socket
import struct
import time

from handoff import wire


async def eventually(check, timeout: float = 5.0, interval: float = 0.05):
    """Awaits ``check()`` (sync or async) until it returns a truthy value; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


# ---------------------------------------------------------------- a raw peer, for misbehaving on purpose


class PeerError(Exception):
    """The peer sent ``error``."""

    def __init__(self, header):
        super().__init__(f"{header.msg} [{header.code}]")
        self.header = header
        self.code = header.code


class RawPeer:
    """A blocking socket that speaks the wire format by hand (run it in a thread)."""

    def __init__(self, addr: str, timeout: float = 5.0):
        if addr.startswith("unix://"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(addr[len("unix://") :])
        else:
            host, port = addr[len("tcp://") :].rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(timeout)
        self.buf = b""

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"stream ended with {len(self.buf)} of {n} bytes")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_header(self):
        n = struct.unpack(">I", self.read_exact(4))[0]
        raw = self.read_exact(n)
        return raw, wire.decode_header(raw)

    def send(self, data: bytes, fds=()) -> None:
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        else:
            self.sock.sendall(data)

    def hello(
        self, name="raw", host="raw-host", nonce=None, caps=("inline", "shm", "ticket"), node=None, proc=None
    ) -> bytes:
        self.node_id = node or secrets.token_hex(16)
        h = wire.Hello(
            node=self.node_id,
            name=name,
            host=host,
            pid=os.getpid(),
            proc=proc or secrets.token_hex(16),
            lang="python",
            impl="raw/0",
            v=1,
            caps=list(caps),
            nonce=nonce or secrets.token_bytes(32),
        )
        return wire.encode_header(h)

    def handshake(self, secret: bytes, **hello_args):
        """The whole handshake; returns the peer's hello (``error`` raises ``PeerError``)."""
        self.send(wire.V1_ONLY.encode())
        wire.Preamble.decode(self.read_exact(16))
        own = self.hello(**hello_args)
        self.send(wire.frame_header(own))
        peer_raw, peer = self.read_header()
        self.send(wire.encode_message(wire.Auth(wire.proof(secret, own, peer_raw))))
        _, auth = self.read_header()
        assert isinstance(auth, wire.Auth), auth
        wire.verify(secret, auth.mac, peer_raw, own)
        self.send(wire.encode_message(wire.Ready()))
        _, ready = self.read_header()
        if isinstance(ready, wire.Error):
            raise PeerError(ready)
        assert isinstance(ready, wire.Ready), ready
        self.handshake_peer = peer
        return peer

    def read_message(self):
        """The next header and, for a ``msg`` or ``pulled``, the bytes of its inline frames."""
        _, h = self.read_header()
        frames = []
        if isinstance(h, wire.Msg):
            frames = [self.read_exact(d.n) for d in h.f if isinstance(d, wire.Inline)]
        elif isinstance(h, wire.Pulled):
            frames = [self.read_exact(h.n)]
        return h, frames

    def expect_error(self):
        """Reads until an `error` header (skipping others); returns it; then expects the end of the stream."""
        while True:
            _, h = self.read_header()
            if isinstance(h, wire.Error):
                break
        try:
            rest = self.sock.recv(1)
        except (ConnectionResetError, socket.timeout):
            rest = b""
        assert rest == b"", "the connection should be closed after an error"
        return h

    def close(self) -> None:
        self.sock.close()

"""A peer without the cluster secret, for the attacks on the handshake (spec §5.6–§5.8).

:class:`Wire` is a blocking socket that keeps every header it reads, so that a test can
say exactly what a victim sent to a peer that proved nothing (:meth:`Wire.kinds`): a
version-3 victim sends such a peer its preamble, its challenge and at most an ``error``
— never an ``auth``, an ``ident`` or a ``ready``. The functions below are the attacks'
steps; the tests in ``test_reflection.py`` (and the Dask test) put them together.
"""

from __future__ import annotations

import array
import socket
import struct
import threading

from handoff_pure import wire

#: What a peer that proved nothing may get from a victim (besides its preamble).
UNPROVEN_KINDS = {"challenge", "error"}


class Wire:
    """One raw connection: what it sends is up to the test, what it reads is kept."""

    def __init__(self, addr=None, sock: socket.socket | None = None, timeout: float = 5.0):
        if sock is None:
            if addr.startswith("unix://"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(addr[len("unix://") :])
            else:
                host, port = addr[len("tcp://") :].rsplit(":", 1)
                sock = socket.create_connection((host, int(port)))
        self.sock = sock
        self.sock.settimeout(timeout)
        self.buf = b""
        self.received = b""
        #: Every header read: (raw bytes, decoded header).
        self.headers: list = []
        self.preamble: bytes | None = None
        self.closed = False

    def send(self, data: bytes, fds=()) -> None:
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        else:
            self.sock.sendall(data)

    def send_header(self, header_bytes: bytes) -> None:
        self.send(wire.frame_header(header_bytes))

    def _more(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        self.buf += data
        self.received += data
        return True

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise EOFError(f"stream ended with {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_preamble(self) -> bytes:
        self.preamble = self.read_exact(16)
        return self.preamble

    def read_header(self):
        """The next header: ``(raw bytes, header)``."""
        n = struct.unpack(">I", self.read_exact(4))[0]
        raw = self.read_exact(n)
        h = wire.decode_header(raw)
        self.headers.append((raw, h))
        return raw, h

    def expect(self, kind: str):
        raw, h = self.read_header()
        assert h.kind == kind, f"expected {kind}, got {h}"
        return raw, h

    def nothing_for(self, seconds: float) -> bool:
        """Whether no byte arrives for ``seconds`` (and the connection stays open)."""
        if self.buf:
            return False
        self.sock.settimeout(seconds)
        try:
            got = self._more()
        except socket.timeout:
            return True
        finally:
            self.sock.settimeout(5.0)
        return False if got else False

    def read_to_end(self, timeout: float = 5.0) -> None:
        """Reads (and keeps) every header until the victim closes the connection."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if len(self.buf) >= 4:
                    n = struct.unpack(">I", self.buf[:4])[0]
                    if len(self.buf) >= 4 + n:
                        self.read_header()
                        continue
                if not self._more():
                    return
        except socket.timeout:
            raise AssertionError(f"the victim did not close the connection within {timeout} s") from None

    def kinds(self) -> list:
        return [h.kind for _, h in self.headers]

    def error_code(self) -> str | None:
        codes = [h.code for _, h in self.headers if isinstance(h, wire.Error)]
        return codes[-1] if codes else None

    def assert_unproven(self, what: str) -> None:
        """The victim sent nothing a peer that proved nothing must not get (§5.8)."""
        got = self.kinds()
        assert set(got) <= UNPROVEN_KINDS, f"{what}: the attacker got {got}"
        for kind in ("auth", "ident", "ready", "hello"):
            assert kind not in got, f"{what}: the attacker got a {kind}"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def opened(addr: str, preamble: bytes = wire.OUR_PREAMBLE.encode()) -> Wire:
    """A connection that sent ``preamble`` and read the victim's preamble and challenge."""
    w = Wire(addr)
    w.send(preamble)
    w.read_preamble()
    w.expect("challenge")
    return w


def challenge_of(w: Wire) -> bytes:
    """The raw bytes of the first challenge ``w`` read."""
    return next(raw for raw, h in w.headers if isinstance(h, wire.Challenge))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pump(a: socket.socket, b: socket.socket) -> None:
    """Copies ``a`` to ``b`` until ``a`` ends (a thread of a byte relay)."""
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def relay(first: bytes, dialed: socket.socket, to_addr: str, drop: int) -> tuple:
    """Relays ``dialed`` (a connection the victim opened to us) byte for byte to
    ``to_addr``: ``first`` (what the victim sent already) goes first, and the first
    ``drop`` bytes the other node sends (its preamble, which the victim already got from
    us, the same 16 bytes) are dropped. Returns the two relay threads."""
    host, port = to_addr[len("tcp://") :].rsplit(":", 1)
    up = socket.create_connection((host, int(port)))
    up.settimeout(10)
    up.sendall(first)
    got = b""
    while len(got) < drop:
        got += up.recv(drop - len(got))
    up.settimeout(None)
    dialed.settimeout(None)
    threads = [
        threading.Thread(target=pump, args=(dialed, up), daemon=True),
        threading.Thread(target=pump, args=(up, dialed), daemon=True),
    ]
    for t in threads:
        t.start()
    return up, threads

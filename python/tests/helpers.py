"""Small helpers shared by the tests."""

from __future__ import annotations

import array
import asyncio
import http.server
import os
import secrets
import socket
import struct
import time

from handoff_pure import wire


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
    """A blocking socket that speaks the wire format by hand (run it in a thread).

    It handshakes as the dialer of protocol version 3, the default of every node (spec
    §5.7), or with ``version=2`` or ``version=1`` as a peer that speaks only that version
    (§5.4, §5.1), which only a node that accepts it lets in. ``received`` keeps every
    byte read, to check what a node revealed.
    """

    def __init__(self, addr: str, timeout: float = 5.0):
        if addr.startswith("unix://"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(addr[len("unix://") :])
        else:
            host, port = addr[len("tcp://") :].rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)))
        self.sock.settimeout(timeout)
        self.buf = b""
        self.received = b""

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"stream ended with {len(self.buf)} of {n} bytes")
            self.buf += data
            self.received += data
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

    def ident(self, name="raw", host="raw-host", caps=("inline", "shm", "ticket"), node=None, proc=None) -> wire.Ident:
        """Who this raw peer says it is (a fresh node id unless ``node`` is given)."""
        self.node_id = node or secrets.token_hex(16)
        return wire.Ident(
            node=self.node_id,
            name=name,
            host=host,
            pid=os.getpid(),
            proc=proc or secrets.token_hex(16),
            lang="python",
            impl="raw/0",
            caps=list(caps),
        )

    def hello(self, nonce=None, **ident_args) -> bytes:
        """A version-1 hello's header bytes."""
        return wire.encode_header(wire.hello_of(self.ident(**ident_args), 1, nonce or secrets.token_bytes(32)))

    def challenge(self, nonce=None, v: int = 3) -> bytes:
        """A challenge's header bytes (version 3 unless ``v`` says otherwise)."""
        return wire.encode_header(wire.Challenge(v, nonce or secrets.token_bytes(32)))

    def _expect(self, header, kind):
        if isinstance(header, wire.Error):
            raise PeerError(header)
        assert header.kind == kind, header
        return header

    def handshake(self, secret: bytes, version: int = 3, **ident_args):
        """The whole handshake, as the dialer; returns the peer's identity (``error`` raises ``PeerError``)."""
        if version == 1:
            return self._handshake_v1(secret, **ident_args)
        if version == 3:
            return self._handshake_v3(secret, **ident_args)
        own_preamble = wire.V2_DEFAULT.encode()
        self.send(own_preamble)
        own = self.challenge(v=2)
        self.send(wire.frame_header(own))
        peer_preamble = self.read_exact(16)
        wire.Preamble.decode(peer_preamble)
        peer_raw, peer = self.read_header()
        self._expect(peer, "challenge")
        mac = wire.proof_v2(secret, own_preamble, peer_preamble, own, peer_raw)
        self.send(wire.encode_message(wire.Auth(mac)))
        _, auth = self.read_header()
        self._expect(auth, "auth")
        wire.verify_v2(secret, auth.mac, peer_preamble, own_preamble, peer_raw, own)
        self.send(wire.encode_message(self.ident(**ident_args)))
        _, ident = self.read_header()
        self._expect(ident, "ident")
        self.send(wire.encode_message(wire.Ready()))
        _, ready = self.read_header()
        self._expect(ready, "ready")
        self.handshake_peer = ident
        return ident

    def _handshake_v3(self, secret: bytes, **ident_args):
        own_preamble = wire.OUR_PREAMBLE.encode()
        self.send(own_preamble)
        own = self.challenge()
        self.send(wire.frame_header(own))
        peer_preamble = self.read_exact(16)
        wire.Preamble.decode(peer_preamble)
        peer_raw, peer = self.read_header()
        self._expect(peer, "challenge")
        transcript = wire.transcript_v3(own_preamble, peer_preamble, own, peer_raw)
        mac = wire.dialer_proof(secret, transcript)
        self.send(wire.encode_message(wire.Auth(mac)))
        _, auth = self.read_header()
        self._expect(auth, "auth")
        wire.verify_acceptor_proof(secret, auth.mac, transcript, mac)
        self.send(wire.encode_message(self.ident(**ident_args)))
        _, ident = self.read_header()
        self._expect(ident, "ident")
        self.send(wire.encode_message(wire.Ready()))
        _, ready = self.read_header()
        self._expect(ready, "ready")
        self.handshake_peer = ident
        #: What this handshake sent and received, for tests that replay it.
        self.transcript = {"preamble": own_preamble, "challenge": own, "mac": mac, "peer_mac": auth.mac}
        return ident

    def _handshake_v1(self, secret: bytes, **ident_args):
        self.send(wire.V1_ONLY.encode())
        wire.Preamble.decode(self.read_exact(16))
        own = self.hello(**ident_args)
        self.send(wire.frame_header(own))
        peer_raw, peer = self.read_header()
        self._expect(peer, "hello")
        self.send(wire.encode_message(wire.Auth(wire.proof(secret, own, peer_raw))))
        _, auth = self.read_header()
        self._expect(auth, "auth")
        wire.verify(secret, auth.mac, peer_raw, own)
        self.send(wire.encode_message(wire.Ready()))
        _, ready = self.read_header()
        self._expect(ready, "ready")
        self.handshake_peer = peer.ident()
        return self.handshake_peer

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


class RangeHTTPHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server that answers Range requests (as object_store's HTTP store asks),
    counts the GETs of each path and can hold each GET back a while (to make fills overlap)."""

    gets: dict = {}
    get_delay = 0.0
    #: (monotonic start, end) of each GET served.
    spans: list = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        RangeHTTPHandler.gets[self.path] = RangeHTTPHandler.gets.get(self.path, 0) + 1
        began = time.monotonic()
        time.sleep(RangeHTTPHandler.get_delay)
        super().do_GET()
        RangeHTTPHandler.spans.append((began, time.monotonic()))

    def send_head(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        f = open(path, "rb")
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start, end = int(first), min(int(last) if last else size - 1, size - 1)
            f.seek(start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self._left = end - start + 1
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self._left = size
        self.send_header("Last-Modified", self.date_time_string(int(os.path.getmtime(path))))
        self.send_header("ETag", f'"{size}"')
        self.end_headers()
        return f

    def copyfile(self, source, outputfile):
        outputfile.write(source.read(self._left))


# ---------------------------------------------------------------- real servers and Dask processes

#: Credentials of the S3-compatible test server (moto accepts any).
S3_KEYS = {"region": "us-east-1", "access_key_id": "k", "secret_access_key": "s"}


def start_moto():
    """moto's S3-compatible server on loopback: ``(server, endpoint)``; ``server.stop()`` ends it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def s3_put(endpoint: str, bucket: str, objects: dict) -> None:
    """Creates ``bucket`` on the server at ``endpoint`` and puts ``objects`` ({key: bytes}) in it."""
    import boto3  # moto's own dependency

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=S3_KEYS.get("region", "us-east-1"),
        aws_access_key_id=S3_KEYS.get("access_key_id", "k"),
        aws_secret_access_key=S3_KEYS.get("secret_access_key", "s"),
    )
    s3.create_bucket(Bucket=bucket)
    for key, data in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)


def dask_cli(*args: str, env: dict, log):
    """``dask ARGS…`` (the command of this interpreter's environment), its stderr to ``log``."""
    import subprocess
    import sys
    from pathlib import Path

    dask_bin = Path(sys.executable).with_name("dask")
    return subprocess.Popen(
        [str(dask_bin), *args], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), stdin=subprocess.DEVNULL
    )


async def start_dask_scheduler(tmp_path, env: dict):
    """``dask scheduler --protocol handoff`` on loopback: ``(process, address)``."""
    import json

    scheduler_file = tmp_path / "scheduler.json"
    args = ("--protocol", "handoff", "--host", "127.0.0.1", "--port", "0", "--no-dashboard")
    proc = dask_cli(
        "scheduler", *args, "--scheduler-file", str(scheduler_file), env=env, log=tmp_path / "scheduler.log"
    )
    for _ in range(600):
        if scheduler_file.exists() and scheduler_file.stat().st_size:
            break
        assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
        await asyncio.sleep(0.1)
    return proc, json.loads(scheduler_file.read_text())["address"]


def stop_processes(procs: list) -> None:
    """SIGTERM to each (newest first), then waits; kills what does not end within 30 s."""
    import signal
    import subprocess

    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def mapping_of(x):
    """The shared-memory mapping (:class:`handoff.shmmap.Region`) a received view lies in,
    following ``.obj`` and ``.base``; ``None`` if it lies in none."""
    from handoff.shmmap import Region

    while x is not None and not isinstance(x, Region):
        x = getattr(x, "obj", None) if isinstance(x, memoryview) else getattr(x, "base", None)
    return x


def inode_of(frame) -> tuple:
    """``(device, inode)`` of the segment behind a frozen shared frame (``handoff.shm.SharedFrame``)."""
    st = os.fstat(frame.fd)
    return st.st_dev, st.st_ino

"""TLS between hosts (spec §3.1): Python nodes on loopback with certificates made here."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import numpy as np
from handoff import Bounds, Buffer, Node, PeerClosed, TlsConfig, TlsError
from handoff_pure import wire
from handoff.tickets import digest
from handoff_pure.tls import TLS_REQUIRED_MESSAGE
from conftest import SECRET as CHILD_SECRET
from helpers import eventually
from tls_certs import Pki, make_pki

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
SECRET = b"tls secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def config(pki: Pki, which: str = "a", ca=None, server_name=None) -> TlsConfig:
    c = getattr(pki, which)
    return TlsConfig.from_files(c.cert, c.key, ca or pki.ca, server_name=server_name)


def node(name: str, tls=None, secret_override=None, **kw) -> Node:
    kw.setdefault("listen", "127.0.0.1:0")
    kw.setdefault("host_id", f"host-{name}")  # another host: TCP, not the Unix socket
    return Node(name, secret=secret_override or SECRET, tls=tls, **kw)


async def test_round_trip_over_tls(pki):
    a, b = node("a", config(pki, "a")), node("b", config(pki, "b"))
    async with a, b:
        peer = await b.connect(a.listen_addr)
        assert peer.channel == "tcp" and peer.tls
        payload = os.urandom(3 * MIB + 17)
        await peer.send("t.X", {"d": payload, "small": b"x" * 10})
        env = await a.recv(10)
        assert bytes(env.body["d"]) == payload and env.body["small"] == b"x" * 10
        # and back, on the accepted side
        back = await a.wait_for_peer("b")
        assert back.tls
        await back.send("t.Y", {"d": payload[::-1]})
        assert bytes((await b.recv(10)).body["d"]) == payload[::-1]
        # many small messages, both ways at once
        for i in range(200):
            await peer.send("t.N", {"i": i})
        got = [(await a.recv(10)).body["i"] for _ in range(200)]
        assert got == list(range(200))


async def test_same_host_still_uses_shm(pki):
    a = node("a", config(pki, "a"), host_id="same")
    b = node("b", config(pki, "b"), host_id="same")
    async with a, b:
        peer = await b.connect(a.listen_addr)
        assert peer.channel == "shm" and not peer.tls
        await peer.send("t.X", {"d": os.urandom(MIB)})
        assert len((await a.recv(10)).body["d"]) == MIB
        assert (await a.wait_for_peer("b", channel="shm")).channel == "shm"


async def test_server_certificate_from_another_ca(pki):
    a = node("a", TlsConfig.from_files(pki.foreign.cert, pki.foreign.key, pki.ca))
    b = node("b", config(pki, "b"))
    async with a, b:
        with pytest.raises(TlsError) as e:
            await b.connect(a.listen_addr)
        assert "not signed by a CA this node trusts" in str(e.value), e.value


async def test_client_certificate_from_another_ca(pki, caplog):
    # a trusts only our CA; b presents a certificate of another CA (and trusts ours).
    a = node("a", config(pki, "a"))
    b = node("b", TlsConfig.from_files(pki.foreign.cert, pki.foreign.key, pki.ca))
    async with a, b:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            with pytest.raises(TlsError) as e:
                await b.connect(a.listen_addr)
            assert "refused" in str(e.value) and "CA" in str(e.value), e.value
            assert await eventually(lambda: "not signed by a CA this node trusts" in caplog.text), caplog.text


async def test_a_client_without_certificate_is_refused(pki, caplog):
    """A TLS client that presents no certificate (here Python's ssl, with the cluster's CA
    and nothing else) fails its handshake, and the node says why."""
    a = node("a", config(pki, "a"))

    def bare_client(addr: str) -> BaseException:
        host, port = addr[len("tcp://") :].rsplit(":", 1)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(pki.ca)
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            try:
                with ctx.wrap_socket(raw, server_hostname=host) as s:
                    s.sendall(wire.OUR_PREAMBLE.encode())
                    s.recv(100)  # TLS 1.3: the server's refusal arrives with the first read
                    return AssertionError("the handshake went through without a certificate")
            except (ssl.SSLError, OSError) as e:
                return e

    async with a:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            failed = await asyncio.to_thread(bare_client, a.listen_addr)
            assert isinstance(failed, (ssl.SSLError, OSError)), failed
            assert await eventually(lambda: "sent no certificate" in caplog.text), caplog.text
        assert a.peers == []


@pytest.mark.pure_only("a node with a ready-made ssl context (the engine runs TLS on rustls, from PEM files)")
async def test_client_without_certificate(pki, caplog):
    a = node("a", config(pki, "a"))
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.load_verify_locations(pki.ca)
    b = node("b", TlsConfig(client=bare))
    async with a, b:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            with pytest.raises(TlsError) as e:
                await b.connect(a.listen_addr)
            assert "sent none" in str(e.value), e.value
            assert await eventually(lambda: "sent no certificate" in caplog.text), caplog.text


@pytest.mark.parametrize("which,words", [("expired", "has expired"), ("not_yet", "is not valid yet")])
async def test_certificate_out_of_its_dates(pki, which, words):
    a = node("a", config(pki, which))
    b = node("b", config(pki, "b"))
    async with a, b:
        with pytest.raises(TlsError) as e:
            await b.connect(a.listen_addr)
        assert words in str(e.value), e.value


async def test_expired_client_certificate(pki, caplog):
    a = node("a", config(pki, "a"))
    b = node("b", config(pki, "expired"))
    async with a, b:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            with pytest.raises(TlsError) as e:
                await b.connect(a.listen_addr)
            assert "expired" in str(e.value), e.value
            assert await eventually(lambda: "has expired" in caplog.text), caplog.text


async def test_name_mismatch_and_server_name(pki):
    a = node("a", config(pki, "other_name"))
    async with a:
        b = node("b", config(pki, "b"))
        async with b:
            with pytest.raises(TlsError) as e:
                await b.connect(a.listen_addr)
            assert "does not name '127.0.0.1'" in str(e.value), e.value
        c = node("c", config(pki, "b", server_name="other.example"))
        async with c:
            peer = await c.connect(a.listen_addr)
            assert peer.tls and peer.name == "a"


async def test_plain_peer_gets_tls_required(pki, caplog):
    a = node("a", config(pki, "a"))
    plain = node("plain")
    b = node("b", config(pki, "b"))
    async with a, plain, b:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            with pytest.raises(TlsError) as e:
                await plain.connect(a.listen_addr)
            assert e.value.code == "tls-required"
            assert "requires TLS" in str(e.value) and "tls-required" in str(e.value), e.value
            assert await eventually(lambda: a.tls_refusals == 1)
            assert await eventually(lambda: "connected without TLS" in caplog.text), caplog.text
        # a keeps serving others
        peer = await b.connect(a.listen_addr)
        await peer.send("t.X", {"n": 1})
        assert (await a.recv(5)).body == {"n": 1}


def test_tls_required_bytes_match_the_vector(pki):
    """What a plain peer reads: the node's preamble, then exactly the vector's message."""
    vector = (REPO / "spec" / "vectors" / "error-tls-required.bin").read_bytes()
    assert wire.encode_message(wire.Error("tls-required", TLS_REQUIRED_MESSAGE)) == vector

    async def main():
        a = node("a", config(pki, "a"))
        async with a:
            host, port = a.listen_addr[len("tcp://") :].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(wire.OUR_PREAMBLE.encode())
            got = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return got

    got = asyncio.run(main())
    assert got[: wire.PREAMBLE_LEN] == wire.our_preamble(False).encode()
    assert got[wire.PREAMBLE_LEN :] == vector


async def test_tls_node_to_plain_node(pki, caplog):
    plain = node("plain")
    b = node("b", config(pki, "b"))
    async with plain, b:
        with caplog.at_level(logging.WARNING, logger="handoff"):
            with pytest.raises(TlsError) as e:
                await b.connect(plain.listen_addr)
            assert "does not speak TLS" in str(e.value), e.value
            assert await eventually(lambda: "the peer speaks TLS and this node has no TLS" in caplog.text), caplog.text


async def test_ticket_pulled_over_tls(pki):
    a = node("a", config(pki, "a"), redeem="lazy")
    b = node("b", config(pki, "b"), redeem="lazy")
    c = node("c", config(pki, "b"), redeem="lazy")
    async with a, b, c:
        await b.connect(a.listen_addr)
        to_c = await b.connect(c.listen_addr)
        data = os.urandom(2 * MIB)
        await (await a.wait_for_peer("b")).send("t.X", {"d": data}, by_ticket=True)
        ticket = (await b.recv(5)).body["d"]
        await to_c.send("t.Y", {"d": ticket})
        ticket.release()
        got = (await c.recv(5)).body["d"]
        assert bytes(await got.redeem()) == data  # c dials a by itself, over TLS
        owners = [p for p in c.peers if p.name == "a"]
        assert owners and all(p.tls for p in owners)
        got.release()


async def test_stalled_tls_peer_hits_the_handshake_timeout(pki, caplog):
    bounds = dataclasses.replace(Bounds(), handshake_timeout=0.5)
    a = node("a", config(pki, "a"), bounds=bounds)
    async with a:
        host, port = a.listen_addr[len("tcp://") :].rsplit(":", 1)
        with caplog.at_level(logging.WARNING, logger="handoff"):
            # Starts a TLS handshake (a record header and a few bytes) and stalls.
            s = socket.create_connection((host, int(port)))
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00")
            s.settimeout(5)

            def until_closed() -> bytes:
                got = b""
                while chunk := s.recv(100):
                    got += chunk
                return got

            # Closed by a, not left hanging (after a TLS alert record, or nothing).
            got = await asyncio.to_thread(until_closed)
            assert got == b"" or got[:1] == b"\x15", got
            s.close()
            assert await eventually(lambda: "did not complete within 0.5 s" in caplog.text), caplog.text
        # The connecting side: a listener that accepts and never answers.
        quiet = socket.socket()
        quiet.bind(("127.0.0.1", 0))
        quiet.listen()
        b = node("b", config(pki, "b"), bounds=bounds)
        async with b:
            with pytest.raises(TlsError) as e:
                await asyncio.wait_for(b.connect(f"127.0.0.1:{quiet.getsockname()[1]}"), 5)
            assert "did not complete within 0.5 s" in str(e.value)
        quiet.close()


def test_worker_flags_all_or_none(pki):
    r = subprocess.run(
        [sys.executable, "-m", "handoff.worker", "--name", "w", "--tls-cert", str(pki.a.cert)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert "--tls-cert, --tls-key and --tls-ca" in r.stderr, r.stderr


async def test_worker_with_tls(pki, spawn_py_worker):
    """Worker processes with the TLS flags: a TLS node pings one; a worker without TLS
    connecting to it (``--connect``) fails clearly, naming TLS."""
    c = pki.a
    flags = ["--tls-cert", str(c.cert), "--tls-key", str(c.key), "--tls-ca", str(pki.ca)]
    worker = await spawn_py_worker("py-tls", "--host-id", "worker-host", *flags)
    async with Node("client", secret=CHILD_SECRET, host_id="client-host", tls=config(pki, "b")) as n:
        peer = await n.connect(worker.listen)
        assert peer.tls and peer.name == "py-tls"
        await peer.send("handoff.bench.Ping", {"seq": 1, "data": b"x" * 100})
        env = await n.recv(20)
        assert env.type_name == "handoff.bench.Ping" and env.body == {"seq": 1, "data": b"x" * 100}
    with pytest.raises(AssertionError) as e:
        await spawn_py_worker("py-plain", "--host-id", "plain-host", "--connect", worker.listen)
    assert "requires TLS" in str(e.value) and "--tls-cert" in str(e.value), e.value


# ---------------------------------------------------------------- with the Rust node


async def spawn_tls_rust(spawn_rust, name: str, pki: Pki, cert):
    """``handoff node`` with TLS: ``cert`` (a :class:`tls_certs.Cert`) and the cluster CA."""
    flags = ("--tls-cert", str(cert.cert), "--tls-key", str(cert.key), "--tls-ca", str(pki.ca))
    return await spawn_rust(name, "--host-id", "rust-host", *flags)


async def test_python_and_rust_talk_over_tls_both_ways(pki, spawn_rust, rust_stats):
    rust = await spawn_tls_rust(spawn_rust, "rs-tls", pki, pki.b)
    async with node("py-tls", config(pki, "a"), secret_override=CHILD_SECRET) as py:
        peer = await py.connect(rust.listen)
        assert peer.channel == "tcp" and peer.tls
        # Python -> Rust: the Rust node checks the digest.
        data = np.random.default_rng(3).integers(0, 256, 4 * MIB, dtype=np.uint8)
        await peer.send(
            "handoff.demo.Payload", {"id": 1, "digest": Buffer(digest(data)), "data": data, "prepare_seconds": 0.0}
        )
        env = await py.recv(30)
        assert env.type_name == "handoff.demo.Receipt" and env.body["verified"] is True, env.body
        # Rust -> Python.
        await peer.send("handoff.demo.SendRequest", {"id": 2, "bytes": 4 * MIB})
        env = await py.recv(30)
        assert env.type_name == "handoff.demo.Payload"
        with env:
            assert digest(env.body["data"]) == bytes(env.body["digest"])
    # The Rust node's own client side: `handoff stats` without TLS is refused, clearly.
    with pytest.raises(AssertionError) as e:
        await rust_stats(rust.listen)
    assert "requires TLS" in str(e.value), e.value


async def test_a_plain_python_node_is_told_that_the_rust_node_requires_tls(pki, spawn_rust):
    rust = await spawn_tls_rust(spawn_rust, "rs-tls-req", pki, pki.b)
    async with node("py-plain", secret_override=CHILD_SECRET) as py:
        with pytest.raises(TlsError) as e:
            await py.connect(rust.listen)
        assert e.value.code == "tls-required" and "requires TLS" in str(e.value), e.value


async def test_a_rust_node_with_a_certificate_from_another_ca_is_refused(pki, spawn_rust):
    rust = await spawn_tls_rust(spawn_rust, "rs-foreign", pki, pki.foreign)
    async with node("py-tls2", config(pki, "a"), secret_override=CHILD_SECRET) as py:
        with pytest.raises(TlsError) as e:
            await py.connect(rust.listen)
        assert "CA" in str(e.value), e.value


async def _tls_transport_pair(pki, bounds: Bounds):
    """Two transports over a loopback TCP connection inside TLS (handshakes done)."""
    from handoff_pure import tls as tls_layer
    from handoff_pure.transport import Transport

    listener = socket.create_server(("127.0.0.1", 0))
    near = socket.create_connection(listener.getsockname())
    far, _ = listener.accept()
    listener.close()
    t_near, t_far = Transport(near, "near", bounds), Transport(far, "far", bounds)
    t_near.use_tls(tls_layer.wrap(config(pki, "a").server, t_near.sock, True, None))
    t_far.use_tls(tls_layer.wrap(config(pki, "b").client, t_far.sock, False, "127.0.0.1"))
    await asyncio.wait_for(
        asyncio.gather(tls_layer.run_handshake(t_near.sock), tls_layer.run_handshake(t_far.sock)), 10
    )
    t_near.tls_ready = t_far.tls_ready = True
    return t_near, t_far


async def test_tls_frame_read_record_after_record(pki):
    """A large frame over TLS is read record after record in one loop: every byte in order,
    progress reported as records arrive, bytes read ahead with the header used first; a
    peer that stalls in the middle hits the progress timeout, one that closes ends the read."""
    bounds = dataclasses.replace(Bounds(), progress_timeout=0.5)
    near, far = await _tls_transport_pair(pki, bounds)
    payload = os.urandom(3 * MIB + 5)
    seen = []
    dest = memoryview(bytearray(len(payload)))
    sending = asyncio.ensure_future(far.send([b"head", payload]))
    assert await near._fill(4, "header", True)
    assert near._take(4) == b"head"
    await near.read_into(dest, "frame", seen.append)
    await sending
    assert bytes(dest) == payload
    assert seen == sorted(seen) and seen[-1] == len(payload) and len(seen) > 3 * MIB // (16 << 10) // 2
    # In pieces with pauses shorter than the progress timeout: still whole.
    dest = memoryview(bytearray(100_000))

    async def slowly():
        for at in range(0, 100_000, 25_000):
            await far.send([payload[at : at + 25_000]])
            await asyncio.sleep(0.1)

    await asyncio.gather(near.read_into(dest), slowly())
    assert bytes(dest) == payload[:100_000]
    # Half a frame, then silence: the progress timeout.
    await far.send([payload[:1000]])
    with pytest.raises(wire.WireError) as stalled:
        await near.read_into(memoryview(bytearray(5000)))
    assert stalled.value.code == "timeout"
    # Half a frame, then the peer closes: the read ends with an error, not a hang.
    await far.send([payload[:1000]])
    far.sock.close()
    with pytest.raises((wire.WireError, PeerClosed)):
        await asyncio.wait_for(near.read_into(memoryview(bytearray(5000))), 5)
    await near.aclose()

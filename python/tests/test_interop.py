"""Interop with the real Rust binary: ``handoff node`` and ``handoff stats``.

Python node ↔ Rust node both ways, over TCP (different host ids) and over shared
memory (the same host id, derived the same way on both sides); tickets both ways;
a wrong secret; and a Rust node connecting to the Python worker.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from conftest import SECRET
from handoff import AuthenticationError, Buffer, Node, OwnerLost, Ticket, TicketRefused, as_numpy
from handoff.identity import host_id
from handoff.tickets import digest
from helpers import eventually, mapping_of

MIB = 1 << 20
BIG = 16 * MIB


def payload(id_: int, size: int = BIG) -> dict:
    data = np.random.default_rng(id_).integers(0, 256, size, dtype=np.uint8)
    return {"id": id_, "digest": Buffer(digest(data)), "data": data, "prepare_seconds": 0.0}


async def expect(node: Node, type_name: str, timeout: float = 30):
    env = await node.recv(timeout)
    assert env.type_name == type_name, f"expected {type_name}, got {env.type_name}: {env.body}"
    return env


# ---------------------------------------------------------------- tcp (different host ids)


async def test_tcp_both_ways(spawn_rust):
    rust = await spawn_rust("rs-tcp", "--host-id", "rust-host")
    async with Node("py-tcp", secret=SECRET, host_id="py-host") as node:
        peer = await node.connect(rust.listen)
        assert (peer.channel, peer.locality, peer.lang, peer.name) == ("tcp", "remote", "rust", "rs-tcp")
        assert {"inline", "ticket"} <= set(peer.caps)

        # Python -> Rust: the Rust node verifies the digest and answers a receipt.
        await peer.send("handoff.demo.Payload", payload(1))
        receipt = (await expect(node, "handoff.demo.Receipt")).body
        assert receipt == {"id": 1, "bytes": BIG, "verified": True, "verify_seconds": receipt["verify_seconds"]}

        # Rust -> Python: ask for a payload and verify it here.
        await peer.send("handoff.demo.SendRequest", {"id": 2, "bytes": BIG})
        with await expect(node, "handoff.demo.Payload") as env:
            body = env.body
            assert body["id"] == 2 and len(body["data"]) == BIG
            assert digest(body["data"]) == bytes(body["digest"])
            assert [f.kind for f in env.frames] == ["inline", "inline"]
            del body

        # The echo service.
        await peer.send("handoff.bench.Ping", {"seq": 9, "data": b"ping"})
        assert (await expect(node, "handoff.bench.Ping")).body == {"seq": 9, "data": b"ping"}


# ---------------------------------------------------------------- shm (same host id)


async def test_shm_python_to_rust(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-shm-in")
    # The same derivation on both sides (spec §5.2): same host, so shared memory.
    assert rust.ready["host_id"] == host_id()
    async with Node("py-shm-out", secret=SECRET) as node:
        peer = await node.connect(rust.listen)
        assert (peer.channel, peer.locality) == ("shm", "same-host")
        await peer.send("handoff.demo.Payload", payload(3))
        # Sent as a sealed memfd under a lease, until the Rust node drops its last view.
        receipt = (await expect(node, "handoff.demo.Receipt")).body
        assert receipt["verified"] is True and receipt["bytes"] == BIG
        assert await eventually(lambda: node.shm_leases()["count"] == 0)
        stats = await rust_stats(rust.listen)
        assert ["py-shm-out", "shm"] in stats["peers"]


@pytest.mark.pure_only("finds the mapping behind a view with the pure peer's mapping table")
async def test_shm_rust_to_python_zero_copy_and_release(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-shm-out")
    async with Node("py-shm-in", secret=SECRET) as node:
        peer = await node.connect(rust.listen)
        assert peer.channel == "shm"
        await peer.send("handoff.demo.SendRequest", {"id": 4, "bytes": BIG})
        env = await expect(node, "handoff.demo.Payload")
        data = env.body["data"]
        # Zero copy: a read-only view straight over the mapping of the Rust node's segment
        # (through the frame's own exporter when the connection keeps the mapping of the
        # Rust node's pooled segment, handoff_pure.mapcache).
        mapping = mapping_of(data)
        assert isinstance(data, memoryview) and mapping is not None
        assert data.readonly and len(data) == BIG
        assert env.frames[1].kind == "shm" and env.segment_of(data)["size"] >= BIG
        array = as_numpy(data)
        assert np.shares_memory(array, mapping.array())
        assert digest(array) == bytes(env.body["digest"])
        # The Rust node keeps the segment under a lease while we hold a view of it.
        stats = await rust_stats(rust.listen)
        assert stats["shm_leases"]["count"] >= 1
        env.release()
        assert (await rust_stats(rust.listen))["shm_leases"]["count"] >= 1  # the numpy array still holds it
        # The mapping too: without a kept mapping (HANDOFF_SHM_KEEP_BYTES=0, or after a Dask
        # node set the process's budget to 0) it is the frame's region, which holds the lease.
        del data, array, env, mapping
        assert await eventually(lambda: _count(rust_stats(rust.listen), "shm_leases"), timeout=10) == "zero"


async def _count(stats_coro, key: str) -> str:
    stats = await stats_coro
    return "zero" if stats[key]["count"] == 0 else ""


# ---------------------------------------------------------------- tickets


async def test_redeem_ticket_from_rust_owner(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-owner", "--host-id", "rust-host", "--ticket-threshold", "0")
    async with Node("py-holder", secret=SECRET, host_id="py-host") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.SendRequest", {"id": 5, "bytes": BIG})
        env = await expect(node, "handoff.demo.Payload")
        # Eager redemption: both buffers arrived as tickets and were pulled, digests checked.
        assert [f.kind for f in env.frames] == ["ticket", "ticket"]
        assert digest(env.body["data"]) == bytes(env.body["digest"])
        env.release()
        assert await eventually(lambda: _count(rust_stats(rust.listen), "ticket_leases"), timeout=10) == "zero"


async def test_lazy_ticket_range_read_then_redeem(spawn_rust, rust_stats):
    rust = await spawn_rust("rs-owner-lazy", "--host-id", "rust-host", "--ticket-threshold", "0")
    async with Node("py-lazy", secret=SECRET, host_id="py-host", redeem="lazy") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.SendRequest", {"id": 6, "bytes": 4 * MIB})
        env = await expect(node, "handoff.demo.Payload")
        ticket = env.body["data"]
        assert isinstance(ticket, Ticket) and len(ticket) == 4 * MIB
        assert ticket.owner == peer.node_id
        head = await ticket.read(4096, 100)
        whole = await ticket.redeem()
        assert bytes(head) == bytes(whole[4096:4196])
        assert digest(whole) == bytes(await env.body["digest"].redeem())
        stats = await rust_stats(rust.listen)
        assert stats["ticket_leases"]["count"] == 2
        env.release()
        del ticket
        assert await eventually(lambda: _count(rust_stats(rust.listen), "ticket_leases"), timeout=10) == "zero"


async def test_rust_redeems_ticket_from_python_owner(spawn_rust):
    rust = await spawn_rust("rs-holder", "--host-id", "rust-host")
    async with Node("py-owner", secret=SECRET, host_id="py-host", listen="127.0.0.1:0") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.Payload", payload(7), by_ticket=True)
        assert node.ticket_leases()["count"] == 2
        receipt = (await expect(node, "handoff.demo.Receipt")).body
        assert receipt["verified"] is True and receipt["bytes"] == BIG
        assert await eventually(lambda: node.ticket_leases()["count"] == 0)


# ---------------------------------------------------------------- authentication


async def test_wrong_secret_is_refused_on_both_sides(spawn_rust, tmp_path):
    rust = await spawn_rust("rs-auth", "--host-id", "rust-host")
    async with Node("py-wrong", secret=b"not the secret", host_id="py-host") as node:
        with pytest.raises(AuthenticationError) as err:
            await node.connect(rust.listen)
        text = str(err.value).lower()
        assert "secret" in text and "authentication" in text
        assert node.peers == []
    log = await rust.wait_stderr("refused connection", "authentication failed")
    assert "refused connection" in log and "authentication failed" in log


async def test_wrong_secret_from_rust_is_refused_by_python(handoff_bin, tmp_path, caplog):
    wrong = tmp_path / "wrong"
    wrong.write_text("another secret")
    async with Node("py-auth", secret=SECRET, listen="127.0.0.1:0") as node:
        proc = await asyncio.create_subprocess_exec(
            str(handoff_bin),
            "stats",
            "--connect",
            node.listen_addr,
            "--secret-file",
            str(wrong),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode != 0
        assert "authentication failed" in err.decode()
        assert await eventually(lambda: "authentication" in caplog.text and "refused connection" in caplog.text)
        assert node.peers == []


# ---------------------------------------------------------------- Rust connects to the Python worker


async def test_rust_node_connects_to_python_worker_over_tcp(spawn_rust, spawn_py_worker, rust_stats):
    worker = await spawn_py_worker("py-w", "--host-id", "py-host")
    rust = await spawn_rust("rs-relay", "--host-id", "rust-host", "--connect", worker.listen)
    # The Python worker answers `handoff stats` too.
    stats = await rust_stats(worker.listen)
    assert ["rs-relay", "tcp"] in stats["peers"]
    async with Node("py-asker", secret=SECRET, host_id="asker-host") as node:
        peer = await node.connect(rust.listen)
        data = os.urandom(MIB)
        # The Rust node sends `Hold` to the worker and relays its `Held`.
        await peer.send("handoff.demo.Forward", {"id": 11, "to": "py-w", "data": Buffer(data)})
        held = (await expect(node, "handoff.demo.Held")).body
        assert held == {"id": 11, "holder": "py-w", "bytes": MIB, "segment": None}


async def test_rust_node_connects_to_python_worker_over_shm(spawn_rust, spawn_py_worker, rust_stats):
    worker = await spawn_py_worker("py-w-shm")
    rust = await spawn_rust("rs-relay-shm", "--connect", worker.listen)
    # Same host: the Rust node switched to the worker's Unix socket.
    stats = await eventually(lambda: _peers(rust_stats(worker.listen)))
    assert ["rs-relay-shm", "shm"] in stats["peers"]
    async with Node("py-asker-shm", secret=SECRET, host_id="asker-host") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.Forward", {"id": 12, "to": "py-w-shm", "data": Buffer(os.urandom(MIB))})
        held = (await expect(node, "handoff.demo.Held")).body
        assert held["holder"] == "py-w-shm" and held["bytes"] == MIB
        assert held["segment"] is not None and held["segment"]["size"] >= MIB  # the worker maps Rust's segment
        # While the worker holds it, the Rust node keeps a lease; Release lets it go.
        assert (await rust_stats(rust.listen))["shm_leases"]["count"] == 1
        await peer.send("handoff.demo.Forward", {"id": 13, "to": "py-w-shm", "data": Buffer(b"x" * 10)})
        assert (await expect(node, "handoff.demo.Held")).body["segment"] is None  # small: inline
    # Ask the worker directly to drop id 12.
    async with Node("py-releaser", secret=SECRET) as node:
        w = await node.connect(worker.listen)
        assert w.channel == "shm"
        await w.send("handoff.demo.Release", {"id": 12})
        held = (await expect(node, "handoff.demo.Held")).body
        assert held == {"id": 12, "holder": "py-w-shm", "bytes": MIB, "segment": None}
    assert await eventually(lambda: _count(rust_stats(rust.listen), "shm_leases"), timeout=10) == "zero"


async def _peers(stats_coro):
    stats = await stats_coro
    return stats if any(c == "shm" for _, c in stats["peers"]) else None


async def test_forward_a_rust_ticket_to_a_python_node_on_the_owner_host(spawn_rust, rust_stats):
    # The owner (Rust) and the final holder share a host; the first holder is remote.
    rust = await spawn_rust("rs-owner-fw", "--ticket-threshold", "0")
    async with (
        Node("py-b", secret=SECRET, host_id="b-host", redeem="lazy") as b,
        Node("py-c", secret=SECRET, listen="127.0.0.1:0", redeem="lazy") as c,
    ):
        to_owner = await b.connect(rust.listen)
        await to_owner.send("handoff.demo.SendRequest", {"id": 14, "bytes": MIB})
        env = await expect(b, "handoff.demo.Payload")
        ticket, dg = env.body["data"], await env.body["digest"].redeem()
        to_c = await b.connect(c.listen_addr)
        await to_c.send("handoff.demo.Hold", {"id": 14, "data": ticket})  # forward, then send
        env.release()
        del ticket
        got = (await expect(c, "handoff.demo.Hold")).body["data"]
        assert isinstance(got, Ticket)
        data = await got.redeem()  # c connects to the owner's address itself
        assert digest(data) == bytes(dg)
        got.release()
        assert await eventually(lambda: _count(rust_stats(rust.listen), "ticket_leases"), timeout=10) == "zero"


async def test_ticket_refusal_and_owner_loss_name_owner_and_lease(spawn_rust):
    rust = await spawn_rust("rs-short", "--host-id", "rust-host", "--ticket-threshold", "0", "--lease-ttl-ms", "200")
    async with Node("py-late", secret=SECRET, host_id="py-host", redeem="lazy") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.SendRequest", {"id": 15, "bytes": MIB})
        env = await expect(node, "handoff.demo.Payload")
        late, dg = env.body["data"], env.body["digest"]
        await asyncio.sleep(0.6)  # past the ttl: the owner ended the hold
        with pytest.raises(TicketRefused) as err:
            await late.redeem()
        assert err.value.code in ("expired", "unknown-lease")
        assert "rs-short" in str(err.value) and f"lease {late.lease}" in str(err.value)

        await peer.send("handoff.demo.SendRequest", {"id": 16, "bytes": MIB})
        fresh = (await expect(node, "handoff.demo.Payload")).body["data"]
        rust.stop()  # the owner dies
        with pytest.raises(OwnerLost) as err:
            await fresh.redeem()
        assert "rs-short" in str(err.value) and f"lease {fresh.lease}" in str(err.value)
        del dg


async def test_a_rust_holder_reads_past_a_message_to_the_answer_of_a_ticket_over_twice_its_bound(spawn_rust):
    """§9.1 on the Rust node: a raw owner sends a Payload with a 3 MiB ticket to a node whose
    per-peer bound is 1 MiB (admitted alone, room taken before the pull), then, in front of
    the pull's answer, a second Payload: the node reads past it to the answer (its bounds
    raised by the reserved ticket), and verifies both."""
    import blake3
    import secrets

    from handoff_pure import wire
    from handoff.codec import encode_body
    from helpers import RawPeer

    rust = await spawn_rust(
        "rs-eager-holder", "--max-buffered-bytes-per-peer", str(1 << 20), "--pull-timeout-ms", "5000"
    )
    big = os.urandom(3 << 20)
    small = os.urandom(1000)

    def payload(i: int, data: bytes, frame) -> bytes:
        body = encode_body(
            {"id": i, "digest": Buffer(blake3.blake3(data).digest()), "data": Buffer(data), "prepare_seconds": 0.0},
            frame_threshold=1,
        ).body
        return body, frame

    def owner() -> list:
        raw = RawPeer(rust.listen, timeout=30)
        raw.handshake(SECRET, host="owner-host")
        token = secrets.token_bytes(32)
        ticket = wire.TicketDesc(len(big), raw.node_id, 1, token, blake3.blake3(big).digest(), 60_000)
        body, _ = payload(1, big, None)
        digest_frame = blake3.blake3(big).digest()
        raw.send(wire.encode_message(wire.Msg("handoff.demo.Payload", body, [wire.Inline(32), ticket]), [digest_frame]))
        got = []
        while True:
            h, frames = raw.read_message()
            if isinstance(h, wire.Pull):
                body2, _ = payload(2, small, None)
                raw.send(
                    wire.encode_message(
                        wire.Msg("handoff.demo.Payload", body2, [wire.Inline(32), wire.Inline(len(small))]),
                        [blake3.blake3(small).digest(), small],
                    )
                    + wire.encode_message(wire.Pulled(h.req, h.n))
                    + big[h.off : h.off + h.n]
                )
            elif isinstance(h, wire.Msg) and h.t == "handoff.demo.Receipt":
                got.append(h)
                if len(got) == 2:
                    raw.close()
                    return got

    started = asyncio.get_running_loop().time()
    receipts = await asyncio.wait_for(asyncio.to_thread(owner), 20)
    assert asyncio.get_running_loop().time() - started < 4.5, "the redemption waited for its pull to time out"
    from handoff.codec import decode_body

    bodies = [decode_body(r.b, []) for r in receipts]
    assert [(b["id"], b["verified"]) for b in bodies] == [(1, True), (2, True)], bodies

"""``python -m handoff.worker``: the demo protocol of spec Appendix A, spoken by a Python node."""

from __future__ import annotations

import os

from conftest import SECRET
from handoff import Buffer, Node
from handoff.tickets import digest
from helpers import eventually

MIB = 1 << 20


async def expect(node: Node, type_name: str):
    env = await node.recv(20)
    assert env.type_name == type_name, (env.type_name, env.body)
    return env


async def test_worker_serves_the_demo_protocol(spawn_py_worker):
    worker = await spawn_py_worker("py-demo", "--host-id", "worker-host")
    assert worker.ready["host_id"] == "worker-host" and worker.ready["pid"] > 0
    async with Node("client", secret=SECRET, host_id="client-host") as node:
        peer = await node.connect(worker.listen)
        assert (peer.channel, peer.lang, peer.name) == ("tcp", "python", "py-demo")

        data = os.urandom(2 * MIB)
        await peer.send(
            "handoff.demo.Payload", {"id": 1, "digest": Buffer(digest(data)), "data": data, "prepare_seconds": 0.0}
        )
        r = (await expect(node, "handoff.demo.Receipt")).body
        assert (r["id"], r["bytes"], r["verified"]) == (1, 2 * MIB, True) and isinstance(r["verify_seconds"], float)
        await peer.send(
            "handoff.demo.Payload", {"id": 2, "digest": Buffer(bytes(32)), "data": data, "prepare_seconds": 0.0}
        )
        assert (await expect(node, "handoff.demo.Receipt")).body["verified"] is False

        await peer.send("handoff.demo.SendRequest", {"id": 3, "bytes": MIB})
        p = (await expect(node, "handoff.demo.Payload")).body
        assert p["id"] == 3 and len(p["data"]) == MIB and digest(p["data"]) == bytes(p["digest"])

        # Ping echoes its data as bin (its schema), even when it arrived as a frame.
        await peer.send("handoff.bench.Ping", {"seq": 4, "data": Buffer(b"z" * 5000)})
        env = await expect(node, "handoff.bench.Ping")
        assert env.body == {"seq": 4, "data": b"z" * 5000} and env.frames == []
        await peer.send("handoff.bench.Blob", {"seq": 5, "data": Buffer(b"q" * 10)})
        assert (await expect(node, "handoff.bench.Ping")).body == {"seq": 5, "data": b""}

        await peer.send("handoff.demo.Hold", {"id": 6, "data": Buffer(b"h" * 100)})
        assert (await expect(node, "handoff.demo.Held")).body == {
            "id": 6,
            "holder": "py-demo",
            "bytes": 100,
            "segment": None,
        }
        await peer.send("handoff.demo.Release", {"id": 6})
        assert (await expect(node, "handoff.demo.Held")).body == {
            "id": 6,
            "holder": "py-demo",
            "bytes": 100,
            "segment": None,
        }

        await peer.send("handoff.admin.StatsRequest", {})
        stats = (await expect(node, "handoff.admin.Stats")).body
        assert stats["node"] == "py-demo" and ["client", "tcp"] in stats["peers"]
        assert set(stats["ticket_leases"]) == {
            "count",
            "bytes",
            "holders",
            "oldest_seconds",
            "expired",
            "pulls",
            "bytes_pulled",
        }


async def test_worker_sends_shared_memory_to_a_same_host_asker(spawn_py_worker):
    worker = await spawn_py_worker("py-shm-demo")
    async with Node("client", secret=SECRET) as node:
        peer = await node.connect(worker.listen)
        assert peer.channel == "shm"
        await peer.send("handoff.demo.SendRequest", {"id": 7, "bytes": 4 * MIB})
        with await expect(node, "handoff.demo.Payload") as env:
            data = env.body["data"]
            # A pooled segment (unsealed, as the Rust node's), mapped: no byte copied.
            segment = env.segment_of(data)
            assert segment is not None and segment["sealed"] is False and segment["size"] >= 4 * MIB
            assert digest(data) == bytes(env.body["digest"])
            del data
        await peer.send("handoff.demo.Hold", {"id": 8, "data": Buffer(os.urandom(MIB))})
        held = (await expect(node, "handoff.demo.Held")).body
        assert held["segment"]["size"] == MIB and held["segment"]["pool_id"] is None
        assert node.shm_leases()["count"] == 1  # the worker holds our segment
        await peer.send("handoff.demo.Release", {"id": 8})
        await expect(node, "handoff.demo.Held")
        assert await eventually(lambda: node.shm_leases()["count"] == 0)


async def test_worker_refuses_unknown_types(spawn_py_worker):
    worker = await spawn_py_worker("py-strict", "--host-id", "w")
    async with Node("client", secret=SECRET, host_id="c") as node:
        peer = await node.connect(worker.listen)
        await peer.send("not.a.Type", {})
        await peer.done.wait()  # the worker sent `error` and closed
    assert "unknown type name" in await worker.wait_stderr("unknown type name")


async def test_worker_reads_data_handles(spawn_py_worker, tmp_path):
    from handoff import BlobHandle, BlobTag, OnDemand

    data = os.urandom(MIB)
    (tmp_path / "mine.bin").write_bytes(data)
    mine, other = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
    worker = await spawn_py_worker(
        "py-data", "--host-id", "worker-host", "--dataset", f"{mine}={tmp_path / 'mine.bin'}"
    )
    async with Node("client", secret=SECRET, host_id="client-host", listen="127.0.0.1:0") as node:
        peer = await node.connect(worker.listen)
        # A dataset the worker has: read in place, nothing pulled from us.
        await peer.send(
            "handoff.demo.BlobWork", {"id": 1, "blob": BlobHandle.from_bytes(data, mine), "digest": digest(data)}
        )
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert (r["id"], r["bytes"], r["verified"], r["path"], r["detail"]) == (1, MIB, True, "read-in-place", None)
        assert node.leases.pulls == 0
        # One it does not have: pulled from us through the lazy fallback.
        await peer.send(
            "handoff.demo.BlobWork", {"id": 2, "blob": BlobHandle.from_bytes(data, other), "digest": digest(data)}
        )
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert (r["id"], r["verified"], r["path"]) == (2, True, "remote-blob")
        assert f"dataset:{other}" in r["detail"] and node.leases.pulls == 1
        assert await eventually(lambda: node.ticket_leases()["count"] == 0)
        # Neither: a failed receipt, and the worker keeps serving.
        await peer.send(
            "handoff.demo.BlobWork", {"id": 3, "blob": BlobHandle(BlobTag(other, name="x")), "digest": bytes(32)}
        )
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert (r["id"], r["path"]) == (0, "failed") and "no fallback" in r["detail"]
        await peer.send("handoff.demo.Hold", {"id": 4, "data": OnDemand(b"lazy" * 1000)})
        assert (await expect(node, "handoff.demo.Held")).body["id"] == 4
        assert node.leases.pulls == 1, "the worker (eager) did not pull the lazy ticket on receipt"

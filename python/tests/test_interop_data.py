"""Interop with the real Rust binary on resource keys, lazy tickets and data handles
(spec §7.5–§7.6, §8.3–§8.5): a Python node sends ``handoff.demo.BlobWork`` to a Rust
``handoff node``, with and without a catalog that has the dataset, and a lazy ticket that
an eagerly redeeming Rust node must not pull on receipt."""

from __future__ import annotations

import os

from conftest import SECRET
from handoff import BlobHandle, BlobTag, Node, OnDemand
from handoff.tickets import digest
from helpers import eventually

MIB = 1 << 20
BIG = "4a0d2e7c-5b1f-4c3e-9d8a-6f2b1c0e9a71"


async def expect(node: Node, type_name: str, timeout: float = 30):
    env = await node.recv(timeout)
    assert env.type_name == type_name, f"expected {type_name}, got {env.type_name}: {env.body}"
    return env


def catalog(tmp_path, data: bytes):
    """A DataSets.jl catalog with one FileSystem Blob dataset, ``big``, holding ``data``."""
    (tmp_path / "big.bin").write_bytes(data)
    path = tmp_path / "Data.toml"
    path.write_text(
        "data_config_version = 1\n\n[[datasets]]\n"
        f'name = "big"\nuuid = "{BIG}"\n'
        '[datasets.storage]\ndriver = "FileSystem"\ntype = "Blob"\npath = "@__DIR__/big.bin"\n'
    )
    return path


async def test_rust_without_the_dataset_pulls_from_the_python_sender(spawn_rust):
    rust = await spawn_rust("rs-data-none", "--host-id", "rust-host")
    async with Node("py-data", secret=SECRET, host_id="py-host", listen="127.0.0.1:0") as node:
        peer = await node.connect(rust.listen)
        data = os.urandom(3 * MIB)
        await peer.send(
            "handoff.demo.BlobWork",
            {"id": 1, "blob": BlobHandle.from_bytes(data, BIG, name="big"), "digest": digest(data)},
        )
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert (r["id"], r["bytes"], r["verified"], r["path"]) == (1, 3 * MIB, True, "remote-blob"), r
        assert f"dataset:{BIG}" in r["detail"], r["detail"]
        assert node.leases.pulls >= 1 and node.leases.bytes_pulled == 3 * MIB
        assert await eventually(lambda: node.ticket_leases()["count"] == 0, timeout=10)

        # A handle the Rust node can neither bind nor pull: a failed receipt naming the key it
        # lacks (unknown-resource, spec §8.5 rule 3).
        await peer.send("handoff.demo.BlobWork", {"id": 2, "blob": BlobHandle(BlobTag(BIG)), "digest": bytes(32)})
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert r["path"] == "failed" and f"dataset:{BIG}" in r["detail"] and "no resource" in r["detail"], r


async def test_rust_with_the_dataset_reads_its_own_copy_and_never_pulls(spawn_rust, tmp_path):
    data = os.urandom(2 * MIB)
    rust = await spawn_rust(
        "rs-data-own",
        "--host-id",
        "rust-host",
        "--catalog",
        str(catalog(tmp_path, data)),
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    async with Node("py-data", secret=SECRET, host_id="py-host", listen="127.0.0.1:0") as node:
        peer = await node.connect(rust.listen)
        await peer.send(
            "handoff.demo.BlobWork",
            {"id": 3, "blob": BlobHandle.from_bytes(data, BIG, name="big"), "digest": digest(data)},
        )
        r = (await expect(node, "handoff.demo.BlobReceipt")).body
        assert (r["id"], r["bytes"], r["verified"], r["path"], r["detail"]) == (3, 2 * MIB, True, "read-in-place", None)
        # The Rust node redeems tickets eagerly, but not the lazy fallback: no byte came from us,
        # and once it read its own copy it let the fallback go.
        assert node.leases.pulls == 0
        assert await eventually(lambda: node.ticket_leases()["count"] == 0, timeout=10)


async def test_an_eager_rust_node_does_not_pull_a_lazy_ticket_on_receipt(spawn_rust):
    rust = await spawn_rust("rs-lazy", "--host-id", "rust-host")
    async with Node("py-lazy-owner", secret=SECRET, host_id="py-host", listen="127.0.0.1:0") as node:
        peer = await node.connect(rust.listen)
        await peer.send("handoff.demo.Hold", {"id": 9, "data": OnDemand(os.urandom(MIB))})
        held = (await expect(node, "handoff.demo.Held")).body
        assert held["id"] == 9
        assert node.ticket_leases()["count"] == 1 and node.leases.pulls == 0
        await peer.send("handoff.demo.Release", {"id": 9})
        await expect(node, "handoff.demo.Held")
        assert await eventually(lambda: node.ticket_leases()["count"] == 0, timeout=10)
        assert node.leases.pulls == 0

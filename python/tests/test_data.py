"""Data handles (spec §8.5) in the Python peer: the wire form against the vectors, binding to a
local source, and the RemoteBlob fallback between Python nodes."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest
from handoff import (
    BlobError,
    BlobHandle,
    BlobTag,
    FileDataset,
    Node,
    OnDemand,
    ResourceError,
    ResourceKey,
    Resources,
    Ticket,
    dataset_key,
)
from handoff_pure import wire
from handoff.codec import decode_body, encode_body
from handoff.data import BlobRangeError, is_handle_map
from handoff.tickets import digest
from helpers import eventually
from test_vectors import BY_NAME

MIB = 1 << 20
BIG = "4a0d2e7c-5b1f-4c3e-9d8a-6f2b1c0e9a71"  # the dataset of the msg-blob-handle vector
TREE = "b7e3c1d2-8a4f-4e6b-a1c9-3d5f7e9b0c24"


def vector_buffer() -> bytes:
    """The 1 MiB of the ticket vectors: byte i is i mod 251."""
    return bytes(i % 251 for i in range(MIB))


def vector_msg(name: str) -> wire.Msg:
    data, _ = BY_NAME[name]
    return wire.decode_message(data).header


# ---------------------------------------------------------------- the wire form


def test_tag_map_order_and_omissions():
    full = BlobTag(BIG, name="big", path="", size=3, digest="ab" * 32, version="v")
    assert list(full.to_map()) == ["dataset", "name", "path", "size", "digest", "version"]
    bare = BlobTag(TREE, path="cats/1.png")
    assert bare.to_map() == {"dataset": TREE, "path": "cats/1.png"}
    assert BlobTag.from_map(full.to_map()) == full
    assert BlobTag.from_map({"dataset": TREE, "x-new": 1}) == BlobTag(TREE)  # path absent = "", unknown keys ignored
    for bad in ({}, {"dataset": 1}, {"dataset": "u", "size": -1}, {"dataset": "u", "name": 3}, []):
        with pytest.raises(ValueError):
            BlobTag.from_map(bad)
    assert dataset_key(BIG.upper()) == f"dataset:{BIG}"


def test_handles_encode_to_the_vectors_bytes():
    msg = vector_msg("msg-blob-handle")
    handle = BlobHandle(
        BlobTag(BIG, name="big", path="", size=MIB, digest=digest(vector_buffer()).hex(), version="etag-5d41402a"),
        fallback=OnDemand(vector_buffer()),
    )
    enc = encode_body({"input": handle})
    assert enc.body == msg.b
    assert len(enc.frames) == 1 and isinstance(enc.sources[0], OnDemand)
    # from_bytes makes the same tag from the bytes themselves.
    made = BlobHandle.from_bytes(vector_buffer(), BIG, name="big", version="etag-5d41402a")
    assert encode_body({"input": made}).body == msg.b
    bare = BlobHandle(BlobTag(TREE, name="images", path="cats/1.png"))
    assert encode_body({"input": bare}).body == vector_msg("msg-blob-handle-no-fallback").b


def test_the_vectors_decode_as_handles():
    msg = vector_msg("msg-blob-handle")
    # Without a registry: the generic view, a key and a tag.
    raw = decode_body(msg.b, ["frame0"])["input"]
    assert raw["catalog"] == ResourceKey(f"dataset:{BIG}") and raw["fallback"] == "frame0" and is_handle_map(raw)
    # A node without the dataset keeps the handle, to fall back on the sender's bytes.
    r = Resources("beta")
    h = decode_body(msg.b, [memoryview(vector_buffer())], "demo.Work", r)["input"]
    assert isinstance(h, BlobHandle) and h.source is None and h.has_fallback
    assert h.tag.name == "big" and h.tag.size == MIB and h.key == f"dataset:{BIG}"
    assert f'no resource "dataset:{BIG}" on node "beta"' in h.fallback_reason
    # Without a fallback, it fails naming the dataset and the key.
    with pytest.raises(ResourceError) as e:
        decode_body(vector_msg("msg-blob-handle-no-fallback").b, [], "demo.Work", r)
    assert e.value.code == "unknown-resource"
    assert f"dataset:{TREE}" in e.value.message and "images/cats/1.png" in e.value.message
    assert "no fallback" in e.value.message


def test_not_a_handle_is_left_alone_or_refused():
    r = Resources("beta")
    r.insert("k", 1)
    # A map with other shapes is an ordinary map whose keys bind.
    body = encode_body({"catalog": ResourceKey("k"), "tag": "not a map"}).body
    assert decode_body(body, [], resources=r)["catalog"].value == 1
    # A handle whose tag lacks its fields, or whose fallback is not a frame, is a bad body.
    for bad in (
        {"catalog": ResourceKey("k"), "tag": {"dataset": "u", "size": "big"}},
        {"catalog": ResourceKey("k"), "tag": {"dataset": "u"}, "fallback": 3},
    ):
        with pytest.raises(wire.WireError) as e:
            decode_body(encode_body(bad).body, [], resources=r)
        assert e.value.code == "bad-body"


# ---------------------------------------------------------------- a local source


async def test_every_reader_of_a_received_fallback_gets_it_read_only():
    """A fallback that came as bytes (to a peer that takes no tickets) is one buffer that
    every reader of the handle gets; a frame read off the socket is writable, so a reader
    could change what the next one reads, unless each gets it read-only."""
    received = memoryview(bytearray(b"the sender's bytes"))  # as a writable received frame
    h = BlobHandle(BlobTag(dataset="11111111-1111-4111-8111-111111111111", size=len(received)), fallback=received)
    first = await h.read_all()
    assert first == b"the sender's bytes" and h.last_origin == "remote-blob"
    assert memoryview(first).readonly and memoryview(await h.read_range(4, 10)).readonly
    with pytest.raises(TypeError):
        memoryview(first)[0] = 0
    assert await h.read_all() == b"the sender's bytes"


def test_file_dataset_reads_files_and_refuses_escapes(tmp_path):
    (tmp_path / "tree" / "cats").mkdir(parents=True)
    (tmp_path / "tree" / "cats" / "1.png").write_bytes(b"png!")
    (tmp_path / "secret").write_bytes(b"no")
    os.symlink(tmp_path / "secret", tmp_path / "tree" / "leak")
    os.symlink(tmp_path / "tree" / "cats" / "1.png", tmp_path / "tree" / "alias")
    tree = FileDataset(tmp_path / "tree")
    assert tree.read(BlobTag(TREE, path="cats/1.png")) == b"png!"
    assert tree.read(BlobTag(TREE, path="cats/1.png"), 1, 3) == b"ng"
    assert tree.read(BlobTag(TREE, path="alias")) == b"png!"
    for bad in ("../secret", "/etc/passwd", "leak", "", "cats/../../secret"):
        with pytest.raises(BlobError):
            tree.read(BlobTag(TREE, path=bad))
    with pytest.raises(BlobRangeError):
        tree.read(BlobTag(TREE, path="cats/1.png"), 0, 5)
    single = FileDataset(tmp_path / "secret")
    assert single.read(BlobTag(BIG)) == b"no" and single.size(BlobTag(BIG)) == 2
    with pytest.raises(BlobError):
        single.read(BlobTag(BIG, path="x"))


# ---------------------------------------------------------------- between nodes


def nodes(*names, **kw):
    return [Node(n, secret=b"s3cret", listen="127.0.0.1:0", **kw) for n in names]


async def send_handle(a: Node, b: Node, handle: BlobHandle) -> BlobHandle:
    peer = await a.connect(b.listen_addr, channel="tcp")
    await peer.send("test.Work", {"id": 1, "input": handle})
    env = await b.recv(5)
    return env.body["input"]


async def test_a_node_without_the_dataset_pulls_from_the_sender():
    a, b = nodes("a", "b")  # b redeems eagerly: the lazy fallback waits all the same
    async with a, b:
        data = os.urandom(3 * MIB)
        b.resources.insert("db", object())
        h = await send_handle(a, b, BlobHandle.from_bytes(data, BIG, name="big"))
        assert isinstance(h, BlobHandle) and h.source is None and h.has_fallback
        assert h.last_origin is None and a.leases.pulls == 0, "nothing is pulled before first use"
        assert a.ticket_leases()["count"] == 1
        reason = h.fallback_reason
        assert f"dataset:{BIG}" in reason and '"b"' in reason and "db" in reason, reason
        assert await h.size() == 3 * MIB
        # A range pulls only that range.
        assert bytes(await h.read_range(1000, 1100)) == data[1000:1100]
        assert a.leases.bytes_pulled == 100 and h.last_origin == "remote-blob"
        with pytest.raises(BlobRangeError):
            await h.read_range(0, 3 * MIB + 1)
        assert bytes(await h.read_all()) == data
        assert h.last_origin == "remote-blob" and a.leases.bytes_pulled == 100 + 3 * MIB
        h.release()
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)


async def test_a_node_with_the_dataset_reads_its_own_copy(tmp_path):
    a, b = nodes("a", "b")
    async with a, b:
        data = os.urandom(MIB)
        (tmp_path / "big.bin").write_bytes(data)
        b.resources.insert(dataset_key(BIG), FileDataset(tmp_path / "big.bin"))
        h = await send_handle(a, b, BlobHandle.from_bytes(data, BIG, name="big"))
        assert h.source is not None and h.fallback_reason is None
        assert bytes(await h.read_range(10, 20)) == data[10:20] and h.last_origin == "read-in-place"
        assert a.ticket_leases()["count"] == 1, "a range read keeps the fallback"
        assert await h.read_all() == data and h.last_origin == "read-in-place"
        assert a.leases.pulls == 0, "no byte came from the sender"
        # The fallback is no longer needed: the sender's lease ends.
        assert not h.has_fallback
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)


async def test_a_node_whose_source_fails_pulls_from_the_sender(tmp_path):
    a, b = nodes("a", "b")
    async with a, b:
        data = os.urandom(100_000)
        (tmp_path / "stale.bin").write_bytes(b"other content")
        b.resources.insert(dataset_key(BIG), FileDataset(tmp_path / "stale.bin"))
        h = await send_handle(a, b, BlobHandle.from_bytes(data, BIG))
        assert h.source is not None
        assert await h.read_all() == data and h.last_origin == "remote-blob"
        assert "storage failed" in h.fallback_reason and "digest" in h.fallback_reason

        # A source that is missing its file altogether: the same.
        b.resources.insert(dataset_key(TREE), FileDataset(tmp_path / "nowhere"))
        h = await send_handle(a, b, BlobHandle.from_bytes(b"tree bytes", TREE, path="cats/1.png"))
        assert bytes(await h.read_range(0, 4)) == b"tree" and "storage failed" in h.fallback_reason


async def test_a_handle_with_neither_binding_nor_fallback_fails_clearly():
    a, b = nodes("a", "b")
    async with a, b:
        b.resources.insert("cache", object())
        peer = await a.connect(b.listen_addr, channel="tcp")
        await peer.send("test.Work", {"input": BlobHandle(BlobTag(TREE, name="images", path="cats/1.png"))})
        env = await b.recv(5)
        with pytest.raises(ResourceError) as e:
            env.body
        text = e.value.message
        assert e.value.code == "unknown-resource"
        assert f"dataset:{TREE}" in text and "images/cats/1.png" in text and "no fallback" in text and "cache" in text
        # The connection keeps serving.
        await peer.send("test.Work", {"input": BlobHandle.from_bytes(b"x", TREE)})
        assert isinstance((await b.recv(5)).body["input"], BlobHandle)


async def test_a_received_handle_passed_on_keeps_its_lazy_fallback():
    a, b, c = nodes("a", "b", "c")
    async with a, b, c:
        data = os.urandom(200_000)
        h = await send_handle(a, b, BlobHandle.from_bytes(data, BIG, name="big"))
        to_c = await b.connect(c.listen_addr, channel="tcp")
        await to_c.send("test.Work", {"input": h})
        env = await c.recv(5)
        got = env.body["input"]
        assert got.tag == h.tag and got.has_fallback
        ticket = env.frames[0].view
        assert isinstance(ticket, Ticket) and ticket.lazy and ticket.owner == a.node_id
        assert a.leases.pulls == 0
        assert await got.read_all() == data and got.last_origin == "remote-blob"
        assert a.leases.pulls == 1


async def test_releasing_the_envelope_leaves_the_handles_fallback():
    a, b = nodes("a", "b")
    async with a, b:
        data = os.urandom(50_000)
        peer = await a.connect(b.listen_addr, channel="tcp")
        await peer.send("test.Work", {"input": BlobHandle.from_bytes(data, BIG)})
        env = await b.recv(5)
        h = env.body["input"]
        env.release()
        await asyncio.sleep(0.05)
        assert a.ticket_leases()["count"] == 1 and h.has_fallback
        assert await h.read_all() == data
        # Dropping the handle ends the hold.
        del h, env
        gc.collect()
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)

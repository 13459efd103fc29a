"""Resource keys (spec §8.3–§8.4) and lazy tickets (§7.5–§7.6) in the Python peer: the
registry, the codec, the wire, and between Python nodes."""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
from handoff import (
    Buffer,
    Node,
    OnDemand,
    Resource,
    ResourceError,
    ResourceKey,
    Resources,
    Ticket,
    WireError,
)
from handoff_pure import wire
from handoff.codec import decode_body, encode_body
from helpers import RawPeer, eventually

MIB = 1 << 20


class Pool:
    def __init__(self, owner: str):
        self.owner = owner

    def query(self, sql: str) -> str:
        return f"{self.owner}: {sql}"


# ---------------------------------------------------------------- the registry


def test_registry_inserts_removes_and_lists():
    r = Resources("beta")
    assert r.owner == "beta" and r.keys() == []
    pool = Pool("b")
    r.insert("db-main", pool)
    r.insert("cache", object())
    assert r.keys() == ["cache", "db-main"]
    assert r.get("db-main") is pool
    assert r.bind("db-main").value is pool and r.bind("db-main").key == "db-main"
    assert r.remove("cache") and not r.remove("cache")
    assert r.keys() == ["db-main"]
    with pytest.raises(TypeError):
        r.insert(3, pool)


def test_unknown_key_names_the_key_the_node_and_its_keys():
    r = Resources("beta")
    r.insert("cache", 1)
    r.insert("db-main", 2)
    with pytest.raises(ResourceError) as e:
        r.get("db")
    err = e.value
    assert isinstance(err, WireError) and err.code == "unknown-resource"
    assert (err.kind, err.key, err.node, err.available) == ("unknown", "db", "beta", ["cache", "db-main"])
    # The reference's wording (crates/handoff-wire/src/resource.rs).
    assert err.message == 'no resource "db" on node "beta" (it has: cache, db-main)'
    with pytest.raises(ResourceError, match=r"\(it has: no resources\)"):
        Resources("empty").get("x")
    with pytest.raises(ResourceError) as e:
        Resources('we"ird').get('a"b\\c')
    assert e.value.message.startswith('no resource "a\\"b\\\\c" on node "we\\"ird"')


def test_resolvers_open_keys_on_demand_in_order():
    r = Resources("beta")
    opened = []

    def pools(key):
        if not key.startswith("pool:"):
            return None
        name = key[len("pool:") :]
        if name == "broken":
            raise ConnectionRefusedError("the database refused the connection")
        opened.append(name)
        return Pool(f"b/{name}")

    class Caches:
        def resolve(self, key):
            return {"cache": "shared"}.get(key)

        def keys(self):
            return ["cache"]

    r.add_resolver(pools, keys=["pool:*"])
    r.add_resolver(Caches())
    r.add_resolver(lambda key: "last" if key == "x" else None)  # lists no keys
    assert r.get("pool:reports").owner == "b/reports" and opened == ["reports"]
    assert r.get("cache") == "shared" and r.get("x") == "last"
    assert r.keys() == ["cache", "pool:*"]
    # A registered object wins over resolvers.
    r.insert("pool:reports", "mine")
    assert r.get("pool:reports") == "mine" and opened == ["reports"]
    with pytest.raises(ResourceError) as e:
        r.get("pool:broken")
    assert e.value.kind == "failed" and e.value.code == "unknown-resource"
    assert (
        e.value.message
        == 'resource "pool:broken" on node "beta" could not be opened: the database refused the connection'
    )
    with pytest.raises(ResourceError, match=r"it has: cache, pool:\*, pool:reports"):
        r.get("other")
    with pytest.raises(TypeError):
        r.add_resolver(42)


def test_wrong_type_is_unknown_resource():
    r = Resources("beta")
    r.insert("db", "not a pool")
    assert r.get("db") == "not a pool"
    with pytest.raises(ResourceError) as e:
        r.get("db", Pool)
    assert e.value.kind == "wrong-type" and e.value.message == 'resource "db" on node "beta" is not a Pool'


def test_a_bound_resource_reads_like_its_object():
    res = Resource("db", Pool("b"))
    assert res.query("select 1") == "b: select 1" and res.owner == "b"
    assert repr(res) == "Resource('db')" and ResourceKey("db") == ResourceKey("db")
    assert hash(ResourceKey("db")) == hash(ResourceKey("db")) and ResourceKey("db") != "db"


# ---------------------------------------------------------------- the codec


@pytest.mark.parametrize(
    "key, head",
    [
        ("x", "d402"),
        ("db", "d502"),
        ("abcd", "d602"),
        ("abcdefgh", "d702"),
        ("k" * 16, "d802"),
        ("", "c70002"),
        ("abc", "c70302"),
        ("cache:reports", "c70d02"),
        ("k" * 256, "c8010002"),
        ("k" * 70000, "c90001117002"),
    ],
)
def test_keys_encode_as_the_smallest_ext_2(key, head):
    for value in (ResourceKey(key), Resource(key, object())):
        body = encode_body(value).body
        assert body.hex().startswith(head) and body.endswith(key.encode())
        assert len(body) == len(head) // 2 + len(key.encode())


def test_keys_decode_unbound_without_a_registry_and_bound_with_one():
    body = encode_body({"sql": "select 1", "pool": Resource("db", Pool("a")), "more": [ResourceKey("pool:x")]}).body
    assert decode_body(body, []) == {"sql": "select 1", "pool": ResourceKey("db"), "more": [ResourceKey("pool:x")]}
    r = Resources("beta")
    mine = Pool("b")
    r.insert("db", mine)
    r.add_resolver(lambda k: Pool(k) if k.startswith("pool:") else None)
    got = decode_body(body, [], "demo.Query", r)
    assert isinstance(got["pool"], Resource) and got["pool"].value is mine
    assert got["more"][0].value.owner == "pool:x"
    r.remove("db")
    with pytest.raises(ResourceError) as e:
        decode_body(body, [], "demo.Query", r)
    assert e.value.code == "unknown-resource" and '"db"' in e.value.message and "pool:x" not in e.value.available


def test_a_key_that_is_not_utf8_is_bad_body():
    body = msgpack.packb({"pool": msgpack.ExtType(2, b"d\xffb")})
    for resources in (None, Resources("beta")):
        with pytest.raises(WireError) as e:
            decode_body(body, [], "demo.Query", resources)
        assert e.value.code == "bad-body" and "not UTF-8" in e.value.message


def test_frame_refs_and_keys_together():
    body = encode_body({"k": ResourceKey("db"), "data": Buffer(b"abc")})
    assert [bytes(f) for f in body.frames] == [b"abc"]
    r = Resources("beta")
    r.insert("db", 1)
    got = decode_body(body.body, [memoryview(b"abc")], resources=r)
    assert got["k"].value == 1 and bytes(got["data"]) == b"abc"
    # Other ext types are still kept as they are.
    assert decode_body(msgpack.packb(msgpack.ExtType(9, b"z")), [], resources=r).code == 9


# ---------------------------------------------------------------- lazy on the wire


def _claim(lazy: bool) -> wire.TicketDesc:
    return wire.TicketDesc(
        n=MIB, owner="0" * 32, lease=9, token=b"\xab" * 32, digest=b"\xcd" * 32, ttl=30_000, addr="tcp://x", lazy=lazy
    )


def test_lazy_is_written_only_when_true_and_last():
    plain = wire.encode_header(wire.Msg("x", b"\x80", [_claim(False)]))
    lazy = wire.encode_header(wire.Msg("x", b"\x80", [_claim(True)]))
    assert b"lazy" not in plain
    assert lazy.endswith(b"\xa4lazy\xc3") and len(lazy) == len(plain) + 6
    assert wire.decode_header(lazy).f[0].lazy is True and wire.decode_header(plain).f[0].lazy is False
    assert wire.encode_header(wire.decode_header(lazy)) == lazy


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), (None, True), (1, False), ("yes", False)])
def test_lazy_is_a_bool_in_every_descriptor(value, ok):
    for desc in (dict(wire.to_map(_claim(False)), lazy=value), {"k": "inline", "n": 0, "lazy": value}):
        header = msgpack.packb({"k": "msg", "t": "x", "b": b"\x80", "f": [desc]}, use_bin_type=True)
        if ok:
            got = wire.decode_header(header).f[0]
            if isinstance(got, wire.TicketDesc):
                assert got.lazy is bool(value)
        else:
            with pytest.raises(WireError) as e:
                wire.decode_header(header)
            assert e.value.code == "malformed-header"


# ---------------------------------------------------------------- between nodes


def nodes(*names, **kw):
    return [Node(n, secret=b"s3cret", listen="127.0.0.1:0", **kw) for n in names]


async def test_a_resource_binds_to_the_receivers_object_and_unknown_keys_are_reported():
    a, b = nodes("a", "b")
    async with a, b:
        b.resources.insert("cache", Pool("b-cache"))
        b.resources.insert("db-main", Pool("b"))
        peer = await a.connect(b.listen_addr, channel="tcp")
        await peer.send("test.Query", {"sql": "select 1", "pool": Resource("db", Pool("a"))})
        env = await b.recv(5)
        with pytest.raises(ResourceError) as e:
            env.body
        assert e.value.code == "unknown-resource"
        assert e.value.message == 'no resource "db" on node "b" (it has: cache, db-main)'
        # The connection keeps delivering; once registered, the key binds.
        mine = Pool("b")
        b.resources.insert("db", mine)
        await peer.send("test.Query", {"sql": "select 2", "pool": Resource("db", Pool("a"))})
        env = await b.recv(5)
        assert env.body["pool"].value is mine and env.body["pool"].query("x") == "b: x"
        assert not peer.closed and b.peer("a") is not None


async def test_a_lazy_ticket_is_not_redeemed_by_an_eager_receiver():
    a, b = nodes("a", "b")  # b redeems eagerly (the default)
    async with a, b:
        peer = await a.connect(b.listen_addr, channel="tcp")
        data = bytes(range(256)) * 4096  # 1 MiB
        await peer.send("t.X", {"fallback": OnDemand(data), "small": Buffer(b"abc"), "eager": Buffer(b"e" * 5000)})
        env = await b.recv(5)
        assert [f.kind for f in env.frames] == ["ticket", "inline", "inline"]
        ticket = env.body["fallback"]
        assert isinstance(ticket, Ticket) and ticket.lazy and len(ticket) == MIB
        assert a.ticket_leases()["count"] == 1 and a.leases.pulls == 0
        # Pulled on use only: a range, then everything.
        assert bytes(await ticket.read(1000, 10)) == data[1000:1010]
        assert bytes(await ticket.redeem()) == data
        assert (a.leases.pulls, a.leases.bytes_pulled) == (2, MIB + 10)
        env.release()
        assert await eventually(lambda: a.ticket_leases()["count"] == 0)


async def test_an_eager_ticket_beside_a_lazy_one_is_redeemed():
    a, b = nodes("a", "b")
    async with a, b:
        peer = await a.connect(b.listen_addr, channel="tcp")
        await peer.send("t.X", {"eager": b"x" * 2000, "lazy": OnDemand(b"y" * 2000)}, by_ticket=True)
        env = await b.recv(5)
        assert bytes(env.body["eager"]) == b"x" * 2000
        assert isinstance(env.body["lazy"], Ticket) and a.leases.pulls == 1
        # The eager one's hold ends after its pull; the lazy one's stays.
        assert await eventually(lambda: a.ticket_leases()["count"] == 1)


async def test_a_lazy_ticket_stays_lazy_when_forwarded():
    a, b, c = nodes("a", "b", "c", redeem="lazy")
    async with a, b, c:
        to_b = await a.connect(b.listen_addr, channel="tcp")
        to_c = await b.connect(c.listen_addr, channel="tcp")
        data = b"z" * 100_000
        await to_b.send("t.X", {"data": OnDemand(data)})
        got = (await b.recv(5)).body["data"]
        assert got.lazy
        await to_c.send("t.X", {"data": got})
        forwarded = (await c.recv(5)).body["data"]
        assert isinstance(forwarded, Ticket) and forwarded.lazy and forwarded.owner == a.node_id
        assert bytes(await forwarded.redeem()) == data


async def test_on_demand_bytes_go_inline_to_a_peer_without_tickets():
    (a,) = nodes("a")
    async with a:
        hold = {}

        def raw():
            p = RawPeer(a.listen_addr)
            p.handshake(b"s3cret", name="noticket", caps=("inline",))
            hold["peer"] = p
            _, h = p.read_header()
            hold["header"] = h
            hold["bytes"] = p.read_exact(h.f[0].n)
            p.close()

        t = threading.Thread(target=raw)
        t.start()
        peer = await a.wait_for_peer("noticket")
        await peer.send("t.X", {"data": OnDemand(b"q" * 5000)})
        await asyncio.get_running_loop().run_in_executor(None, t.join, 5)
        assert isinstance(hold["header"].f[0], wire.Inline) and hold["bytes"] == b"q" * 5000
        assert a.ticket_leases()["count"] == 0

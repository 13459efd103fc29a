"""Bodies: canonical msgpack (spec §2), buffers as frames (§8.2), decoding limits and errors."""

from __future__ import annotations

import mmap
import time

import msgpack
import numpy as np
import pytest
from handoff_pure import wire
from handoff.codec import Buffer, as_bytes_view, as_numpy, decode_body, encode_body
from handoff.msgpack_values import BadStr, Ext


@pytest.mark.parametrize(
    "value, hexed",
    [
        (0, "00"),
        (127, "7f"),
        (128, "cc80"),
        (255, "ccff"),
        (256, "cd0100"),
        (65535, "cdffff"),
        (65536, "ce00010000"),
        (2**32, "cf0000000100000000"),
        (2**64 - 1, "cfffffffffffffffff"),
        (-1, "ff"),
        (-32, "e0"),
        (-33, "d0df"),
        (-128, "d080"),
        (-129, "d1ff7f"),
        (-(2**31), "d280000000"),
        (-(2**31) - 1, "d3ffffffff7fffffff"),
        ("", "a0"),
        ("x" * 31, "bf" + "78" * 31),
        ("x" * 32, "d920" + "78" * 32),
        ("x" * 256, "da0100" + "78" * 256),
        (b"", "c400"),
        (b"\x01" * 3, "c403010101"),
        (1.5, "cb3ff8000000000000"),
        (None, "c0"),
        (True, "c3"),
        (False, "c2"),
        ([], "90"),
        ([1] * 16, "dc0010" + "01" * 16),
        ({}, "80"),
        ({"b": 1, "a": 2}, "82a16201a16102"),
    ],
)
def test_canonical_encodings(value, hexed):
    enc = encode_body(value)
    assert enc.body.hex() == hexed and enc.frames == []


def test_map_of_16_entries_is_map16():
    enc = encode_body({str(i): i for i in range(16)})
    assert enc.body[:3] == b"\xde\x00\x10"


def test_buffers_become_frames_in_serialization_order():
    big = bytes(range(256)) * 8  # 2048 bytes: at least the frame threshold
    small = b"tiny"
    arr = np.arange(10, dtype=np.float64)
    enc = encode_body({"a": Buffer(b"xy"), "b": [big, small], "c": arr, "d": Buffer(memoryview(b"z"))})
    assert [f.nbytes for f in enc.frames] == [2, 2048, 80, 1]
    body = msgpack.unpackb(enc.body, raw=False)
    assert body["a"] == msgpack.ExtType(1, b"\x00\x00\x00\x00")
    assert body["b"] == [msgpack.ExtType(1, b"\x00\x00\x00\x01"), small]
    assert body["c"] == msgpack.ExtType(1, b"\x00\x00\x00\x02")
    assert body["d"] == msgpack.ExtType(1, b"\x00\x00\x00\x03")
    assert b"\xd6\x01\x00\x00\x00\x02" in enc.body  # fixext 4, type 1, u32 BE
    # A frame is a view of the caller's memory, not a copy.
    assert np.shares_memory(np.frombuffer(enc.frames[2], dtype=np.uint8), arr)


def test_frame_threshold_is_configurable():
    assert len(encode_body({"x": b"abcd"}, frame_threshold=4).frames) == 1
    assert len(encode_body({"x": b"abcd"}, frame_threshold=5).frames) == 0


def test_strided_numpy_arrays_are_copied_contiguously():
    arr = np.arange(20, dtype=np.int32)[::2]
    enc = encode_body(Buffer(arr))
    assert bytes(enc.frames[0]) == arr.tobytes()


def test_as_bytes_view_flattens():
    v = as_bytes_view(np.zeros((3, 4), dtype=np.float32))
    assert v.format == "B" and v.ndim == 1 and v.nbytes == 48


def test_unencodable_values_are_refused():
    with pytest.raises(TypeError):
        encode_body({"x": object()})
    with pytest.raises(OverflowError):
        encode_body(2**64)


def test_decode_resolves_frame_refs_to_the_frames_themselves():
    frames = [memoryview(b"abc"), memoryview(bytearray(b"def"))]
    body = msgpack.packb({"x": msgpack.ExtType(1, b"\x00\x00\x00\x01"), "y": [msgpack.ExtType(1, bytes(4))]})
    out = decode_body(body, frames)
    assert out["x"] is frames[1] and out["y"][0] is frames[0]


def test_decode_errors():
    ref = lambda payload: msgpack.packb([msgpack.ExtType(1, payload)])  # noqa: E731
    with pytest.raises(wire.WireError) as e:
        decode_body(ref(b"\x00\x00"), [b"x"])
    assert e.value.code == "bad-body"
    with pytest.raises(wire.WireError) as e:
        decode_body(ref(b"\x00\x00\x00\x01"), [b"x"])
    assert e.value.code == "bad-frame-ref"
    with pytest.raises(wire.WireError) as e:
        decode_body(b"\xc1", [])
    assert e.value.code == "bad-body"
    with pytest.raises(wire.WireError) as e:
        decode_body(b"\x92\x01", [])  # truncated
    assert e.value.code == "bad-body"
    # Other ext types and non-UTF-8 strings are kept, as the reference's generic reader does.
    assert decode_body(msgpack.packb(msgpack.ExtType(5, b"ab")), []) == Ext(5, b"ab")
    assert decode_body(b"\xa2\xff\xfe", []) == BadStr(b"\xff\xfe")


def _nested(depth: int) -> bytes:
    return b"\x91" * (depth - 1) + b"\x90"


def test_body_nesting_limit_is_127_levels():
    assert decode_body(_nested(127), []) is not None
    with pytest.raises(wire.WireError) as e:
        decode_body(_nested(128), [])
    assert e.value.code == "bad-body"
    # An ext value counts one level too.
    assert decode_body(b"\x91" * 126 + b"\xd4\x05\x00", []) is not None
    with pytest.raises(wire.WireError):
        decode_body(b"\x91" * 127 + b"\xd4\x05\x00", [])


def _strict(body: bytes):
    """What the reference's strict reader alone gives (its C pass of bodies without frames
    turned off), through decode_body."""
    import functools

    import handoff.codec as codec
    from handoff_pure import body as reference

    reader, codec._reader = codec._reader, functools.partial(reference.read, fast=False)
    try:
        return ("ok", decode_body(body, []))
    except wire.WireError as e:
        return ("error", e.code, str(e))
    finally:
        codec._reader = reader


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb({"f": [b"abc", "x", 1, -1, 2**64 - 1, 1.5, None, True, [], {}], "more": False}),
        msgpack.packb({"a": [[[{"b": b""}]]]}),
        _nested(127),
        _nested(128),  # too deep: the strict reader's error
        b"\x81\xa1a" * 127 + b"\x80",
        b"\x81\xa1a" * 128 + b"\x80",
        _nested(1100),  # past msgpack's own stack (1024): StackError, still the depth error
        b"\x91" * 1100 + b"\xc1",  # a bad byte after the depth point: still the depth error
        b"\x91" * 100 + b"\xc1" + b"\x91" * 1100,  # a bad byte before it: that error
        b"\x91" * 100 + b"\xa1\xff" + b"\x91" * 1100,  # non-UTF-8 before it: the strict reader
        b"\xd6\xff\x00\x00\x00\x01",  # the timestamp ext: an Ext, as for the strict reader
        msgpack.packb([msgpack.ExtType(5, b"ab")]),
        b"\xa2\xff\xfe",  # not UTF-8: BadStr
        b"\x81\xa2\xff\xfe\x01",  # a key that is not UTF-8
        b"\x81\x01\x02",  # an int key
        b"\x81\x91\x01\x02",  # an array key: a tuple
        b"\x82\xa1a\x01\xa1a\x02",  # a duplicate key: the later wins
        b"\x90\x90",  # trailing bytes are not looked at
        b"\x92\x01",  # truncated
        b"\xc1",
        b"\xca\x3f\xc0\x00\x00",  # float32
        b"\xdd\xff\xff\xff\xff",
    ],
)
def test_bodies_without_frames_decode_as_the_strict_reader_decodes_them(body):
    """The reader in use (the engine's, or the reference's C pass of bodies without frames)
    reads every body as the reference's strict reader does, errors word for word."""
    try:
        got = ("ok", decode_body(body, []))
    except wire.WireError as e:
        got = ("error", e.code, str(e))
    want = _strict(body)
    assert repr(got) == repr(want) and type(got[-1]) is type(want[-1])


def test_huge_announced_containers_do_not_allocate():
    with pytest.raises(wire.WireError) as e:
        decode_body(b"\xdd\xff\xff\xff\xff", [])
    assert e.value.code == "bad-body"


def test_as_numpy_is_zero_copy():
    m = mmap.mmap(-1, 4096)
    view = memoryview(m)[1024:2048]
    arr = as_numpy(view, dtype=np.uint32)
    assert arr.shape == (256,)
    view[0:4] = b"\x01\x00\x00\x00"
    assert arr[0] == 1
    assert as_numpy(memoryview(bytes(16)), shape=(4, 4)).shape == (4, 4)


def _plain_values():
    from hypothesis import strategies as st

    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(1 << 63), (1 << 64) - 1),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.binary(max_size=8),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(st.text(max_size=4), st.binary(max_size=4)), inner, max_size=4),
        ),
        max_leaves=20,
    )


def test_the_fast_body_reader_agrees_with_the_strict_one_on_generated_bodies():
    """Property: valid bodies, and the same bytes mutated, read as the strict reader reads them."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(_plain_values(), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=3))
    def check(value, flips):
        body = bytearray(msgpack.packb(value, use_bin_type=True))
        for at, byte in flips:
            body[at % len(body)] = byte
        body = bytes(body)
        try:
            got = ("ok", decode_body(body, []))
        except wire.WireError as e:
            got = ("error", e.code, str(e))
        want = _strict(body)
        assert repr(got) == repr(want) and type(got[-1]) is type(want[-1])

    check()


def _nested_value(depth: int):
    v: object = 1
    for _ in range(depth - 1):
        v = [v]
    return v


@pytest.mark.parametrize(
    "value",
    [
        {"seq": 1, "data": b"\x01" * 100},
        5,
        None,
        "x",
        b"a" * 1023,
        b"a" * 1024,
        (1, [2, (3,)]),
        {"a": {"b": [1.5, True, None, False, -1]}},
        -(1 << 63),
        (1 << 64) - 1,
        1 << 64,
        -(1 << 63) - 1,
        {1: 2, b"k": "v", None: (), 2.5: []},
        [[], [], {}],
        "é" * 40,
        bytearray(b"xy"),
        memoryview(b"ab"),
        [1, "\ud800"],
        _nested_value(127),
        _nested_value(128),
    ],
)
def test_plain_values_pack_as_the_walk_does(value):
    """encode_body's direct path for plain values gives the walk's bytes, frames and errors."""
    from handoff import Bin

    for v in (value, {"v": value, "bin": Bin(b"q" * 2000)}):
        try:
            fast = encode_body(v)
            fast = (fast.body, [bytes(f) for f in fast.frames])
        except Exception as e:
            fast = (type(e), str(e))
        try:
            slow = encode_body(v, fast=False)
            slow = (slow.body, [bytes(f) for f in slow.frames])
        except Exception as e:
            slow = (type(e), str(e))
        assert fast == slow


def _colliding_pairs(n: int) -> list:
    """``n`` pairs of ints whose tuples CPython hashes alike, in every process (its tuple
    hash is xxHash-like over the items' hashes, and a small int hashes to itself): the keys
    an attacker would choose to make a dict's inserts quadratic."""
    m, p1, p2, p5 = 1 << 64, 11400714785074694791, 14029467366897019727, 2870177450012600261

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (64 - r))) & (m - 1)

    def step(acc: int, lane: int) -> int:
        return rotl((acc + lane * p2) % m, 31) * p1 % m

    # The state before the length is mixed in, for a chosen final hash; then, for each first
    # item, the second item that reaches it.
    before = (12345 - (2 ^ (p5 ^ 3527539))) % m
    wanted = rotl(before * pow(p1, -1, m) % m, 64 - 31)
    out, a, inv2 = [], 0, pow(p2, -1, m)
    while len(out) < n:
        a += 1
        lane = (wanted - step(p5, a)) * inv2 % m
        if lane < (1 << 61) - 1:
            out.append((a, lane))
    return out


def test_keys_whose_hashes_an_attacker_chooses_are_bounded_per_body():
    """§9: at most 1024 map keys that are arrays or floats in one body (Python hashes tuples
    and floats alike in every process: 30 000 colliding keys held a node's loop for 11 s).
    A body with more is refused at once; a node does not send one."""
    keys = _colliding_pairs(30_000)
    assert len({hash(k) for k in keys[:100]}) == 1, "the keys collide"
    # (Packed from pairs: a dict of them would take this test the time the attack costs.)
    body = msgpack.Packer().pack_map_pairs([(k, 0) for k in keys])  # a tuple key packs as an array
    t0 = time.perf_counter()
    with pytest.raises(wire.WireError, match="more than 1024 map keys are arrays or floats") as e:
        decode_body(body, [])
    assert e.value.code == "bad-body"
    assert time.perf_counter() - t0 < 1.0
    # Up to the bound they decode, and floats count with arrays; str, bin and int keys do not.
    at_bound = {**{k: 0 for k in keys[:1000]}, **{float(i) + 0.5: 1 for i in range(24)}}
    assert decode_body(msgpack.packb(at_bound), []) == at_bound
    plenty = {**{str(i): 0 for i in range(5000)}, **{i: 0 for i in range(5000)}, **{bytes([i]): 0 for i in range(256)}}
    assert decode_body(msgpack.packb({"m": plenty, "t": at_bound}), []) == {"m": plenty, "t": at_bound}
    over = {**at_bound, 0.25: 2}
    with pytest.raises(wire.WireError, match="more than 1024"):
        decode_body(msgpack.packb([at_bound, {(1, 2): 3, (4, 5): 6}]), [])
    # The sender refuses to send what such a peer refuses, on either encoding path.
    for fast in (True, False):
        assert decode_body(encode_body(at_bound, fast=fast).body, []) == at_bound
        with pytest.raises(ValueError, match="more than 1024 map keys are tuples or floats"):
            encode_body(over, fast=fast)
        with pytest.raises(ValueError, match="more than 1024"):
            encode_body({"a": at_bound, "b": {(7, 8): 1}}, fast=fast)

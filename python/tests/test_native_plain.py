"""The extension's plain-message codec (``handoff._native.PlainCodec``) against the walk of
``handoff.codec`` it stands in for, byte for byte: every value either packs to what
``is_plain`` then msgpack give, or is "not plain" exactly where ``is_plain`` says so.
And the engine's reader of bodies (``handoff._native.BodyReader``) against the pure-Python
reference's (``handoff_pure.body``): the same values, or the same fault in the same words.
(Headers are the engine's to read: the extension reads none for Python.)"""

from __future__ import annotations

import msgpack
import pytest
from handoff import codec
from handoff_pure import wire
from handoff.codec import Bin
from handoff.msgpack_values import BadStr, Ext
from handoff.resources import ResourceKey
from handoff_pure.body import read as reference_read
from handoff_pure.plain import is_plain
from hypothesis import given, settings
from hypothesis import strategies as st

native = pytest.importorskip("handoff._native")
CODEC = native.PlainCodec(Bin, wire.MAX_BODY_DEPTH)
THRESHOLD = 64


class SubDict(dict):
    pass


class SubStr(str):
    pass


def expected(value, threshold=THRESHOLD):
    if not is_plain(value, threshold):
        return None
    try:
        return wire.packer().pack(value)
    except (ValueError, UnicodeEncodeError, OverflowError):
        return None  # msgpack refuses it: the walk raises the same


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False),
    st.text(max_size=300),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.binary(max_size=2 * THRESHOLD),
    st.binary(max_size=2 * THRESHOLD).map(Bin),
    st.just(SubStr("sub")),
    st.just(bytearray(b"ba")),
    st.just(frozenset()),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=20),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-5, 5)), inner, max_size=18),
        st.dictionaries(st.text(max_size=3), inner, max_size=2).map(SubDict),
    ),
    max_leaves=60,
)


@settings(max_examples=1500, deadline=None)
@given(values)
def test_pack_is_the_pure_path_or_not_plain_where_it_is_not(value):
    assert CODEC.pack(value, THRESHOLD) == expected(value)


@pytest.mark.parametrize(
    "value",
    [
        0,
        127,
        128,
        255,
        256,
        65535,
        65536,
        (1 << 32) - 1,
        1 << 32,
        (1 << 64) - 1,
        1 << 64,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        -(1 << 31),
        -(1 << 31) - 1,
        -(1 << 63),
        -(1 << 63) - 1,
        "x" * 31,
        "x" * 32,
        "x" * 255,
        "x" * 256,
        "x" * 65536,
        b"x" * 63,
        b"x" * 64,
        Bin(b"x" * 70000),
        list(range(15)),
        list(range(16)),
        list(range(70000)),
        {i: i for i in range(15)},
        {i: i for i in range(16)},
        {i: None for i in range(70000)},
        1.5,
        float("inf"),
        float("nan"),
        True,
        False,
        None,
    ],
)
def test_every_length_form_matches_msgpack(value):
    got = CODEC.pack(value, THRESHOLD)
    want = expected(value)
    if isinstance(value, float) and value != value:  # nan: equal bytes, not equal values
        assert got == want
    else:
        assert got == want


def test_depth_is_bounded_as_in_the_pure_path():
    """Nested lists around a scalar: the native codec packs exactly the depths the pure
    path packs, and stops where it stops (at MAX_BODY_DEPTH)."""
    value, depth, plain_depths = 0, 1, []
    while depth <= wire.MAX_BODY_DEPTH + 2:
        assert CODEC.pack(value, THRESHOLD) == expected(value)
        if expected(value) is not None:
            plain_depths.append(depth)
        value, depth = [value], depth + 1
    assert plain_depths == list(range(1, wire.MAX_BODY_DEPTH + 1))


def test_a_codec_deeper_than_its_recursion_allows_is_refused():
    with pytest.raises(ValueError, match="deepest this codec packs"):
        native.PlainCodec(Bin, 10**9)


@pytest.mark.parametrize("threshold", [float("inf"), 4096.0, -1, 1 << 64])
def test_any_threshold_the_pure_path_takes_is_taken(threshold):
    """The native codec takes whole byte counts only: any other threshold goes the pure way."""
    for value in ({"a": b"x" * 10, "n": 1}, [b"y" * 5000]):
        want = codec.encode_body(value, threshold, fast=False)
        got = codec.encode_body(value, threshold)
        assert (got.body, [bytes(f) for f in got.frames]) == (want.body, [bytes(f) for f in want.frames])


framed_values = st.recursive(
    st.one_of(
        scalars,
        st.binary(min_size=THRESHOLD, max_size=3 * THRESHOLD),
        st.binary(max_size=100).map(codec.Buffer),
        st.just(codec.Buffer(bytearray(b"ba"))),
        st.just(codec.Buffer(memoryview(b"mv" * 40))),
        st.just(codec.Buffer(12345)),  # not bytes-like: the walk leaves its frame to the node
        st.just(codec.OnDemand(b"od")),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=8),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=6),
    ),
    max_leaves=30,
)


def _encoded(enc):
    return enc.body, [None if f is None else bytes(f) for f in enc.frames], [id(s) for s in enc.sources]


@settings(max_examples=1500, deadline=None)
@given(framed_values)
def test_framed_bodies_encode_as_the_walk_encodes_them(value):
    """encode_body takes the native packer for bodies that are plain but for frames: the
    same body bytes, frames and frame sources as the walk, or the walk itself."""
    try:
        want = _encoded(codec.encode_body(value, THRESHOLD, fast=False))
    except (ValueError, TypeError, OverflowError, UnicodeEncodeError) as e:
        with pytest.raises(type(e)):
            codec.encode_body(value, THRESHOLD)
        return
    assert _encoded(codec.encode_body(value, THRESHOLD)) == want


def test_pack_framed_takes_exact_buffers_and_large_bytes_only():
    big = b"z" * THRESHOLD
    buf = codec.Buffer(b"abc")
    body, sources = CODEC_FRAMED.pack_framed({"a": big, "b": buf, "c": b"small"}, THRESHOLD)
    assert sources == [big, buf.data]
    assert body == codec.encode_body({"a": big, "b": buf, "c": b"small"}, THRESHOLD, fast=False).body
    assert CODEC_FRAMED.pack_framed([codec.OnDemand(b"x")], THRESHOLD) is None
    assert CODEC.pack_framed([buf], THRESHOLD) is None  # a codec made without Buffer packs none


CODEC_FRAMED = native.PlainCodec(Bin, wire.MAX_BODY_DEPTH, codec.Buffer)


# ------------------------------------------------------- bodies: the engine's reader and the reference's

ENGINE_READER = native.BodyReader(wire.MAX_BODY_DEPTH, "handoff.route", ResourceKey, Ext, BadStr)


def read_with(read, body: bytes, frames: list):
    """``("value", v, keys_seen)`` or ``("fault", code, detail)``."""
    try:
        value, _marked, keys_seen = read(body, frames)
    except ValueError as e:
        return ("fault", *e.args)
    return ("value", value, keys_seen)


def marked(value) -> bool:
    if isinstance(value, dict):
        return "handoff.route" in value or any(marked(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(marked(v) for v in value)
    return False


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (True is not 1, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) and type(k) is type(k2) for k, k2 in zip(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def check_readers(body: bytes, frames: list = ()) -> None:
    """The engine's reader and the reference's give the same value (types included) or the
    same fault, word for word; the engine notes a route-aware value where a map has the key."""
    frames = list(frames)
    engine = read_with(ENGINE_READER.read, body, frames)
    reference = read_with(reference_read, body, frames)
    assert engine[0] == reference[0], (body.hex(), engine, reference)
    if engine[0] == "fault":
        assert engine == reference, body.hex()
        return
    assert same(engine[1], reference[1]), (body.hex(), engine[1], reference[1])
    assert engine[2] == reference[2], body.hex()
    assert ENGINE_READER.read(body, frames)[1] == marked(engine[1])


bodies = values.map(lambda v: expected(v, 1 << 30) or b"\xc0")
FRAMES = [memoryview(b"frame-0"), memoryview(b"frame-1")]
with_exts = st.recursive(
    st.one_of(
        scalars,
        st.integers(0, 3).map(lambda i: msgpack.ExtType(1, i.to_bytes(4, "big"))),  # frame refs, one past
        st.text(max_size=5).map(lambda k: msgpack.ExtType(2, k.encode())),  # resource keys
        st.tuples(st.integers(0, 127), st.binary(max_size=20)).map(lambda t: msgpack.ExtType(*t)),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=4), inner, max_size=6)),
    max_leaves=30,
)


def _packed_ext_body(value) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (ValueError, TypeError, OverflowError):
        return b"\xc0"


@settings(max_examples=1500, deadline=None)
@given(st.one_of(bodies, with_exts.map(_packed_ext_body)), st.data())
def test_the_engine_reads_every_body_as_the_reference_does(body, data):
    frames = data.draw(st.sampled_from([[], FRAMES[:1], FRAMES]))
    check_readers(body, frames)
    # Mutated: a byte changed, bytes cut or added.
    if body:
        i = data.draw(st.integers(0, len(body) - 1))
        check_readers(body[:i] + bytes([data.draw(st.integers(0, 255))]) + body[i + 1 :], frames)
        check_readers(body[:i], frames)
    check_readers(body + data.draw(st.binary(min_size=1, max_size=3)), frames)


def test_every_form_and_every_fault_reads_alike():
    forms = [
        0, 127, -1, -32, 255, 256, 65535, 65536, (1 << 32), (1 << 64) - 1, -129, -(1 << 31) - 1, -(1 << 63),
        1.5, "", "a" * 31, "a" * 32, "a" * 256, "é" * 40000, b"", b"x" * 300, b"y" * 70000,
        [], list(range(16)), list(range(70000)), {}, {str(i): i for i in range(16)}, {b"k": 1}, {1: 2, None: 3},
        None, True, False,
    ]  # fmt: skip
    for v in forms:
        check_readers(msgpack.packb(v, use_bin_type=True))
    check_readers(msgpack.packb(1.5, use_single_float=True))
    for body in (
        b"\xc1",  # never used
        b"\xd4\x01\x00",  # a frame reference of 1 byte
        b"\xd6\x01\x00\x00\x00\x05",  # a frame the message does not have
        b"\xc7\x01\x02\xff",  # a resource key that is not UTF-8
        b"\xc7\x01\x07\x00",  # an ext of another type
        b"\xd4\xff\x00",  # one of a negative type (the timestamp's is -1)
        b"\x81\x91\x01\x02",  # an array as a map key: a tuple
        b"\x81\x81\x01\x02\x03",  # a map as a map key
        b"\xa2\xff\xfe",  # a str that is not UTF-8
        b"\xc0\xc0",  # something after the value (not looked at)
        b"\xdd\xff\xff\xff\xff",  # an array that claims more than the body holds
        b"\xdf\x00\x01\x00\x00",  # a map that does
        b"\xda\x00\x05ab",  # a str cut short
        b"",
    ):
        check_readers(body, FRAMES)
        check_readers(body)
    # A frame as a map key (a writable buffer: its bytes, as the reference makes it), and a
    # deep body whose count is wrong before its depth is (the count is the fault).
    check_readers(b"\x81\xd6\x01\x00\x00\x00\x00\x01", [memoryview(bytearray(b"key"))])
    assert ENGINE_READER.read(b"\x81\xd6\x01\x00\x00\x00\x00\x01", [memoryview(bytearray(b"key"))])[0] == {b"key": 1}
    check_readers(b"\xdc\x04\x4d" + b"\x91" * 1100)
    # Nested as deep as bodies may be, and one deeper, with and without frames.
    deep = b"\x91" * (wire.MAX_BODY_DEPTH - 1) + b"\x90"
    for body in (deep, b"\x91" + deep, b"\x91" * 126 + b"\xd4\x05\x00", b"\x91" * 127 + b"\xd4\x05\x00"):
        check_readers(body)
        check_readers(body, FRAMES)
    # A received frame, a memoryview: read where it lies; frames are the objects given.
    got = ENGINE_READER.read(memoryview(b"\x81\xadhandoff.route\xd6\x01\x00\x00\x00\x01"), FRAMES)
    assert got == ({"handoff.route": FRAMES[1]}, True, False) and got[0]["handoff.route"] is FRAMES[1]

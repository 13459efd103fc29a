"""The extension's plain-message codec (``handoff._native.PlainCodec``) against the walk of
``handoff.codec`` it stands in for, byte for byte: every value either packs to what
``_is_plain`` then msgpack give, or is "not plain" exactly where ``_is_plain`` says so.
(Headers are the engine's to read: the extension reads none for Python.)"""

from __future__ import annotations

import pytest
from handoff import codec
from handoff_pure import wire
from handoff.codec import Bin
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
    if not codec._is_plain(value, threshold):
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


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300), values)
def test_message_is_frame_plain_msg_of_the_packed_body(type_name, value):
    body = expected(value)
    got = CODEC.message(type_name, value, THRESHOLD)
    if body is None:
        assert got is None
        return
    try:
        want = wire.frame_plain_msg(type_name, body)
    except UnicodeEncodeError:
        want = None
    assert got == want


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


# ------------------------------------------------------- plain bodies read in one call


def read_pure(body: bytes):
    """What ``handoff.codec``'s fast path reads without the extension: ``("value", v)``,
    ``("too-deep",)`` or ``("not-plain",)``."""
    try:
        return ("value", codec._plain_body(body))
    except codec._NotPlain:
        return ("not-plain",)
    except codec._TooDeep:
        return ("too-deep",)


def marked(value) -> bool:
    if isinstance(value, dict):
        return "handoff.route" in value or any(marked(v) for v in value.values())
    if isinstance(value, list):
        return any(marked(v) for v in value)
    return False


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (True is not 1, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def check_unpack(body: bytes) -> None:
    got = CODEC.unpack(body, "handoff.route")
    want = read_pure(body)
    if got is None:
        # Not read here: only where the pure path does not read a value either, or where it
        # finds the body too deep (the pure path words that error).
        assert want[0] in ("not-plain", "too-deep"), (body.hex(), want)
        return
    assert want[0] == "value", (body.hex(), want)
    assert same(got[0], want[1]), (body.hex(), got[0], want[1])
    assert got[1] == marked(want[1])


bodies = values.map(lambda v: expected(v, 1 << 30) or b"\xc0")


@settings(max_examples=1500, deadline=None)
@given(bodies, st.data())
def test_unpack_reads_what_the_fast_path_reads(body, data):
    check_unpack(body)
    # Mutated: a byte changed, bytes cut or added; the same answer or "not plain".
    if body:
        i = data.draw(st.integers(0, len(body) - 1))
        check_unpack(body[:i] + bytes([data.draw(st.integers(0, 255))]) + body[i + 1 :])
        check_unpack(body[:i])
    check_unpack(body + data.draw(st.binary(min_size=1, max_size=3)))


def test_unpack_every_form_and_what_is_not_plain():
    import msgpack

    forms = [
        0,
        127,
        -1,
        -32,
        255,
        256,
        65535,
        65536,
        (1 << 32),
        (1 << 64) - 1,
        -129,
        -(1 << 31) - 1,
        -(1 << 63),
        1.5,
        "",
        "a" * 31,
        "a" * 32,
        "a" * 256,
        "é" * 40000,
        b"",
        b"x" * 300,
        b"y" * 70000,
        [],
        list(range(16)),
        list(range(70000)),
        {},
        {str(i): i for i in range(16)},
        {b"k": 1},
        None,
        True,
        False,
    ]
    for v in forms:
        check_unpack(msgpack.packb(v, use_bin_type=True))
    check_unpack(msgpack.packb(1.5, use_single_float=True))
    for not_plain in (
        b"\xc1",  # never used
        b"\xd4\x01\x00",  # a fixext (a frame reference's kind)
        b"\xc7\x01\x02\x00",  # ext 8
        b"\x81\x01\x02",  # an int map key
        b"\xa2\xff\xfe",  # not UTF-8
        b"\xc0\xc0",  # something after the value
        b"\xdd\xff\xff\xff\xff",  # an array that claims more than the body holds
        b"",
    ):
        assert CODEC.unpack(not_plain, "handoff.route") is None, not_plain.hex()
        check_unpack(not_plain)
    # Nested as deep as bodies may be, and one deeper (left to the path that words it).
    deep = b"\x91" * (wire.MAX_BODY_DEPTH - 1) + b"\x90"
    check_unpack(deep)
    assert CODEC.unpack(deep, "handoff.route") is not None
    assert CODEC.unpack(b"\x91" + deep, "handoff.route") is None and read_pure(b"\x91" + deep) == ("too-deep",)
    # A received frame, a memoryview: read where they lie.
    assert CODEC.unpack(memoryview(b"\x81\xadhandoff.route\x01"), "handoff.route") == ({"handoff.route": 1}, True)

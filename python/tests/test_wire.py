"""The sans-IO wire format beyond the vectors: limits, order of checks, type rules, encoders."""

from __future__ import annotations

import struct

import msgpack
import pytest
from handoff_pure import wire


def message(header: dict | bytes, tail: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else msgpack.packb(header, use_bin_type=True)
    return struct.pack(">I", len(raw)) + raw + tail


def code_of(data: bytes, limits=wire.DEFAULT_LIMITS, carried=wire.TCP_KINDS) -> str:
    try:
        wire.decode_message(data, limits, carried)
    except wire.WireError as e:
        return e.code
    return "ok"


def msg(frames, **extra) -> dict:
    return {"k": "msg", "t": "x", "b": b"\x80", "f": frames, **extra}


def test_length_prefix_checks():
    lim = wire.Limits(max_header_bytes=100)
    assert code_of(b"\x00\x00") == "truncated"
    assert code_of(struct.pack(">I", 101), lim) == "header-too-large"
    assert code_of(struct.pack(">I", 0)) == "malformed-header"
    assert code_of(struct.pack(">I", 100) + b"\x80", lim) == "truncated"
    assert wire.header_length(struct.pack(">I", 100), lim) == 100  # inclusive


def test_frame_and_message_limits_are_inclusive():
    lim = wire.Limits(max_frame_bytes=10, max_message_bytes=15, max_frames=2)
    assert code_of(message(msg([{"k": "inline", "n": 10}]), b"x" * 10), lim) == "ok"
    assert code_of(message(msg([{"k": "inline", "n": 11}])), lim) == "frame-too-large"
    assert code_of(message(msg([{"k": "inline", "n": 10}, {"k": "inline", "n": 5}]), b"x" * 15), lim) == "ok"
    assert code_of(message(msg([{"k": "inline", "n": 10}, {"k": "inline", "n": 6}])), lim) == "message-too-large"
    assert code_of(message(msg([{"k": "inline", "n": 1}] * 3)), lim) == "too-many-frames"
    # A ticket's length counts too, although its bytes are not in the stream.
    t = {"k": "ticket", "n": 11, "owner": "o", "lease": 1, "token": bytes(32), "digest": bytes(32), "ttl": 1}
    assert code_of(message(msg([t])), lim) == "frame-too-large"
    # The bytes of a pulled: per frame, then per message.
    assert code_of(message({"k": "pulled", "req": 1, "n": 11}), lim) == "frame-too-large"
    lim2 = wire.Limits(max_frame_bytes=10, max_message_bytes=5)
    assert code_of(message({"k": "pulled", "req": 1, "n": 6}), lim2) == "message-too-large"


def test_order_of_checks():
    # The header structure (every descriptor's known keys typed) comes before the frame count...
    frames = [{"k": "inline", "n": 1}] * 1025
    assert code_of(message(msg(frames))) == "too-many-frames"
    assert code_of(message(msg(frames[:-1] + [{"k": "inline", "n": "x"}]))) == "malformed-header"
    # ...which comes before each descriptor's kind.
    assert code_of(message(msg([{"k": "pigeon"}] * 1025))) == "too-many-frames"
    # A descriptor's kind, then its n, then its size.
    assert code_of(message(msg([{"k": "pigeon"}]))) == "unknown-descriptor"
    assert code_of(message(msg([{"n": 1}]))) == "malformed-header"
    assert code_of(message(msg([{"k": "inline"}]))) == "malformed-header"
    assert code_of(message(msg([{"k": "inline", "n": 1}, {"k": "pigeon"}]))) == "unknown-descriptor"
    # Header checks before the descriptor kinds against the connection.
    assert code_of(message(msg([{"k": "tag", "key": "x"}, {"k": "pigeon"}]))) == "unknown-descriptor"
    assert code_of(message(msg([{"k": "tag", "key": "x"}]))) == "unsupported-descriptor"
    assert code_of(message(msg([{"k": "tag"}]))) == "malformed-header"
    # The kind before the kind's fields; t before b.
    assert code_of(message({"k": "nope", "t": 1})) == "malformed-header"  # t typed whatever the kind
    assert code_of(message({"k": "nope"})) == "unknown-kind"
    assert code_of(message({"k": "msg"})) == "malformed-header"


def test_descriptor_kinds_per_connection():
    shm = {"k": "shm", "n": 4, "off": 0, "size": 4, "lease": 1, "sealed": True}
    ticket = {"k": "ticket", "n": 4, "owner": "o", "lease": 1, "token": bytes(32), "digest": bytes(32), "ttl": 1}
    assert code_of(message(msg([shm]))) == "unsupported-descriptor"
    assert code_of(message(msg([shm])), carried=wire.UNIX_KINDS) == "ok"
    assert code_of(message(msg([ticket]))) == "ok"
    assert (
        code_of(message(msg([ticket])), carried=wire.carried_kinds(unix=True, ticket=False)) == "unsupported-descriptor"
    )


def test_cuda_descriptor():
    """§7.10: its fields after ``n`` in order, its range within u64, only on a Unix socket to a
    receiver that announced ``cuda``."""
    cuda = {"k": "cuda", "n": 4, "off": 0, "lease": 1, "token": bytes(32)}
    cuda |= {"ipc": bytes(64), "device": bytes(16)}
    on_cuda = wire.carried_kinds(unix=True, cuda=True)
    assert code_of(message(msg([cuda])), carried=on_cuda) == "ok"
    assert code_of(message(msg([cuda])), carried=wire.UNIX_KINDS) == "unsupported-descriptor"
    assert code_of(message(msg([cuda])), carried=wire.carried_kinds(unix=False, cuda=True)) == "unsupported-descriptor"
    h = wire.decode_header(msgpack.packb(msg([cuda]), use_bin_type=True))
    assert h.f[0] == wire.Cuda(4, 0, 1, bytes(32), bytes(64), bytes(16))
    assert wire.encode_header(h) == msgpack.packb(msg([cuda]), use_bin_type=True)
    fields = ["n", "off", "lease", "token", "ipc", "device"]
    for i, key in enumerate(fields):  # each missing (or nil) with every later one: that one is named
        for lacking in ({k: v for k, v in cuda.items() if k not in fields[i:]}, {**cuda, key: None}):
            with pytest.raises(wire.WireError) as err:
                wire.decode_message(message(msg([lacking])), carried=on_cuda)
            assert err.value.code == "malformed-header" and f"lacks field {key!r}" in err.value.message
    assert code_of(message(msg([{**cuda, "off": 2**64 - 5}])), carried=on_cuda) == "ok"  # ends at 2**64 - 1
    assert code_of(message(msg([{**cuda, "off": 2**64 - 4}])), carried=on_cuda) == "malformed-header"
    with pytest.raises(wire.WireError, match="lacks field 'device'"):  # the fields before the range
        wire.decode_message(message(msg([{**cuda, "off": 2**64 - 4, "device": None}])), carried=on_cuda)
    # Header checks come before the kinds against the connection (§11.2 step 5).
    assert code_of(message(msg([{**cuda, "ipc": bytes(63)}]))) == "malformed-header"


def test_type_rules():
    # Known keys are typed whatever the kind; nil counts as absent; unknown keys are ignored.
    assert code_of(message({"k": "ready", "pid": "x"})) == "malformed-header"
    assert code_of(message({"k": "ready", "pid": 2**32})) == "malformed-header"
    assert code_of(message({"k": "ready", "v": 2**16})) == "malformed-header"
    assert code_of(message({"k": "ready", "req": -1})) == "malformed-header"
    assert code_of(message({"k": "ready", "caps": ["a", 1]})) == "malformed-header"
    assert code_of(message({"k": "ready", "t": None, "x-anything": {"deep": [1, 2]}})) == "ok"
    assert code_of(message({"k": "ready", "nonce": "not bin"})) == "malformed-header"
    assert code_of(message({"k": "ready", "node": b"bin, not str"})) == "malformed-header"
    assert code_of(message(msg(None))) == "ok"
    assert code_of(message(msg([{"k": "inline", "n": 0, "sealed": 1}]))) == "malformed-header"
    assert code_of(message(msg([{"k": "inline", "n": 0, "x": 1}]))) == "ok"
    assert code_of(message(msg([5]))) == "malformed-header"
    assert code_of(message(b"\x92\xa1k\xa5ready")) == "malformed-header"  # an array, not a map


def test_duplicate_keys_are_malformed():
    dup = b"\x82\xa1k\xa5ready\xa1k\xa5ready"
    assert code_of(message(dup)) == "malformed-header"
    dup_desc = msgpack.packb({"k": "msg", "t": "x", "b": b"\x80"})[1:]
    dup_desc = b"\x84" + dup_desc + b"\xa1f\x91\x82\xa1n\x00\xa1n\x00"
    assert code_of(message(dup_desc)) == "malformed-header"


def test_header_nesting_limit_is_15_levels():
    def nested(levels):  # the header map is level 1
        v = 1
        for _ in range(levels - 1):
            v = [v]
        return {"k": "ready", "x-deep": v}

    assert code_of(message(nested(15))) == "ok"
    assert code_of(message(nested(16))) == "malformed-header"


def test_shm_window_and_fields():
    base = {"k": "shm", "n": 4096, "off": 8192, "size": 12288, "lease": 1}
    assert code_of(message(msg([base])), carried=wire.UNIX_KINDS) == "ok"
    assert code_of(message(msg([{**base, "off": 8193}])), carried=wire.UNIX_KINDS) == "malformed-header"
    big = {**base, "off": 2**64 - 1, "size": 2**64 - 1}  # no overflow
    assert code_of(message(msg([big])), carried=wire.UNIX_KINDS) == "malformed-header"
    h = wire.decode_header(msgpack.packb(msg([base]), use_bin_type=True))
    assert h.f[0].sealed is False  # absent sealed reads as false


def test_handshake_fields():
    nonce_short = {"k": "hello", "nonce": bytes(31)}
    assert code_of(message(nonce_short)) == "malformed-header"
    assert code_of(message({"k": "auth", "mac": bytes(31)})) == "malformed-header"
    assert code_of(message({"k": "release", "leases": [1, -1]})) == "malformed-header"
    assert code_of(message({"k": "forwarded", "req": 1, "token": bytes(33)})) == "malformed-header"
    # Version 2: the challenge's nonce is 32 bytes as the hello's; the ident needs its identity.
    assert code_of(message({"k": "challenge", "v": 2, "nonce": bytes(31)})) == "malformed-header"
    assert code_of(message({"k": "challenge", "nonce": bytes(32)})) == "malformed-header"
    assert code_of(message({"k": "ident", "name": "a"})) == "malformed-header"
    assert code_of(message({"k": "ident", "nonce": bytes(3)})) == "malformed-header"  # typed whatever the kind


def test_preamble():
    assert wire.Preamble.decode(wire.OUR_PREAMBLE.encode()) == wire.Preamble(3, 3, 0)
    assert wire.our_preamble() == wire.OUR_PREAMBLE
    assert wire.our_preamble(accept_v2=True) == wire.ACCEPTING_V2 == wire.Preamble(2, 3)
    # Accepting v1 accepts v2 as well: a range has no holes.
    assert wire.our_preamble(accept_v1=True) == wire.our_preamble(accept_v1=True, accept_v2=True) == wire.Preamble(1, 3)
    # Versions 1 and 2 only by consent, refused alike on both sides otherwise.
    for a, b, expect in (
        (wire.OUR_PREAMBLE, wire.V1_ONLY, None),
        (wire.OUR_PREAMBLE, wire.V2_DEFAULT, None),
        (wire.OUR_PREAMBLE, wire.V2_ACCEPTING_V1, None),
        (wire.ACCEPTING_V2, wire.V1_ONLY, None),
        (wire.ACCEPTING_V2, wire.V2_DEFAULT, 2),
        (wire.ACCEPTING_V2, wire.V2_ACCEPTING_V1, 2),
        (wire.ACCEPTING_V2, wire.OUR_PREAMBLE, 3),
        (wire.ACCEPTING_V1, wire.V1_ONLY, 1),
        (wire.ACCEPTING_V1, wire.V2_DEFAULT, 2),
        (wire.ACCEPTING_V1, wire.OUR_PREAMBLE, 3),
    ):
        for x, y in ((a, b), (b, a)):
            if expect is None:
                with pytest.raises(wire.WireError) as e:
                    x.negotiate(y)
                assert e.value.code == "unsupported-version"
            else:
                assert x.negotiate(y) == expect
    for lo, hi in ((0, 1), (3, 2)):
        with pytest.raises(wire.WireError) as e:
            wire.Preamble.decode(wire.Preamble(lo, hi).encode())
        assert e.value.code == "handshake"
    # Flags are ignored.
    assert wire.Preamble.decode(b"HANDOFF\x00\x00\x01\x00\x04\xff\xff\xff\xff").negotiate(wire.OUR_PREAMBLE) == 3


def test_encoders_omit_absent_optional_keys_and_always_write_f():
    assert wire.encode_header(wire.Msg("x", b"", [])) == b"\x84\xa1k\xa3msg\xa1t\xa1x\xa1b\xc4\x00\xa1f\x90"
    t = wire.TicketDesc(n=1, owner="o", lease=2, token=bytes(32), digest=bytes(32), ttl=3)
    assert "addr" not in msgpack.unpackb(wire.encode_header(wire.Msg("x", b"", [t])))["f"][0]
    h = wire.Hello("n", "a", "h", 1, "p", "python", "i", 1, ["inline"], bytes(32))
    assert set(msgpack.unpackb(wire.encode_header(h))) == {
        "k",
        "node",
        "name",
        "host",
        "pid",
        "proc",
        "lang",
        "impl",
        "v",
        "caps",
        "nonce",
    }


def test_round_trip_every_kind():
    token = bytes(range(32))
    headers = [
        wire.Hello("n", "a", "h", 1, "p", "python", "i", 1, ["inline", "shm"], token, "tcp://x:1", "unix:///s"),
        wire.Auth(token),
        wire.Ready(),
        wire.Msg("t", b"\x80", [wire.Inline(3), wire.Tag("key")]),
        wire.Error("auth-failed", "no"),
        wire.Release([1, 2**64 - 1]),
        wire.Pull(1, 2, token, 3, 4),
        wire.Pulled(1, 0),
        wire.Forward(1, 2, token, "to"),
        wire.Forwarded(1, token),
        wire.TicketError(1, "expired", "late"),
        wire.Unlease(1, token),
        wire.Renew(1, token),
    ]
    for h in headers:
        assert wire.decode_header(wire.encode_header(h)) == h


def test_mutated_vectors_raise_only_wire_errors():
    """Any bytes decode or fail with a WireError code of §11 (a cheap fuzz over the vectors)."""
    import random
    from pathlib import Path

    from handoff.codec import decode_body

    rng = random.Random(7)
    vectors = [p.read_bytes() for p in (Path(__file__).resolve().parents[2] / "spec" / "vectors").glob("msg-*.bin")]
    vectors += [p.read_bytes() for p in (Path(__file__).resolve().parents[2] / "spec" / "vectors").glob("ticket-*.bin")]
    codes = set()
    for _ in range(3000):
        b = bytearray(rng.choice(vectors))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            if op == 0 and len(b) > 4:
                b[rng.randrange(4, len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)) :]
            else:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        try:
            m = wire.decode_message(bytes(b), carried=wire.UNIX_KINDS)
            if isinstance(m.header, wire.Msg):
                decode_body(m.header.b, [b""] * len(m.header.f))
            codes.add("ok")
        except wire.WireError as e:
            codes.add(e.code)
    assert "ok" in codes and "malformed-header" in codes and "truncated" in codes
    assert codes <= {
        "ok", "truncated", "header-too-large", "too-many-frames", "frame-too-large", "message-too-large",
        "malformed-header", "unknown-kind", "unknown-descriptor", "unsupported-descriptor", "bad-frame-ref", "bad-body",
    }  # fmt: skip


def _decode_both(buf: bytes, limits: wire.Limits = wire.DEFAULT_LIMITS) -> tuple:
    """decode_header's result (or error) with and without its path for plain msg headers."""
    import handoff_pure.wire.decode as decode

    def run():
        try:
            return ("ok", repr(wire.decode_header(buf, limits)))
        except wire.WireError as e:
            return ("error", e.code, str(e))

    fast = run()
    plain, decode._plain_msg = decode._plain_msg, lambda _buf: None
    try:
        strict = run()
    finally:
        decode._plain_msg = plain
    return fast, strict


@pytest.mark.parametrize("t", ["", "a", "x" * 31, "x" * 32, "y" * 255, "z" * 256, "é" * 20])
@pytest.mark.parametrize("b", [b"", b"q", b"w" * 255, b"w" * 256, b"v" * 65535, b"v" * 65536])
def test_plain_msg_headers_decode_as_the_two_passes_decode_them(t, b):
    """A msg header without frames, as encoders write it, is read without the cursor: the same Msg."""
    buf = wire.encode_header(wire.Msg(t, b, []))
    fast, strict = _decode_both(buf)
    assert fast == strict and fast[0] == "ok"
    assert _decode_both(buf, wire.Limits(max_header_values=8))[0][0] == "error"  # the budget still holds


@pytest.mark.parametrize(
    "buf",
    [
        b"\x84\xa1k\xa3msg\xa1t\xd9\x03abc\xa1b\xc4\x01x\xa1f\x90",  # t not in its shortest form
        b"\x84\xa1k\xa3msg\xa1t\xa3abc\xa1b\xc5\x00\x01x\xa1f\x90",  # b not in its shortest form
        b"\x84\xa1k\xa3msg\xa1t\xa3abc\xa1b\xa1x\xa1f\x90",  # b a str
        b"\x84\xa1k\xa3msg\xa1t\xa2\xff\xfe\xa1b\xc4\x01x\xa1f\x90",  # t not UTF-8
        b"\x84\xa1k\xa3msg\xa1t\xa3abc\xa1b\xc4\x01x\xa1f\x90\x00",  # a byte after the map
        b"\x84\xa1k\xa3msg\xa1t\xa3abc\xa1b\xc4\x02x\xa1f\x90",  # b's length runs into f
        b"\x84\xa1k\xa3msg\xa1t\xa3abc\xa1t\xc4\x01x\xa1f\x90",  # t twice, no b
        b"\x84\xa1k\xa3msg\xa1t\xbf\xa1f\x90",  # t's length beyond the end
    ],
)
def test_headers_that_only_look_plain_get_the_two_passes(buf):
    fast, strict = _decode_both(buf)
    assert fast == strict


def test_plain_msg_headers_agree_with_the_two_passes_on_generated_headers():
    """Property: generated frameless msg headers, and the same bytes mutated, decode as the passes decode them."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(
        st.text(max_size=300),
        st.binary(max_size=70_000),
        st.lists(st.tuples(st.integers(-40, 40), st.integers(0, 255)), max_size=2),  # near either end
    )
    def check(t, b, flips):
        buf = bytearray(wire.encode_header(wire.Msg(t, b, [])))
        for at, byte in flips:
            buf[at % len(buf)] = byte
        fast, strict = _decode_both(bytes(buf))
        assert fast == strict

    check()


@pytest.mark.parametrize(
    "type_name,body",
    [("handoff.bench.Ping", b"\x80"), ("t" * 31, b"b" * 255), ("t" * 40, b"y" * 300), ("t", b"z" * 70000), ("", b"")],
)
def test_frame_plain_msg_is_the_canonical_encoding(type_name, body):
    expected = wire.frame_header(wire.encode_header(wire.Msg(type_name, body, [])))
    assert wire.frame_plain_msg(type_name, body) == expected
    if body:
        assert wire.decode_header(expected[4:]) == wire.Msg(type_name, body, [])

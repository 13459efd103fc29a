"""The field types of spec Appendix A, as the Python worker checks them (handoff.demo_types)."""

from __future__ import annotations

import pytest
from handoff import demo_types
from handoff.msgpack_values import BadStr
from handoff_pure.wire import WireError

PING = "handoff.bench.Ping"


def test_a_well_typed_body_passes():
    demo_types.check(PING, {"seq": 3, "data": b"x", "extra": "ignored"})
    demo_types.check("handoff.demo.Hold", {"id": 0, "data": memoryview(b"abc")})
    demo_types.check("handoff.demo.Hold", {"id": 0, "data": [0, 255]})  # §8.2: an array of bytes
    demo_types.check("handoff.demo.Held", {"id": 1, "holder": "n", "bytes": 0})  # nil-able field absent
    segment = {"device": 1, "inode": 2, "offset": 0, "size": 4096, "pool_id": None, "sealed": False}
    demo_types.check("handoff.demo.Held", {"id": 1, "holder": "n", "bytes": 1, "segment": segment})
    demo_types.check("handoff.demo.Payload", {"id": 1, "digest": b"", "data": b"", "prepare_seconds": 0})
    demo_types.check("some.other.Type", {"anything": object()})  # not described: not checked


@pytest.mark.parametrize(
    "type_name, body, says",
    [
        (PING, {"seq": "x", "data": b""}, "'seq' must be uint, got str"),
        (PING, {"seq": -1, "data": b""}, "'seq' must be uint, got int"),
        (PING, {"seq": 1 << 64, "data": b""}, "'seq' must be uint"),
        (PING, {"seq": True, "data": b""}, "'seq' must be uint, got bool"),
        (PING, {"seq": 1, "data": BadStr(b"\xff")}, "'data' must be bin, got str (not UTF-8)"),
        (PING, {"seq": 1}, "lacks the field 'data'"),
        (PING, [1, b""], "body must be a map, got list"),
        ("handoff.demo.Hold", {"id": 1, "data": [256]}, "'data' must be Buffer, got list"),
        ("handoff.demo.Hold", {"id": 1, "data": "text"}, "'data' must be Buffer, got str"),
        ("handoff.demo.Held", {"id": 1, "holder": "n", "bytes": 0, "segment": 3}, "must be nil or map"),
        ("handoff.demo.Held", {"id": 1, "holder": "n", "bytes": 0, "segment": {"device": 1}}, "must be nil or map"),
        ("handoff.demo.Payload", {"id": 1, "digest": b"", "data": b"", "prepare_seconds": "0"}, "float64"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_bad_body(type_name, body, says):
    with pytest.raises(WireError) as e:
        demo_types.check(type_name, body)
    assert e.value.code == "bad-body" and says in e.value.message, e.value.message

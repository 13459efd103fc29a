"""Encoding and decoding leave no reference cycles: a cycle that holds received frames keeps
them (and the shared segments under them) until the cyclic collector runs, and the collector
cannot clear a memoryview that is still exported — CPython then reports a BufferError from
tp_clear, and a Dask worker was seen to crash right after."""

from __future__ import annotations

import gc

import numpy as np
from handoff.codec import Buffer, decode_body, encode_body
from handoff_pure.msgpack_read import unpack_one


def _garbage_of(fn) -> list:
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        fn()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_encoding_and_decoding_leave_no_cycles():
    frame = memoryview(bytearray(4096))

    def roundtrip():
        enc = encode_body({"a": [1, {"b": Buffer(frame)}], "x": np.arange(10)})
        value = decode_body(enc.body, [bytes(f) for f in enc.frames])
        assert value["a"][1]["b"] == bytes(4096)
        unpack_one(b"\x92\x01\xc4\x01\x00", max_depth=4)

    garbage = _garbage_of(roundtrip)
    assert not [g for g in garbage if isinstance(g, (memoryview, type(roundtrip)))], garbage[:10]

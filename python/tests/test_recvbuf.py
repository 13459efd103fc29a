"""The pool of warm receive buffers (handoff_pure.recvbuf): reuse, bounds, isolation of frames."""

import gc
import time

import numpy as np

from handoff_pure.recvbuf import RecvPool


def test_a_buffer_comes_back_when_the_last_view_is_gone_and_is_reused():
    p = RecvPool(max_idle_bytes=64 << 20)
    v = p.take(3 << 20)
    assert len(v) == 3 << 20 and not v.readonly
    v[:] = b"\x01" * len(v)
    p.filled(v)
    arr = np.frombuffer(v, dtype=np.uint8)[10:20]  # a numpy view of a slice keeps it busy
    del v
    gc.collect()
    assert p.stats()["idle_buffers"] == 0
    del arr
    gc.collect()
    assert p.stats()["idle_buffers"] == 1
    w = p.take(3 << 20)
    assert p.stats()["reused"] == 1 and p.stats()["idle_buffers"] == 0
    assert len(w) == 3 << 20  # exactly n bytes, never the rest of the buffer


def test_a_frame_sees_only_its_own_length_of_a_larger_buffer():
    p = RecvPool(max_idle_bytes=64 << 20)
    v = p.take(4 << 20)
    p.filled(v)
    del v
    gc.collect()
    w = p.take((4 << 20) - 100)  # fits: at most n/4 larger
    assert p.stats()["reused"] == 1
    assert len(w) == (4 << 20) - 100


def test_a_much_larger_idle_buffer_is_not_used_for_a_small_frame():
    p = RecvPool(max_idle_bytes=256 << 20)
    v = p.take(64 << 20)
    p.filled(v)
    del v
    gc.collect()
    w = p.take(8 << 20)
    assert p.stats()["reused"] == 0 and p.stats()["created"] == 2
    del w


def test_idle_bytes_are_bounded_and_the_oldest_go_first():
    p = RecvPool(max_idle_bytes=8 << 20)
    views = [p.take(4 << 20) for _ in range(3)]
    for v in views:
        p.filled(v)
    del views, v
    gc.collect()
    s = p.stats()
    assert s["idle_bytes"] <= 8 << 20 and s["freed"] >= 1


def test_no_idle_bytes_allowed_means_no_pooling():
    assert RecvPool(max_idle_bytes=0).take(4 << 20) is None


def test_idle_buffers_are_freed_after_the_idle_time():
    p = RecvPool(max_idle_bytes=64 << 20, idle_seconds=1.0)
    v = p.take(4 << 20)
    p.filled(v)
    returned = time.monotonic()
    del v  # the last view: back at once (reference counting)
    assert p.stats()["idle_buffers"] == 1 or time.monotonic() - returned >= 1.0
    deadline = time.monotonic() + 10
    while p.stats()["idle_buffers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.stats()["idle_buffers"] == 0 and p.stats()["freed"] == 1


def test_the_buffer_of_a_frame_cut_short_is_freed_not_kept():
    # A peer that announced a large frame and stalled made the node touch its first pages:
    # they are not kept for the next frame once the connection failed.
    p = RecvPool(max_idle_bytes=64 << 20)
    v = p.take(4 << 20)
    v[: 1 << 20] = b"\x02" * (1 << 20)
    del v
    gc.collect()
    s = p.stats()
    assert s["idle_buffers"] == 0 and s["idle_bytes"] == 0 and s["freed"] == 1
    w = p.take(4 << 20)
    assert p.stats()["reused"] == 0 and p.stats()["created"] == 2
    p.filled(memoryview(b"not from the pool"))  # any other view: left alone
    del w

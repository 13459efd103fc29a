"""What a node's settings do on the engine: each reaches it, or is refused by name. A setting
that is taken and then does nothing is what these tests catch (the Dask backend's
``kept-map-bytes`` and ``pool-idle-bytes`` once configured only the pure-Python reference)."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
from conftest import ON_ENGINE
from handoff import Node
from handoff.bounds import DEFAULT_BOUNDS
from helpers import eventually

pytestmark = pytest.mark.skipif(not ON_ENGINE, reason="the engine's settings")

MIB = 1 << 20


def _native():
    from handoff import _native

    return _native


async def _send_and_drop(rx: Node, tx: Node) -> None:
    """One 4 MiB frame through shared memory, received, then let go of."""
    peer = await tx.connect(rx.unix_addr)
    await peer.send("t.A", {"x": np.arange(MIB, dtype=np.int32)})
    env = await rx.recv(5)
    assert env.frames[0].kind == "shm"
    assert int(np.frombuffer(env.body["x"], dtype=np.int32)[-1]) == MIB - 1
    del env
    gc.collect()
    assert await eventually(lambda: tx.shm_leases()["count"] == 0)


@pytest.mark.parametrize("kept", [None, 0])
async def test_kept_map_bytes_reach_the_engine(kept):
    native = _native()
    native.give_back_held()
    async with (
        Node("rx", secret="k", listen="127.0.0.1:0", kept_map_bytes=kept) as rx,
        Node("tx", secret="k", shm_pool=True) as tx,
    ):
        await _send_and_drop(rx, tx)
        if kept is None:
            kept_idle = native.held_for_reuse()["kept-idle"]
            assert kept_idle >= 4 * MIB, "by default the engine keeps a received segment mapped"
        else:
            # Unmapped at the next sweep, within 50 ms, not after the default's 10 s.
            assert await eventually(lambda: native.held_for_reuse()["kept-idle"] == 0, timeout=1.0), (
                f"kept_map_bytes=0, yet {native.held_for_reuse()['kept-idle']} bytes stay mapped"
            )
    native.give_back_held()


@pytest.mark.parametrize("cap", [None, 0])
async def test_the_segment_pool_s_idle_cap_reaches_the_engine(cap):
    native = _native()
    native.give_back_held()
    native.configure_segment_pool(max_idle_bytes=cap)
    try:
        async with (
            Node("rx", secret="k", listen="127.0.0.1:0") as rx,
            Node("tx", secret="k", shm_pool=True) as tx,
        ):
            await _send_and_drop(rx, tx)
            idle = native.segment_pool_stats()["idle_bytes"]
            if cap is None:
                assert idle >= 4 * MIB, "by default a sent segment waits in the pool for the next send"
            else:
                assert idle == 0, f"an idle cap of 0 keeps no segment, yet {idle} bytes are idle"
    finally:
        native.configure_segment_pool(max_idle_bytes=4 << 30)
        native.give_back_held()
    with pytest.raises(ValueError, match="idle_seconds"):
        native.configure_segment_pool(idle_seconds=-1)


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_pending_fds", 64),
        ("handshake_header_bytes", 4096),
        ("message_overhead", 0),
        ("drain_seconds", 5.0),
        ("drain_bytes", 0),
        ("max_control_queued", 16),
    ],
)
def test_a_bound_the_engine_keeps_fixed_is_refused_by_name(field, value):
    bounds = dataclasses.replace(DEFAULT_BOUNDS, **{field: value})
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        Node("n", secret="k", bounds=bounds)
    Node("n", secret="k", bounds=bounds, engine=False)  # the reference applies it


def test_kept_map_settings_are_checked():
    with pytest.raises(ValueError, match="kept_map_bytes"):
        Node("n", secret="k", kept_map_bytes=-1)
    with pytest.raises(ValueError, match="kept_map_seconds"):
        Node("n", secret="k", kept_map_seconds=float("nan"))

"""What a node's settings do on the engine: each reaches it, or is refused by name. A setting
that is taken and then does nothing is what these tests catch (the Dask backend's
``kept-map-bytes`` and ``pool-idle-bytes`` once configured only the pure-Python reference)."""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import stat

import numpy as np
import pytest
from conftest import ON_ENGINE
from handoff import Node
from handoff.bounds import DEFAULT_BOUNDS, Bounds
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


def test_a_fixed_bound_is_refused_in_the_engine_s_words():
    with pytest.raises(ValueError) as e:
        Node("n", secret="k", bounds=dataclasses.replace(DEFAULT_BOUNDS, drain_seconds=5.0))
    assert str(e.value) == (
        "Bounds(drain_seconds=5.0): a node on the engine keeps drain_seconds at 1.0; leave it at that value"
    )
    with pytest.raises(ValueError) as e:
        Node("n", secret="k", bounds=dataclasses.replace(DEFAULT_BOUNDS, max_control_queued=16))
    assert str(e.value) == (
        "Bounds(max_control_queued=16): a node on the engine bounds the ticket answers queued for a connection "
        "by bytes (1 MiB), not by this count; leave it at 1024"
    )
    fixed = _native().ENGINE_FIXED_BOUNDS
    assert fixed == {name: getattr(DEFAULT_BOUNDS, name) for name in fixed}


def test_the_engine_takes_bounds_by_their_python_names():
    """``handoff.bounds.Bounds`` as it is: renamed fields reach the engine, the driver's own
    (lease_wait, the warnings) are accepted, and an unknown name is still refused."""
    bounds = Bounds(max_handshakes=7, max_connections=9, max_owner_dials=3, max_owner_connections=5, write_timeout=11.0)
    bounds = dataclasses.replace(bounds, lease_wait=2.0, warnings_per_period=1, warning_period=3.0)
    engine = _native().Engine("n", b"k", bounds=dataclasses.asdict(bounds))
    assert engine.bounds == {
        "max_handshakes": 7,
        "max_connections": 9,
        "max_ticket_dials": 3,
        "max_owner_connections": 5,
        "write_timeout": 11.0,
    }
    with pytest.raises(ValueError, match="no bound named max_nothing"):
        _native().Engine("n", b"k", bounds={"max_nothing": 1})
    with pytest.raises(ValueError, match="bound max_owner_dials cannot be 0"):
        _native().check_engine_bounds({"max_owner_dials": 0})


@pytest.mark.parametrize("seconds", [1e20, 1e10, float("inf")])
async def test_a_time_too_long_for_the_clock_is_refused_by_name_not_a_panic(seconds, monkeypatch):
    """Every time the engine takes: past MAX_SECONDS (about 31 years) a deadline counted
    from now would overflow the clock; such a value is a ValueError naming it (a Rust panic
    would be a BaseException, past every ``except Exception``)."""
    native = _native()
    with pytest.raises(ValueError, match="write_timeout"):
        Node("n", secret="k", bounds=dataclasses.replace(DEFAULT_BOUNDS, write_timeout=seconds))
    with pytest.raises(ValueError, match="handshake_timeout"):
        native.Engine("n", b"k", handshake_timeout=seconds)
    with pytest.raises(ValueError, match="lease_ttl"):
        native.Engine("n", b"k", lease_ttl=seconds)
    with pytest.raises(ValueError, match="kept_map_seconds"):
        native.Engine("n", b"k", kept_map_seconds=seconds)
    with pytest.raises(ValueError, match="idle_seconds"):
        native.configure_segment_pool(idle_seconds=seconds)
    # From the environment, where nobody can be told: the default instead.
    monkeypatch.setenv("HANDOFF_SHM_KEEP_SECONDS", repr(seconds))
    monkeypatch.setenv("HANDOFF_SHM_POOL_IDLE_SECONDS", repr(seconds))
    async with Node("env", secret="k") as node:
        assert node._driver.engine.sweep_idle() > 0
    native.Engine("n", b"k", bounds={"write_timeout": 1e9})  # the longest taken


async def test_the_engine_reads_kept_map_bytes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HANDOFF_SHM_KEEP_BYTES", " 12345 ")
    async with Node("env", secret="k") as a, Node("own", secret="k", kept_map_bytes=7) as b:
        assert (a._driver.engine.kept_map_bytes, b._driver.engine.kept_map_bytes) == (12345, 7)
    monkeypatch.setenv("HANDOFF_SHM_KEEP_BYTES", "lots")
    node = Node("bad", secret="k")
    with pytest.raises(ValueError) as e:
        await node.start()
    assert str(e.value) == "HANDOFF_SHM_KEEP_BYTES='lots': expected a number of bytes (0: keep none)"
    assert node.unix_path is None or not node.unix_path.exists()


@pytest.mark.parametrize("shm", [True, False])
def test_the_engine_announces_the_reference_s_capabilities(shm):
    caps = Node("n", secret="k", shm=shm).caps
    assert [c for c in caps if c != "cuda"] == Node("n", secret="k", shm=shm, engine=False).caps
    assert ("shm" in caps) == shm and ("cuda" not in caps or shm)


async def test_the_unix_socket_is_named_and_guarded_as_the_reference_s():
    async with Node("a b/é", secret="k") as a:
        assert re.fullmatch(r"a_b__-[0-9a-f]{12}\.sock", a.unix_path.name), a.unix_path
        assert stat.S_IMODE(os.stat(a.unix_path).st_mode) == 0o600
        path = a.unix_path
    assert not path.exists()

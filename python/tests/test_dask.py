"""The handoff:// Dask comm backend in one process: frames, zero copy, the route, secrets,
registration, scheme inheritance, and Dask computations equal to the same run on tcp://.

Dask's own comm conformance checks run with ``../shared/dask/run``; the tests with
worker processes are in ``test_dask_processes.py``."""

from __future__ import annotations

import asyncio
import mmap
import subprocess
import sys
import time

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, Nanny, Scheduler, Worker
from distributed.comm import connect, listen
from distributed.comm.core import CommClosedError, FatalCommClosedError
from distributed.protocol import dask_deserialize, dask_serialize, to_serialize
from distributed.utils_test import gen_cluster, gen_test
from handoff import Node
from handoff.dask import HandoffComm, config
from handoff.dask import frames as dask_frames
from handoff.dask.frames import SMALL, FramesError, plan_message, unpack_part
from handoff.shmmap import Region
from handoff._native import Frame
from handoff_pure.wire import Limits

MIB = 1 << 20
SECRET = {"distributed.comm.handoff.secret": "dask test secret"}


def _owner(x):
    """What finally holds an array's memory: follows ``.base`` and ``.obj``."""
    while True:
        if isinstance(x, np.ndarray) and x.base is not None:
            x = x.base
        elif isinstance(x, memoryview):
            x = x.obj
        else:
            return x


def _address(buf) -> int:
    if isinstance(buf, Region):  # a received mapping: not a buffer itself, its arrays are
        return buf.addr
    return np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0]


async def _pair(addr: str = "handoff://127.0.0.1", listen_config=None, connect_config=None):
    """A connected (connector comm, listener comm) pair; each side under its own config."""
    q: asyncio.Queue = asyncio.Queue()

    async def handle(comm):
        await q.put(comm)

    with dask.config.set(listen_config or SECRET):
        listener = listen(addr, handle)
        await listener.start()
    with dask.config.set(connect_config or SECRET):
        a = await connect(listener.contact_address, timeout=10)
    b = await asyncio.wait_for(q.get(), 10)
    listener.stop()
    return a, b


# ---------------------------------------------------------------- frames (no I/O)


def test_shards_of_one_buffer_travel_as_one_frame_and_come_back_as_slices_of_one_buffer():
    data = np.arange(10 * 1024, dtype=np.uint8)
    base = memoryview(data)
    shards = [base[i : i + 4096] for i in range(0, base.nbytes, 4096)]
    other = memoryview(bytearray(b"x" * 5000))
    plan = plan_message([b"header", *shards, other, b"tail"])
    [part] = plan.parts
    entries = part["f"]
    assert entries[0] == b"header" and entries[-1] == b"tail"
    assert entries[1]["cut"] == [4096, 4096, 2048]  # one frame for the three shards
    assert entries[2].data is other  # an unrelated buffer stays a frame of its own
    assert plan.nbytes == len(b"header") + data.nbytes + other.nbytes + len(b"tail")
    # The receiver's side: the body as decoded, with the frames as received (one buffer each).
    received = memoryview(bytearray(bytes(entries[1]["f"].data)))
    body = {"f": [b"header", {"cut": entries[1]["cut"], "f": received}, bytes(other), b"tail"]}
    out: list = []
    assert unpack_part(body, out) is False
    assert [bytes(f) for f in out] == [b"header", *(bytes(s) for s in shards), bytes(other), b"tail"]
    assert all(f.obj is received.obj for f in out[1:4])  # Dask joins these without a copy


def test_a_message_of_small_frames_is_packed_as_send_would_encode_it():
    """comm.write sends such a message with Peer.send_packed: the same body bytes."""
    from handoff.codec import encode_body
    from handoff_pure.wire import packer

    plan = plan_message([b"header", b"x" * 1023, b""])
    assert plan.inline and len(plan.parts) == 1
    assert packer().pack(plan.parts[0]) == encode_body(plan.parts[0]).body
    assert not plan_message([b"header", b"x" * 1024]).inline


def test_a_message_is_cut_into_parts_within_the_receivers_limits():
    limits = Limits(max_frames=3, max_frame_bytes=8192)
    frames = [bytes([i]) * 2000 for i in range(7)] + [b"z" * 20000]
    plan = plan_message(frames, limits=limits)
    assert len(plan.parts) == 4 and all(p.get("more") for p in plan.parts[:-1])
    assert "more" not in plan.parts[-1]
    out: list = []
    for part in plan.parts:
        body = {
            **part,
            "f": [
                {"join": [bytes(p.data) for p in e["join"]]} if isinstance(e, dict) else bytes(e.data)
                for e in part["f"]
            ],
        }
        unpack_part(body, out)
    assert [bytes(f) for f in out] == frames  # the 20000-byte frame travelled in 3 pieces
    # 64 shared segments at most per part, on a Unix socket.
    plan = plan_message([b"a" * 100_000] * 70, shm_threshold=65536)
    assert [len(p["f"]) for p in plan.parts] == [64, 6]


def _plan_as_data(plan) -> tuple:
    """A plan as plain data: each entry's kind, the type it wraps and its bytes."""

    def entry(e):
        if isinstance(e, dask_frames.Bin):
            return ("bin", type(e).__name__, bytes(e))
        if isinstance(e, dask_frames.Buffer):
            view = memoryview(e.data)
            return ("frame", type(e.data).__name__, view.format, view.ndim, bytes(view))
        return ("other", repr(e))

    return [([entry(e) for e in p["f"]], p.get("more")) for p in plan.parts], plan.nbytes, plan.inline


def test_the_one_pass_plan_of_most_messages_is_the_walks_plan(monkeypatch):
    """plan_message plans most messages in one pass (_one_part); where it does, its plan is
    the one the general walk makes, and it leaves the rest (GPU memory, consecutive large
    frames that may be shards of one buffer, bytearrays, strided views) to the walk."""
    big = np.arange(300_000)
    messages = {
        "an 8-byte array": [b"h", b"sub", memoryview(np.zeros(1))],
        "a 64 KiB array": [b"h", b"sub", memoryview(np.ones(8192))],
        "bins at the edge": [b"", memoryview(b""), b"x" * 1023, b"y" * 1024, b"s", memoryview(b"z" * 1025)],
        "a 2-D array": [b"h", memoryview(np.arange(600).reshape(20, 30))],
        "large, small, large": [memoryview(big)[:100_000], b"s", memoryview(big)[100_000:200_000]],
        "two large in a row": [memoryview(big)[:100_000], memoryview(big)[100_000:200_000]],
        "a bytearray": [b"h", memoryview(bytearray(3000)), bytearray(2000)],
        "a strided view": [memoryview(np.arange(10_000))[::2]],
    }
    fast_ones = set()
    for shm_threshold in (None, 1024, 1 << 20):
        for name, frames in messages.items():
            fast = dask_frames._one_part(frames, shm_threshold, dask_frames.DEFAULT_LIMITS)
            with monkeypatch.context() as m:
                m.setattr(dask_frames, "_one_part", lambda *a: None)
                walked = plan_message(frames, shm_threshold=shm_threshold)
            if fast is not None:
                fast_ones.add(name)
                assert _plan_as_data(fast) == _plan_as_data(walked), name
    assert fast_ones == {"an 8-byte array", "a 64 KiB array", "bins at the edge", "a 2-D array", "large, small, large"}


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"f": 1},
        {"f": [1]},
        {"f": [{"cut": [5], "f": b"abc"}]},
        {"f": [], "more": "yes"},
        {"f": [{"join": [1]}]},
        # A cut of empty or small lengths (a view per byte or two sent), or of one length:
        # never sent (only shards of at least SMALL bytes go as a cut).
        {"f": [{"cut": [0] * 1000, "f": b""}]},
        {"f": [{"cut": [1, 2047], "f": bytes(2048)}]},
        {"f": [{"cut": [2048], "f": bytes(2048)}]},
    ],
)
def test_parts_this_backend_would_not_send_are_refused(body):
    with pytest.raises(FramesError):
        unpack_part(body, [])


def test_an_address_a_same_host_peer_claims_is_taken_only_in_the_form_of_one():
    """On a Unix socket the comm's addresses are what the peer's Open says: only a
    ``handoff://host:port`` of at most 300 characters, nothing that could forge a log line
    or fill Dask's structures (a 4 MB address with a newline was taken before)."""
    from handoff.dask.listener import _address

    assert _address("handoff://10.0.0.9:8786", "F") == "handoff://10.0.0.9:8786"
    assert _address("handoff://[::1]:8786", "F") == "handoff://[::1]:8786"
    assert _address("handoff://worker-3.example.org:40001", "F") == "handoff://worker-3.example.org:40001"
    forged = "handoff://10.0.0.9 closed\nCRITICAL - distributed.scheduler - forged:1"
    for bad in (forged, "handoff://" + "x" * 300 + ":1", "tcp://10.0.0.9:1", "handoff://a b:1", 5, None):
        assert _address(bad, "F") == "F", bad


def test_a_message_of_more_dask_frames_than_the_bound_is_refused_before_they_are_made(monkeypatch):
    monkeypatch.setattr(dask_frames, "MAX_DASK_FRAMES", 10)
    out: list = []
    assert unpack_part({"f": [b""] * 6, "more": True}, out)
    for part in ({"f": [b""] * 5}, {"f": [{"cut": [SMALL] * 5, "f": bytes(5 * SMALL)}]}):
        with pytest.raises(FramesError, match="more than 10 Dask frames"):
            unpack_part(part, out)
        assert len(out) == 6  # nothing of the refused part was made
    assert not unpack_part({"f": [{"cut": [SMALL] * 4, "f": bytes(4 * SMALL)}]}, out)
    assert len(out) == 10
    # The sender refuses such a message itself, naming the bound.
    with pytest.raises(FramesError, match="at most 10 in one message"):
        plan_message([b"x"] * 11)


def test_the_secret_comes_from_config_then_a_file_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("HANDOFF_SECRET", raising=False)
    assert config.settings().secret == b""
    monkeypatch.setenv("HANDOFF_SECRET", "from-env")
    assert config.settings().secret == b"from-env"
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    with dask.config.set({"distributed.comm.handoff.secret-file": str(f)}):
        assert config.settings().secret == b"from-file"
        with dask.config.set({"distributed.comm.handoff.secret": "from-config"}):
            assert config.settings().secret == b"from-config"
    with dask.config.set(
        {
            "distributed.comm.handoff.shm-threshold": "256KiB",
            "distributed.comm.handoff.shm": False,
            "distributed.comm.handoff.pool-idle-bytes": "2GiB",
            "distributed.comm.handoff.kept-map-bytes": "1GiB",
            "distributed.comm.handoff.pool-idle-seconds": "2s",
            "distributed.comm.handoff.kept-map-seconds": 0,
        }
    ):
        s = config.settings()
        assert (s.shm_threshold, s.shm, s.pool_idle_bytes, s.kept_map_bytes) == (256 << 10, False, 2 << 30, 1 << 30)
        assert (s.pool_idle_seconds, s.kept_map_seconds) == (2.0, 0.0)
    s = config.settings()
    assert s.pool_idle_bytes is None and s.kept_map_bytes is None and s.pool_idle_seconds is None
    assert s.shm_threshold == MIB  # the default: below it a frame goes inline on the Unix socket
    with dask.config.set({"distributed.comm.handoff.pool-idle-seconds": "soon"}):
        with pytest.raises(ValueError, match="pool-idle-seconds"):
            config.settings()


# ---------------------------------------------------------------- comms


_KEPT_PROBE = """
import asyncio, dask, sys
from handoff_pure import mapcache
from handoff.dask import config
from handoff.dask.nodes import make_node
if sys.argv[1]:
    dask.config.set({"distributed.comm.handoff.kept-map-bytes": sys.argv[1]})

async def main():
    async with make_node(config.settings(), "t") as node:
        # What the node keeps: its engine's setting, or the reference's process-wide one.
        driver = getattr(node, "_driver", None)
        print(driver.engine.kept_map_bytes if driver is not None else mapcache._keep_bytes())

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "env, setting, kept",
    [
        ({}, "", 0),  # a Dask process keeps no received segment mapped unless told
        ({"HANDOFF_SHM_KEEP_BYTES": "12345"}, "", 12345),  # the environment still says
        ({"HANDOFF_SHM_KEEP_BYTES": "12345"}, "1MiB", 1 << 20),  # and Dask's config first
    ],
)
def test_a_dask_process_keeps_no_received_mapping_by_default(env, setting, kept):
    """Kept mappings count in the worker's RSS, which Dask's memory manager reads
    (issue 25: with 1 GiB kept, worker peaks were up to 1.29× tcp://'s)."""
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HANDOFF_SHM_KEEP", "DASK_"))}
    p = subprocess.run(
        [sys.executable, "-c", _KEPT_PROBE, setting], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[-1]) == kept


@gen_test(timeout=60)
@pytest.mark.pure_only("finds the mapping and the lease among the pure peer's parts (the engine's: test_engine_driver)")
async def test_numpy_arrays_arrive_zero_copy_in_a_private_writable_mapping(monkeypatch):
    monkeypatch.setattr(HandoffComm, "max_shard_size", MIB)  # 8 shards of one buffer
    a, b = await _pair()
    try:
        assert a.channel == b.channel == "shm" and a.same_host
        arr = np.random.default_rng(0).integers(0, 255, 8 * MIB, dtype=np.uint8)
        n = await a.write({"x": to_serialize(arr), "small": to_serialize(np.arange(10))})
        assert n > arr.nbytes
        got = (await b.read())["x"]
        assert np.array_equal(got, arr) and got.flags.writeable
        mapping = _owner(got)
        assert isinstance(mapping, Region)  # not a copy: the array lies in the received mapping
        start = _address(mapping)
        assert start <= _address(got) and _address(got) + got.nbytes <= start + len(mapping)
        # The mapping is private: writing to it leaves the sender's segment as it was.
        [lease] = list(a.peer._leases.values())
        got[:16] = 0
        assert bytes(lease.segment.map.view()[:16]) == arr[:16].tobytes()
        # Dropping the array releases the lease: the segment is idle in the sender's pool.
        del got, mapping
        assert await _eventually(lambda: not a.peer._leases)
    finally:
        await a.close()
        await b.close()


async def _eventually(check, timeout=5.0):
    import gc

    deadline = time.monotonic() + timeout
    while not check():
        gc.collect()
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


class _Probe:
    """Serialized with the route the comm hands to serializers (context["handoff"])."""

    def __init__(self, value):
        self.value = value


@dask_serialize.register(_Probe)
def _probe_dumps(x, context=None):
    route = (context or {}).get("handoff", {})
    return {"to-host": route.get("peer", {}).get("host"), "channel": route.get("channel")}, [x.value]


@dask_deserialize.register(_Probe)
def _probe_loads(header, frames):
    return header["to-host"], header["channel"], bytes(frames[0])


@gen_test(timeout=60)
async def test_an_array_sent_inline_arrives_writable_and_is_not_copied_again():
    """Dask's deserializer keeps a writable frame as it is and copies a read-only one
    (``np.require(..., "W")``): a frame read off the socket must arrive writable, as tcp://'s
    do, or every array below the shared-memory threshold is copied once more on receipt
    (64 KiB: seen as a tenth of the comm's round trip). The same program on tcp://, on
    handoff:// on one host (the Unix socket, the frame below the shm threshold) and between
    hosts (TCP), with the same outcome on each."""
    seen = {}
    for addr, host_ids in [
        ("tcp://127.0.0.1", None),
        ("handoff://127.0.0.1", None),
        ("handoff://127.0.0.1", ("host-a", "host-b")),
    ]:
        listen_config = connect_config = SECRET
        if host_ids:
            listen_config = {**SECRET, "distributed.comm.handoff.host-id": host_ids[0]}
            connect_config = {**SECRET, "distributed.comm.handoff.host-id": host_ids[1]}
        a, b = await _pair(addr, listen_config, connect_config)
        try:
            arr = np.arange(64 * 1024 // 8, dtype=np.int64)
            await a.write({"x": to_serialize(arr)})
            got = (await b.read())["x"]
            assert np.array_equal(got, arr) and got.flags.writeable
            assert got.base is not None, "a copy: the array does not lie in the buffer it was read into"
            got[:4] = -1  # the receiver's own memory: the sender's array does not change
            assert arr[0] == 0 and got[0] == -1
            seen[(addr, host_ids)] = (bool(got.flags.writeable), got.base is not None, int(arr[0]))
        finally:
            await a.close()
            await b.close()
    assert len(set(seen.values())) == 1, seen


@gen_test(timeout=60)
async def test_nodes_with_different_host_ids_talk_tcp_and_serializers_see_the_route(monkeypatch):
    monkeypatch.setattr(HandoffComm, "max_shard_size", MIB)
    a, b = await _pair(
        listen_config={**SECRET, "distributed.comm.handoff.host-id": "host-a"},
        connect_config={**SECRET, "distributed.comm.handoff.host-id": "host-b"},
    )
    try:
        assert a.channel == b.channel == "tcp" and not a.same_host
        assert a.route["locality"] == "remote" and a.route["peer"]["host"] == "host-a"
        assert b.route["peer"]["host"] == "host-b" and b.remote_info["handoff"]["host"] == "host-b"
        assert a.peer_address == b.local_address and a.local_address == b.peer_address
        await a.write({"p": to_serialize(_Probe(b"payload"))})
        assert (await b.read())["p"] == ("host-a", "tcp", b"payload")
        # Over TCP the shards of one buffer are read into one buffer too: no copy to join them.
        arr = np.arange(3 * MIB, dtype=np.uint8)
        await a.write({"x": to_serialize(arr)})
        got = (await b.read())["x"]
        # The one buffer the frame was read into (numpy's, a mapping, or the engine's frame,
        # which the array is a view of: no copy after the read either).
        owner = _owner(got)
        assert np.array_equal(got, arr) and got.flags.writeable
        assert isinstance(owner, (np.ndarray, mmap.mmap, Region, Frame))
        assert memoryview(owner).nbytes >= arr.nbytes
    finally:
        await a.close()
        await b.close()


@gen_test(timeout=30)
async def test_a_peer_without_the_secret_is_refused_at_once():
    q: asyncio.Queue = asyncio.Queue()
    with dask.config.set(SECRET):
        listener = listen("handoff://127.0.0.1", q.put)
        await listener.start()
    try:
        with dask.config.set({"distributed.comm.handoff.secret": "not the secret"}):
            t0 = time.monotonic()
            with pytest.raises(FatalCommClosedError, match="secret"):
                await connect(listener.contact_address, timeout=20)
            assert time.monotonic() - t0 < 5  # refused, not retried until the timeout
        assert q.empty()
    finally:
        listener.stop()


@gen_test(timeout=60)
async def test_a_peer_that_breaks_the_comm_protocol_loses_only_its_connection():
    handled: list = []

    async def handle(comm):
        try:
            handled.append(await comm.read())
        except CommClosedError as e:
            handled.append(e)
        finally:
            await comm.close()

    with dask.config.set(SECRET):
        listener = listen("handoff://127.0.0.1", handle)
        await listener.start()
    try:
        tcp = "tcp://" + listener.contact_address[len("handoff://") :]
        async with Node("rogue", secret=SECRET["distributed.comm.handoff.secret"], per_connection=True) as rogue:
            no_open = await rogue.connect(tcp, channel="tcp")
            await no_open.send("handoff.dask.Frames", {"f": []})  # a part before any Open
            assert await _eventually(lambda: no_open.closed)
            bad_part = await rogue.connect(tcp, channel="tcp")
            await bad_part.send("handoff.dask.Open", {"from": 5, "to": "nowhere"})
            await bad_part.send("handoff.dask.Frames", {"f": [{"cut": [10], "f": b"abc"}]})
            assert await _eventually(lambda: bad_part.closed)
            unknown = await rogue.connect(tcp, channel="tcp")
            await unknown.send("some.Other", {})
            assert await _eventually(lambda: unknown.closed)
        assert handled == []  # none of them got as far as a comm handed to the server
        # The listener still serves well-behaved peers.
        with dask.config.set(SECRET):
            a = await connect(listener.contact_address, timeout=10)
        await a.write({"op": "still here"})
        assert await _eventually(lambda: handled == [{"op": "still here"}])
        await a.close()
        # A message that never ends, of empty frames (no byte counted for them): its
        # frames are bounded all the same, and the comm ends at the bound.
        async with Node("rogue-2", secret=SECRET["distributed.comm.handoff.secret"], per_connection=True) as rogue:
            endless = await rogue.connect(tcp, channel="tcp")
            await endless.send("handoff.dask.Open", {"from": "tcp://a:1", "to": "tcp://b:2"})
            bound, dask_frames.MAX_DASK_FRAMES = dask_frames.MAX_DASK_FRAMES, 5000
            try:
                sent = 0
                for _ in range(20):
                    if endless.closed:
                        break
                    await endless.send("handoff.dask.Frames", {"f": [b""] * 1000, "more": True})
                    sent += 1
                assert await _eventually(lambda: endless.closed)
                assert sent >= 6, sent  # taken until its frames passed the bound
            finally:
                dask_frames.MAX_DASK_FRAMES = bound
        await asyncio.sleep(0.2)
        assert handled == [{"op": "still here"}]  # (the server's handshake read failed: no comm was handed)
    finally:
        listener.stop()


def test_the_backend_is_found_through_its_entry_point_in_a_fresh_process():
    code = (
        "import sys, distributed.comm.registry as r\n"
        "assert 'handoff' not in r.backends and 'handoff.dask' not in sys.modules\n"
        "b = r.get_backend('handoff')\n"
        "print(type(b).__module__, type(b).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["handoff.dask.backend", "HandoffBackend"]


# ---------------------------------------------------------------- servers and clusters


@gen_cluster(nthreads=[], scheduler_kwargs={"protocol": "handoff"}, config=SECRET, timeout=120)
async def test_workers_and_nannies_take_the_scheme_of_the_scheduler_address(s):
    assert s.address.startswith("handoff://")
    async with Worker(s.address, nthreads=1) as w:
        assert w.address.startswith("handoff://")
        async with Nanny(s.address, nthreads=1) as n:
            assert n.address.startswith("handoff://") and n.worker_address.startswith("handoff://")
            async with Client(s.address, asynchronous=True) as c:
                await c.wait_for_workers(2)
                assert sorted(await c.run(lambda: 1)) == sorted([w.address, n.worker_address])


@gen_test(timeout=60)
async def test_the_default_scheme_can_be_handoff():
    with dask.config.set({**SECRET, "distributed.comm.default-scheme": "handoff"}):
        async with Scheduler(host="127.0.0.1", dashboard_address=":0") as s:
            assert s.address.startswith("handoff://")
            async with Worker("127.0.0.1:%d" % s.port, nthreads=1) as w:
                assert w.address.startswith("handoff://")


async def _on_cluster(protocol: str, compute):
    async with Scheduler(protocol=protocol, host="127.0.0.1", dashboard_address=":0") as s:
        async with Worker(s.address, nthreads=1) as a, Worker(s.address, nthreads=1) as b:
            async with Client(s.address, asynchronous=True) as c:
                result = await compute(c)
                return result, (a.address, b.address)


@gen_test(timeout=180)
async def test_dask_array_results_equal_the_same_run_on_tcp():
    async def compute(c):
        x = da.random.RandomState(42).random_sample((2000, 2000), chunks=(250, 500))
        y = (x + x.T).rechunk((2000, 125)).sum(axis=0) + (x[::3, ::5] ** 2).mean()
        return await c.compute(y)

    with dask.config.set(SECRET):
        on_handoff, addrs = await _on_cluster("handoff", compute)
    on_tcp, _ = await _on_cluster("tcp", compute)
    assert all(a.startswith("handoff://") for a in addrs)
    assert on_handoff.shape == (2000,)
    np.testing.assert_array_equal(on_handoff, on_tcp)


@gen_test(timeout=180)
async def test_p2p_shuffle_results_equal_the_same_run_on_tcp():
    rng = np.random.default_rng(7)
    df = pd.DataFrame({"k": rng.integers(0, 40, 30_000), "v": rng.random(30_000), "s": rng.integers(0, 1000, 30_000)})

    async def compute(c):
        ddf = dd.from_pandas(df, npartitions=6)
        out = ddf.shuffle(on="k", shuffle_method="p2p", npartitions=5)
        parts = await c.gather(c.compute(out.to_delayed()))
        return [p.sort_values(["k", "v"]).reset_index(drop=True) for p in parts]

    with dask.config.set(SECRET):
        on_handoff, _ = await _on_cluster("handoff", compute)
    on_tcp, _ = await _on_cluster("tcp", compute)
    assert len(on_handoff) == len(on_tcp) == 5
    for h, t in zip(on_handoff, on_tcp):
        pd.testing.assert_frame_equal(h, t)
    # Each key is in one partition, and every row arrived once.
    keys = [set(p["k"]) for p in on_handoff]
    assert sum(len(k) for k in keys) == len(set().union(*keys))
    every = pd.concat(on_handoff).sort_values(["k", "v"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(every, df.sort_values(["k", "v"]).reset_index(drop=True))


# ---------------------------------------------------------------- TLS (Dask's own settings)


@pytest.fixture(scope="module")
def dask_pki(tmp_path_factory):
    from tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("dask-pki"))


def _security(pki, require_encryption=True):
    from distributed.security import Security

    return Security(
        tls_ca_file=str(pki.ca),
        tls_client_cert=str(pki.a.cert),
        tls_client_key=str(pki.a.key),
        tls_scheduler_cert=str(pki.b.cert),
        tls_scheduler_key=str(pki.b.key),
        tls_worker_cert=str(pki.a.cert),
        tls_worker_key=str(pki.a.key),
        require_encryption=require_encryption,
    )


# Shared memory off: every comm is a TCP connection, each inside TLS.
_TLS_TCP = {**SECRET, "distributed.comm.handoff.shm": False}


@gen_test(timeout=120)
async def test_a_cluster_with_a_security_object_computes_over_tls(dask_pki):
    sec = _security(dask_pki)
    with dask.config.set(_TLS_TCP):
        async with Scheduler(protocol="handoff", host="127.0.0.1", dashboard_address=":0", security=sec) as s:
            assert s.address.startswith("handoff://")
            async with Worker(s.address, nthreads=1, security=sec) as w:
                async with Client(s.address, asynchronous=True, security=sec) as c:
                    x = da.arange(1_000_000, chunks=100_000)
                    assert await c.compute((x * 2).sum()) == 2 * sum(range(1_000_000))
                    assert w.address.startswith("handoff://")
                    (listener,) = s.listeners
                    peers = listener.node.peers
                    assert peers and all(p.channel == "tcp" and p.tls for p in peers)


@gen_test(timeout=60)
async def test_a_plain_client_is_refused_by_a_tls_scheduler_clearly(dask_pki):
    with dask.config.set(_TLS_TCP):
        async with Scheduler(
            protocol="handoff", host="127.0.0.1", dashboard_address=":0", security=_security(dask_pki)
        ) as s:
            t0 = time.monotonic()
            with pytest.raises(Exception, match="requires TLS"):
                async with Client(s.address, asynchronous=True, timeout=20):
                    pass
            assert time.monotonic() - t0 < 15  # refused, not retried until the timeout
            (listener,) = s.listeners
            assert listener.node.tls_refusals >= 1


@gen_test(timeout=30)
async def test_required_encryption_without_a_tls_context_fails_clearly():
    with dask.config.set(SECRET):
        with pytest.raises(RuntimeError, match="encryption required"):
            await connect("handoff://127.0.0.1:1", timeout=5, require_encryption=True)
        with pytest.raises(RuntimeError, match="encryption required"):
            listen("handoff://127.0.0.1", lambda comm: None, require_encryption=True)

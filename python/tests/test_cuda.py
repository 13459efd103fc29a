"""GPU arrays in messages (spec §7.10, issue 38).

The decision by route, the checks of what a peer sends, and the host-copy path run
everywhere. Moving device memory needs a CUDA device and CuPy: those tests run where both
are (``scripts/gpu-check`` runs them on a lent machine) and are skipped elsewhere with the
reason ``handoff.cuda.status()`` gives.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from handoff import Node, cuda
from handoff.native import ext
from handoff.route import REMOTE, SAME_HOST, UNKNOWN, Endpoint, Route, RouteError, decode_value

ROOT = Path(__file__).resolve().parents[2]
# Asked at import, before any test sets HANDOFF_CUDA_EMULATE for its subprocesses: this
# process keeps the driver it found (the real one, or none), whatever a test sets later.
CUDA_OK, CUDA_WHY = cuda.status()
try:
    import cupy
except ImportError:  # pragma: no cover - depends on the machine
    cupy = None

needs_gpu = pytest.mark.skipif(
    not CUDA_OK or cupy is None,
    reason=f"needs a CUDA device and CuPy: {CUDA_WHY or 'CuPy is not installed'}",
)


class FakeCudaArray:
    """An object that says it is a CUDA array: what the encoder and the extension read first."""

    def __init__(self, shape=(4, 2), typestr="<f4", strides=None, mask=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0xDEAD0000, False),
            "version": 3,
            "strides": strides,
            "mask": mask,
        }


def route(channel: str, caps: tuple, locality: str = SAME_HOST) -> Route:
    a = Endpoint("a" * 32, host="h", proc="p1")
    b = Endpoint("b" * 32, host="h" if locality == SAME_HOST else "other", proc="p2", caps=caps)
    return Route(a, b, locality, channel)


def test_the_route_decides_the_ipc_handle_or_a_host_copy(monkeypatch):
    """§7.10: the array itself (its IPC handle) only to a same-host peer on the Unix socket
    that maps handles (``cuda``) and takes tickets; a host copy to any other."""
    copies = []

    class Stub:
        shares_device_memory = staticmethod(ext.shares_device_memory)

        @staticmethod
        def cuda_to_host(array):
            copies.append(array)
            return b"\0" * 32

    monkeypatch.setattr(cuda, "_native", Stub)
    x = FakeCudaArray()
    header, frames = cuda._encode(x, route("shm", ("ticket", "cuda")))
    assert frames == [x] and not copies
    assert header == {"shape": [4, 2], "typestr": "<f4", "kind": "array"}
    for other in (
        route("tcp", ("ticket", "cuda")),  # a pinned TCP connection: no IPC
        route("shm", ("ticket",)),  # no driver there
        route("shm", ("cuda",)),  # no tickets there: nothing to release the lease with
        route("tcp", ("ticket", "cuda"), REMOTE),  # another host
        UNKNOWN,  # no handoff connection (Dask on tcp://, spilling)
    ):
        _, frames = cuda._encode(x, other)
        assert frames == [b"\0" * 32], other
    assert len(copies) == 5


@pytest.mark.parametrize(
    "header, frame, why",
    [
        ({"shape": [2], "typestr": "<f4", "kind": "cupy"}, b"\0" * 7, "has 8 bytes, its frame 7"),
        ({"shape": [-1], "typestr": "<f4", "kind": "cupy"}, b"", "shape"),
        ({"shape": [1] * 65, "typestr": "|u1", "kind": "cupy"}, b"\0", "shape"),
        ({"shape": [2], "typestr": "f4", "kind": "cupy"}, b"\0" * 8, "typestr"),
        ({"shape": [2], "typestr": "<f0", "kind": "cupy"}, b"", "typestr"),
        ({"shape": [2], "typestr": "<f4", "kind": "jax"}, b"\0" * 8, "kind"),
        ("not a map", b"", "header map"),
    ],
)
def test_what_a_peer_sends_is_checked_before_anything_is_made(header, frame, why):
    with pytest.raises(RouteError, match=why):
        decode_value(cuda.NAME, {"h": header}, [frame], route("shm", ()))


def test_a_host_copy_comes_back_with_its_shape_and_dtype():
    data = np.arange(12, dtype="<f8").reshape(3, 4)
    header = {"shape": [3, 4], "typestr": "<f8", "kind": "array"}
    got = decode_value(cuda.NAME, {"h": header}, [data.tobytes()], route("tcp", (), REMOTE))
    host = cupy.asnumpy(got) if cupy is not None and CUDA_OK else got
    assert host.dtype == np.dtype("<f8") and host.shape == (3, 4)
    np.testing.assert_array_equal(host, data)


def test_the_extension_refuses_arrays_it_cannot_send():
    with pytest.raises(ValueError, match="C-contiguous"):
        ext.cuda_to_host(FakeCudaArray(shape=(4, 2), strides=(4, 16)))
    with pytest.raises(ValueError, match="masked"):
        ext.cuda_to_host(FakeCudaArray(mask=object()))
    with pytest.raises(ValueError, match="unknown item type"):
        ext.cuda_to_host(FakeCudaArray(typestr="<fx"))
    if not CUDA_OK:
        with pytest.raises(OSError, match="CUDA cannot be used here"):
            ext.cuda_to_host(FakeCudaArray())


def test_a_node_announces_cuda_only_with_a_driver_and_shared_memory():
    async def main():
        async with Node("gpu-caps", secret="s") as a, Node("gpu-caps-tcp", secret="s", shm=False) as b:
            assert ("cuda" in a.caps) == CUDA_OK
            assert "cuda" not in b.caps

    asyncio.run(main())


@pytest.mark.skipif(CUDA_OK, reason="checks a machine without CUDA")
def test_without_cuda_a_gpu_array_fails_its_send_and_nothing_else():
    """A process that cannot read device memory says why; the connection goes on. (Two
    hosts as far as the nodes know: in one process the array itself would move.)"""

    async def main():
        a = Node("a", secret="s", listen="127.0.0.1:0", host_id="host-a")
        async with a, Node("b", secret="s", host_id="host-b") as b:
            peer = await b.connect(a.listen_addr)
            with pytest.raises(OSError, match="no CUDA driver"):
                await peer.send("t.Gpu", {"x": FakeCudaArray()})
            await peer.send("t.Plain", {"n": 1})
            with await asyncio.wait_for(a.recv(), 10) as env:
                assert env.type_name == "t.Plain" and env.body == {"n": 1}

    asyncio.run(main())


@needs_gpu
def test_in_one_process_the_array_itself_moves():
    """Same process: nothing is serialized, the very array arrives (spec §1)."""

    async def main():
        async with Node("a", secret="s", listen="127.0.0.1:0") as a, Node("b", secret="s") as b:
            peer = await b.connect(a.listen_addr)
            x = cupy.arange(1 << 20, dtype=cupy.float32)
            await peer.send("t.Gpu", {"x": x})
            with await asyncio.wait_for(a.recv(), 10) as env:
                assert env.body["x"] is x or bool(cupy.array_equal(env.body["x"], x))

    asyncio.run(main())


@needs_gpu
def test_between_two_processes_ipc_pull_and_a_killed_receiver(tmp_path):
    """bench/gpu_ipc.py at 64 MiB: IPC maps the sender's memory, the fallback pulls it, every
    byte is checked on the device, and a killed receiver's memory is freed by the owner."""
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python" / "src")}
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_ipc.py"), "--mib", "64", "--rounds", "1", "--json", str(out)]
    subprocess.run(cmd, check=True, timeout=300, env=env)
    r = json.loads(out.read_text())
    assert r["channel"] == "shm" and "cuda" in r["receiver_caps"]
    assert r["ways"]["ipc"]["via"] == ["ipc"] and r["ways"]["pull"]["via"] == ["copy"]
    assert all(w["every_byte_checked_ok"] for w in r["ways"].values())
    assert r["killed_receiver"]["via"] == "ipc" and r["killed_receiver"]["freed"]


def test_dask_frames_carry_gpu_memory_whole_and_check_it_on_receipt():
    """A CUDA array among a Dask message's frames travels as one ``cuda`` entry (never cut
    or joined, counted at its size), and a receiver takes nothing else in its place."""
    pytest.importorskip("distributed")
    from handoff.codec import Buffer
    from handoff.dask.frames import FramesError, host_nbytes, plan_message, unpack_part

    gpu = FakeCudaArray(shape=(1 << 18,), typestr="<f4")  # 1 MiB
    host = np.arange(1 << 18, dtype=np.uint8)
    plan = plan_message([b"header", gpu, host])
    [part] = plan.parts
    entries = part["f"]
    assert entries[0] == b"header"
    assert isinstance(entries[1], dict) and isinstance(entries[1]["cuda"], Buffer) and entries[1]["cuda"].data is gpu
    assert isinstance(entries[2], Buffer)
    assert plan.nbytes == len(b"header") + (1 << 20) + host.nbytes
    out: list = []
    assert unpack_part({"f": [b"h", {"cuda": gpu}]}, out) is False
    assert out[1] is gpu and host_nbytes(out[1]) == 0 and host_nbytes(out[0]) == 1
    with pytest.raises(FramesError, match="GPU memory"):
        unpack_part({"f": [{"cuda": b"bytes, not GPU memory"}]}, [])


def test_dask_serializes_gpu_frames_uncompressed_and_whole(monkeypatch):
    pytest.importorskip("distributed")
    from handoff.dask import serialize

    x = FakeCudaArray(shape=(16,), typestr="|u1")
    same_host = route("shm", ("ticket", "cuda"))
    header, frames = serialize.dumps(cuda.CudaArray(x), {"handoff": _route_dict(same_host)})
    assert frames == [x] and header["compression"] == [False]

    class Stub:
        shares_device_memory = staticmethod(ext.shares_device_memory)

        @staticmethod
        def cuda_to_host(array):
            return b"\0" * 16

    monkeypatch.setattr(cuda, "_native", Stub)
    header, frames = serialize.dumps(cuda.CudaArray(x), None)  # tcp://, spilling: no route
    assert frames == [b"\0" * 16] and "compression" not in header


def _route_dict(r: Route) -> dict:
    return {
        "local": r.sender.to_dict(),
        "peer": r.recipient.to_dict(),
        "locality": r.locality,
        "channel": r.channel,
        "protocol": 3,
    }


def _pair(*args: str) -> dict:
    """python/tests/cuda_pair.py on the emulated driver: two processes, three ways."""
    env = {**os.environ, "HANDOFF_CUDA_EMULATE": "1", "PYTHONPATH": str(ROOT / "python" / "src")}
    env.pop("HANDOFF_CUDA_IPC", None)
    script = Path(__file__).with_name("cuda_pair.py")
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_between_two_processes_on_the_emulated_driver_device_memory_is_named_pulled_and_freed():
    """Handoff's side of §7.10 end to end, where no GPU is: both nodes announce ``cuda``; a
    frame is mapped by its handle, or pulled when mapping is refused; the owner's memory
    goes back when the receiver drops it, and when the receiver is killed holding it."""
    r = _pair("--mib", "4")
    assert "cuda" in r["hello"]["caps"] and "cuda" in r["owner_caps"] and r["hello"]["channel"] == "shm"
    assert r["ipc"]["via"] == "ipc" and r["ipc"]["ok"]
    assert r["pull"]["via"] == "copy" and r["pull"]["ok"]
    assert r["killed"]["via"] == "ipc" and r["killed"]["ok"]
    assert r["killed"]["held_while_alive"] == 4 << 20, "the lease kept the owner's memory while the receiver lived"
    for way in ("ipc", "pull", "killed"):
        assert r[way]["seconds_to_free"] >= 0, f"{way}: the owner's memory never came back"


def test_a_slow_host_copy_for_a_pull_holds_up_only_the_peer_that_asked(monkeypatch):
    """The host copy a pull asks for is made off the owner's event loop: with a bus that
    takes 60 ms per MiB, copying 8 MiB takes about half a second, and the owner's loop
    stays free meanwhile (made inside the loop's callback, it was late by all of that)."""
    monkeypatch.setenv("HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB", "60")
    r = _pair("--mib", "8")
    assert r["pull"]["via"] == "copy" and r["pull"]["ok"], r["pull"]
    assert r["pull"]["seconds_to_free"] >= 0, "the owner's memory never came back"
    assert r["pull"]["max_loop_lag"] < 0.2, f"the owner's loop was held up {r['pull']['max_loop_lag']:.3f} s"
    assert r["ipc"]["via"] == "ipc" and r["ipc"]["ok"]


def test_a_receiver_without_cuda_gets_host_copies():
    """The pure-Python reference announces no ``cuda``: an engine node sends it host copies,
    and keeps nothing for it."""
    r = _pair("--mib", "1", "--reference")
    assert "cuda" not in r["hello"]["caps"]
    for way in ("ipc", "pull", "killed"):
        assert r[way]["via"] == "host" and r[way]["ok"] and r[way]["kind"] == "ndarray", r[way]
    assert r["killed"]["held_while_alive"] == 0

"""GPU arrays between Dask worker processes (spec §7.10, issue 38): the same program on
``tcp://`` and ``handoff://``. On the emulated driver (``HANDOFF_CUDA_EMULATE=1``) where no
GPU is; with CuPy on a GPU where one is (skipped elsewhere with the reason).

(Apart from test_cuda.py: a cluster leaves callbacks for the collector behind it, which
test_cycles.py, run between them, would take for its own.)
"""

from __future__ import annotations

import pytest

from handoff import cuda

pytest.importorskip("distributed")

CUDA_OK, CUDA_WHY = cuda.status()  # asked before any test sets HANDOFF_CUDA_EMULATE
try:
    import cupy
except ImportError:  # pragma: no cover - depends on the machine
    cupy = None


def _made_on_a_checked_on_b(protocol: str, make, check, n: int) -> dict:
    """``make(7, n)`` on one worker, ``check(its result, 7, n)`` on the other."""
    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.comm.handoff.secret": "cuda test secret"}),
        LocalCluster(
            protocol=protocol,
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as c,
    ):
        c.wait_for_workers(2)
        a, b = sorted(c.scheduler_info()["workers"])
        x = c.submit(make, 7, n, workers=[a], pure=False)
        return c.submit(check, x, 7, n, workers=[b], pure=False).result(timeout=120)


@pytest.mark.parametrize("protocol", ["tcp", "handoff"])
def test_on_the_emulated_driver_workers_pass_device_memory_as_tcp_passes_bytes(protocol, monkeypatch):
    """An array of (emulated) device memory made on one worker and read on the other
    arrives with the same bytes; on ``handoff://`` the second worker maps the first's
    memory, on ``tcp://`` it gets a host copy."""

    def make(seed, n):
        from handoff import CudaArray
        from handoff.native import ext

        return CudaArray(ext.cuda_upload(bytes((i * 7 + seed) % 251 for i in range(n))))

    def check(x, seed, n):
        frame = getattr(x, "frame", None)
        got = x.to_host() if frame is not None else x.tobytes()
        return {"ok": got == bytes((i * 7 + seed) % 251 for i in range(n)), "via": getattr(frame, "via", "host")}

    monkeypatch.setenv("HANDOFF_CUDA_EMULATE", "1")  # for the worker processes
    got = _made_on_a_checked_on_b(protocol, make, check, 1 << 20)
    assert got["ok"], got
    assert got["via"] == ("ipc" if protocol == "handoff" else "host"), got


@pytest.mark.skipif(
    not CUDA_OK or cupy is None, reason=f"needs a CUDA device and CuPy: {CUDA_WHY or 'CuPy is not installed'}"
)
@pytest.mark.parametrize("protocol", ["tcp", "handoff"])
def test_on_a_gpu_workers_pass_a_cupy_array(protocol):
    """A CuPy array checked byte for byte on the other worker's device; mapped by IPC on
    ``handoff://``."""

    def make(seed, n):
        import cupy

        return cupy.random.default_rng(seed).integers(0, 2**32, n // 4, dtype=cupy.uint32).view(cupy.uint8)

    def check(x, seed, n):
        import cupy

        owner = getattr(x.data.mem, "_owner", None)
        via = getattr(getattr(owner, "frame", None), "via", "host")
        ok = bool(cupy.array_equal(x, make(seed, n)))
        return {"ok": ok, "via": via, "type": type(x).__name__}

    got = _made_on_a_checked_on_b(protocol, make, check, 64 << 20)
    assert got["ok"] and got["type"] == "ndarray", got
    assert got["via"] == ("ipc" if protocol == "handoff" else "host"), got

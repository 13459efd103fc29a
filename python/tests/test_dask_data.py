"""Dataset objects in Dask on handoff:// (handoff.dask.data): every worker opens a catalog
and a cache (a worker plugin), and a Blob returned from a task binds on the worker that
receives it to that worker's own catalog and cache. Real processes: a `dask scheduler`
and four `dask worker`s, an HTTP server on loopback counting GETs."""

from __future__ import annotations

import http.server
import os
import threading

import pytest

pytest.importorskip("distributed")

import dask  # noqa: E402
from distributed import Client  # noqa: E402
from distributed.utils_test import gen_test  # noqa: E402
from helpers import S3_KEYS, RangeHTTPHandler, dask_cli, s3_put, start_dask_scheduler, start_moto, stop_processes  # noqa: E402

from handoff.tickets import digest  # noqa: E402

SECRET = {"distributed.comm.handoff.secret": "dask data test secret"}
UUID = "3c7a2f5e-1b9d-4e8a-9f60-5d4c2b1a0e99"
UUID_S3 = "3c7a2f5e-1b9d-4e8a-9f60-5d4c2b1a0e98"


@gen_test(timeout=240)
async def test_a_blob_binds_on_each_worker_to_its_own_catalog_and_cache(tmp_path):
    from handoff.dask.data import OpenCatalog

    # Defined here, the task functions travel by value (pickle cannot name them, so Dask
    # uses cloudpickle): the workers cannot import this test module.
    def _produce(name="big"):
        from handoff.dask.data import read_all, worker_catalog

        blob = worker_catalog().blob(name)
        read_all(blob)  # this worker fetches it: the first GET
        return blob

    def _consume(blob):
        from handoff.dask.data import read_all
        from handoff.tickets import digest

        data = read_all(blob)
        return digest(data).hex(), blob.last_origin, getattr(blob, "fallback_reason", None)

    www = tmp_path / "www"
    www.mkdir()
    content = os.urandom(4 << 20)
    (www / "big.bin").write_bytes(content)
    handler = lambda *a, **k: RangeHTTPHandler(*a, directory=str(www), **k)  # noqa: E731
    RangeHTTPHandler.gets, RangeHTTPHandler.get_delay, RangeHTTPHandler.spans = {}, 0.0, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # And the S3-compatible server (moto): another object (the same bytes would be found in
    # the far worker's cache by their digest).
    content_s3 = os.urandom(4 << 20)
    pytest.importorskip("moto.server")
    moto, endpoint = start_moto()
    s3_put(endpoint, "dask-data", {"big.bin": content_s3})
    s3_options = "".join(f'{k} = "{v}"\n' for k, v in {"endpoint": endpoint, **S3_KEYS}.items())
    with_big = tmp_path / "Data.toml"
    with_big.write_text(
        "data_config_version = 1\n"
        f'[[datasets]]\nname = "big"\nuuid = "{UUID}"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "{url}/big.bin"\n'
        f'[[datasets]]\nname = "big-s3"\nuuid = "{UUID_S3}"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "s3://dask-data/big.bin"\n'
        f"[datasets.storage.options]\n{s3_options}"
    )
    without = tmp_path / "Other.toml"
    without.write_text("data_config_version = 1\n")

    env = {**os.environ, "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": SECRET["distributed.comm.handoff.secret"]}
    scheduler, address = await start_dask_scheduler(tmp_path, env)
    procs = [scheduler]
    try:
        workers = {
            "a": {"HANDOFF_CATALOG": str(with_big)},
            "b": {"HANDOFF_CATALOG": str(with_big)},
            # Another host: its own host identity, so its own cache folder.
            "far": {"HANDOFF_CATALOG": str(with_big), "DASK_DISTRIBUTED__COMM__HANDOFF__HOST_ID": "far-host"},
            # This host, but a catalog without the dataset.
            "lacking": {"HANDOFF_CATALOG": str(without)},
        }
        for name, extra in workers.items():
            procs.append(
                dask_cli(
                    "worker",
                    address,
                    "--name",
                    name,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--no-nanny",
                    env={**env, **extra},
                    log=tmp_path / f"{name}.log",
                )
            )
        with dask.config.set(SECRET):
            async with Client(address, asynchronous=True) as c:
                await c.wait_for_workers(4, timeout=120)
                await c.register_plugin(OpenCatalog(cache_dir=str(tmp_path / "cache-{host_id}")))
                blob = c.submit(_produce, workers=["a"], pure=False)
                want = digest(content).hex()

                got, origin, _ = await c.submit(_consume, blob, workers=["b"], pure=False)
                assert (got, origin) == (want, "shared-cache"), "b found a's download in the shared folder"
                assert RangeHTTPHandler.gets.get("/big.bin") == 1, RangeHTTPHandler.gets

                got, origin, _ = await c.submit(_consume, blob, workers=["far"], pure=False)
                assert (got, origin) == (want, "storage"), "another host fetches it itself"
                assert RangeHTTPHandler.gets.get("/big.bin") == 2, RangeHTTPHandler.gets

                got, origin, reason = await c.submit(_consume, blob, workers=["lacking"], pure=False)
                assert (got, origin) == (want, "remote-blob"), "pulled from the worker that sent it"
                assert UUID in reason, reason
                assert RangeHTTPHandler.gets.get("/big.bin") == 2, "the sender served it from its cache"

                # The same on the S3-compatible server (its GETs are counted over HTTP above).
                blob = c.submit(_produce, "big-s3", workers=["a"], pure=False)
                origins = {}
                for w in ("b", "far", "lacking"):
                    got, origins[w], _ = await c.submit(_consume, blob, workers=[w], pure=False)
                    assert got == digest(content_s3).hex(), w
                assert origins == {"b": "shared-cache", "far": "storage", "lacking": "remote-blob"}, origins
    finally:
        stop_processes(procs)
        server.shutdown()
        server.server_close()
        moto.stop()


@gen_test(timeout=180)
async def test_a_spec_selects_on_a_stack_and_the_handle_carries_it(tmp_path):
    """``$HANDOFF_CATALOG`` as a ``:``-separated stack on every worker, a DataSets.jl spec
    (``tree#file``) on one, read on the other: the handle carries the file it selected, and the
    first catalog of the stack answers for a shadowed name on both."""
    from pathlib import Path

    from handoff.dask.data import OpenCatalog

    def _produce(spec):
        from handoff.dask.data import worker_catalog

        return worker_catalog().blob(spec)

    def _consume(blob):
        from handoff.dask.data import read_all

        return read_all(blob), blob.path, blob.last_origin

    fixtures = Path(__file__).resolve().parents[2] / "crates" / "handoff-data" / "tests" / "fixtures" / "julia"
    stack = f"{fixtures / 'stack'}:{fixtures / 'Data.toml'}"
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__HANDOFF__SECRET": SECRET["distributed.comm.handoff.secret"]}
    scheduler, address = await start_dask_scheduler(tmp_path, env)
    procs = [scheduler]
    try:
        for name in ("a", "b"):
            procs.append(
                dask_cli(
                    "worker", address, "--name", name, "--nthreads", "1", "--no-dashboard", "--no-nanny",
                    env={**env, "HANDOFF_CATALOG": stack}, log=tmp_path / f"{name}.log",
                )
            )  # fmt: skip
        with dask.config.set(SECRET):
            async with Client(address, asynchronous=True) as c:
                await c.wait_for_workers(2, timeout=120)
                await c.register_plugin(OpenCatalog(cache_dir=str(tmp_path / "cache-{host_id}")))
                blob = c.submit(_produce, "a_tree_example#2.csv", workers=["a"], pure=False)
                data, path, origin = await c.submit(_consume, blob, workers=["b"], pure=False)
                assert (data, path) == ((fixtures / "data/csvset/2.csv").read_bytes(), "2.csv")
                assert origin == "read-in-place", "b bound the tag to its own catalog"
                blob = c.submit(_produce, "a_text_file", workers=["a"], pure=False)
                data, _, _ = await c.submit(_consume, blob, workers=["b"], pure=False)
                assert data == b"From the first catalog\n", "the first catalog of the stack answers"
                with pytest.raises(Exception, match="invalid dataset specification"):
                    await c.submit(_produce, "a tree example", workers=["a"], pure=False)
    finally:
        stop_processes(procs)

"""Dataset objects in Dask on handoff:// (handoff.dask.data): every worker opens a catalog
and a cache (a worker plugin), and a Blob returned from a task binds on the worker that
receives it to that worker's own catalog and cache. Real processes: a `dask scheduler`
and four `dask worker`s, an HTTP server on loopback counting GETs."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("distributed")
pytest.importorskip("obstore")

import dask  # noqa: E402
from distributed import Client  # noqa: E402
from distributed.utils_test import gen_test  # noqa: E402
from helpers import RangeHTTPHandler  # noqa: E402

from handoff.tickets import digest  # noqa: E402

SECRET = {"distributed.comm.handoff.secret": "dask data test secret"}
UUID = "3c7a2f5e-1b9d-4e8a-9f60-5d4c2b1a0e99"
UUID_S3 = "3c7a2f5e-1b9d-4e8a-9f60-5d4c2b1a0e98"


def _dask_cli(*args: str, env: dict, log: Path) -> subprocess.Popen:
    dask_bin = Path(sys.executable).with_name("dask")
    return subprocess.Popen(
        [str(dask_bin), *args], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), stdin=subprocess.DEVNULL
    )


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
    moto_server = pytest.importorskip("moto.server")
    moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import urllib.request

    import obstore
    from obstore.store import S3Store

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/dask-data", method="PUT")).read()
    keys = {"region": "us-east-1", "access_key_id": "k", "secret_access_key": "s"}
    obstore.put(
        S3Store("dask-data", config={"endpoint": endpoint, **keys}, client_options={"allow_http": True}),
        "big.bin",
        content_s3,
    )
    s3_options = "".join(f'{k} = "{v}"\n' for k, v in {"endpoint": endpoint, **keys}.items())
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
    scheduler_file = tmp_path / "scheduler.json"
    procs = [
        _dask_cli(
            "scheduler",
            "--protocol",
            "handoff",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(scheduler_file),
            env=env,
            log=tmp_path / "scheduler.log",
        )
    ]
    try:
        for _ in range(600):
            if scheduler_file.exists() and scheduler_file.stat().st_size:
                break
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            await asyncio.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
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
                _dask_cli(
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
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        server.shutdown()
        server.server_close()
        moto.stop()

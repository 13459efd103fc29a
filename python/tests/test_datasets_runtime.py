"""handoff.datasets runs handoff-data on a tokio runtime of its own, awaited from asyncio.
What that must not break, tried as it breaks: a forked child reading (the parent's runtime
threads are not in the child), a read cancelled while storage is slow, many reads at once,
and the event loop's other work while storage is slow."""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import RangeHTTPHandler

from handoff.datasets import Blob, Cache, Catalog, StorageError

FIXTURES = Path(__file__).resolve().parents[2] / "crates" / "handoff-data" / "tests" / "fixtures" / "julia"
UUID = "b498f769-a7f6-4f67-8d74-40b770398f26"


@pytest.fixture
def slow_http(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(1 << 20))
    handler = lambda *a, **k: RangeHTTPHandler(*a, directory=str(root), **k)  # noqa: E731
    RangeHTTPHandler.gets, RangeHTTPHandler.get_delay, RangeHTTPHandler.spans = {}, 0.0, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    text = (
        "data_config_version = 1\n"
        f'[[datasets]]\nname = "big"\nuuid = "{UUID}"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "{url}/big.bin"\n'
    )
    yield root, text
    RangeHTTPHandler.get_delay = 0.0
    server.shutdown()
    server.server_close()


async def test_a_forked_child_reads_on_a_runtime_of_its_own(tmp_path):
    catalog = Catalog.load(FIXTURES / "Data.toml", Cache(tmp_path / "c"))
    assert await catalog.blob("a_text_file").read_all() == b"Hello world!\n"  # the parent's runtime runs
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:

            async def child():
                blob = catalog.blob("a_tree_example#1.csv")
                return await asyncio.wait_for(blob.read_all(), 20)

            code = 0 if asyncio.run(child()).startswith(b"Name,Age") else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's read never finished: it waited on the parent's runtime")
        await asyncio.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    assert await catalog.blob("a_text_file").read_all() == b"Hello world!\n", "the parent's runtime still runs"


async def test_a_cancelled_read_leaves_the_handle_and_the_cache_usable(slow_http, tmp_path):
    root, text = slow_http
    cache = Cache(tmp_path / "c")
    blob = Catalog.parse(text, tmp_path / "Data.toml", cache).blob("big")
    RangeHTTPHandler.get_delay = 1.0
    task = asyncio.ensure_future(blob.read_all())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    RangeHTTPHandler.get_delay = 0.0
    again = Catalog.parse(text, tmp_path / "Data.toml", cache).blob("big")
    assert await asyncio.wait_for(again.read_all(), 30) == (root / "big.bin").read_bytes()


async def test_the_event_loop_runs_while_storage_is_slow(slow_http, tmp_path):
    _, text = slow_http
    blob = Catalog.parse(text, tmp_path / "Data.toml", Cache(tmp_path / "c")).blob("big")
    RangeHTTPHandler.get_delay = 1.0
    read = asyncio.ensure_future(blob.read_all())
    ticks = 0
    began = time.monotonic()
    while not read.done():
        await asyncio.sleep(0.01)
        ticks += 1
    elapsed = time.monotonic() - began
    assert len(await read) == 1 << 20 and elapsed >= 1.0
    assert ticks >= 0.5 * elapsed / 0.01, f"the loop ran {ticks} ticks in {elapsed:.2f} s: the read blocked it"


async def test_many_reads_at_once_each_get_their_bytes(tmp_path):
    catalog = Catalog.load(FIXTURES / "Embedded.toml", Cache(tmp_path / "c"))
    tree = catalog.tree("embedded_tree")
    paths = [f"d0{i}/{f}.txt" for i in range(1, 5) for f in "ab"] * 25
    got = await asyncio.gather(*(tree.blob(p).read_all() for p in paths))
    assert got == [f"{p[2]} {p[4]} content".encode() for p in paths]
    ranges = await asyncio.gather(*(tree.blob(p).read_range(0, 1) for p in paths))
    assert ranges == [p[2].encode() for p in paths]


async def test_a_missing_object_is_a_storage_error_that_names_it(slow_http, tmp_path):
    root, text = slow_http
    (root / "big.bin").unlink()
    blob = Catalog.parse(text, tmp_path / "Data.toml", Cache(tmp_path / "c")).blob("big")
    assert isinstance(blob, Blob)
    with pytest.raises(StorageError, match="big.bin"):
        await blob.read_all()


_READ_AND_EXIT = """
import asyncio, sys
from handoff.datasets import Cache, Catalog

async def main():
    tree = Catalog.load(sys.argv[1], Cache(sys.argv[2])).tree("embedded_tree")
    paths = [f"d0{i}/{f}.txt" for i in range(1, 5) for f in "ab"]
    got = await asyncio.gather(*(tree.blob(p).read_all() for p in paths * 4))
    print(len(got))

asyncio.run(main())
"""


def test_a_process_that_reads_exits_cleanly(tmp_path):
    """The data runtime's threads never call into Python: a thread that did (to complete
    an asyncio future) could be ended by the interpreter's exit halfway through and crash
    the process (about 1 run in 20 did, with pyo3-async-runtimes' completion threads). Many
    reads end right before each exit here; every run must exit 0."""
    import subprocess
    import sys

    script = tmp_path / "read_and_exit.py"
    script.write_text(_READ_AND_EXIT)
    for batch in range(10):
        runs = [
            subprocess.Popen(
                [sys.executable, str(script), str(FIXTURES / "Embedded.toml"), str(tmp_path / f"c{batch}-{k}")],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(4)
        ]
        for p in runs:
            out, err = p.communicate(timeout=60)
            assert (p.returncode, out.strip()) == (0, "32"), (p.returncode, err[-2000:])


def test_reads_from_event_loops_in_two_threads_each_complete_on_their_own_loop(tmp_path):
    """Every loop that awaits a read watches the one wake pipe; whichever collects a result
    completes its future on the loop that awaits it (call_soon_threadsafe)."""
    import threading

    catalog = Catalog.load(FIXTURES / "Embedded.toml", Cache(tmp_path / "c"))
    results: dict = {}

    def run(name: str) -> None:
        async def reads():
            tree = catalog.tree("embedded_tree")
            loop = asyncio.get_running_loop()
            got = []
            for _ in range(20):
                fut = tree.blob("d02/a.txt").read_all()
                got.append(await fut)
            return got, loop

        results[name] = asyncio.run(reads())

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["t0", "t1"]
    for got, _ in results.values():
        assert got == [b"2 a content"] * 20

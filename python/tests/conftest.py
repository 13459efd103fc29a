"""Fixtures: the Rust binary, child nodes (Rust ``handoff node`` or the Python worker), secrets."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _on_engine() -> bool:
    from handoff.node import engine_default

    return engine_default()


#: Whether every ``handoff.Node`` that does not say runs on the Rust engine
#: (handoff.engine_node): wherever the extension is in use, unless ``HANDOFF_ENGINE=0``.
ON_ENGINE = _on_engine()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "pure_only(why): looks inside the Python implementation's own parts (its transport, its lease "
        "table); skipped when nodes run on the engine (the default with the extension)",
    )


def pytest_collection_modifyitems(config, items):
    if not ON_ENGINE:
        return
    for item in items:
        pure = item.get_closest_marker("pure_only")
        if pure is not None:
            item.add_marker(pytest.mark.skip(reason=f"pure peer only: {pure.args[0]}"))


def _find_handoff_bin() -> Path:
    env = os.environ.get("HANDOFF_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return p
    subprocess.run(["cargo", "build", "-p", "handoff-cli"], cwd=REPO, check=True)
    return REPO / "target" / "debug" / "handoff"


@pytest.fixture(scope="session")
def handoff_bin() -> Path:
    p = _find_handoff_bin()
    if not p.exists():
        pytest.fail(f"the Rust binary {p} does not exist (set HANDOFF_BIN or run cargo build -p handoff-cli)")
    return p


@pytest.fixture(autouse=True)
def process_kept_map_budget():
    """Each test starts with the kept-mapping budget of the environment: a Dask node made
    by an earlier test sets this process's to 0 (``handoff.dask.nodes.KEPT_MAP_BYTES``)."""
    from handoff_pure import mapcache

    mapcache._state["keep_bytes"] = None
    yield
    mapcache._state["keep_bytes"] = None


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path_factory, monkeypatch):
    """Each test's node sockets in a folder of their own; host ids from the machine."""
    d = tmp_path_factory.mktemp("run")
    d.chmod(0o700)
    monkeypatch.setenv("HANDOFF_RUNTIME_DIR", str(d))
    monkeypatch.delenv("HANDOFF_HOST_ID", raising=False)
    # A catalog opened without a cache uses the default folder: each test its own, and never
    # the user's ~/.cache.
    monkeypatch.setenv("HANDOFF_CACHE_DIR", str(d / "data-cache"))
    return d


@pytest.fixture
def secret_file(tmp_path) -> Path:
    p = tmp_path / "secret"
    p.write_text("interop secret\n")
    p.chmod(0o600)
    return p


SECRET = b"interop secret"


class Child:
    """A child node process; ``ready`` is its ready line, ``stderr`` what it logged so far."""

    def __init__(self, proc: subprocess.Popen, err_path: Path, ready: dict):
        self.proc = proc
        self.err_path = err_path
        self.ready = ready

    @property
    def listen(self) -> str:
        return self.ready["listen"]

    @property
    def name(self) -> str:
        return self.ready["name"]

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    async def wait_stderr(self, *needles: str, timeout: float = 5.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.stderr()
            if all(n in text for n in needles) or time.monotonic() > deadline:
                return text
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _spawn(cmd: list, tmp_path: Path, env: dict | None, label: str) -> Child:
    err_path = tmp_path / f"{label}-{len(list(tmp_path.glob(label + '-*')))}.stderr"
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=open(err_path, "wb"), stdin=subprocess.DEVNULL, env=full_env
    )
    loop = asyncio.get_running_loop()
    try:
        line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
    except asyncio.TimeoutError:
        proc.kill()
        raise AssertionError(f"{label} did not report ready in time; stderr: {err_path.read_text()}") from None
    if not line:
        proc.wait()
        raise AssertionError(f"{label} exited before reporting ready; stderr: {err_path.read_text()}")
    ready = json.loads(line)
    assert ready["event"] == "ready", line
    return Child(proc, err_path, ready)


@pytest.fixture
async def spawn_rust(handoff_bin, tmp_path, secret_file):
    children = []

    async def spawn(name: str, *args: str, secret: Path | None = None, env: dict | None = None) -> Child:
        cmd = [str(handoff_bin), "node", "--name", name, "--secret-file", str(secret or secret_file), *args]
        child = await _spawn(cmd, tmp_path, {"HANDOFF_LOG": "warn", **(env or {})}, name)
        children.append(child)
        return child

    yield spawn
    for c in children:
        c.stop()


@pytest.fixture
async def spawn_py_worker(tmp_path, secret_file):
    children = []

    async def spawn(name: str, *args: str, env: dict | None = None) -> Child:
        cmd = [sys.executable, "-m", "handoff.worker", "--name", name, "--secret-file", str(secret_file), *args]
        child = await _spawn(cmd, tmp_path, {"HANDOFF_LOG": "info", **(env or {})}, name)
        children.append(child)
        return child

    yield spawn
    for c in children:
        c.stop()


@pytest.fixture
def rust_stats(handoff_bin, secret_file):
    """``handoff stats --connect ADDR --json`` as a dict."""

    async def stats(addr: str) -> dict:
        proc = await asyncio.create_subprocess_exec(
            str(handoff_bin),
            "stats",
            "--connect",
            addr,
            "--secret-file",
            str(secret_file),
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 0, err.decode()
        return json.loads(out)

    return stats

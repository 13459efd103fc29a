"""The lab the multi-host tests run in, and real nodes on its hosts.

These tests run inside host 1 of a lab that `scripts/netlab` made: `./scripts/test` runs

    scripts/netlab run --lab LAB --hosts 3 -- ip netns exec LAB-h1 PYTHON -m pytest python/tests/multihost

so this process is host 1. The tests start `handoff node` on any host with `ip netns exec`.
The fixtures of ``python/tests/conftest.py`` (a runtime folder per test, the secret file)
apply here too. Each host is a network namespace with its own address (10.77.0.N), so nodes on different
hosts count as different hosts (the host id includes the network namespace, WIRE.md §5.2)
and talk over TCP across the lab's bridge; nodes on one host use shared memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
NETLAB = REPO / "scripts" / "netlab"


@dataclass
class Lab:
    """The lab this test process runs in."""

    name: str
    hosts: dict[int, str]  # host number -> address

    def namespace(self, host: int) -> str:
        return f"{self.name}-h{host}"

    def netlab(self, *args: str) -> str:
        """Runs `scripts/netlab ARGS --lab NAME`; a failure fails the test."""
        command, *rest = args
        proc = subprocess.run(
            [sys.executable, str(NETLAB), command, "--lab", self.name, *rest],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"netlab {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def link(self, host: int, state: str) -> None:
        self.netlab("link", str(host), state)

    def shape(self, host: int, *args: str) -> None:
        self.netlab("shape", str(host), *args)


@pytest.fixture(scope="session")
def lab() -> Lab:
    name = os.environ.get("NETLAB")
    if not name:
        pytest.skip("not in a lab: run under `scripts/netlab run` (./scripts/test does, as root)")
    hosts = {}
    for entry in os.environ.get("NETLAB_HOSTS", "").split():
        ns, address = entry.split("=")
        hosts[int(ns.rsplit("-h", 1)[1])] = address
    here = subprocess.run(["ip", "netns", "identify", str(os.getpid())], capture_output=True, text=True)
    assert here.stdout.strip() == f"{name}-h1", f"the tests must run in host 1 ({name}-h1), not {here.stdout!r}"
    assert len(hosts) >= 3, f"the lab needs 3 hosts, has {hosts}"
    return Lab(name, hosts)


def _find_handoff_bin() -> Path:
    env = os.environ.get("HANDOFF_BIN")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return p
    pytest.fail("no handoff binary: set HANDOFF_BIN or run cargo build -p handoff-cli")


class RustNode:
    """A `handoff node` process on one host of the lab."""

    def __init__(self, proc: subprocess.Popen, err: Path, ready: dict, host: int):
        self.proc, self.err, self.ready, self.host = proc, err, ready, host

    @property
    def listen(self) -> str:
        return self.ready["listen"]

    @property
    def name(self) -> str:
        return self.ready["name"]

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
async def spawn_node(lab, tmp_path, secret_file):
    """Starts `handoff node --name NAME` on host HOST, listening on the host's address."""
    binary = _find_handoff_bin()
    nodes: list[RustNode] = []

    async def spawn(host: int, name: str, *args: str) -> RustNode:
        err = tmp_path / f"{name}.stderr"
        cmd = ["ip", "netns", "exec", lab.namespace(host), str(binary), "node", "--name", name]
        cmd += ["--listen", f"{lab.hosts[host]}:0", "--secret-file", str(secret_file), *args]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=open(err, "wb"),
            stdin=subprocess.DEVNULL,
            env=os.environ | {"HANDOFF_LOG": "warn"},
        )
        loop = asyncio.get_running_loop()
        line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 30)
        if not line:
            proc.wait()
            raise AssertionError(f"{name} on host {host} exited before it was ready: {err.read_text()}")
        ready = json.loads(line)
        assert ready["event"] == "ready", line
        node = RustNode(proc, err, ready, host)
        nodes.append(node)
        return node

    yield spawn
    for n in nodes:
        n.stop()


@pytest.fixture
def secret(secret_file) -> bytes:
    """The cluster secret of the nodes the tests start (what ``secret_file`` holds)."""
    return secret_file.read_bytes().rstrip(b"\n")


@pytest.fixture
def lab_stats(secret_file):
    """`handoff stats --connect ADDR --json` from this host, as a dict."""
    binary = _find_handoff_bin()

    async def stats(addr: str, timeout: float = 20) -> dict:
        proc = await asyncio.create_subprocess_exec(
            str(binary), "stats", "--connect", addr, "--secret-file", str(secret_file), "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        assert proc.returncode == 0, err.decode()
        return json.loads(out)

    return stats

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

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Child, _spawn  # the suite's conftest, one folder up

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


@pytest.fixture
async def spawn_node(lab, tmp_path, secret_file, handoff_bin):
    """Starts `handoff node --name NAME` on host HOST, listening on the host's address (the
    suite's `_spawn`, run inside the host's namespace)."""
    nodes: list[Child] = []

    async def spawn(host: int, name: str, *args: str) -> Child:
        cmd = ["ip", "netns", "exec", lab.namespace(host), str(handoff_bin), "node", "--name", name]
        cmd += ["--listen", f"{lab.hosts[host]}:0", "--secret-file", str(secret_file), *args]
        node = await _spawn(cmd, tmp_path, {"HANDOFF_LOG": "warn"}, f"{name}-h{host}")
        nodes.append(node)
        return node

    yield spawn
    for n in nodes:
        n.stop()


@pytest.fixture
def secret(secret_file) -> bytes:
    """The cluster secret of the nodes the tests start (what ``secret_file`` holds)."""
    return secret_file.read_bytes().rstrip(b"\n")

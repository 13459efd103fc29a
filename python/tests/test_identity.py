"""The host identity (spec §5.2): the reference derivation and what it is derived from, and the
engine's ids and host identity (``handoff.identity``) held to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from handoff import identity
from handoff.identity import host_id
import handoff_pure.identity as reference
from handoff_pure.identity import derive_host_id

MACHINE = "0123456789abcdef0123456789abcdef"
BOOT = "5f2c1b7e-9a3d-4c8e-b1f0-2d6e8a4c9b37"


def test_the_reference_derivation_gives_the_specs_examples():
    # The worked examples of WIRE.md §5.2; the Rust reference checks the same ones.
    assert derive_host_id(MACHINE, BOOT, "", "net:[4026531840]") == "911174bd877e6514"
    assert derive_host_id(MACHINE, BOOT, "", "net:[4026532999]") == "194d7c9652d9d136"
    assert derive_host_id("", "", "box7", "net:[4026531840]") == "988b8172d433bebc"
    # The hostname counts only when the machine and boot ids are both missing.
    assert derive_host_id(MACHINE, BOOT, "box7", "net:[4026531840]") == derive_host_id(
        MACHINE, BOOT, "", "net:[4026531840]"
    )


def test_the_environment_overrides_it(monkeypatch):
    monkeypatch.setenv("HANDOFF_HOST_ID", "lab-host-2")
    assert host_id() == "lab-host-2"


def test_this_processes_network_namespace_is_part_of_it():
    netns = os.readlink("/proc/self/ns/net")
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    machine = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            break
    hostname = ""
    if not machine and not boot:
        with open("/etc/hostname") as f:
            hostname = f.read().strip()
    assert host_id() == derive_host_id(machine, boot, hostname, netns)


@pytest.mark.skipif(os.geteuid() != 0, reason="a new network namespace needs root")
def test_another_network_namespace_is_another_host(monkeypatch):
    # `unshare --net` runs a process in a network namespace of its own: the same machine and
    # boot, so only the namespace differs.
    monkeypatch.delenv("HANDOFF_HOST_ID", raising=False)
    probe = [sys.executable, "-c", "from handoff.identity import host_id; print(host_id())"]
    inside = subprocess.run(["unshare", "--net", *probe], capture_output=True, text=True, check=True).stdout.strip()
    here = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert here == host_id()
    assert inside != here and len(inside) == 16


def test_the_engine_and_the_reference_derive_the_same_host_id(monkeypatch):
    monkeypatch.delenv("HANDOFF_HOST_ID", raising=False)
    assert host_id() == reference.host_id()
    assert len(host_id()) == 16


#: The engine's (``handoff.identity``) and the reference's (``handoff_pure.identity``).
BOTH = pytest.mark.parametrize("identity", [identity, reference], ids=["engine", "reference"])


@BOTH
def test_ids_are_random_and_a_forked_child_is_another_process_instance(identity):
    ids = {identity.random_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    mine = identity.process_id()
    assert identity.process_id() == mine, "one id per process instance"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, identity.process_id().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != mine
    assert identity.process_id() == mine


@BOTH
def test_the_runtime_directory_is_ours_alone(identity, tmp_path, monkeypatch):
    d = tmp_path / "run"
    monkeypatch.setenv("HANDOFF_RUNTIME_DIR", str(d))
    assert identity.runtime_dir() == d
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o755)
    identity.runtime_dir()
    assert (d.stat().st_mode & 0o777) == 0o700, "others' rights are taken away"
    monkeypatch.setenv("HANDOFF_RUNTIME_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(OSError):
        identity.runtime_dir()

"""``HANDOFF_NATIVE`` chooses the implementation per process (``handoff.native``): 0 the
pure-Python path, 1 the extension or a clear error, unset the extension where it loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("handoff._native")

PROBE = (
    "import handoff.native as n, handoff.codec as c, handoff.node as m;"
    "print(n.ENABLED, c._PLAIN is not None, m.engine_default(), '|', n.REASON)"
)


def probe(value):
    env = {k: v for k, v in os.environ.items() if k != "HANDOFF_NATIVE"}
    if value is not None:
        env["HANDOFF_NATIVE"] = value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_unset_and_1_select_the_extension():
    for value in (None, "1"):
        out = probe(value)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("True True True |"), out.stdout


def test_0_selects_the_pure_path_everywhere():
    out = probe("0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False False | HANDOFF_NATIVE=0"


#: A process whose extension cannot be loaded (as on a machine where the wheel's was not
#: installed), with neither test switch: handoff imports, and a node says why it cannot run.
NO_EXTENSION = (
    "import sys; sys.modules['handoff._native'] = None\n"
    "import handoff, handoff.native as n\n"
    "assert not n.ENABLED, n.REASON\n"
    "try:\n"
    "    handoff.Node('x')\n"
    "except ValueError as e:\n"
    "    print('refused:', e)\n"
    "print('pure loaded:', 'handoff_pure' in sys.modules)\n"
)


def test_without_the_extension_a_node_says_why_and_the_reference_stays_unloaded():
    env = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_NATIVE", "HANDOFF_ENGINE")}
    out = subprocess.run([sys.executable, "-c", NO_EXTENSION], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: handoff.Node runs on the extension handoff._native, which is not in use" in out.stdout
    assert "HANDOFF_ENGINE=0 selects it" in out.stdout
    assert "pure loaded: False" in out.stdout


#: What an application and a Dask worker import and run, on the engine: two nodes that
#: exchange a message with a frame, over shm and over tcp.
ON_THE_ENGINE = """
import asyncio, sys
import handoff, handoff.dask, handoff.worker, handoff.datasets

async def main():
    async with handoff.Node("a", listen="127.0.0.1:0") as a, handoff.Node("b") as b:
        for channel in ("shm", "tcp"):
            peer = await b.connect(a.listen_addr, channel=channel)
            await peer.send("t.X", {"data": b"x" * 200_000})
            env = await a.recv(10)
            assert len(env.body["data"]) == 200_000
    print(type(a).__module__, sorted(m for m in sys.modules if m.split(".")[0] == "handoff_pure"))

asyncio.run(main())
"""


def test_nodes_on_the_engine_import_nothing_of_the_reference():
    env = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_NATIVE", "HANDOFF_ENGINE")}
    out = subprocess.run([sys.executable, "-c", ON_THE_ENGINE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["handoff.engine_node", "[]"], out.stdout


def test_the_switches_select_the_reference_node_behind_the_same_api():
    for env_var in ("HANDOFF_NATIVE", "HANDOFF_ENGINE"):
        env = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_NATIVE", "HANDOFF_ENGINE")}
        env[env_var] = "0"
        code = "import handoff, sys; n = handoff.Node('x'); print(type(n).__module__, isinstance(n, handoff.Node))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["handoff_pure.node", "True"], (env_var, out.stdout)


def test_anything_else_is_refused_with_what_was_wrong():
    out = probe("yes")
    assert out.returncode != 0
    assert "HANDOFF_NATIVE='yes': expected 0 (pure Python), 1 (the extension) or unset" in out.stderr


def test_importing_handoff_runs_no_program():
    """Importing handoff (each Dask worker does at its start) runs no other program: it once
    ran ``ldconfig -p`` to find the C library."""
    code = (
        "import os, subprocess\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError(f'import handoff ran a program: {a!r}')\n"
        "subprocess.Popen = refuse\n"
        "os.posix_spawn = os.fork = os.execv = refuse\n"
        "import handoff, handoff.dask, handoff.shared\n"
        "print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr

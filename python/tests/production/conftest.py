"""Running one program on both schemes, each in a fresh interpreter of its own.

A program is a Python file that takes the scheme as its first argument and prints one
JSON object as its last line; :func:`run_program` runs it with a time limit and returns
that object (or fails the test with the program's output). A process of its own per run:
limits (``RLIMIT_NOFILE``), forks and memory figures of one run never leak into the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(path: Path, scheme: str, env: dict, timeout: float) -> dict:
    full = dict(os.environ)
    full.update(env)
    full["DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME"] = scheme
    try:
        p = subprocess.run(
            [sys.executable, str(path), scheme],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full,
            cwd=path.parent,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-4000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-4000:]
        pytest.fail(f"the program on {scheme}:// ran over {timeout} s; its output ends:\n{out}")
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        pytest.fail(
            f"the program on {scheme}:// exited with {p.returncode}; stdout ends:\n{p.stdout[-3000:]}\n"
            f"stderr ends:\n{p.stderr[-5000:]}"
        )
    return json.loads(lines[-1])


@pytest.fixture
def run_program(tmp_path):
    """``run_program(source, scheme, env={}, timeout=120) -> dict`` (see the module)."""

    def run(source: str, scheme: str, env: dict = None, timeout: float = 120) -> dict:
        path = tmp_path / f"program_{scheme}.py"
        path.write_text(textwrap.dedent(source))
        return _run(path, scheme, env or {}, timeout)

    return run

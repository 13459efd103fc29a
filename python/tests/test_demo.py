"""`handoff demo` with the Python worker: verified rows from and to `py-…` on tcp and shm."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_demo_has_verified_python_rows_on_tcp_and_shm(handoff_bin):
    env = dict(os.environ, HANDOFF_PYTHON=sys.executable, HANDOFF_LOG="warn")
    out = subprocess.run(
        [str(handoff_bin), "demo", "--json", "--bytes", "3000000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert all(r["verified"] for r in rows), rows
    py = [r for r in rows if r["from"].startswith("py-") or r["to"].startswith("py-")]
    for channel, locality in (("tcp", "remote"), ("shm", "same-host")):
        on = [r for r in py if r["channel"] == channel and r["locality"] == locality]
        assert any(r["from"].startswith("py-") for r in on), (channel, py)
        assert any(r["to"].startswith("py-") for r in on), (channel, py)

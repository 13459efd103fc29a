"""`handoff demo` with the Python worker: verified rows from and to `py-…` on tcp and shm, and
the Dask rows (a cluster on handoff://) on shm and on tcp, beside Dask's tcp:// time."""

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
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert all(r["verified"] for r in rows), rows
    # A value row is the route's first transfer (cold) with the warm median of its repeats beside it.
    for r in rows:
        if "data" not in r and not r["from"].startswith("dask-"):
            assert r["cold"] is True and r["warm_seconds"] > 0, r
    py = [r for r in rows if r["from"].startswith("py-") or r["to"].startswith("py-")]
    for channel, locality in (("tcp", "remote"), ("shm", "same-host")):
        on = [r for r in py if r["channel"] == channel and r["locality"] == locality]
        assert any(r["from"].startswith("py-") for r in on), (channel, py)
        assert any(r["to"].startswith("py-") for r in on), (channel, py)
    try:
        import distributed  # noqa: F401
    except ImportError:
        return
    dask = {(r["channel"], r["locality"]): r for r in rows if r["from"].startswith("dask-") and "data" not in r}
    assert set(dask) == {("shm", "same-host"), ("tcp", "remote")}, rows
    for r in dask.values():
        assert r["verified"] and r["bytes"] == 3000000 and r["seconds"] > 0 and r["dask_tcp_seconds"] > 0, r
        # Dask's array rows are warm already (a median after a warm-up); the warm-up is their cold figure.
        assert r["cold"] is False and r["warm_seconds"] == r["seconds"] and r["cold_seconds"] > 0, r
    assert all("dask_tcp_seconds" not in r for r in rows if not r["from"].startswith("dask-"))
    # A Dask worker receiving a data handle: one row per origin, with the storage GETs it caused.
    handles = {r["to"]: r for r in rows if r["from"].startswith("dask-") and "data" in r}
    got = {to: (r["path"], r["storage_gets"], r["channel"]) for to, r in handles.items()}
    assert got == {
        "dask-b": ("shared-cache", 0, "shm"),
        "dask-r": ("storage", 1, "tcp"),
        "dask-n": ("remote-blob", 0, "shm"),
    }, handles
    assert all(r["verified"] and r["bytes"] == 3000000 and "dask_tcp_seconds" not in r for r in handles.values())
    assert all(r["cold"] is True and "warm_seconds" not in r for r in handles.values()), handles

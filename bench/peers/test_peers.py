"""The smoke version of bench/peers: tiny sizes, handoff and the raw limits only (no Dask,
no Ray), so that the harness, the handoff bench options it uses and the report cannot rot.

Run by ./scripts/test (``pytest bench/peers``) with ``HANDOFF_BIN`` set to the debug binary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import report  # noqa: E402

SIZES = [1 << 10, 64 << 10, 1 << 20]


def handoff_bin() -> str:
    if os.environ.get("HANDOFF_BIN"):
        return os.environ["HANDOFF_BIN"]
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "handoff"
        if p.exists():
            return str(p)
    pytest.skip("no handoff binary: build it (cargo build -p handoff-cli) or set HANDOFF_BIN")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("peers")
    env = dict(os.environ, HANDOFF_BIN=handoff_bin(), HANDOFF_PEERS_PYTHON=sys.executable)
    proc = subprocess.run(
        [str(HERE / "run"), "--smoke", "--out", str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "peers.json").read_text())


def test_every_handoff_and_raw_series_is_measured_at_every_size(smoke):
    _, data = smoke
    assert data["errors"] == []
    assert data["meta"]["sizes"] == SIZES
    seen = {(r["series"], r.get("read"), r["route"], r["bytes"]) for r in data["transfers"]}
    expected = [
        ("raw memcpy", "copy", "same-host"),
        ("raw Unix socket", "copy", "same-host"),
        ("raw TCP", "copy", "remote"),
        # The same receives followed by a read of every byte: what full reads compare with.
        ("raw Unix socket", "full", "same-host"),
        ("raw TCP", "full", "remote"),
        ("handoff Rust shm zero-copy", "none", "same-host"),
        ("handoff Rust shm zero-copy", "full", "same-host"),
        ("handoff Rust shm copy-in", "none", "same-host"),
        ("handoff Rust tcp", "full", "remote"),
        ("handoff Python←Rust shm", "full", "same-host"),
        ("handoff Python←Python shm", "sample", "same-host"),
        ("handoff Python←Rust tcp", "full", "remote"),
        ("handoff Python←Python tcp", "full", "remote"),
    ]
    for series, read, route in expected:
        for n in SIZES:
            assert (series, read, route, n) in seen, (series, read, route, n)
    # Tickets only from the owner's ticket threshold (64 KiB) up.
    for series in ("handoff Rust ticket pull", "handoff Rust ticket 3rd party", "handoff Python←Rust ticket"):
        assert {r["bytes"] for r in data["transfers"] if r["series"] == series} == {64 << 10, 1 << 20}
    for r in data["transfers"]:
        assert len(r["runs"]) == 2 and r["min"] <= r["median"] <= r["max"], r
        assert r["median"] > 0, r
    # Over shm the Python peer really got shared memory, over tcp it did not.
    frames = {r["series"]: set(r["frames"]) for r in data["transfers"] if r["bytes"] == 1 << 20 and "frames" in r}
    assert "shm" in frames["handoff Python←Rust shm"] and "shm" in frames["handoff Python←Python shm"]
    assert "shm" not in frames["handoff Python←Rust tcp"]
    assert "ticket" in frames["handoff Python←Rust ticket"]


def test_round_trips_of_handoff_and_raw_sockets(smoke):
    _, data = smoke
    names = {r["series"] for r in data["rtt"]}
    for name in (
        "raw Unix socket",
        "raw TCP",
        "handoff Rust shm",
        "handoff Rust tcp",
        "handoff Python↔Rust shm",
        "handoff Python↔Python tcp",
        "handoff Python↔Python tcp (pure Python)",
        "handoff Python↔Python shm (pure Python)",
        "handoff Python↔Python tcp (engine)",
        "handoff Python↔Rust shm (engine)",
        # The asyncio floors, measured in the same run as each Python series.
        "asyncio add_reader floor unix",
        "asyncio add_reader floor tcp (engine)",
    ):
        assert name in names, name
    assert all(0 < r["median"] < 0.1 for r in data["rtt"])
    pure = [r for r in data["rtt"] if r["series"].endswith("(pure Python)") and not r["series"].startswith("asyncio")]
    assert pure and {r["system"] for r in pure} == {"handoff-python-pure"}
    engine = [r for r in data["rtt"] if r["series"].endswith("(engine)") and not r["series"].startswith("asyncio")]
    assert engine and {r["system"] for r in engine} == {"handoff-python-engine"}
    floors = [r for r in data["rtt"] if r["series"].startswith("asyncio add_reader floor")]
    assert floors and {r["system"] for r in floors} == {"raw"}


def test_the_report_has_its_tables_and_updates_only_its_part_of_the_doc(smoke, tmp_path):
    out, data = smoke
    md = (out / "peers.md").read_text()
    for heading in ("Largest size, same host", "Largest size, remote", "100-byte round trip", "Every size, remote"):
        assert heading in md
    assert "1 MiB" in md and "raw Unix socket" in md
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\nintro\n\n{report.BEGIN}\nSTALE-PART\n{report.END}\n\nclosing note\n")
    report.write_all(data, tmp_path, doc)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith("\n\nclosing note\n")
    assert "STALE-PART" not in text and "Largest size, same host" in text


def test_plots_are_written_when_matplotlib_is_there(smoke, tmp_path):
    pytest.importorskip("matplotlib")
    _, data = smoke
    report.write_all(data, tmp_path, None)
    for name in ("peers-same-host-full.png", "peers-same-host-view.png", "peers-remote.png", "peers-rtt.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name


def _dask_rows(system: str, series: str, seconds: dict) -> list:
    from common import row

    return [
        row(series, system, "same-host", read, n, [t * 0.9, t, t * 1.2], "test") for (read, n), t in seconds.items()
    ]


def test_the_dask_section_sets_dask_on_handoff_beside_dask_on_tcp(tmp_path):
    """Computed from the rows: ratios of the medians per size, and of the round trips."""
    sizes = [1 << 10, 64 << 20]
    tcp = {("full", n): 0.002 + n / 2e9 for n in sizes} | {("sample", n): 0.002 + n / 2.5e9 for n in sizes}
    ho = {("full", n): 0.002 + n / 8e9 for n in sizes} | {("sample", n): 0.002 for n in sizes}
    data = {
        "meta": {
            "started": "2026-12-01T00:00:00+00:00",
            "finished": "2026-12-01T00:01:00+00:00",
            "command": "bench/peers/run --systems dask,dask-handoff",
            "machine": {"cpus": 2},
            "sizes": sizes,
            "reps": {},
            "rtt_reps": 3,
            "systems": {},
        },
        "transfers": _dask_rows("dask", "Dask", tcp) + _dask_rows("dask-handoff", "Dask on handoff://", ho),
        "rtt": [
            *_dask_rows("dask", "Dask task (client→worker→client)", {(None, None): 0.010}),
            *_dask_rows("dask-handoff", "Dask on handoff:// task (client→worker→client)", {(None, None): 0.0105}),
        ],
        "errors": [],
    }
    text = report.dask_section(data)
    big = next(line for line in text.splitlines() if line.startswith("| 64 MiB"))
    assert f"{tcp['full', 64 << 20] / ho['full', 64 << 20]:.2f}×" in big
    assert "| task (client→worker→client) | 10.0 ms | 10.5 ms | 1.05× |" in text
    report.write_all(data, tmp_path, None)
    assert "Dask on handoff:// against Dask on tcp://" in (tmp_path / "peers.md").read_text()
    if (tmp_path / "peers-same-host-full.png").exists():  # matplotlib is there
        assert (tmp_path / "peers-dask.png").stat().st_size > 10_000
    # Without one of the two, the section says so.
    data["transfers"] = [r for r in data["transfers"] if r["system"] == "dask"]
    assert "not measured" in report.dask_section(data)


def test_dask_handoff_runs_the_dask_script_on_handoff():
    """The 'dask-handoff' system is sys_dask.py with --protocol handoff (no Dask run here)."""
    import peers

    assert "dask-handoff" in peers.SYSTEMS and peers.SCRIPTS["dask-handoff"] == ("dask", ["--protocol", "handoff"])
    env = dict(os.environ, PYTHONPATH=str(HERE))
    out = subprocess.run(
        [sys.executable, str(HERE / "sys_dask.py"), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "--protocol" in out.stdout, out.stderr


def _transfer(series: str, read: str, n: int, median: float) -> dict:
    return {"series": series, "read": read, "bytes": n, "median": median}


def test_the_python_targets_are_judged_from_the_run_and_say_what_is_missing():
    gib = 1 << 30
    data = {
        "transfers": [
            _transfer("raw TCP", "copy", gib, 0.400),
            _transfer("handoff Python←Rust tcp", "sample", gib, 0.450),  # 0.89: holds
            _transfer("handoff Python←Rust tcp", "full", gib, 0.600),  # 0.67: short
            _transfer("handoff Rust shm zero-copy", "full", gib, 0.100),
            _transfer("handoff Python←Rust shm", "full", gib, 0.140),  # 1.4: short
            # Issue 40's rows compare like with like: sampled with the raw receive, full
            # read with the raw receive and read.
            _transfer("raw TCP", "full", gib, 0.500),
            _transfer("handoff Python←Rust tcp (engine)", "sample", gib, 0.450),  # 0.89: short
            _transfer("handoff Python←Rust tcp (engine)", "full", gib, 0.520),  # 0.96: holds
            _transfer("handoff Python←Rust ticket (engine)", "full", gib, 0.600),  # 0.83: short
        ],
        "rtt": [
            {"series": "raw Unix socket", "median": 20e-6},
            {"series": "handoff Python↔Python shm", "median": 45e-6},  # 2.25: holds
        ],
    }
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.targets_section(data).splitlines()[2:]}
    assert "| 0.89 | yes |" in lines["Python←Rust tcp, sampled, 1 GiB: raw TCP time ÷ ours"]
    assert "| 0.67 | **no** |" in lines["Python←Rust tcp, full read, 1 GiB: raw TCP time ÷ ours"]
    assert "| 1.40 | **no** |" in lines["Python←Rust shm, full read, 1 GiB: ours ÷ Rust full read"]
    assert "not measured" in lines["Python←Python shm, full read, 1 GiB: ours ÷ Rust full read"]
    assert "| 2.25 | yes |" in lines["Python↔Python shm, 100-byte round trip: ours ÷ raw Unix socket round trip"]
    assert "not measured" in lines["Python↔Python tcp, 100-byte round trip: ours ÷ raw Unix socket round trip"]
    assert "| 0.89 | **no** |" in lines["engine: Python←Rust tcp, sampled, 1 GiB: raw TCP time ÷ ours"]
    assert "| 0.96 | yes |" in lines["engine: Python←Rust tcp, full read, 1 GiB: raw TCP full read time ÷ ours"]
    assert "not measured" in lines["engine: Python←Python tcp, full read, 1 GiB: raw TCP full read time ÷ ours"]
    assert "| 0.83 | **no** |" in lines["engine: Python←Rust ticket, full read, 1 GiB: raw TCP full read time ÷ ours"]


def test_floors_judges_each_run_of_handoff_bench(capsys):
    sys.path.insert(0, str(HERE.parent))
    import floors

    rows = [
        {"case": "shm-copy-in", "bytes": 64 << 10, "ours": 1e-5, "efficiency": 0.1},  # below 1 MiB: no floor
        {"case": "shm-copy-in", "bytes": 1 << 20, "ours": 1e-4, "efficiency": 0.69},
        {"case": "shm-view", "bytes": 1 << 30, "ours": 99e-6, "efficiency": 300.0},
        {"case": "ticket-3party", "bytes": 64 << 20, "ours": 0.04, "efficiency": 0.85},
    ]
    judged = {(j["case"], j["bytes"]): j["holds"] for j in floors.judge(rows)}
    assert judged == {("shm-copy-in", 1 << 20): False, ("shm-view", 1 << 30): True, ("ticket-3party", 64 << 20): True}

    # One real run of the binary, one case: the floor is judged on what it printed.
    code = floors.main(["--runs", "1", "--bin", handoff_bin(), "--json", "--", "--only", "shm-rtt", "--reps", "1"])
    out = json.loads(capsys.readouterr().out)
    assert [j["case"] for j in out["runs"][0]] == ["shm-rtt"]
    assert code == (0 if out["all_hold"] else 1)

"""docs/dask.md and the Dask backend's settings agree: every key of ``handoff.yaml`` is in the
guide's table of settings, and every ``distributed.comm.handoff.…`` key a guide names exists."""

from __future__ import annotations

import re

import pytest
from markdown_docs import REPO, guide_files, rel

YAML = REPO / "python/src/handoff/dask/handoff.yaml"
yaml = pytest.importorskip("yaml")  # Dask's dependency: there with the dask extra


def _keys() -> set[str]:
    return set(yaml.safe_load(YAML.read_text())["distributed"]["comm"]["handoff"])


def test_every_setting_is_in_the_dask_guide():
    table = (REPO / "docs/dask.md").read_text().split("## Settings", 1)[1].split("\n## ", 1)[0]
    missing = sorted(k for k in _keys() if f"`{k}`" not in table)
    assert not missing, f"settings of {rel(YAML)} missing from docs/dask.md's table: {missing}"


def test_every_setting_a_guide_names_exists():
    keys = _keys()
    named = {
        (rel(p), m[1])
        for p in guide_files()
        for m in re.finditer(r"distributed\.comm\.handoff\.([a-z0-9-]+)", p.read_text())
    }
    unknown = sorted(f"{where}: {key}" for where, key in named if key not in keys)
    assert not unknown, "settings that do not exist:\n" + "\n".join(unknown)

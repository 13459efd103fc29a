"""``HANDOFF_NATIVE`` chooses the implementation per process (``handoff.native``): 0 the
pure-Python path, 1 the extension or a clear error, unset the extension where it loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("handoff._native")

PROBE = (
    "import handoff.native as n, handoff.codec as c, handoff.wire.decode as d;"
    "print(n.ENABLED, c._PLAIN is not None, d._native_plain_msg is not None, '|', n.REASON)"
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


def test_anything_else_is_refused_with_what_was_wrong():
    out = probe("yes")
    assert out.returncode != 0
    assert "HANDOFF_NATIVE='yes': expected 0 (pure Python), 1 (the extension) or unset" in out.stderr

"""Every example of README.md and docs/ runs, each block a case named by its file and line.

- ``python`` blocks run as scripts of their own, from the repository root, each within
  :data:`TIMEOUT`; one that starts a Dask cluster starts a real one. A block that needs Dask or
  numpy is skipped, saying so, where they are not installed.
- ``toml`` blocks parse.
- ``rust`` blocks are doc tests (``cargo test --doc``): each guide that has one is included, with
  ``#[doc = include_str!(…)]``, by the crate whose API it shows. Checked here: that the inclusion
  exists, so that no guide's Rust goes untested.
- ``sh`` blocks are checked, not run, by test_docs_commands.py; ``text`` blocks are output.

A block with no language would be compiled by rustdoc as Rust: every block names one of
:data:`LANGS`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from markdown_docs import REPO, Block, code_blocks, guide_files, rel

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

#: The languages a guide's blocks may have.
LANGS = {"python", "rust", "toml", "sh", "text"}
#: Seconds one Python block may take (a Dask cluster of two worker processes starts in a few).
TIMEOUT = 120

BLOCKS = [b for path in guide_files() for b in code_blocks(path)]


def _of(lang: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang]


def run_python(block: Block, tmp_path) -> subprocess.CompletedProcess:
    """Runs a Python block as a script (a file, so that Dask's worker processes can import it)."""
    script = tmp_path / f"example_{block.line}.py"
    script.write_text(block.text)
    return subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: b.where)
def test_python_example_runs(block, tmp_path):
    for module in ("distributed", "numpy"):
        if f"import {module}" in block.text or f"from {module}" in block.text:
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"{module} is not installed")
    if "handoff.dask" in block.text and importlib.util.find_spec("distributed") is None:
        pytest.skip("distributed is not installed")
    out = run_python(block, tmp_path)
    assert out.returncode == 0, f"{block.where} failed:\n{out.stdout}\n{out.stderr[-4000:]}"


@pytest.mark.parametrize("block", _of("toml"), ids=lambda b: b.where)
def test_toml_example_parses(block):
    tomllib.loads(block.text)


def test_every_block_names_a_language():
    unnamed = [f"{b.where}: {b.info!r}" for b in BLOCKS if b.lang not in LANGS]
    assert not unnamed, f"blocks whose language is not one of {sorted(LANGS)}:\n" + "\n".join(unnamed)


def test_every_guide_with_rust_is_a_doc_test():
    """Each guide with a ``rust`` block is included as doc tests by a crate of the workspace."""
    sources = "\n".join(p.read_text() for p in (REPO / "crates").glob("*/src/**/*.rs"))
    missing = []
    for path in sorted({b.path for b in _of("rust")}):
        if f'include_str!("{_from_src(path)}")' not in sources:
            missing.append(rel(path))
    assert not missing, "guides whose Rust blocks no doc test includes: " + ", ".join(missing)


def _from_src(path) -> str:
    """The guide's path as ``include_str!`` in ``crates/<crate>/src/guide_examples.rs`` names it."""
    return "../../../" + rel(path)


def test_a_broken_example_fails(tmp_path):
    """The runner above can fail: a block that raises exits non-zero."""
    broken = Block(REPO / "README.md", 0, "python", "import handoff\nraise SystemExit('broken example')\n")
    out = run_python(broken, tmp_path)
    assert out.returncode != 0 and "broken example" in out.stderr


def test_the_readme_figure_can_be_redrawn(tmp_path):
    """scripts/readme-plot draws README.md's figure from the committed bench/results/peers.json."""
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (pip install matplotlib)")
    out = tmp_path / "figure.png"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts/readme-plot"), "--out", str(out)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert out.read_bytes().startswith(b"\x89PNG")
    assert "docs/figures/throughput-1gib.png" in (REPO / "README.md").read_text()

"""A DataSets.jl user's habits, in the Python peer: catalogs of version 0, the dataset name rule,
specs with a query and a fragment, opening what a spec selects, stacks of catalogs. The fixtures
are the Rust reference's (crates/handoff-data/tests/fixtures/julia), which its tests read too, and
the last tests run the Rust CLI's ``handoff data cat`` on the same specs: both agree on each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


from handoff.data import BlobError  # noqa: E402
from handoff.datasets import (  # noqa: E402
    BadPath,
    Blob,
    BlobTree,
    Cache,
    Catalog,
    CatalogError,
    CatalogStack,
    InvalidName,
    InvalidSpec,
    NoSuchDataset,
    NoSuchPath,
    check_name,
    parse_spec,
)
from handoff.datasets import paths_of  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "crates" / "handoff-data" / "tests" / "fixtures" / "julia"


def _unescape(line: str) -> str:
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            n = line[i + 1]
            if n == "s":
                out.append(" ")
            elif n == "t":
                out.append("\t")
            elif n == "u":
                out.append(chr(int(line[i + 2 : i + 6], 16)))
                i += 4
            else:
                out.append("\\" + n)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _names(file: str):
    lines = (FIXTURES / file).read_text(encoding="utf-8").splitlines()
    return [_unescape(x.strip()) for x in lines if x.strip() and not x.strip().startswith("#")]


def _variants(name: str):
    return [name, f"foo/{name}", f"{name}/foo", f"foo/{name}/bar"]


def test_every_name_datasets_jl_accepts_is_accepted_and_alone_is_a_spec():
    valid = _names("names-valid.txt")
    assert len(valid) > 20
    for name in valid:
        for n in _variants(name):
            assert check_name(n) is None, n
            spec = parse_spec(n)
            assert (spec.name, spec.bare) == (n, True)


def test_every_name_datasets_jl_rejects_is_rejected_and_is_no_spec():
    invalid = _names("names-invalid.txt")
    assert len(invalid) > 30
    for name in invalid:
        for n in _variants(name):
            why = check_name(n)
            assert why is not None and "is not a valid dataset name" in why, n
            if "#" not in n and "?" not in n:
                with pytest.raises(InvalidSpec, match="^invalid dataset specification"):
                    parse_spec(n)


def test_specs_parse_as_datasets_jl_parses_them():
    cases = json.loads((FIXTURES / "specs.json").read_text(encoding="utf-8"))["cases"]
    assert len(cases) > 30
    for case in cases:
        spec = case["spec"]
        if case.get("error"):
            with pytest.raises(InvalidSpec) as e:
                parse_spec(spec)
            assert str(e.value).startswith(f"invalid dataset specification {json.dumps(spec, ensure_ascii=False)}")
            continue
        got = parse_spec(spec)
        assert (got.name, got.query, got.fragment) == (case["name"], case["query"], case["fragment"]), spec


async def test_a_version_0_catalog_loads_and_other_versions_are_named(tmp_path):
    c = Catalog.load(FIXTURES / "Version0.toml")
    assert await c.blob("a_text_file").read_all() == b"Hello world!\n"
    for version, shown in (("2", "2"), ("-1", "-1"), ('"1"', '"1"')):
        with pytest.raises(CatalogError) as e:
            Catalog.parse(f"data_config_version = {version}\n", tmp_path / "x.toml")
        assert f"data_config_version is {shown}" in str(e.value) and "versions 0 and 1" in str(e.value)


async def test_a_dataset_with_an_invalid_name_is_listed_and_cannot_be_opened():
    c = Catalog.load(FIXTURES / "Names.toml")
    assert [(d.name, d.invalid_name is not None) for d in c.datasets] == [
        ("good_name", False),
        ("bad name", True),
        ("a#b", True),
    ]
    assert await c.blob("good_name").read_all() == b"Hello world!\n"
    with pytest.raises(InvalidSpec):
        c.dataset("bad name")
    with pytest.raises(NoSuchDataset):
        c.dataset("a#b")  # the spec of a dataset "a" with a fragment
    with pytest.raises(InvalidName, match=r'"bad name".*cannot be opened.*DataSets.jl\'s rule'):
        c.blob("0c2a4d1e-5b7f-4c3a-9e8d-1f2a3b4c5d62")
    assert "dataset:0c2a4d1e-5b7f-4c3a-9e8d-1f2a3b4c5d62" not in c.keys(), "received handles do not bind to it"


async def test_open_gives_a_blob_or_a_tree_and_a_fragment_selects_in_a_tree():
    c = Catalog.load(FIXTURES / "Data.toml")
    text = await c.open("a_text_file")
    assert isinstance(text, Blob) and await text.read_all() == b"Hello world!\n"
    tree = await c.open("a_tree_example")
    assert isinstance(tree, BlobTree) and [e.path for e in await tree.list()] == ["1.csv", "2.csv"]
    csv = await c.open("a_tree_example#1.csv")
    assert isinstance(csv, Blob) and await csv.read_all() == b'Name,Age\n"Aaron",23\n"Beth",45\n'
    assert csv.path == "1.csv", "a handle sent on carries the path the spec selected"
    sel = c.dataset("a_tree_example?x=1&y%20y=2#1.csv")
    assert (sel.name, sel.query, sel.fragment) == ("a_tree_example", {"x": "1", "y y": "2"}, "1.csv")

    with pytest.raises(NoSuchPath, match=r'"3.csv".*1.csv, 2.csv'):
        await c.open("a_tree_example#3.csv")
    with pytest.raises(NoSuchPath, match=r'"1.csv/x"'):
        await c.open("a_tree_example#1.csv/x")
    with pytest.raises(NoSuchPath, match=r"is a Blob.*#x"):
        await c.open("a_text_file#x")
    with pytest.raises(BadPath, match="leaves the tree"):
        await c.open("a_tree_example#../Data.toml")
    with pytest.raises(InvalidSpec, match='^invalid dataset specification "a text file"'):
        await c.open("a text file")


async def test_a_stack_resolves_names_in_order(tmp_path):
    cache = Cache(tmp_path / "cache")
    first, second = FIXTURES / "stack", FIXTURES / "Data.toml"
    stack = CatalogStack.load([first, second], cache)
    assert stack.dataset("a_text_file").uuid == "314996ef-12be-40d0-912c-9755af354fdb"
    assert await stack.blob("a_text_file").read_all() == b"From the first catalog\n"
    assert stack.dataset("some_namespace/a_text_file").uuid == "b498f769-a7f6-4f67-8d74-40b770398f27"
    shadowed = [(e.dataset.name, e.shadowed_by is not None) for e in stack.entries() if e.dataset.name == "a_text_file"]
    assert shadowed == [("a_text_file", False), ("a_text_file", True)]
    sub = await stack.open("nested_tree#sub")
    assert isinstance(sub, BlobTree) and sub.path == "sub"
    csv = await stack.open("nested_tree#sub/3.csv")
    assert await csv.read_all() == b'Name,Age\n"Zed",7\n'
    with pytest.raises(NoSuchDataset, match=r'"nowhere".*only_in_first.*a_tree_example'):
        stack.dataset("nowhere")
    reversed_ = CatalogStack.load([second, first], cache)
    assert reversed_.dataset("a_text_file").uuid == "b498f769-a7f6-4f67-8d74-40b770398f26"
    # A stack from a ':'-separated list, as $HANDOFF_CATALOG gives it.
    listed = CatalogStack.from_list(f"{first}:{second}", cache)
    assert [c.file for c in listed.catalogs] == [first / "Data.toml", second]


def test_a_path_list_is_split_as_julia_splits_it():
    assert paths_of("/a/Data.toml:/b") == [Path("/a/Data.toml"), Path("/b")]
    default = Path(os.environ["HOME"]) / ".julia/datasets/Data.toml"
    got = paths_of(":/b")
    assert (default in got) == default.exists() and got[-1] == Path("/b")


# ------------------------------------------------------------------ the two languages agree

CAT_SPECS = [
    "a_text_file",
    "a_tree_example#1.csv",
    "a_tree_example?x=1#2.csv",
    "some_namespace/a_text_file?k=v",
    "nested_tree#sub/3.csv",
    "nested_tree#top.txt",
    "a_tree_example",
    "a_tree_example#9.csv",
    "a_text_file#x",
    "a text file",
    "nowhere",
    "only_in_first",
]


async def test_handoff_data_cat_and_the_python_peer_agree_on_each_spec(handoff_bin, tmp_path):
    stack_args = ["--catalog", str(FIXTURES / "stack"), "--catalog", str(FIXTURES / "Data.toml")]
    stack = CatalogStack.load([FIXTURES / "stack", FIXTURES / "Data.toml"])
    for spec in CAT_SPECS:
        rust = subprocess.run(
            [str(handoff_bin), "data", *stack_args, "--cache-dir", str(tmp_path / "cache"), "cat", spec],
            capture_output=True,
            timeout=60,
        )
        try:
            opened = await stack.open(spec)
            python = await opened.read_all() if isinstance(opened, Blob) else None
        except BlobError:
            python = None
        if python is None:
            assert rust.returncode != 0 and rust.stdout == b"", (spec, rust.stdout)
            assert rust.stderr.strip(), "the CLI says why"
        else:
            assert (rust.returncode, rust.stdout) == (0, python), (spec, rust.stderr)


def test_handoff_catalog_is_a_stack_for_the_cli(handoff_bin, tmp_path):
    env = {**os.environ, "HANDOFF_CATALOG": f"{FIXTURES / 'stack'}:{FIXTURES / 'Data.toml'}"}
    out = subprocess.run(
        [str(handoff_bin), "data", "--cache-dir", str(tmp_path / "c"), "cat", "a_text_file"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert out.stdout == b"From the first catalog\n", out.stderr
    ls = subprocess.run(
        [str(handoff_bin), "data", "--cache-dir", str(tmp_path / "c"), "ls"], capture_output=True, text=True, env=env
    )
    assert "(shadowed by #1)" in ls.stdout, ls.stdout


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


async def test_every_fixture_dataset_reads_alike_in_both_languages(handoff_bin, tmp_path):
    """Every catalog fixture, every dataset, every file of every tree (and what a tree's
    folder lists): the Rust CLI and the Python peer give the same bytes or both refuse.
    DataSets.jl's embedded tree (TomlDataStorage, folders of files) was the case where
    Python saw nothing under a folder."""
    checked = 0
    for fixture in sorted(FIXTURES.glob("*.toml")):
        catalog = Catalog.load(fixture)

        def cli(spec: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [str(handoff_bin), "data", "--catalog", str(fixture), "--cache-dir", str(tmp_path / "c"), "cat", spec],
                capture_output=True,
                timeout=60,
            )

        for name in sorted({ds.name for ds in catalog.datasets}):
            try:
                opened = await catalog.open(name)
            except BlobError:
                assert cli(name).returncode != 0, (fixture.name, name)
                continue
            if isinstance(opened, Blob):
                rust = cli(name)
                assert (rust.returncode, rust.stdout) == (0, await opened.read_all()), (fixture.name, name)
                checked += 1
                continue
            files = [e.path for e in await opened.walk()]
            assert files, (fixture.name, name, "a tree with no files")
            for path in files:
                rust = cli(f"{name}#{path}")
                python = await (await catalog.open(f"{name}#{path}")).read_all()
                assert (rust.returncode, rust.stdout) == (0, python), (fixture.name, name, path, rust.stderr)
                checked += 1
            # A folder's listing, as the CLI words it when asked for its bytes.
            for folder in {p.split("/")[0] for p in files if "/" in p}:
                rust = cli(f"{name}#{folder}")
                assert rust.returncode != 0
                listed = rust.stderr.decode().rsplit("it has: ", 1)[-1].strip()
                sub = await catalog.open(f"{name}#{folder}")
                assert isinstance(sub, BlobTree)
                python = sorted([e.shown for e in await sub.list()])
                assert listed.split(", ") == python, (fixture.name, name, folder, listed, python)
            missing = f"{name}#no/such/file"
            assert cli(missing).returncode != 0
            with pytest.raises(BlobError):
                await (await catalog.open(missing)).read_all()
    assert checked >= 10, checked

"""The Rust catalog (``handoff data``, the CLI over handoff-data) and the Python one
(``handoff.datasets``) read every catalog alike: a differential test on the same files.

For every catalog fixture of crates/handoff-data/tests/fixtures/julia (and stacks of them), both
sides are asked the same questions and must give the same answers:

- the datasets listed (``handoff data ls --json`` against ``CatalogStack.entries``): name, uuid,
  type, driver, description, catalog, shadowing, availability, whether the name is valid;
- lookups by name, by uuid (either case) and by spec, the specs of specs.json among them
  (``handoff data show --json`` against ``CatalogStack.locate`` and ``open``): the dataset, the
  spec's query and fragment, and what it opens to, or a failure on both sides;
- the bytes of every blob and of every file of every tree (``handoff data cat``);
- tree listings at the root and in every folder, and walks (``handoff data tree --json``).

The last tests build catalogs of the cases where the two used to disagree (names that an
object store encodes, a float version, control characters in an embedded tree, an empty
``JULIA_PROJECT``) and check that they now agree. One difference is left on purpose: the Rust
reader (the ``toml`` crate) also reads TOML 1.1's additions, which tomllib and Julia's TOML
refuse (docs/datasets.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import quote

import pytest


from handoff.data import BlobError  # noqa: E402
from handoff.datasets import Blob, BlobTree, Cache, CatalogError, CatalogStack  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "crates" / "handoff-data" / "tests" / "fixtures" / "julia"

#: Each catalog fixture alone, and the stacks the tests of both languages use.
CASES = {
    "Data.toml": ["Data.toml"],
    "Embedded.toml": ["Embedded.toml"],
    "Names.toml": ["Names.toml"],
    "Version0.toml": ["Version0.toml"],
    "stack": ["stack"],
    "stack+Data.toml": ["stack", "Data.toml"],
    "Data.toml+stack": ["Data.toml", "stack"],
    "all": ["stack", "Data.toml", "Embedded.toml", "Names.toml", "Version0.toml"],
}

#: Specs beyond every dataset's name and uuid: fragments that select, climb, miss or leave.
EXTRA_SPECS = {
    "Data.toml": [
        "a_tree_example#",
        "a_tree_example#.",
        "a_tree_example#./1.csv",
        "a_tree_example#../Data.toml",
        "a_tree_example#/etc/passwd",
        "a_tree_example#1.csv/x",
        "a_tree_example?x=1&y%20y=2#1.csv",
        "a_text_file#x",
        "a_text_file#",
        "A_TEXT_FILE",
    ],
    "Embedded.toml": [
        "embedded_tree#d04/b.txt",
        "embedded_tree#d01/../d04/a.txt",
        "embedded_tree#d04/",
        "embedded_tree#d05",
        "embedded_tree#d01/a.txt/x",
        "embedded_filetree#a.txt",
        "embedded_blob#x",
        "old_backend_blob",
    ],
    "Names.toml": ["bad name", "a#b", "a", "good_name#x"],
    "stack+Data.toml": ["nested_tree#sub", "nested_tree#sub/3.csv", "nested_tree#top.txt", "only_in_first"],
}
EXTRA_SPECS["all"] = [spec for specs in EXTRA_SPECS.values() for spec in specs]


class Rust:
    """``handoff data`` over a stack of catalogs, with its own cache folder."""

    def __init__(self, binary: Path, catalogs: List[Path], cache: Path):
        self.binary, self.catalogs, self.cache = binary, catalogs, cache
        self.env = {**os.environ, "HANDOFF_CACHE_DIR": str(cache)}
        self.calls = 0
        #: What the last failed command said.
        self.error = ""

    def run(self, *args: str) -> subprocess.CompletedProcess:
        self.calls += 1
        given = [a for c in self.catalogs for a in ("--catalog", str(c))]
        return subprocess.run(
            [str(self.binary), "data", *given, "--cache-dir", str(self.cache), *args],
            capture_output=True,
            env=self.env,
            timeout=60,
        )

    def json(self, command: str, *spec: str) -> Optional[Any]:
        """The command's JSON document, ``None`` if it failed (saying why on stderr); a spec
        after ``--``, so that one starting with ``-`` is a spec for the CLI too."""
        out = self.run(command, "--json", "--", *spec)
        if out.returncode != 0:
            assert out.stdout == b"" and out.stderr.strip(), (command, spec, out)
            self.error = out.stderr.decode(errors="replace")
            return None
        return json.loads(out.stdout)

    def cat(self, spec: str) -> Optional[bytes]:
        out = self.run("cat", "--", spec)
        if out.returncode != 0:
            assert out.stdout == b"" and out.stderr.strip(), (spec, out)
            return None
        return out.stdout


class Python:
    """``handoff.datasets`` over the same stack, with its own cache folder."""

    def __init__(self, stack: CatalogStack):
        self.stack = stack
        #: What the last failure said.
        self.error = ""

    def ls(self) -> Dict[str, Any]:
        return {
            "catalogs": [{"file": str(c.file), "datasets": len(c.datasets)} for c in self.stack.catalogs],
            "datasets": [
                {
                    "name": e.dataset.name,
                    "uuid": e.dataset.uuid,
                    "type": e.dataset.kind,
                    "driver": e.dataset.driver,
                    "description": e.dataset.description,
                    "catalog": str(e.catalog),
                    "shadowed_by": None if e.shadowed_by is None else str(e.shadowed_by),
                    "available": e.dataset.available,
                    "invalid_name": e.dataset.invalid_name is not None,
                }
                for e in self.stack.entries()
            ],
        }

    async def show(self, spec: str) -> Optional[Dict[str, Any]]:
        try:
            catalog, sel = self.stack.locate(spec)
            opened = await self.stack.open(spec)
            size = await opened.size() if isinstance(opened, Blob) else None
        except BlobError as e:
            self.error = str(e)
            return None
        return {
            "spec": spec,
            "dataset": sel.name,
            "uuid": sel.uuid,
            "type": sel.kind,
            "driver": sel.driver,
            "catalog": str(catalog.file),
            "query": sel.query,
            "fragment": sel.fragment,
            "opens": "Blob" if isinstance(opened, Blob) else "BlobTree",
            "path": opened.path,
            "size": size,
        }

    async def cat(self, spec: str) -> Optional[bytes]:
        try:
            opened = await self.stack.open(spec)
            return await opened.read_all() if isinstance(opened, Blob) else None
        except BlobError:
            return None

    async def tree(self, spec: str) -> Optional[Dict[str, Any]]:
        try:
            catalog, _ = self.stack.locate(spec)
            opened = await self.stack.open(spec)
            if not isinstance(opened, BlobTree):
                return None
            listed, walked = await opened.list(), await opened.walk()
        except BlobError:
            return None
        return {
            "dataset": opened.dataset.name,
            "uuid": opened.dataset.uuid,
            "catalog": str(catalog.file),
            "path": opened.path,
            "list": [{"path": e.path, "is_dir": e.is_dir, "size": e.size} for e in listed],
            "walk": [{"path": e.path, "size": e.size} for e in walked],
        }


#: Why a lookup fails, in the words both implementations use: the same failure on both sides
#: is the same kind of failure.
FAILURES = (
    "invalid dataset specification",
    "no dataset named or with uuid",
    "names several datasets",
    "cannot be opened",
    "is not available here",
    "is no file or folder of the tree",
    "is a Blob: a fragment",
    "refused:",
)


def failure(message: str) -> str:
    return next((f for f in FAILURES if f in message), f"another failure: {message}")


def rust_ls(doc: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What ``data ls --json`` says, reduced to what the Python side can say."""
    if doc is None:
        return None
    keys = ("name", "uuid", "type", "driver", "description", "catalog", "shadowed_by", "available")
    return {
        "catalogs": doc["catalogs"],
        "datasets": [
            {**{k: d[k] for k in keys}, "invalid_name": d["invalid_name"] is not None} for d in doc["datasets"]
        ],
    }


class Agreement:
    """Asks both sides the same questions; every answer must be the same."""

    def __init__(self, rust: Rust, python: Python):
        self.rust, self.python = rust, python
        self.specs = self.blobs = self.trees = 0
        self.failures: set = set()

    async def show(self, spec: str) -> Optional[Dict[str, Any]]:
        r, p = self.rust.json("show", spec), await self.python.show(spec)
        assert r == p, f"show {spec!r}:\n  rust   {r}\n  python {p}\n  rust said {self.rust.error!r}"
        if r is None:
            assert failure(self.rust.error) == failure(self.python.error), (spec, self.rust.error, self.python.error)
            self.failures.add(failure(self.python.error))
        self.specs += 1
        return r

    async def cat(self, spec: str) -> Optional[bytes]:
        r, p = self.rust.cat(spec), await self.python.cat(spec)
        assert r == p, f"cat {spec!r}: rust {r!r}, python {p!r}"
        self.blobs += r is not None
        return r

    async def tree(self, spec: str) -> Optional[Dict[str, Any]]:
        r, p = self.rust.json("tree", spec), await self.python.tree(spec)
        assert r == p, f"tree {spec!r}:\n  rust   {r}\n  python {p}"
        self.trees += r is not None
        return r

    async def spec(self, spec: str) -> None:
        """A lookup, and then what it selects: a blob's bytes, or a tree's listings (every folder's
        too) and the bytes of every file in it."""
        shown = await self.show(spec)
        if shown is None:
            assert await self.cat(spec) is None and await self.tree(spec) is None, spec
            return
        if shown["opens"] == "Blob":
            assert await self.cat(spec) is not None, spec
            return
        assert await self.cat(spec) is None, f"{spec} is a tree: cat refuses it on both sides"
        name = shown["dataset"]
        base = shown["path"]
        tree = await self.tree(spec)
        if tree is None:
            return  # both failed to list it (the assertion above compared the failures)
        for entry in tree["list"]:
            if entry["is_dir"]:
                await self.spec(f"{name}#{quote(join(base, entry['path']))}")
        for entry in tree["walk"]:
            file_spec = f"{name}#{quote(join(base, entry['path']))}"
            shown = await self.show(file_spec)
            assert shown["opens"] == "Blob" and shown["size"] == entry["size"], (file_spec, shown)
            assert len(await self.cat(file_spec)) == entry["size"], file_spec
        assert await self.show(f"{name}#{quote(join(base, 'no/such/file'))}") is None


def join(base: str, rel: str) -> str:
    return f"{base}/{rel}" if base else rel


def stack_of(paths: List[Path], cache: Path) -> CatalogStack:
    return CatalogStack.load(paths, Cache(cache))


def both(handoff_bin: Path, tmp_path: Path, paths: List[Path]) -> Agreement:
    rust = Rust(handoff_bin, paths, tmp_path / "rust-cache")
    return Agreement(rust, Python(stack_of(paths, tmp_path / "python-cache")))


def test_every_catalog_fixture_is_a_case():
    """A catalog fixture added later is compared too, or this fails."""
    covered = {
        (FIXTURES / p / "Data.toml") if (FIXTURES / p).is_dir() else FIXTURES / p for c in CASES.values() for p in c
    }
    assert set(FIXTURES.rglob("*.toml")) <= covered, sorted(set(FIXTURES.rglob("*.toml")) - covered)


@pytest.mark.parametrize("case", sorted(CASES))
async def test_rust_and_python_agree_on_a_catalog(handoff_bin, tmp_path, case):
    paths = [FIXTURES / p for p in CASES[case]]
    check = both(handoff_bin, tmp_path, paths)
    listed = check.python.ls()
    assert rust_ls(check.rust.json("ls")) == listed
    specs: List[str] = []
    for d in listed["datasets"]:
        specs += [d["name"], d["uuid"], d["uuid"].upper()]
    for spec in dict.fromkeys(specs + EXTRA_SPECS.get(case, [])):
        await check.spec(spec)
    assert check.specs >= len(set(specs)), check.specs
    assert check.rust.calls < 400, "keep it fast"
    if case == "all":  # each kind of failure came up, and alike on both sides
        assert set(FAILURES) - check.failures == {"names several datasets"}, check.failures
    if case == "Embedded.toml":
        assert "names several datasets" in check.failures, "a lookup by the uuid two datasets share"


async def test_the_specs_of_specs_json_select_alike(handoff_bin, tmp_path):
    """Each spec of specs.json on the catalog it was written for: the same dataset, query and
    fragment, the same bytes, and a failure on both sides for every spec marked as an error."""
    check = both(handoff_bin, tmp_path, [FIXTURES / "stack", FIXTURES / "Data.toml"])
    cases = json.loads((FIXTURES / "specs.json").read_text(encoding="utf-8"))["cases"]
    for case in cases:
        shown = await check.show(case["spec"])
        await check.cat(case["spec"])
        if case.get("error"):
            assert shown is None, case
        elif shown is not None:
            assert (shown["query"], shown["fragment"]) == (case["query"], case["fragment"]), case
    found = [c["spec"] for c in cases if not c.get("error") and c["name"] in ("a_text_file", "a_tree_example")]
    assert len(found) > 10


async def test_datasets_jl_s_embedded_tree_reads_alike(handoff_bin, tmp_path):
    """DataSets.jl's own test catalog embeds d01..d04, two files each: the fourth folder's
    files read in both languages, and a walk from the root lists all eight; a listing of the
    root has the four folders (Python listed only files: it had none there)."""
    check = both(handoff_bin, tmp_path, [FIXTURES / "Embedded.toml"])
    assert await check.cat("embedded_tree#d04/b.txt") == b"4 b content"
    assert await check.python.cat("embedded_tree#d04/b.txt") == b"4 b content"
    tree = await check.tree("embedded_tree")
    assert [e["path"] for e in tree["walk"]] == [f"d0{i}/{f}.txt" for i in range(1, 5) for f in "ab"]
    assert len((await check.python.tree("embedded_tree"))["walk"]) == 8
    assert [(e["path"], e["is_dir"]) for e in tree["list"]] == [(f"d0{i}", True) for i in range(1, 5)]
    assert [e["path"] for e in (await check.tree("embedded_tree#d03"))["list"]] == ["a.txt", "b.txt"]
    assert (await check.show("embedded_tree#d04/b.txt"))["size"] == 11


# ------------------------------------------------------------------ the rest of that class

#: Names an object store must hold as they are: object_store's own Path would percent-encode
#: them (Rust asked for ``%C3%A9.txt`` when the file is ``é.txt``, and listed the embedded
#: tree's files by their encoded names, which it could then not open).
ODD_NAMES = ["é.txt", "a b.txt", "x#y", "50%", "q?", "c~d.txt", "a%41", "日本.csv"]


def _odd_tree(root: Path) -> None:
    (root / "sub dir").mkdir(parents=True)
    (root / "empty").mkdir()
    for name in ODD_NAMES:
        (root / name).write_bytes(f"<{name}>".encode())
    (root / "sub dir" / "ü").write_bytes(b"u")


def _odd_catalog(tmp_path: Path) -> Path:
    root = tmp_path / "odd"
    _odd_tree(root)
    files = {n: base64.b64encode(f"<{n}>".encode()).decode() for n in ODD_NAMES}
    embedded = "\n".join(f"{json.dumps(n, ensure_ascii=False)} = {json.dumps(b)}" for n, b in files.items())
    text = f"""data_config_version = 1

[[datasets]]
name = "embedded_odd"
uuid = "5e1e7c2a-0000-4000-8000-00000000000a"
    [datasets.storage]
    driver = "TomlDataStorage"
    type = "FileTree"
        [datasets.storage.data]
        {embedded}
        [datasets.storage.data."sub dir"]
        "ü" = "dQ=="

[[datasets]]
name = "store_odd"
uuid = "5e1e7c2a-0000-4000-8000-00000000000b"
    [datasets.storage]
    driver = "ObjectStore"
    type = "BlobTree"
    url = "file://{root}"

[[datasets]]
name = "local_odd"
uuid = "5e1e7c2a-0000-4000-8000-00000000000c"
    [datasets.storage]
    driver = "FileSystem"
    type = "BlobTree"
    path = "@__DIR__/odd"
"""
    catalog = tmp_path / "Data.toml"
    catalog.write_text(text, encoding="utf-8")
    return catalog


async def test_names_an_object_store_would_encode_read_alike(handoff_bin, tmp_path):
    """Files named with non-ASCII letters, ``#``, ``%``, ``?``, ``~`` or a space, in an embedded
    tree, a ``file://`` object store and a local folder: listed by their names and read by them
    in both languages (before, Rust listed the embedded ones as ``%C3%A9.txt`` and found
    neither those nor the object store's)."""
    catalog = _odd_catalog(tmp_path)
    check = both(handoff_bin, tmp_path, [catalog])
    for name in ("embedded_odd", "store_odd", "local_odd"):
        await check.spec(name)
        tree = await check.tree(name)
        assert {e["path"] for e in tree["walk"]} == {*ODD_NAMES, "sub dir/ü"}, tree
        for odd in ODD_NAMES:
            assert await check.cat(f"{name}#{quote(odd)}") == f"<{odd}>".encode(), (name, odd)
    # An empty folder of a local tree (DataSets.jl's readdir lists it); an embedded tree has none.
    assert {"path": "empty", "is_dir": True, "size": None} in (await check.tree("local_odd"))["list"]
    assert check.blobs >= 3 * len(ODD_NAMES)


_BLOB = """[[datasets]]
name = "x"
uuid = "5e1e7c2a-0000-4000-8000-000000000001"
{storage}
"""
_STORAGE = '[datasets.storage]\ndriver = "TomlDataStorage"\ntype = "Blob"\ndata = "eA=="'


@pytest.mark.parametrize(
    "text",
    [
        # A float version (the Python peer took 1.0 for 1).
        "data_config_version = 1.0\n" + _BLOB.format(storage=_STORAGE),
        "data_config_version = 0.0\n" + _BLOB.format(storage=_STORAGE),
        # A control character in an embedded tree's name (Python failed with obstore's
        # ValueError, not a catalog error; Rust loaded it).
        "data_config_version = 1\n"
        + _BLOB.format(
            storage='[datasets.storage]\ndriver = "TomlDataStorage"\ntype = "BlobTree"\n'
            '[datasets.storage.data]\n"a\\tb" = "eA=="'
        ),
    ],
    ids=[
        "version-1.0",
        "version-0.0",
        "tab",
    ],
)
def test_catalogs_one_side_read_and_the_other_refused_are_refused_by_both(handoff_bin, tmp_path, text):
    catalog = tmp_path / "Data.toml"
    catalog.write_text(text, encoding="utf-8")
    rust = Rust(handoff_bin, [catalog], tmp_path / "c")
    out = rust.run("ls", "--json")
    assert out.returncode != 0 and out.stdout == b"", out
    assert b"Data.toml" in out.stderr, out.stderr
    with pytest.raises(CatalogError):
        stack_of([catalog], tmp_path / "pc")


@pytest.mark.parametrize("project", ["", "dir"])
def test_the_active_julia_project_is_read_alike(handoff_bin, tmp_path, monkeypatch, project):
    """``@`` in ``$HANDOFF_CATALOG`` is the active Julia project; an empty ``JULIA_PROJECT`` is
    none, as in Julia (Rust took it for ``./Data.toml``, and failed where Python skipped it)."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "Data.toml").write_text((FIXTURES / "Version0.toml").read_text())
    (tmp_path / "proj" / "data").symlink_to(FIXTURES / "data")
    value = str(tmp_path / "proj") if project == "dir" else ""
    monkeypatch.setenv("JULIA_PROJECT", value)
    listed = f"@:{FIXTURES / 'Data.toml'}"
    env = {"HANDOFF_CATALOG": listed, "JULIA_PROJECT": value}
    out = subprocess.run(
        [str(handoff_bin), "data", "--cache-dir", str(tmp_path / "c"), "ls", "--json"],
        capture_output=True,
        env={**os.environ, **env},
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    stack = CatalogStack.from_list(listed, Cache(tmp_path / "pc"))
    assert rust_ls(json.loads(out.stdout)) == Python(stack).ls()
    assert len(stack.catalogs) == (2 if project else 1)

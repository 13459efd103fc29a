"""Catalogs in the Python peer (handoff.datasets): DataSets.jl's Data.toml as it is, the
same drivers as the Rust reference, against a real S3-compatible server (moto, on
loopback) and a real HTTP server, and received data handles bound to the catalog."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SECRET
from helpers import RangeHTTPHandler, s3_put, start_moto


from handoff import Node  # noqa: E402
from handoff.data import BlobError, BlobHandle  # noqa: E402
from handoff.datasets import (  # noqa: E402
    Ambiguous,
    BadPath,
    Catalog,
    CatalogError,
    DriverUnavailable,
    NoSuchDataset,
)

FIXTURES = Path(__file__).resolve().parents[2] / "crates" / "handoff-data" / "tests" / "fixtures" / "julia"
SHARED = "b498f769-a7f6-4f67-8d74-40b770398f26"


# ---------------------------------------------------------------- DataSets.jl catalogs as they are


async def test_the_datasets_jl_documentation_catalog_loads_and_reads_in_place():
    c = Catalog.load(FIXTURES / "Data.toml")
    assert [d.name for d in c.datasets] == ["a_text_file", "some_namespace/a_text_file", "a_tree_example"]
    ds = c.dataset("a_text_file")
    assert ds.description == "A text file containing the standard greeting" and ds.kind == "Blob"
    blob = c.blob("a_text_file")
    assert await blob.read_all() == b"Hello world!\n" and blob.last_origin == "read-in-place"
    assert await blob.read_range(6, 11) == b"world"
    assert c.dataset("B498F769-A7F6-4F67-8D74-40B770398F27").name == "some_namespace/a_text_file"
    tree = c.tree("a_tree_example")
    assert [e.path for e in await tree.walk()] == ["1.csv", "2.csv"]


async def test_toml_data_storage_blobs_and_trees():
    c = Catalog.load(FIXTURES / "Embedded.toml")
    assert await c.blob("embedded_blob").read_all() == bytes([0, 0, 0, 0, 0, 0, 0x45, 0x40])
    assert await c.blob("embedded_file").read_all() == b"hello from TOML\n"  # type "File"
    assert c.dataset("embedded_filetree").kind == "BlobTree"  # type "FileTree"
    tree = c.tree("embedded_tree")
    assert [e.path for e in await tree.walk()] == [f"d0{i}/{f}.txt" for i in range(1, 5) for f in "ab"]
    assert [e.path for e in await tree.tree("d01").list()] == ["a.txt", "b.txt"]
    assert await tree.blob("d02/b.txt").read_all() == b"2 b content"
    assert await tree.blob("d04/b.txt").read_all() == b"4 b content"
    assert await tree.blob("d01/../d02/a.txt").read_range(0, 1) == b"2"
    assert [e.path for e in await c.tree("embedded_filetree").walk()] == ["a.txt", "b.txt"]


def test_embedded_content_is_named_as_the_rust_reference_names_it(tmp_path):
    # The same values as handoff-data's embedded tests: both languages key a cache alike.
    c = Catalog.load(FIXTURES / "Embedded.toml")
    assert c.dataset("embedded_file").source.identity == (
        "toml-data:004701f545ae09d44ca92991a8c55b460732a2b553de4f4607d434b9d4fd015c"
    )
    text = (
        f'data_config_version = 1\n[[datasets]]\nname = "t"\nuuid = "{SHARED}"\n'
        '[datasets.storage]\ndriver = "TomlDataStorage"\ntype = "BlobTree"\n'
        '[datasets.storage.data]\ntop = "YQ=="\n[datasets.storage.data.d01]\n"a.txt" = "MSBhIGNvbnRlbnQ="\n'
    )
    t = Catalog.parse(text, tmp_path / "Data.toml")
    assert t.dataset("t").source.identity == (
        "toml-data:1d6fe1b7991cb520355d6b71410b68ccab65327cd2d8c9b134ffeba633e80a2e"
    )


def test_a_driver_handoff_lacks_does_not_stop_the_catalog():
    c = Catalog.load(FIXTURES / "Embedded.toml")
    ds = c.dataset("old_backend_blob")
    assert ds.driver == "OldBackendAPI" and not ds.available
    with pytest.raises(DriverUnavailable) as e:
        c.blob("old_backend_blob")
    for part in ("old_backend_blob", "OldBackendAPI", "FileSystem", "TomlDataStorage", "ObjectStore", "Embedded.toml"):
        assert part in str(e.value), (part, str(e.value))


def test_a_shared_uuid_is_refused_only_when_looked_up():
    c = Catalog.load(FIXTURES / "Embedded.toml")
    with pytest.raises(Ambiguous) as e:
        c.dataset(SHARED)
    assert "embedded_blob" in str(e.value) and "embedded_tree" in str(e.value)
    assert c.dataset("embedded_tree").uuid == SHARED
    with pytest.raises(NoSuchDataset):
        c.dataset("nope")


@pytest.mark.parametrize(
    "body, says",
    [
        ('driver = "TomlDataStorage"\ntype = "Blob"\ndata = "not base64!"', "storage.data is not valid base64"),
        ('driver = "TomlDataStorage"\ntype = "Blob"\ndata = "YR=="', "Invalid last symbol"),  # not canonical
        ('driver = "TomlDataStorage"\ntype = "BlobTree"\n[datasets.storage.data]\n".." = "YQ=="', "one path part"),
        ('driver = "FileSystem"\ntype = "Table"\npath = "x"', '"Blob" or "BlobTree"'),
        ('driver = "FileSystem"\ntype = "Blob"', "storage.path is missing"),
        ('driver = "ObjectStore"\ntype = "Blob"\nurl = "ftp://host/k"', "unsupported url scheme"),
        (
            'driver = "ObjectStore"\ntype = "Blob"\nurl = "s3://b/k"\n[datasets.storage.options]\nendpiont = "x"',
            "endpiont",
        ),
    ],
)
def test_bad_catalogs_name_the_file_the_dataset_and_the_field(tmp_path, body, says):
    text = f'data_config_version = 1\n[[datasets]]\nname = "bad"\nuuid = "{SHARED}"\n[datasets.storage]\n{body}\n'
    with pytest.raises(CatalogError) as e:
        Catalog.parse(text, tmp_path / "Bad.toml")
    msg = str(e.value)
    assert "Bad.toml" in msg and "bad" in msg and says in msg, msg


async def test_paths_that_leave_a_tree_are_refused(tmp_path):
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "in.txt").write_bytes(b"in")
    (tmp_path / "secret.txt").write_bytes(b"secret")
    os.symlink(tmp_path / "secret.txt", tmp_path / "tree" / "out.txt")
    text = (
        f'data_config_version = 1\n[[datasets]]\nname = "t"\nuuid = "{SHARED}"\n'
        '[datasets.storage]\ndriver = "FileSystem"\ntype = "BlobTree"\npath = "@__DIR__/tree"\n'
    )
    c = Catalog.parse(text, tmp_path / "Data.toml")
    tree = c.tree("t")
    assert await tree.blob("sub/in.txt").read_all() == b"in"
    for bad in ("../secret.txt", "/etc/passwd", "sub/../../secret.txt", "a\\b", "out.txt"):
        with pytest.raises(BadPath):
            await tree.blob(bad).read_all()
    assert [e.path for e in await tree.walk()] == ["sub/in.txt"], "a symlink out of the tree is not listed"


# ---------------------------------------------------------------- real storage servers on loopback


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    server, endpoint = start_moto()
    objects = {"data/big.bin": bytes(range(256)) * 4096, "trees/t/x.txt": b"x", "trees/t/y/z.txt": b"zz"}
    s3_put(endpoint, "bucket", objects)
    yield endpoint
    server.stop()


def _s3_catalog_text(endpoint: str) -> str:
    opts = f'[datasets.storage.options]\nendpoint = "{endpoint}"\nregion = "us-east-1"\naccess_key_id = "k"\nsecret_access_key = "s"\n'
    return (
        "data_config_version = 1\n"
        f'[[datasets]]\nname = "big"\nuuid = "11111111-1111-4111-8111-111111111111"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "s3://bucket/data/big.bin"\n{opts}\n'
        f'[[datasets]]\nname = "tree"\nuuid = "22222222-2222-4222-8222-222222222222"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "FileTree"\nurl = "s3://bucket/trees/t"\n{opts}'
    )


def _s3_catalog(tmp_path: Path, endpoint: str) -> Catalog:
    return Catalog.parse(_s3_catalog_text(endpoint), tmp_path / "Data.toml")


async def test_object_store_datasets_on_a_real_s3_server(s3, tmp_path):
    c = _s3_catalog(tmp_path, s3)
    big = c.blob("big")
    assert await big.size() == 1 << 20
    assert await big.read_range(256, 260) == bytes([0, 1, 2, 3]) and big.last_origin == "storage"
    assert await big.read_all() == bytes(range(256)) * 4096
    assert c.dataset("big").source.identity == f"s3://bucket/data/big.bin?endpoint={s3}", "as Rust spells it"
    tree = c.tree("tree")
    assert [(e.path, e.size) for e in await tree.walk()] == [("x.txt", 1), ("y/z.txt", 2)]
    assert [(e.path, e.is_dir) for e in await tree.list()] == [("x.txt", False), ("y", True)], "as Rust lists it"
    assert await tree.blob("y/z.txt").read_all() == b"zz"
    with pytest.raises(Exception) as e:
        await tree.blob("missing.txt").read_all()
    assert "missing.txt" in str(e.value)


async def test_a_spec_s_fragment_selects_a_file_or_folder_of_a_remote_tree_as_in_rust(s3, tmp_path, handoff_bin):
    """``tree#path`` opens a file or a folder of a tree in an object store: a listing's
    prefix names a folder in every store, so a file is asked about by its own path. The
    Rust CLI reads the same bytes."""
    c = _s3_catalog(tmp_path, s3)
    (tmp_path / "Data.toml").write_text(_s3_catalog_text(s3))
    for spec, want in (("tree#x.txt", b"x"), ("tree#y/z.txt", b"zz")):
        opened = await c.open(spec)
        assert await opened.read_all() == want, spec
        rust = subprocess.run(
            [
                str(handoff_bin),
                "data",
                "--catalog",
                str(tmp_path / "Data.toml"),
                "--cache-dir",
                str(tmp_path / "c"),
                "cat",
                spec,
            ],
            capture_output=True,
            timeout=60,
        )
        assert (rust.returncode, rust.stdout) == (0, want), rust.stderr
    sub = await c.open("tree#y")
    assert [e.path for e in await sub.list()] == ["z.txt"]


@pytest.fixture
def http_root(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: RangeHTTPHandler(*a, directory=str(root), **k)  # noqa: E731
    RangeHTTPHandler.gets, RangeHTTPHandler.get_delay, RangeHTTPHandler.spans = {}, 0.0, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_object_store_datasets_on_a_real_http_server(http_root, tmp_path):
    root, url = http_root
    (root / "files").mkdir()
    (root / "files" / "greeting.txt").write_bytes(b"Hello over HTTP\n")
    text = (
        "data_config_version = 1\n"
        f'[[datasets]]\nname = "greeting"\nuuid = "{SHARED}"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "{url}/files/greeting.txt"\n'
    )
    c = Catalog.parse(text, tmp_path / "Data.toml")
    blob = c.blob("greeting")
    assert c.dataset("greeting").source.identity == f"{url}/files/greeting.txt"
    assert await blob.size() == 16
    assert await blob.read_range(6, 10) == b"over"
    assert await blob.read_all() == b"Hello over HTTP\n"


# ---------------------------------------------------------------- received handles bind to the catalog


async def test_a_received_handle_binds_to_the_catalog_or_falls_back_with_the_reason(s3, tmp_path):
    data = bytes(range(256)) * 4096
    big_uuid = "11111111-1111-4111-8111-111111111111"
    async with Node("sender", secret=SECRET, host_id="host-a", listen="127.0.0.1:0") as sender:
        async with Node("with-catalog", secret=SECRET, host_id="host-b", listen="127.0.0.1:0") as a:
            _s3_catalog(tmp_path, s3).serve(a.resources)
            async with Node("without", secret=SECRET, host_id="host-c", listen="127.0.0.1:0") as b:
                Catalog.load(FIXTURES / "Embedded.toml").serve(b.resources)
                for node in (a, b):
                    peer = await sender.connect(node.listen_addr)
                    await peer.send("demo.Work", {"blob": BlobHandle.from_bytes(data, big_uuid, name="big")})
                got_a = (await a.recv(10)).body["blob"]
                assert await got_a.read_all() == data and got_a.last_origin == "storage"
                assert await got_a.read_range(1, 3) == bytes([1, 2])
                got_b = (await b.recv(10)).body["blob"]
                assert await got_b.read_all() == data and got_b.last_origin == "remote-blob"
                assert got_b.fallback_reason and big_uuid in got_b.fallback_reason
                got_a.release()
                got_b.release()


# ---------------------------------------------------------------- one cache folder, both languages


def test_embedded_blobs_are_named_as_the_cache_spec_names_them(tmp_path):
    """spec/CACHE.md §10's embedded example; handoff-data's layout tests check the rest of
    §10 (the keys of an entry), which the Python peer now shares with the Rust CLI."""
    text = (
        f'data_config_version = 1\n[[datasets]]\nname = "b"\nuuid = "{SHARED}"\n'
        '[datasets.storage]\ndriver = "TomlDataStorage"\ntype = "Blob"\ndata = "AAAAAAAARUA="\n'
    )
    ds = Catalog.parse(text, tmp_path / "Data.toml").dataset("b")
    assert ds.source.identity == "toml-data:a6847e7a830b5518ee25768c2e14f597601a386d2b21508333ed1549c8dc9c32"


_READER = """
import asyncio, sys, time
from handoff.datasets import Cache, Catalog
from handoff.tickets import digest

async def main():
    blob = Catalog.load(sys.argv[1], Cache(sys.argv[2])).blob("big")
    began = time.monotonic()
    data = await blob.read_all()
    print(digest(data).hex(), blob.last_origin, began)

asyncio.run(main())
"""


async def test_three_processes_of_both_languages_share_one_download(http_root, tmp_path, handoff_bin):
    root, url = http_root
    (root / "big.bin").write_bytes(os.urandom(8 << 20))
    catalog = tmp_path / "Data.toml"
    catalog.write_text(
        "data_config_version = 1\n"
        f'[[datasets]]\nname = "big"\nuuid = "{SHARED}"\n'
        f'[datasets.storage]\ndriver = "ObjectStore"\ntype = "Blob"\nurl = "{url}/big.bin"\n'
    )
    cache = tmp_path / "cache"
    RangeHTTPHandler.get_delay = 1.5  # long enough for all three to ask while it is under way
    rust = subprocess.Popen(
        [str(handoff_bin), "data", "--catalog", str(catalog), "--cache-dir", str(cache), "fetch", "big"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pythons = [
        subprocess.Popen(
            [sys.executable, "-c", _READER, str(catalog), str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in [rust, *pythons]]
    for p, (out, err) in zip([rust, *pythons], outs):
        assert p.returncode == 0, err
    want = __import__("blake3").blake3((root / "big.bin").read_bytes()).hexdigest()
    assert f"blake3 {want}" in outs[0][0], outs[0][0]
    ((get_began, get_ended),) = RangeHTTPHandler.spans
    for out, _ in outs[1:]:
        got, origin, began = out.split()
        assert got == want and origin in ("storage", "cache"), out
        assert float(began) < get_ended, "each reader asked while the one download was under way"
    assert RangeHTTPHandler.gets.get("/big.bin") == 1, f"GETs: {RangeHTTPHandler.gets}"

    # What the Python readers wrote, the Rust node reads as its own (and the other way round).
    RangeHTTPHandler.get_delay = 0.0
    ls = subprocess.run(
        [str(handoff_bin), "data", "--catalog", str(catalog), "--cache-dir", str(cache), "ls"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "cached: 1 objects, 8.0 MiB" in ls.stdout, ls.stdout
    again = subprocess.run([sys.executable, "-c", _READER, str(catalog), str(cache)], capture_output=True, text=True)
    assert again.stdout.split()[:2] == [want, "cache"], again.stderr
    assert RangeHTTPHandler.gets.get("/big.bin") == 1, "a hit sends a HEAD, not a GET"


async def test_each_path_is_fetched_once_and_then_read_from_the_cache(tmp_path):
    """The cache's counters, as the Rust CLI keeps them: one miss per object, then hits."""
    from handoff.datasets import Cache

    cache = Cache(tmp_path / "cache")
    c = Catalog.load(FIXTURES / "Embedded.toml", cache)
    tree = c.tree("embedded_tree")
    for path in ("d01/a.txt", "d01/b.txt", "d02/a.txt"):
        assert await tree.blob(path).read_all()
    assert cache.stats["misses"] == 3 and cache.stats["hits"] == 0
    for path in ("d01/a.txt", "d01/b.txt", "d02/a.txt"):
        blob = tree.blob(path)
        assert await blob.read_all() and blob.last_origin == "cache"
    assert cache.stats["misses"] == 3 and cache.stats["hits"] == 3


async def test_a_pull_from_a_dask_worker_is_bounded_and_checked(monkeypatch):
    """handoff.dask.data's handler: what a peer worker asks for is checked before reading."""
    pytest.importorskip("distributed")
    from handoff.dask import data as dask_data

    catalog = Catalog.load(FIXTURES / "Embedded.toml")
    monkeypatch.setitem(dask_data._catalogs, "tcp://w", catalog)
    tag = (await catalog.blob("embedded_file").describe()).to_map()
    assert await dask_data._serve_read("tcp://w", tag, 0, None) == b"hello from TOML\n"
    assert await dask_data._serve_read("tcp://w", tag, 6, 10) == b"from"
    for start, end in ((-1, 4), (4, 2), ("0", 4)):
        with pytest.raises(BlobError):
            await dask_data._serve_read("tcp://w", tag, start, end)
    monkeypatch.setattr(dask_data, "MAX_PULL", 8)
    with pytest.raises(BlobError, match="over the limit of 8"):
        await dask_data._serve_read("tcp://w", tag, 0, None)
    with pytest.raises(BlobError, match="no catalog"):
        await dask_data._serve_read("tcp://other", tag, 0, None)

"""Data handles in Dask: every worker opens a catalog and a cache (the plugin
:class:`OpenCatalog`), and a dataset object passed to a task or returned from one travels
as a tag that the receiving worker binds to its own catalog and cache; a worker that cannot
open the dataset gets a :class:`RemoteBlob`, which reads the bytes from the sending worker
through Dask's RPC on the same comms. Tasks run in threads: :func:`read_all` and
:func:`read_range` run a read on the worker's event loop and wait for it. A guide with an
example: ``docs/datasets.md``, "In Dask".
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import to_serialize
from distributed.utils import sync

from .. import route as _route
from ..data import BlobError, BlobTag
from ..datasets import Blob, Cache, CatalogStack
from ..datasets import paths_of

__all__ = ["OpenCatalog", "RemoteBlob", "worker_catalog", "read_all", "read_range", "HANDLER"]

#: The worker handler that serves a dataset object's bytes to a worker that cannot read it.
HANDLER = "handoff_blob_read"
#: The most bytes one pull from a sending worker may ask for (larger reads fail, saying so).
MAX_PULL = 4 << 30

_catalogs: Dict[str, CatalogStack] = {}


def _host_id() -> str:
    from .. import identity
    from .config import settings

    return settings().host_id or identity.host_id()


class OpenCatalog(WorkerPlugin):
    """Opens ``catalog`` (a DataSets.jl ``Data.toml``, a list of them, or a ``:``-separated
    string of them; default: the worker's ``$HANDOFF_CATALOG``) with a cache in ``cache_dir``
    on every worker. Several catalogs are a stack searched in order."""

    name = "handoff-catalog"

    def __init__(self, catalog: Union[None, str, os.PathLike, List[Any]] = None, cache_dir: Optional[str] = None):
        if catalog is None:
            self.catalogs: Optional[List[str]] = None
        elif isinstance(catalog, (list, tuple)):
            self.catalogs = [str(c) for c in catalog]
        else:
            self.catalogs = [str(p) for p in paths_of(str(catalog))]
        self.cache_dir = None if cache_dir is None else str(cache_dir)

    def setup(self, worker) -> None:
        paths = self.catalogs
        if paths is None:
            value = os.environ.get("HANDOFF_CATALOG")
            paths = [str(p) for p in paths_of(value)] if value else []
        if not paths:
            raise ValueError("OpenCatalog: give a catalog, or set HANDOFF_CATALOG on the workers")
        cache = None
        if self.cache_dir is not None:
            cache = Cache(self.cache_dir.replace("{host_id}", _host_id()))
        _catalogs[worker.address] = CatalogStack.load(paths, cache)

        async def serve_read(tag: dict, start: int = 0, end: Optional[int] = None) -> Any:
            # As a frame of its own, not inside the msgpack of the answer.
            return to_serialize(await _serve_read(worker.address, tag, start, end))

        worker.handlers[HANDLER] = serve_read

    def teardown(self, worker) -> None:
        _catalogs.pop(worker.address, None)
        worker.handlers.pop(HANDLER, None)


def worker_catalog() -> CatalogStack:
    """The catalogs :class:`OpenCatalog` opened on the worker running this task (a stack of
    one or more, with ``blob``, ``tree``, ``open`` and ``dataset`` taking DataSets.jl specs)."""
    try:
        address = get_worker().address
    except ValueError:
        address = None
    catalog = _catalogs.get(address) if address else None
    if catalog is None and len(_catalogs) == 1:
        catalog = next(iter(_catalogs.values()))
    if catalog is None:
        raise BlobError("no catalog on this worker: register handoff.dask.data.OpenCatalog(...) with the client")
    return catalog


async def _serve_read(address: str, tag_map: Any, start: Any, end: Any) -> bytes:
    """The sending worker's side of a pull: the object its tag names, from its own catalog."""
    catalog = _catalogs.get(address)
    if catalog is None:
        raise BlobError(f"worker {address} has no catalog to serve a pull from")
    tag = BlobTag.from_map(tag_map)
    if type(start) is not int or start < 0 or (end is not None and (type(end) is not int or end < start)):
        raise BlobError(f"{tag.describe()}: bad range {start!r}..{end!r}")
    blob = catalog.open_tag(tag)
    size = await blob.size()
    end = size if end is None else end
    if end - start > MAX_PULL:
        raise BlobError(f"{tag.describe()}: a pull of {end - start} bytes is over the limit of {MAX_PULL}")
    if start == 0 and end == size:
        return await blob.read_all()
    return await blob.read_range(start, end)


class RemoteBlob:
    """A dataset object this worker cannot open itself: its bytes are read from the worker
    that sent it, when first used."""

    def __init__(self, tag: BlobTag, sender: Optional[str], reason: str):
        self.tag = tag
        self.sender = sender
        #: Why this worker could not open the dataset itself.
        self.fallback_reason = reason
        self.last_origin: Optional[str] = None

    def __repr__(self) -> str:
        return f"RemoteBlob({self.tag.describe()} from {self.sender})"

    async def _pull(self, start: int, end: Optional[int]) -> bytes:
        if self.sender is None:
            raise BlobError(
                f"{self.tag.describe()}: this worker cannot open it ({self.fallback_reason}), and no worker "
                "that can was named when it was sent"
            )
        worker = get_worker()
        try:
            data = await worker.rpc(self.sender).handoff_blob_read(tag=self.tag.to_map(), start=start, end=end)
        except Exception as e:
            raise BlobError(
                f"{self.tag.describe()}: this worker cannot open it ({self.fallback_reason}), and pulling it from "
                f"{self.sender} failed: {e}"
            ) from e
        self.last_origin = "remote-blob"
        return bytes(data)

    async def read_all(self) -> bytes:
        return await self._pull(0, None)

    async def read_range(self, start: int, end: int) -> bytes:
        return await self._pull(start, end)


def _run(coro_fn, *args) -> Any:
    worker = get_worker()
    return sync(worker.loop, coro_fn, *args)


def read_all(blob: Any) -> bytes:
    """The whole object, from a task (a thread): run on the worker's event loop."""
    return _run(blob.read_all)


def read_range(blob: Any, start: int, end: int) -> bytes:
    """Bytes ``start .. end``, from a task."""
    return _run(blob.read_range, start, end)


# ---------------------------------------------------------------- the route-aware codec


def _sender() -> Optional[str]:
    """The address of the worker this process runs (encoding may run on Dask's offload
    thread, where ``get_worker`` finds none: then the one worker with a catalog here)."""
    try:
        return get_worker().address
    except ValueError:
        return next(iter(_catalogs)) if len(_catalogs) == 1 else None


def _encode_blob(blob: Blob, route) -> tuple:
    ds = blob.dataset
    tag = blob.tag or BlobTag(dataset=ds.uuid, name=ds.name, path=blob.path)
    if blob.known_digest is not None and tag.digest is None:
        tag = BlobTag(tag.dataset, tag.name, tag.path, blob.known_size, blob.known_digest, tag.version)
    return {"tag": tag.to_map(), "from": _sender()}, []


def _encode_remote(blob: RemoteBlob, route) -> tuple:
    # Passed on: the worker that has it is still the one to ask.
    return {"tag": blob.tag.to_map(), "from": blob.sender}, []


def _decode(header: Any, frames: list, route) -> Any:
    if not isinstance(header, dict) or not isinstance(header.get("tag"), dict):
        raise ValueError("a dataset object's header must be a map with a 'tag' map")
    tag = BlobTag.from_map(header["tag"])
    sender = header.get("from")
    if sender is not None and not isinstance(sender, str):
        raise ValueError("a dataset object's 'from' must be a worker address")
    try:
        return worker_catalog().open_tag(tag)
    except Exception as e:
        # Never fail here (Dask would retry the transfer): reading says what is wrong.
        return RemoteBlob(tag, sender, str(e))


_route.register(Blob, _encode_blob, _decode, name="handoff.datasets.Blob")
_route.register(RemoteBlob, _encode_remote, _decode, name="handoff.dask.RemoteBlob")

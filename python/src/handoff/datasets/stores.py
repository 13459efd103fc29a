"""A dataset's storage, opened: a local path read in place, or an object store through
``obstore`` (the Python binding of the same ``object_store`` crate the Rust reference uses).

Urls and options mean what they mean in the Rust reference (``handoff-data``'s
``source``): ``s3://bucket/prefix`` with ``[datasets.storage.options]`` such as
``endpoint``, ``region``, ``access_key_id``, ``secret_access_key``, ``allow_http``;
``http(s)://host/path``; ``file:///abs/path``; ``memory://name/path`` (a store of this
process). An ``http://`` S3 endpoint allows plain HTTP without being told. Each source
has the *identity* that keys its cache entries, spelled as the Rust reference spells it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

from ..data import BlobError, BlobRangeError

__all__ = ["Source", "Entry", "open_url", "local", "memory_store", "StorageError", "encode_part"]

#: Client options (``obstore``'s ``client_options``) among a store's options; the rest
#: configure the store itself.
_CLIENT_OPTIONS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "timeout",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "http1_only",
        "http2_only",
        "proxy_url",
        "user_agent",
        "default_content_type",
    }
)

#: Bytes of a part of an object path that object_store percent-encodes (spec/CACHE.md §2.3).
_ENCODED = frozenset(b'/\\{^}%`]">[~<#|*?')

_memory: Dict[str, Any] = {}
_memory_instances = 0


class StorageError(BlobError):
    """A storage request failed (it names the dataset, the store and the path)."""


class Entry:
    """An entry of a tree: its path relative to the tree, and a file's size; a folder (only a
    listing of one level has them, as DataSets.jl's ``readdir``) has ``is_dir`` and no size."""

    __slots__ = ("path", "size", "is_dir")

    def __init__(self, path: str, size: Optional[int], is_dir: bool = False):
        self.path, self.size, self.is_dir = path, size, is_dir

    @property
    def shown(self) -> str:
        """The path as a listing shows it: a folder's with a final ``/``."""
        return self.path + "/" if self.is_dir else self.path

    def __repr__(self) -> str:
        return f"Entry({self.path!r}, is_dir=True)" if self.is_dir else f"Entry({self.path!r}, {self.size})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Entry) and (self.path, self.size, self.is_dir) == (
            other.path,
            other.size,
            other.is_dir,
        )


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


class Source:
    """One dataset's opened storage. ``local`` is set for a folder or file read in place
    (``FileSystem``); else ``store`` and ``root`` (the object, or the tree's prefix)."""

    def __init__(self, identity: str, *, local: Optional[Path] = None, store: Any = None, root: str = ""):
        self.identity = identity
        self.local = local
        self.store = store
        self.root = root.strip("/")

    # ------------------------------------------------------------------ naming

    def object_path(self, rel: str) -> str:
        """The store path of ``rel`` (normalized) below the root, as requests name it
        (``obstore`` encodes what it must)."""
        if not rel:
            return self.root
        return f"{self.root}/{rel}" if self.root else rel

    def key_path(self, rel: str) -> str:
        """The object path as ``object_store`` spells it, which keys the cache (spec/CACHE.md
        §2.3): the root as it is, each part of ``rel`` percent-encoded."""
        encoded = "/".join(encode_part(p) for p in rel.split("/")) if rel else ""
        if not encoded:
            return self.root
        return f"{self.root}/{encoded}" if self.root else encoded

    def local_path(self, rel: str) -> Optional[Path]:
        """The local file of ``rel``, for a source read in place."""
        if self.local is None:
            return None
        return self.local / rel if rel else self.local

    def describe(self) -> str:
        return str(self.local) if self.local is not None else self.identity

    # ------------------------------------------------------------------ reading

    async def size(self, dataset: str, rel: str) -> int:
        if self.local is not None:
            path = self.local_path(rel)
            try:
                return path.stat().st_size
            except OSError as e:
                raise StorageError(f"dataset {dataset}: cannot read {path}: {e.strerror or e}") from None
        import obstore

        location = self.object_path(rel)
        try:
            meta = await obstore.head_async(self.store, location)
        except FileNotFoundError:
            raise StorageError(f"dataset {dataset}: {location} not found in {self.identity}") from None
        except Exception as e:
            raise StorageError(f"dataset {dataset}: storage {self.identity} failed for {location}: {e}") from None
        return int(meta["size"])

    async def read(self, dataset: str, rel: str, start: int = 0, end: Optional[int] = None) -> bytes:
        """Bytes ``start .. end`` of ``rel`` (``end=None``: to its end)."""
        if self.local is not None:
            return await asyncio.to_thread(self._read_local, dataset, rel, start, end)
        import obstore

        location = self.object_path(rel)
        try:
            if end is None:
                size = await self.size(dataset, rel)
                end = size
            if end == start:
                return b""
            data = await obstore.get_range_async(self.store, location, start=start, end=end)
        except BlobError:
            raise
        except FileNotFoundError:
            raise StorageError(f"dataset {dataset}: {location} not found in {self.identity}") from None
        except Exception as e:
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "range" in text.lower():
                raise BlobRangeError(f"dataset {dataset}: range {start}..{end} is outside {location}") from None
            raise StorageError(f"dataset {dataset}: storage {self.identity} failed for {location}: {text}") from None
        return bytes(data)

    def _read_local(self, dataset: str, rel: str, start: int, end: Optional[int]) -> bytes:
        path = self.local_path(rel)
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if end is None:
                    end = size
                if end > size or start > end:
                    raise BlobRangeError(
                        f"dataset {dataset}: range {start}..{end} is outside {rel or path} ({size} bytes)"
                    )
                fh.seek(start)
                return fh.read(end - start)
        except IsADirectoryError:
            raise StorageError(f"dataset {dataset}: {path} is a folder, not a file") from None
        except OSError as e:
            raise StorageError(f"dataset {dataset}: cannot read {path}: {e.strerror or e}") from None

    async def list(self, dataset: str, rel: str, recursive: bool) -> List[Entry]:
        """The files below ``rel`` at every level, or the files and folders directly in it
        (as the Rust reference and DataSets.jl's ``readdir`` list them), sorted by path."""
        if self.local is not None:
            return await asyncio.to_thread(self._list_local, dataset, rel, recursive)
        import obstore

        prefix = self.object_path(rel)
        cut = len(prefix) + 1 if prefix else 0
        out: List[Entry] = []
        try:
            if recursive:
                async for batch in obstore.list(self.store, prefix or None):
                    for meta in batch:
                        path = meta["path"]
                        if prefix and not path.startswith(prefix + "/"):
                            continue
                        out.append(Entry(path[cut:], int(meta["size"])))
            else:
                listed = await obstore.list_with_delimiter_async(self.store, prefix or None)
                for folder in listed["common_prefixes"]:
                    out.append(Entry(folder[cut:].rstrip("/"), None, is_dir=True))
                for meta in listed["objects"]:
                    out.append(Entry(meta["path"][cut:], int(meta["size"])))
        except Exception as e:
            raise StorageError(f"dataset {dataset}: listing {prefix or '/'} in {self.identity} failed: {e}") from None
        out.sort(key=lambda e: e.path)
        return out

    async def kind_of(self, dataset: str, rel: str) -> Optional[str]:
        """What the tree path ``rel`` is: ``"Blob"`` (a file), ``"BlobTree"`` (a folder) or ``None``."""
        if self.local is not None:
            path = self.local_path(rel)
            real, root = path.resolve(), self.local.resolve()
            if real != root and root not in real.parents:
                return None  # a symlink out of the tree is not in it
            return "BlobTree" if real.is_dir() else "Blob" if real.is_file() else None
        import obstore

        # What the listing of its folder says, as the Rust reference asks it (a listing's prefix
        # names a folder in every object store): so a folder a store lists without objects
        # below it (an empty one of a file:// tree) is one, and a folder wins over a file of
        # the same name, as it comes first in a listing.
        parent, _, leaf = rel.rpartition("/")
        prefix = self.object_path(parent)
        cut = len(prefix) + 1 if prefix else 0
        try:
            listed = await obstore.list_with_delimiter_async(self.store, prefix or None)
        except Exception as e:
            raise StorageError(f"dataset {dataset}: listing {prefix or '/'} in {self.identity} failed: {e}") from None
        if any(p[cut:].rstrip("/") == leaf for p in listed["common_prefixes"]):
            return "BlobTree"
        if any(m["path"][cut:] == leaf for m in listed["objects"]):
            return "Blob"
        return None

    async def top_level(self, dataset: str) -> List[str]:
        """The files and folders (``name/``) at the top of the tree, sorted by name."""
        if self.local is not None:
            names = await asyncio.to_thread(os.listdir, self.local)
            found = [(n, (self.local / n).is_dir()) for n in names]
        else:
            import obstore

            prefix = self.object_path("")
            cut = len(prefix) + 1 if prefix else 0
            try:
                listed = await obstore.list_with_delimiter_async(self.store, prefix or None)
            except Exception as e:
                raise StorageError(
                    f"dataset {dataset}: listing {prefix or '/'} in {self.identity} failed: {e}"
                ) from None
            found = [(p[cut:].rstrip("/"), True) for p in listed["common_prefixes"]]
            found += [(m["path"][cut:], False) for m in listed["objects"]]
        return [n + "/" if is_dir else n for n, is_dir in sorted(found)]

    def _list_local(self, dataset: str, rel: str, recursive: bool) -> List[Entry]:
        base = self.local_path(rel)
        real_root = self.local.resolve()
        out: List[Entry] = []
        if not base.is_dir():
            raise StorageError(f"dataset {dataset}: {base} is not a folder")
        walker = os.walk(base) if recursive else [(str(base), [], os.listdir(base))]
        for folder, _dirs, files in walker:
            for name in files:
                full = Path(folder) / name
                real = full.resolve()
                if real != real_root and real_root not in real.parents:
                    continue  # a symlink out of the tree is not listed
                if real.is_dir() and not recursive:
                    out.append(Entry(full.relative_to(base).as_posix(), None, is_dir=True))
                    continue
                if not real.is_file():
                    continue
                out.append(Entry(full.relative_to(base).as_posix(), real.stat().st_size))
        out.sort(key=lambda e: e.path)
        return out


def encode_part(part: str) -> str:
    """One part of a dataset-relative path, percent-encoded as object_store encodes it (§2.3)."""
    out = []
    for b in part.encode("utf-8"):
        if b >= 0x80 or b < 0x20 or b == 0x7F or b in _ENCODED:
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def local(path: Path) -> Source:
    """A ``FileSystem`` source: the file or folder read in place."""
    return Source(f"file://{path}", local=path)


def memory_store(name: str) -> Any:
    """The in-process memory store ``name`` (``memory://name/...``), made on first use."""
    from obstore.store import MemoryStore

    store = _memory.get(name)
    if store is None:
        store = _memory[name] = MemoryStore()
    return store


def _split_options(options: Dict[str, str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    config, client = {}, {}
    for k, v in options.items():
        key = k.lower()
        (client if key in _CLIENT_OPTIONS else config)[key] = v
    return config, client


def open_url(url: str, options: Dict[str, str]) -> Source:
    """Opens an ``ObjectStore`` dataset's url; a ``ValueError`` says what is wrong."""
    global _memory_instances
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not scheme or not (parts.netloc or scheme == "file"):
        raise ValueError("not a url (like s3://bucket/prefix)")
    url_path = parts.path.strip("/")
    root = unquote(url_path)  # the root as object_store takes it from the url (decoded)
    config, client = _split_options(options)
    try:
        if scheme in ("s3", "s3a"):
            from obstore.store import S3Store

            # Every spelling object_store takes for the endpoint (it names the identity).
            endpoint = (
                next(
                    (
                        config[k]
                        for k in ("endpoint", "aws_endpoint", "endpoint_url", "aws_endpoint_url")
                        if config.get(k)
                    ),
                    None,
                )
                or os.environ.get("AWS_ENDPOINT_URL")
                or os.environ.get("AWS_ENDPOINT")
            )
            if endpoint and endpoint.startswith("http://") and "allow_http" not in client:
                client["allow_http"] = "true"
            store = S3Store(parts.netloc, config=config or None, client_options=_typed(client) or None)
            identity = f"s3://{parts.netloc}/{url_path}" + (f"?endpoint={endpoint}" if endpoint else "")
            return Source(identity, store=store, root=root)
        if scheme in ("http", "https"):
            from obstore.store import HTTPStore

            if config:
                raise ValueError(f"unknown option {sorted(config)[0]!r} for an http store")
            if scheme == "http" and "allow_http" not in client:
                client["allow_http"] = "true"
            origin = f"{scheme}://{parts.netloc}"
            store = HTTPStore.from_url(origin, client_options=_typed(client) or None)
            return Source(f"{origin}/{url_path}", store=store, root=root)
        if scheme == "file":
            from obstore.store import LocalStore

            if not parts.path.startswith("/"):
                raise ValueError("file:// url must hold an absolute local path")
            path = Path(unquote(parts.path))
            return Source(f"file://{path}", store=LocalStore("/"), root=str(path).lstrip("/"))
        if scheme == "memory":
            _memory_instances += 1
            identity = f"memory://{parts.netloc}/{url_path}#{os.getpid()}-py{_memory_instances}"
            return Source(identity, store=memory_store(parts.netloc), root=root)
    except ValueError:
        raise
    except Exception as e:  # obstore's configuration errors
        raise ValueError(str(e).splitlines()[0]) from None
    raise ValueError(f"unsupported url scheme {scheme!r}; use s3://, http(s)://, file://, memory://")


def _typed(client: Dict[str, str]) -> Dict[str, Any]:
    return {
        k: (_truthy(v) if k in ("allow_http", "allow_invalid_certificates", "http1_only", "http2_only") else v)
        for k, v in client.items()
    }

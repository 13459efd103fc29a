"""The shared on-disk cache of spec/CACHE.md, as the Python peer reads and writes it.

A Rust node and Python workers on one host share one cache folder: the same names (§2),
the same entries and seals (§3), temporary files renamed into place (§4), the same
``flock`` locks for single flight across processes (§5), and pins that the Rust evictor
respects (§6.1). Three processes of either language reading the same object cause one GET.

What this implementation does not do (spec/CACHE.md §9 allows each, and says so):
- it never evicts (no size cap; a Rust node sharing the folder, or ``handoff data gc``,
  keeps it in bounds), and it honours pins, so eviction never removes what it reads;
- range reads of objects not cached whole go to storage directly: it neither writes nor
  reads block files;
- it has no offline mode (§8.1).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import blake3

from ..data import BlobError
from .stores import StorageError, encode_part

__all__ = ["Cache", "CachedFile", "Key", "short_hash", "encode_part", "default_dir", "version_of"]

_HEX = frozenset("0123456789abcdef")
_CHUNK = 4 << 20


def default_dir() -> Path:
    """``$HANDOFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/handoff/data``, else ``~/.cache/handoff/data``."""
    if os.environ.get("HANDOFF_CACHE_DIR"):
        return Path(os.environ["HANDOFF_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "handoff" / "data"
    if os.environ.get("HOME"):
        return Path(os.environ["HOME"]) / ".cache" / "handoff" / "data"
    return Path("/tmp/handoff-data-cache")


def short_hash(*parts: str) -> str:
    """The first 16 bytes, in hex, of BLAKE3 over each part's UTF-8 and a zero byte (§2.1)."""
    h = blake3.blake3()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.digest()[:16].hex()


def version_of(meta: Dict[str, Any]) -> str:
    """The version of an object from what storage says about it (§2.4)."""
    if meta.get("version"):
        return f"v:{meta['version']}"
    if meta.get("e_tag"):
        return f"e:{meta['e_tag']}"
    modified = meta.get("last_modified")
    ns = 0
    if modified is not None:
        try:
            ns = int(modified.timestamp()) * 1_000_000_000 + modified.microsecond * 1000
        except (OverflowError, ValueError, OSError):
            ns = 0
    return f"m:{int(meta.get('size', 0))}:{ns}"


@dataclass(frozen=True)
class Key:
    """What an entry is found by: store identity, object path, version."""

    identity: str
    path: str
    version: str

    @property
    def path_key(self) -> str:
        return short_hash("handoff-data path v1", self.identity, self.path)

    @property
    def version_key(self) -> str:
        return short_hash("handoff-data version v1", self.version)


class CachedFile:
    """An object file of the cache, open and pinned (a shared ``flock``: the evictor of any
    process skips it) until :meth:`close`."""

    def __init__(self, fd: int, path: Path, digest: str, size: int):
        self.fd, self.path, self.digest, self.size = fd, path, digest, size

    def read(self, start: int = 0, end: Optional[int] = None) -> bytes:
        """Bytes ``start .. end`` of the content (one ``pread`` returns at most 2 GiB: looped)."""
        end = self.size if end is None else end
        if end - start <= _CHUNK:
            return os.pread(self.fd, end - start, start)
        out = bytearray(end - start)
        view = memoryview(out)
        done = 0
        while done < len(out):
            n = os.preadv(self.fd, [view[done : done + (1 << 30)]], start + done)
            if n == 0:
                raise BlobError(f"the cached {self.path} ended after {start + done} of {end} bytes")
            done += n
        return bytes(out)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "CachedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Cache:
    """A cache folder (created if missing), shared with other processes of either language."""

    def __init__(self, directory: Any = None):
        self.dir = Path(directory) if directory is not None else default_dir()
        for sub in ("objects", "index", "blocks", "locks", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._turns: Dict[str, list] = {}
        self._counter = 0
        #: Whole objects this process downloaded (a test counts them).
        self.fills = 0

    def __repr__(self) -> str:
        return f"Cache({str(self.dir)!r})"

    # ------------------------------------------------------------------ names

    def _object(self, digest: str) -> Path:
        return self.dir / "objects" / digest[:2] / digest

    def _entry(self, key: Key) -> Path:
        return self.dir / "index" / key.path_key / f"{key.version_key}.json"

    def _tmp(self, what: str) -> Path:
        self._counter += 1
        return self.dir / "tmp" / f"{what}-{os.getpid()}-{time.time_ns()}-{self._counter - 1}.tmp"

    def _write_atomic(self, dest: Path, data: bytes) -> None:
        tmp = self._tmp("meta")
        tmp.write_bytes(data)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _seal(self, digest: str, st: os.stat_result) -> None:
        body = json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns}, separators=(",", ":"))
        self._write_atomic(self._object(digest).with_name(f"{digest}.seal"), body.encode())

    # ------------------------------------------------------------------ reading (§3.3, §3.4, §6.1)

    def _pin(self, digest: str) -> Optional[int]:
        path = self._object(digest)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                os.close(fd)
                return None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                return fd
            os.close(fd)
        return None

    def open_digest(self, digest: str) -> Optional[CachedFile]:
        """The content with this digest, pinned and checked (§3.3 step 2), or ``None``."""
        if len(digest) != 64 or not set(digest) <= _HEX:
            return None
        fd = self._pin(digest)
        if fd is None:
            return None
        try:
            return self._checked(fd, digest)
        except BaseException:
            os.close(fd)
            raise

    def _checked(self, fd: int, digest: str) -> Optional[CachedFile]:
        st = os.fstat(fd)
        seal_path = self._object(digest).with_name(f"{digest}.seal")
        try:
            seal = json.loads(seal_path.read_bytes())
            sealed = seal.get("size") == st.st_size and seal.get("mtime_ns") == st.st_mtime_ns
        except (OSError, ValueError, AttributeError):
            sealed = False
        if not sealed:
            h = blake3.blake3()
            off = 0
            while off < st.st_size:
                chunk = os.pread(fd, min(_CHUNK, st.st_size - off), off)
                if not chunk:
                    break
                h.update(chunk)
                off += len(chunk)
            if h.hexdigest() != digest:
                os.close(fd)
                for p in (self._object(digest), seal_path):
                    p.unlink(missing_ok=True)
                return None
            self._seal(digest, st)
        return CachedFile(fd, self._object(digest), digest, st.st_size)

    def hit(self, key: Key) -> Optional[CachedFile]:
        """The content of ``key`` if an entry names it (and it is there), pinned (§3.4)."""
        entry = self._entry(key)
        try:
            digest = json.loads(entry.read_bytes())["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        f = self.open_digest(digest) if isinstance(digest, str) else None
        if f is None:
            entry.unlink(missing_ok=True)
            return None
        try:
            os.utime(entry)
        except OSError:
            pass
        return f

    def has_path(self, identity: str, path: str) -> bool:
        """Whether some version of the object has an entry (§5.3)."""
        folder = self.dir / "index" / short_hash("handoff-data path v1", identity, path)
        try:
            return any(folder.iterdir())
        except OSError:
            return False

    # ------------------------------------------------------------------ filling (§4, §5)

    async def _locked(self, lock_name: str):
        """An in-process turn, then ``LOCK_EX`` on ``locks/<lock_name>``. Another process's
        fill is waited for by polling the lock (no thread blocks in ``flock``, so a
        cancelled wait leaves nothing behind)."""
        # {lock name: [lock, tasks using it]}: an entry lives only while a task uses it (the
        # paths come from tags peers send, so the table must not keep one per path ever seen).
        entry = self._turns.setdefault(lock_name, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            await entry[0].acquire()
        except BaseException:
            self._leave(lock_name, entry)
            raise
        try:
            fd = os.open(self.dir / "locks" / lock_name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                pause = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.05)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            entry[0].release()
            self._leave(lock_name, entry)
            raise
        return fd, lock_name, entry

    def _leave(self, lock_name: str, entry: list) -> None:
        entry[1] -= 1
        if entry[1] == 0:
            del self._turns[lock_name]

    def _unlock(self, held) -> None:
        fd, lock_name, entry = held
        os.close(fd)
        entry[0].release()
        self._leave(lock_name, entry)

    async def _download(self, store: Any, location: str, options: Optional[dict], dataset: str, expect_digest):
        """GETs the object into a temporary file, hashing it; returns (tmp, digest, size, meta)."""
        import obstore

        tmp = self._tmp("object")
        h = blake3.blake3()
        size = 0
        try:
            result = await obstore.get_async(store, location, options=options)
            meta = result.meta
            with open(tmp, "wb") as out:
                async for chunk in result.stream(min_chunk_size=1 << 20):
                    view = memoryview(chunk)
                    h.update(view)
                    out.write(view)
                    size += len(view)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"dataset {dataset}: {location} not found") from None
        except BlobError:
            tmp.unlink(missing_ok=True)
            raise
        except Exception as e:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"dataset {dataset}: downloading {location} failed: {e}") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        try:
            if size != int(meta["size"]):
                raise BlobError(f"dataset {dataset}: {location} announced {meta['size']} bytes, {size} came")
            digest = h.hexdigest()
            if expect_digest is not None and digest != expect_digest.lower():
                raise BlobError(
                    f"dataset {dataset}: {location} has BLAKE3 {digest} but {expect_digest} was expected "
                    "(the sender's tag)"
                )
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.fills += 1
        return tmp, digest, size, meta

    def _install(self, key: Key, tmp: Path, digest: str, size: int) -> CachedFile:
        """§4.2: the content under its digest (unless there), the entry, older entries and
        blocks of the object gone; returns the content pinned."""
        existing = self.open_digest(digest)
        if existing is not None:
            existing.close()
            tmp.unlink(missing_ok=True)
        else:
            os.chmod(tmp, 0o444)
            dest = self._object(digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dest)
            self._seal(digest, os.stat(dest))
        entry = {"identity": key.identity, "path": key.path, "version": key.version, "size": size, "digest": digest}
        target = self._entry(key)
        self._write_atomic(target, json.dumps(entry, separators=(",", ":")).encode())
        for other in target.parent.iterdir():
            if other.name != target.name:
                other.unlink(missing_ok=True)
        shutil.rmtree(self.dir / "blocks" / key.path_key, ignore_errors=True)
        pinned = self.open_digest(digest)
        if pinned is None:
            raise BlobError(f"the cache {self.dir} lost {digest} as it was installed")
        return pinned

    async def object(
        self,
        store: Any,
        identity: str,
        location: str,
        dataset: str,
        expect_digest: Optional[str] = None,
        key_path: Optional[str] = None,
    ) -> Tuple[CachedFile, str]:
        """The whole object, pinned, and where it came from (``cache`` or ``storage``).

        As the Rust reference does (§5.2, §5.3): with no version of the object cached yet,
        the first process to take ``locks/<path key>.lock`` GETs it and the others wait and
        then find it; once some version is cached, a HEAD gives the key, and a fill of that
        key takes the same lock, then looks again before it GETs."""
        import obstore

        named = location if key_path is None else key_path  # the path as object_store spells it (§2.3)
        probe = Key(identity, named, "")
        if not await asyncio.to_thread(self.has_path, identity, named):
            held = await self._locked(f"{probe.path_key}.lock")
            try:
                if not self.has_path(identity, named):
                    tmp, digest, size, meta = await self._download(store, location, None, dataset, expect_digest)
                    key = Key(identity, named, version_of(meta))
                    return await asyncio.to_thread(self._install, key, tmp, digest, size), "storage"
            finally:
                self._unlock(held)
        try:
            meta = await obstore.head_async(store, location)
        except FileNotFoundError:
            raise StorageError(f"dataset {dataset}: {location} not found in {identity}") from None
        except Exception as e:
            raise StorageError(f"dataset {dataset}: storage {identity} failed for {location}: {e}") from None
        key = Key(identity, named, version_of(meta))
        f = await asyncio.to_thread(self.hit, key)
        if f is not None:
            return f, "cache"
        held = await self._locked(f"{key.path_key}.lock")
        try:
            f = await asyncio.to_thread(self.hit, key)
            if f is not None:
                return f, "cache"
            options: Dict[str, Any] = {}
            if meta.get("e_tag"):
                options["if_match"] = meta["e_tag"]
            if meta.get("version"):
                options["version"] = meta["version"]
            tmp, digest, size, _ = await self._download(store, location, options or None, dataset, expect_digest)
            return await asyncio.to_thread(self._install, key, tmp, digest, size), "storage"
        finally:
            self._unlock(held)

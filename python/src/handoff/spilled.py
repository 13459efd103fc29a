"""``SpilledFile``: a large file on disk that travels by its route — the worked example of
:mod:`handoff.route`. To a same-host Python peer it goes as its path under a pin
(:mod:`handoff.pins`) and is mapped read-only in place; elsewhere as its bytes. The owner
keeps the file until every pin ends, and a receiver opens a peer's path only under the
directories it allows, as a regular file of its own uid with the stated device, inode and
size. The whole design, and what a hostile same-host peer can and cannot make a receiver
do: ``docs/python.md``, "Spilled files and pins, in detail".
"""

from __future__ import annotations

import os
import pickle
import stat
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Optional

from . import pins
from .route import REMOTE, SAME_HOST, Route, RouteError, register
from .shmmap import Region

__all__ = ["SpilledFile", "NAME", "allowed_dirs", "allow_dir", "spill_dir"]

#: The name of ``SpilledFile`` on the wire.
NAME = "handoff.SpilledFile"
#: The longest path a peer may send.
MAX_PATH = 4096

_dirs_lock = threading.Lock()
_extra_dirs: list = []


def allowed_dirs() -> list:
    """The directories (real paths) under which this process opens files that peers name:
    the system temporary directory, the entries of ``$HANDOFF_SPILL_DIRS``
    (``os.pathsep``-separated), and those added with :func:`allow_dir`."""
    dirs = [tempfile.gettempdir()]
    dirs += [d for d in os.environ.get("HANDOFF_SPILL_DIRS", "").split(os.pathsep) if d]
    with _dirs_lock:
        dirs += _extra_dirs
    out = []
    for d in dirs:
        real = os.path.realpath(d)
        if real not in out and real != "/":
            out.append(real)
    return out


def allow_dir(path: Any) -> None:
    """Lets this process open files that peers name under ``path`` (and its subdirectories)."""
    real = os.path.realpath(os.fspath(path))
    if real == "/":
        raise ValueError("allowing the whole file system to peers defeats the check; name a directory")
    with _dirs_lock:
        if real not in _extra_dirs:
            _extra_dirs.append(real)


def spill_dir() -> Path:
    """Where :meth:`SpilledFile.write` puts files by default: ``handoff-spill-UID`` in the
    system temporary directory, mode 0700."""
    d = Path(tempfile.gettempdir()) / f"handoff-spill-{os.geteuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{d} is not a directory of ours (uid {os.geteuid()}); pass dir=")
    return d


# ------------------------------------------------------------------ what a handle holds


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:  # pragma: no cover - nothing to do about it at this point
        pass


class _Backing:
    """What keeps a handle's bytes: a pin on this object keeps them for a receiver."""

    __slots__ = ("path", "mapping", "pins", "__weakref__")

    def __init__(self, path: Optional[str], mapping: Any):
        self.path = path
        self.mapping = mapping
        self.pins = 0

    def pinned(self) -> None:
        self.pins += 1

    def unpinned(self) -> None:
        self.pins -= 1

    def close_mapping(self) -> None:
        if isinstance(self.mapping, Region):
            self.mapping = None  # unmapped when the last view of it goes


class _LocalFile(_Backing):
    """The owner's file: deleted (if it owns it) when nothing holds this object any more."""

    __slots__ = ("_finalizer",)

    def __init__(self, path: str, delete: bool):
        super().__init__(path, None)
        self._finalizer = weakref.finalize(self, _unlink, path) if delete else None

    def map(self, size: int) -> Any:
        if self.mapping is None:
            if size == 0:
                self.mapping = b""
            else:
                with open(self.path, "rb") as f:
                    # No descriptor kept by the mapping (handoff.shmmap).
                    self.mapping = Region.map(f.fileno(), size)
        return self.mapping


class _PeerFile(_Backing):
    """A same-host peer's file, mapped in place, and the pin its owner keeps it under."""

    __slots__ = ("pin",)

    def __init__(self, path: str, mapping: Any, pin: Optional[pins.Pin]):
        super().__init__(path, mapping)
        self.pin = pin


# ------------------------------------------------------------------ the handle


class SpilledFile:
    """A handle to a large file on disk (or, received from afar, to its bytes in memory).

    ``SpilledFile(path, delete=False)`` takes an existing file (``delete=True`` deletes it
    once this handle and every receiver are done); :meth:`write` spills bytes to a new
    file it owns. :meth:`view` is a read-only, zero-copy view of the bytes; :meth:`close`
    (or leaving a ``with`` block, or dropping the handle) lets go: a receiver's pin is
    released, an owner's file is deleted once no pin holds it. ``origin`` says how this
    handle came to be: ``local``, ``path`` (a same-host peer's file, mapped in place) or
    ``bytes`` (received in memory).
    """

    __slots__ = ("_backing", "_size", "origin", "__weakref__")

    def __init__(self, path: Any, *, delete: bool = False):
        path = os.path.abspath(os.fspath(path))
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        self._backing: Optional[_Backing] = _LocalFile(path, delete)
        self._size = st.st_size
        self.origin = "local"

    @classmethod
    def write(cls, data: Any, *, dir: Any = None, prefix: str = "spill-") -> "SpilledFile":
        """Writes ``data`` (bytes-like) to a new file in ``dir`` (default :func:`spill_dir`)
        and returns a handle that owns it (the file is deleted when everyone is done)."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".bin", dir=os.fspath(dir) if dir else spill_dir())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(view)
        except BaseException:
            _unlink(path)
            raise
        return cls(path, delete=True)

    @classmethod
    def _received(cls, backing: _Backing, size: int, origin: str) -> "SpilledFile":
        self = cls.__new__(cls)
        self._backing = backing
        self._size = size
        self.origin = origin
        return self

    @classmethod
    def from_bytes(cls, data: Any) -> "SpilledFile":
        """A handle over bytes in memory (what a remote receiver gets)."""
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        return cls._received(_Backing(None, view), view.nbytes, "bytes")

    # -------------------------------------------------------------- what it is

    @property
    def path(self) -> Optional[str]:
        """The file's path (the owner's path for a handle received as a path); ``None`` in memory."""
        b = self._backing
        return b.path if b is not None else None

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def closed(self) -> bool:
        return self._backing is None

    @property
    def leases(self) -> int:
        """Pins that hold this handle's bytes for receivers (on the node that sent them)."""
        b = self._backing
        return b.pins if b is not None else 0

    @property
    def pin(self) -> Optional[pins.Pin]:
        """For a handle received as a path: the pin its owner keeps the file under (``None``
        if this node is not the holder it was sent to, e.g. it was forwarded)."""
        b = self._backing
        return b.pin if isinstance(b, _PeerFile) else None

    def _live(self) -> _Backing:
        b = self._backing
        if b is None:
            raise ValueError("the SpilledFile is closed")
        return b

    def view(self) -> memoryview:
        """The bytes, read-only, without a copy (a mapping of the file, or the received frame)."""
        b = self._live()
        m = b.map(self._size) if isinstance(b, _LocalFile) else b.mapping
        if isinstance(m, Region):
            return m.view()
        return memoryview(m if m is not None else b"").toreadonly()

    def read(self) -> bytes:
        """The bytes, copied."""
        return bytes(self.view())

    def close(self) -> None:
        """Lets go of the bytes: a receiver's pin is released; the owner's file is deleted
        (if it owns it) once no receiver holds a pin on it. Views already taken stay valid."""
        b, self._backing = self._backing, None
        if b is None:
            return
        if isinstance(b, _PeerFile) and b.pin is not None and b.pins == 0:
            b.pin.release()
        b.close_mapping()

    def __enter__(self) -> "SpilledFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        # Plain pickling (no route): the bytes, out of band with protocol 5.
        return (SpilledFile.from_bytes, (pickle.PickleBuffer(self.view()),))

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"SpilledFile({self._size} bytes, {self.origin}{where}{', closed' if self.closed else ''})"


# ------------------------------------------------------------------ route-aware encoding


def _encode(obj: SpilledFile, route: Route) -> tuple:
    b = obj._live()
    if b.path is not None and route.known and route.locality == SAME_HOST and route.recipient.lang == "python":
        st = os.stat(b.path)
        if st.st_size != obj.size:
            raise RouteError(f"{b.path} changed size ({obj.size} -> {st.st_size}): a spilled file must not change")
        lease = pins.pin(route, b, on_end=b.unpinned, what=f"file {b.path}")
        b.pinned()
        header = {
            "form": "path",
            "path": b.path,
            "size": obj.size,
            "dev": st.st_dev,
            "ino": st.st_ino,
            "host": route.sender.host,
            "lease": lease,
        }
        return header, []
    return {"form": "bytes", "size": obj.size}, [obj.view()]


def _int(header: dict, key: str) -> int:
    v = header.get(key)
    if type(v) is not int or not 0 <= v < 1 << 63:
        raise ValueError(f"{key!r} is not a non-negative integer: {v!r:.80}")
    return v


def _decode(header: Any, frames: list, route: Route) -> SpilledFile:
    if not isinstance(header, dict):
        raise ValueError(f"the header is not a map: {type(header).__name__}")
    form = header.get("form")
    size = _int(header, "size")
    if form == "bytes":
        if len(frames) != 1:
            raise ValueError(f"the bytes form has one frame, got {len(frames)}")
        try:
            view = memoryview(frames[0])
        except TypeError:
            raise ValueError(
                f"its frame is a {type(frames[0]).__name__}, not bytes (a node with lazy redemption gets tickets)"
            ) from None
        if view.nbytes != size:
            raise ValueError(f"the header says {size} bytes, the frame has {view.nbytes}")
        return SpilledFile.from_bytes(view)
    if form == "path":
        if frames:
            raise ValueError(f"the path form has no frames, got {len(frames)}")
        return _open_peer_file(header, size, route)
    raise ValueError(f"unknown form {form!r:.40} (this process knows 'path' and 'bytes')")


def _checked_path(path: Any) -> str:
    if not isinstance(path, str) or not path or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise ValueError(f"the path is not a str of at most {MAX_PATH} bytes")
    if "\0" in path or not os.path.isabs(path) or os.path.normpath(path) != path:
        raise ValueError(f"{path!r:.200} is not an absolute, normalized path")
    real = os.path.realpath(path)
    for root in allowed_dirs():
        if real != root and os.path.commonpath([real, root]) == root:
            return real
    resolved = f" (it resolves to {real!r:.200})" if real != path else ""
    raise ValueError(
        f"{path!r:.200}{resolved} is not under a directory this process reads peers' files from "
        f"({', '.join(allowed_dirs())}; see handoff.spilled.allow_dir and $HANDOFF_SPILL_DIRS)"
    )


def _open_peer_file(header: dict, size: int, route: Route) -> SpilledFile:
    if route.known and route.locality == REMOTE:
        raise ValueError(f"a path from {route.sender.name}, on another host ({route.sender.host}): it is not ours")
    host = header.get("host")
    if route.known and host != route.recipient.host:
        raise ValueError(f"the path is on host {host!r:.80}, this node is on {route.recipient.host}")
    dev, ino = _int(header, "dev"), _int(header, "ino")
    pin = pins.hold(header.get("lease"), route)  # ValueError for a missing or malformed lease
    try:
        path = _checked_path(header.get("path"))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise ValueError(f"cannot open {path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file")
            if st.st_uid != os.geteuid():
                raise ValueError(f"{path} belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})")
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise ValueError(f"{path} is not the file the sender meant (another device or inode: replaced?)")
            if st.st_size != size:
                raise ValueError(f"the header says {size} bytes, {path} has {st.st_size}")
            mapping = Region.map(fd, size) if size else b""
        finally:
            os.close(fd)
    except BaseException:
        if pin is not None:
            pin.release()  # nothing will be read: the owner need not wait for the claim timeout
        raise
    return SpilledFile._received(_PeerFile(path, mapping, pin), size, "path")


register(SpilledFile, _encode, _decode, name=NAME)

"""Shared-memory frames an application sends (spec §7.2–§7.4): :class:`ShmBuffer`, filled
in place and sent with no copy, and :class:`SharedFrame` / :class:`PooledFrame`, a
segment (a memfd) and the bytes of it that a frame carries.

A same-host send passes the segment's descriptor: a sealed segment
(``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``, the reference's "sealed
mode", §7.4), or a pooled one sealed against shrinking and growing at least (every
segment a node passes is). What the receiver checks and maps is the engine's (and the
pure-Python reference's, ``handoff_pure.shm``). Mappings keep no descriptor
(:mod:`handoff.shmmap`).
"""

from __future__ import annotations

import fcntl
import importlib
import os
from typing import Any, Optional

from .memfd import F_ADD_SEALS, SEALS_ALL, SEALS_FIXED
from . import native
from .memfd import memfd as _memfd
from .shmmap import Region

__all__ = ["ShmBuffer", "SharedFrame", "PooledFrame", "SEALS_FIXED"]


class SharedFrame:
    """A read-only shared segment ready to send (a sealed memfd, or a frozen :class:`ShmBuffer`).

    It is bytes-like through :attr:`view` (a read-only mapping, made on first use), and a
    node sends it to a same-host peer by passing its descriptor: the peer maps the same pages.
    """

    def __init__(self, fd: int, size: int, sealed: bool, mapping: Optional[Region] = None):
        self.fd = fd
        self.size = size
        self.sealed = sealed
        self._map = mapping

    @property
    def view(self) -> memoryview:
        if self._map is None:
            if self.size == 0:
                return memoryview(b"")
            self._map = Region.map(self.fd, self.size)
        return self._map.view()

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        """Closes this handle (mappings and descriptors held by leases stay valid)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"SharedFrame({self.size} bytes, sealed={self.sealed})"


class PooledFrame(SharedFrame):
    """A frozen pooled :class:`ShmBuffer`: its ``n`` bytes at the start of a segment of the
    process's pool, sent unsealed (§7.4, pooled segments). The segment goes back to the
    pool when this handle and every lease sent on it are gone.

    On the engine the segment is the engine's (``handoff._native.PooledBuffer``) and
    :attr:`native_frame` is what its sends take; where the pure-Python reference runs
    (tests), it is a segment of the reference's pool (``handoff_pure.pool``)."""

    def __init__(self, segment: Any, n: int, native_frame: Any = None):
        super().__init__(segment.fd, segment.size, False, None)
        self.segment = segment
        self.n = n
        self.native_frame = native_frame

    @property
    def view(self) -> memoryview:
        if self.segment is None:
            raise ValueError("the pooled frame is closed")
        if self.native_frame is not None:
            return memoryview(self.segment)
        return self.segment.map.view()[: self.n].toreadonly()

    def __len__(self) -> int:
        return self.n

    def close(self) -> None:
        """Lets go of the segment (it stays busy while leases sent on it live)."""
        seg, self.segment = getattr(self, "segment", None), None
        engines = getattr(self, "native_frame", None) is not None  # freed with its last reference
        self.fd = -1
        self._map = None
        self.native_frame = None
        if seg is not None and not engines:
            seg.let_go(True)

    def __repr__(self) -> str:
        return f"PooledFrame({self.n} bytes in a segment of {self.size})"


def _native_pooled() -> type:
    """The engine's pooled buffer class (a class no object is of without the extension)."""
    return native.ext.PooledBuffer if native.ext is not None else type(None)


def _take_pooled(size: int) -> Any:
    """A writable buffer of ``size`` bytes in a segment of the process's pool: the
    engine's, or, where the pure-Python reference runs (tests), the reference's own pool,
    loaded by name (``handoff`` never imports ``handoff_pure``)."""
    if native.ext is not None and not native.reference_chosen():
        return native.ext.PooledBuffer(size)
    try:
        pool = importlib.import_module("handoff_pure.pool").pool
    except ImportError as e:
        raise ImportError(f"a pooled ShmBuffer without the extension needs the reference (handoff_pure): {e}") from None
    return pool().take(size)


class ShmBuffer:
    """A writable buffer in a fresh shared segment: fill it in place, then :meth:`freeze` it
    and send it to same-host peers with no copy (like the reference's ``SharedBufMut``).

    With ``pooled`` it is the start of a segment of the process's pool instead (as the
    reference's ``SharedBufMut`` is): its pages are warm when the segment is reused, and
    a receiver that keeps the segment's mapping (``handoff_pure.mapcache``) maps the next
    frame in it without faulting its pages again. Such a segment is never sealed."""

    def __init__(self, size: int, pooled: bool = False):
        if size <= 0:
            raise ValueError("a shared buffer needs at least one byte")
        self.size = size
        self._segment = None
        if pooled:
            self._segment = _take_pooled(size)
            self.fd = self._segment.fd
            if isinstance(self._segment, _native_pooled()):
                self._map = None
                self.view = memoryview(self._segment)
            else:
                self._map = self._segment.map
                self.view = self._map.view()[:size]
            return
        self.fd = _memfd(size)
        self._map = Region.map(self.fd, size, write=True)
        #: The writable bytes; fill them in place before :meth:`freeze`.
        self.view = self._map.view()

    def freeze(self, seal: bool = True) -> SharedFrame:
        """Ends writing; with ``seal`` the segment is sealed against any change (§7.4).

        Without ``seal`` it stays writable (by whoever maps it), but is sealed against
        shrinking and growing all the same: receivers refuse any segment that could
        shrink under their mapping (§7.2). A pooled buffer is never sealed (``seal`` is
        ignored): it becomes a :class:`PooledFrame`."""
        if self.fd < 0:
            raise ValueError("the shared buffer is frozen already: its frame is what freeze() returned")
        self.view.release()
        if isinstance(self._segment, _native_pooled()):
            try:
                frame = self._segment.freeze()  # refused while other views of it are held
            except BufferError:
                self.view = memoryview(self._segment)  # still writable: release them, try again
                raise
            seg, self._segment = self._segment, None
            self.fd = -1
            return PooledFrame(seg, self.size, frame)
        if self._segment is not None:
            seg, self._segment = self._segment, None
            self.fd = -1
            return PooledFrame(seg, self.size)
        self._map = None  # unmapped once nothing else views it (sealing needs it gone)
        fd, self.fd = self.fd, -1
        try:
            fcntl.fcntl(fd, F_ADD_SEALS, SEALS_ALL if seal else SEALS_FIXED)
        except OSError as e:
            os.close(fd)
            raise BufferError(f"cannot seal the shared buffer while views of it are held: {e}") from None
        return SharedFrame(fd, self.size, seal)

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:  # pragma: no cover - best effort
        seg = getattr(self, "_segment", None)
        if seg is not None and not isinstance(seg, _native_pooled()):  # a reference pool's, never frozen
            self._segment = None
            seg.let_go(True)

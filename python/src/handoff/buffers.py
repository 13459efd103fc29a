"""Marks on bytes-like values that say how they travel: :class:`Buffer` (always as a
frame) and :class:`OnDemand` (only as an on-demand ticket), and :func:`as_bytes_view`.

They sit below both the body codec (:mod:`handoff.codec`, which sends them and
re-exports them) and the data handles (:mod:`handoff.data`, whose fallback is an
:class:`OnDemand`), so that the codec can turn data handles into objects without the
handles needing the codec.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["Buffer", "OnDemand", "as_bytes_view", "is_ndarray"]


class Buffer:
    """Marks a bytes-like object (bytes, bytearray, memoryview, mmap, numpy array …) to
    travel as a frame whatever its size, like the Rust reference's ``Buffer``."""

    __slots__ = ("data",)

    def __init__(self, data: Any):
        self.data = data

    def __len__(self) -> int:
        return as_bytes_view(self.data).nbytes

    def __repr__(self) -> str:
        try:
            return f"{type(self).__name__}({len(self)} bytes)"
        except TypeError:  # not bytes-like: sending it fails and says so; its repr must not
            return f"{type(self).__name__}({type(self.data).__name__}, not bytes-like)"


class OnDemand(Buffer):
    """Marks a bytes-like object to travel only as an on-demand ticket (like the reference's
    ``tickets::on_demand``): to a peer that takes tickets it is sent as a ticket flagged
    ``lazy``, which the receiver pulls only when the bytes are used, even if it redeems
    other tickets eagerly — for a fallback the receiver may never need, such as the bytes
    behind a data handle. A peer without tickets gets the bytes.

    ``digest``, if given, is the BLAKE3 hash of the bytes (32 bytes), so the owner does not
    hash them again when it issues the ticket.
    """

    __slots__ = ("digest",)

    def __init__(self, data: Any, digest: Optional[bytes] = None):
        super().__init__(data)
        self.digest = digest

    def __repr__(self) -> str:
        return f"OnDemand({len(self)} bytes)"


def is_ndarray(value: Any) -> bool:
    # No import: if numpy is not loaded yet, nothing can be one of its arrays.
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def as_bytes_view(value: Any) -> memoryview:
    """A flat, byte-typed memoryview of a bytes-like value (a C-contiguous copy for strided numpy arrays)."""
    if isinstance(value, Buffer):
        value = value.data
    if is_ndarray(value) and not value.flags.c_contiguous:
        value = sys.modules["numpy"].ascontiguousarray(value)
    view = value if isinstance(value, memoryview) else memoryview(value)
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B")
    return view

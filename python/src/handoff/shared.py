"""Arrays born in shared memory: inside :func:`shared_arrays` (or after :func:`install`),
NumPy allocates every array of at least ``min_bytes`` (1 MiB unless set) from handoff's
memfd arenas, so that a same-host send passes a descriptor and both processes share one
physical copy; elsewhere its bytes are copied as any array's. Neither side sees the
other's later writes. How and why, and what a plain ``threading.Thread`` or a fork gets:
``docs/shared-arrays.md``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

from .native import required

__all__ = ["shared_arrays", "install", "uninstall", "stats", "locate", "configure"]


def _ext():
    # (A forked child's copies of its arrays are the extension's to make: it takes its
    # registry across every fork, pthread_atfork, so no Python hook is needed.)
    return required("handoff.shared_arrays")


def configure(
    min_bytes: Optional[int] = None, max_arenas: Optional[int] = None, idle_bytes: Optional[int] = None
) -> None:
    """Sets, for the whole process: the smallest allocation an arena serves (``min_bytes``,
    default 1 MiB; also ``$HANDOFF_SHARED_ARRAYS_MIN``), the bound on arenas (``max_arenas``,
    default 256, each two descriptors), and how many freed bytes stay populated for reuse
    (``idle_bytes``, default 64 MiB, also ``$HANDOFF_SHARED_ARRAYS_IDLE_BYTES``; freed pages
    past it go back to the system)."""
    for name, value in (("min_bytes", min_bytes), ("max_arenas", max_arenas), ("idle_bytes", idle_bytes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"{name} must be a whole number of at least 0, not {value!r}")
    _ext().arena_configure(min_bytes, max_arenas, idle_bytes)


#: Whether the environment's settings were applied (once, at the first install, so that a
#: later :func:`configure` call is not undone by the next install).
_env_applied = False


def _configure_from_env() -> None:
    global _env_applied
    if _env_applied:
        return
    settings = {}
    for var, setting in (
        ("HANDOFF_SHARED_ARRAYS_MIN", "min_bytes"),
        ("HANDOFF_SHARED_ARRAYS_IDLE_BYTES", "idle_bytes"),
    ):
        raw = os.environ.get(var, "").strip()
        if raw:
            try:
                settings[setting] = int(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r}: expected a whole number of bytes") from None
    configure(**settings)
    _env_applied = True


def install(min_bytes: Optional[int] = None) -> Any:
    """Makes handoff's allocator NumPy's in the current context (and the threads and tasks
    that copy it) until :func:`uninstall`; returns the allocator it replaced."""
    ext = _ext()
    _configure_from_env()
    if min_bytes is not None:
        configure(min_bytes=min_bytes)
    return ext.shared_arrays_set_handler(None)


def uninstall(previous: Any) -> None:
    """Gives NumPy back the allocator :func:`install` returned."""
    _ext().shared_arrays_set_handler(previous)


@contextlib.contextmanager
def shared_arrays(min_bytes: Optional[int] = None) -> Iterator[None]:
    """Within the block, NumPy arrays of at least ``min_bytes`` are born in shared memory::

    with handoff.shared_arrays():
        a = np.ones(2**27)           # in an arena
    await peer.send("t", {"a": a})   # to a same-host node: its descriptor, no copy
    """
    previous = install(min_bytes)
    try:
        yield
    finally:
        uninstall(previous)


def stats() -> dict:
    """This process's arenas: ``arenas`` and ``arena_bytes``, ``live_bytes`` (arrays alive),
    ``lent_ranges``/``lent_bytes`` (mapped by peers now), ``retired_bytes`` (never reused: a
    peer that may map them outlived its connection), ``private_ranges`` (remapped private
    for a send now, bounded), ``free_bytes``, and the counts of
    ``lends``, ``copies`` (sends that had to copy), ``write_backs`` and ``refused``
    allocations (with ``last_refusal``)."""
    return dict(_ext().arena_stats())


def locate(buffer: Any) -> Optional[dict]:
    """Where ``buffer``'s bytes lie in this process's arenas (``inode``, ``offset``, ``len``,
    ``private``, ``loans``), or None."""
    return _ext().arena_locate(buffer)

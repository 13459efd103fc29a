"""Which implementation this process runs: the compiled extension ``handoff._native``
(the Rust core under the Python API, ``crates/handoff-python``) or pure Python.

The native path is the default wherever the extension is installed (``pip install
./python`` builds it). ``HANDOFF_NATIVE=0`` selects the pure-Python path, the spec's
second and independent implementation; ``HANDOFF_NATIVE=1`` requires the extension and
fails the import of :mod:`handoff` with the reason if it cannot be loaded. Unset, a
missing extension means the pure path, and :data:`REASON` says why.

Each module that has a native counterpart asks :data:`ext` once, at import: the choice is
made per process, before any connection exists, so both ends of a connection need not
agree (they speak the same wire format either way). See ``docs/native.md``.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Optional

__all__ = ["ENABLED", "REASON", "ext", "required", "reference_chosen"]


def _load() -> tuple[Optional[ModuleType], str]:
    wanted = os.environ.get("HANDOFF_NATIVE", "").strip()
    if wanted not in ("", "0", "1"):
        raise ImportError(f"HANDOFF_NATIVE={wanted!r}: expected 0 (pure Python), 1 (the extension) or unset")
    if wanted == "0":
        return None, "HANDOFF_NATIVE=0"
    try:
        from . import _native
    except ImportError as e:
        if wanted == "1":
            raise ImportError(
                f"HANDOFF_NATIVE=1, but the extension handoff._native cannot be loaded ({e}); "
                "build it with `pip install ./python` (it needs the Rust toolchain) or unset HANDOFF_NATIVE"
            ) from e
        return None, f"the extension handoff._native cannot be loaded: {e}"
    return _native, "the extension handoff._native"


#: The extension module, or ``None`` on the pure-Python path.
ext, REASON = _load()
#: Whether the native path is in use.
ENABLED = ext is not None


def required(what: str) -> ModuleType:
    """The extension for a part that has no pure-Python implementation (``what`` names it):
    loaded even with ``HANDOFF_NATIVE=0``, which chooses only between the two peers."""
    if ext is not None:
        return ext
    try:
        from . import _native
    except ImportError as e:
        raise ImportError(
            f"{what} runs on handoff's extension (handoff._native), which cannot be loaded: {e}; "
            "install handoff's wheel, or build it with `pip install ./python`"
        ) from e
    return _native


def reference_chosen() -> bool:
    """Whether a test switch asks for the pure-Python reference (``handoff_pure``):
    ``HANDOFF_ENGINE=0``, or ``HANDOFF_NATIVE=0`` (no extension at all)."""
    return os.environ.get("HANDOFF_ENGINE") == "0" or os.environ.get("HANDOFF_NATIVE", "").strip() == "0"

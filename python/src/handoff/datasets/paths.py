"""Paths inside a dataset tree: normalized, and refused when they would leave it.

The same rules as the Rust reference (``handoff-data``'s ``relpath``): a path is relative,
``/``-separated, without NUL or backslash; ``.`` and empty parts are dropped, and ``..``
may climb within the tree but never out of it. Local trees also refuse a path whose
existing part resolves, through a symlink, outside the dataset's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..data import BlobError

__all__ = ["BadPath", "normalize", "join", "check_local_symlinks"]


class BadPath(BlobError):
    """A path that is not allowed in a dataset (it names the dataset, the path and why)."""

    def __init__(self, dataset: str, path: str, reason: str):
        super().__init__(f"dataset {dataset}: path {path!r} refused: {reason}")
        self.dataset, self.path, self.reason = dataset, path, reason


def normalize(dataset: str, rel: str) -> str:
    """``a/./b/../c`` → ``a/c``; refuses absolute paths, NUL, backslashes and ``..`` out of the tree."""
    if rel.startswith("/") or rel.startswith("\\") or os.path.isabs(rel):
        raise BadPath(dataset, rel, "absolute paths are not allowed; give a path relative to the tree")
    if "\0" in rel or "\\" in rel:
        raise BadPath(dataset, rel, "NUL and backslash are not allowed in paths; separate parts with '/'")
    parts: list = []
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise BadPath(dataset, rel, "'..' leaves the tree")
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def join(dataset: str, base: str, rel: str) -> str:
    """``base`` (normalized) joined with ``rel``, normalized; ``..`` may not climb above the tree."""
    if not base:
        return normalize(dataset, rel)
    if rel.startswith("/") or os.path.isabs(rel):
        raise BadPath(dataset, rel, "absolute paths are not allowed; give a path relative to the tree")
    try:
        return normalize(dataset, f"{base}/{rel}")
    except BadPath as e:
        raise BadPath(dataset, rel, e.reason) from None


def check_local_symlinks(dataset: str, root: Path, rel: str) -> None:
    """Refuses ``rel`` if the existing part of ``root/rel`` resolves outside ``root``."""
    try:
        real_root = root.resolve(strict=True)
    except OSError:
        return  # a missing root: the read fails later, naming it
    probe = root
    for part in rel.split("/"):
        if not part:
            continue
        probe = probe / part
        if not os.path.lexists(probe):
            break
        real = probe.resolve()
        if real != real_root and real_root not in real.parents:
            raise BadPath(dataset, rel, "it leads out of the dataset's folder (a symlink)")

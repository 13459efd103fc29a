"""DataSets.jl's built-in ``TomlDataStorage`` driver: a dataset's bytes kept in the catalog.

A ``Blob``'s bytes are base64 in ``[datasets.storage] data``; a ``BlobTree`` is nested
tables (folders) of base64 strings (files). The content is decoded and checked when the
catalog loads. Its identity, which keys cache entries, is ``toml-data:`` and a BLAKE3
digest computed exactly as the Rust reference computes it (``handoff-data``'s
``embedded``), so that both languages name the same content alike.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, Union

import blake3

__all__ = ["MAX_DEPTH", "parse", "identity"]

#: Folders nested deeper than this in an embedded tree are refused.
MAX_DEPTH = 64

#: A Blob's bytes, or a BlobTree's files by path (``d01/a.txt``).
Content = Union[bytes, Dict[str, bytes]]


#: What may separate base64 in a multi-line TOML string: ASCII whitespace, as in Rust.
_SPACE = str.maketrans("", "", " \t\n\x0c\r")


def _decode(text: str, path: str) -> bytes:
    """Standard base64 with padding, canonical (the unused bits of the last character zero),
    as the Rust reference's decoder takes it."""
    where = f" (file {path!r})" if path else ""
    compact = text.translate(_SPACE)
    try:
        data = base64.b64decode(compact.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise ValueError(f"is not valid base64{where}: {e}") from None
    if base64.b64encode(data).decode("ascii") != compact:
        raise ValueError(f"is not valid base64{where}: not in its canonical form (padding or trailing bits)")
    return data


def _walk(table: dict, prefix: str, depth: int, files: Dict[str, bytes]) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"nests folders deeper than {MAX_DEPTH} levels (at {prefix!r})")
    for name, value in table.items():
        if name in ("", ".", "..") or "/" in name or "\\" in name or any(c < " " or c == "\x7f" for c in name):
            raise ValueError(
                f"has an entry named {name!r} in folder {prefix!r}: a name must be one path part (no '/', not '.' or "
                "'..', no control characters)"
            )
        path = f"{prefix}/{name}" if prefix else name
        if isinstance(value, str):
            files[path] = _decode(value, path)
        elif isinstance(value, dict):
            _walk(value, path, depth + 1, files)
        else:
            raise ValueError(f"has {path!r} that is neither a file (base64 string) nor a folder (table)")


def parse(kind: str, data: Any) -> Content:
    """Decodes ``storage.data`` for a dataset of ``kind`` (``Blob`` or ``BlobTree``); a
    ``ValueError`` says what is wrong with it (the catalog adds file and dataset)."""
    if data is None:
        raise ValueError("is missing: TomlDataStorage keeps the bytes in `data` (base64)")
    if kind == "Blob":
        if not isinstance(data, str):
            raise ValueError("must be a base64 string for a Blob")
        return _decode(data, "")
    if not isinstance(data, dict):
        raise ValueError(
            "must be a table for a BlobTree: a folder is a table, a file a base64 string ([datasets.storage.data.FOLDER])"
        )
    files: Dict[str, bytes] = {}
    _walk(data, "", 1, files)
    return dict(sorted(files.items(), key=lambda kv: kv[0].encode("utf-8")))


def identity(content: Content) -> str:
    """``toml-data:<BLAKE3>`` of the content, as the Rust reference computes it."""
    h = blake3.blake3()
    if isinstance(content, bytes):
        h.update(b"blob\0")
        h.update(content)
    else:
        h.update(b"tree\0")
        for path in sorted(content, key=lambda p: p.encode("utf-8")):
            raw, data = path.encode("utf-8"), content[path]
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return "toml-data:" + h.hexdigest()

"""Dataset specifications, as DataSets.jl's ``dataset(project, spec)`` reads them:
``name[?query][#fragment]``, with the same meaning as the Rust reference (``handoff_data::spec``).

- ``name`` follows the name rule (:mod:`handoff.datasets.names`);
- ``query`` is ``key=value`` pairs separated by ``&``, each key and value percent-decoded; a key
  given twice keeps its last value;
- ``fragment`` is percent-decoded; in a ``BlobTree`` it is a ``/``-separated path to a file or a
  folder of the tree (``a_tree_example#1.csv``).

Stricter than Julia, each with an error that says what is wrong: a query pair with more than one
``=`` (write ``%3D``), a ``%`` not followed by two hex digits, decoded bytes that are not UTF-8, a
final newline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from ..data import BlobError
from .names import NAME_RULE, _json_str, _repr, name_prefix

__all__ = ["DataSpec", "InvalidSpec", "parse_spec"]

_HEX = set("0123456789abcdefABCDEF")


class InvalidSpec(BlobError, ValueError):
    """A string that is not a dataset specification; the message names it and says why."""

    def __init__(self, spec: str, reason: str):
        super().__init__(f"invalid dataset specification {_json_str(spec)}: {reason}")
        self.spec = spec
        self.reason = reason


@dataclass(frozen=True)
class DataSpec:
    """A parsed specification: the name, the decoded query (``None`` without ``?``) and fragment
    (``None`` without ``#``)."""

    name: str
    query: Optional[Dict[str, str]] = None
    fragment: Optional[str] = None

    @property
    def bare(self) -> bool:
        """Whether the spec is a name alone."""
        return self.query is None and self.fragment is None


def _decode(s: str) -> str:
    if "%" not in s:
        return s
    raw = s.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25:  # '%'
            hexpart = raw[i + 1 : i + 3]
            if len(hexpart) != 2 or not all(chr(b) in _HEX for b in hexpart):
                got = raw[i : i + 3].decode("utf-8", "replace")
                raise ValueError(f"{_json_str(got)} at byte {i} is not '%' and two hex digits")
            out.append(int(hexpart, 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{_json_str(s)} percent-decodes to bytes that are not UTF-8") from None


def _query(raw: str) -> Dict[str, str]:
    pairs: Dict[str, str] = {}
    for part in raw.split("&"):
        kv = part.split("=")
        if len(kv) == 1:
            raise ValueError(f"the query part {_json_str(part)} has no '=' (write key=value)")
        if len(kv) > 2:
            raise ValueError(
                f"the query part {_json_str(part)} has more than one '='; write '=' in a key or value as %3D"
            )
        try:
            pairs[_decode(kv[0])] = _decode(kv[1])
        except ValueError as e:
            raise ValueError(f"in the query: {e}") from None
    return pairs


def parse_spec(spec: str) -> DataSpec:
    """Parses ``name[?query][#fragment]``; raises :class:`InvalidSpec`."""
    n = name_prefix(spec)
    if n == 0:
        if not spec:
            raise InvalidSpec(spec, f"it is empty; {NAME_RULE}")
        raise InvalidSpec(spec, f"the name cannot start with {_repr(spec[0])}; {NAME_RULE}")
    name, rest = spec[:n], spec[n:]
    query = None
    if rest.startswith("?"):
        after = rest[1:]
        end = after.find("#")
        end = len(after) if end < 0 else end
        try:
            query = _query(after[:end])
        except ValueError as e:
            raise InvalidSpec(spec, str(e)) from None
        rest = after[end:]
    fragment = None
    if rest.startswith("#"):
        after = rest[1:]
        if "\n" in after:
            raise InvalidSpec(spec, "the fragment holds a newline")
        try:
            fragment = _decode(after)
        except ValueError as e:
            raise InvalidSpec(spec, f"in the fragment: {e}") from None
        rest = ""
    if rest:
        raise InvalidSpec(
            spec,
            f"{_repr(rest[0])} after the name {_json_str(name)}: a name may be followed only by ?query or "
            f"#fragment; {NAME_RULE}",
        )
    return DataSpec(name, query, fragment)

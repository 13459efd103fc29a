"""DataSets.jl's rule for dataset names (its ``check_dataset_name``), as the Rust reference
(``handoff_data::name``) applies it.

A name is one or more segments separated by ``/`` or ``.``. Each segment starts with a letter or
a digit and goes on with letters, digits, ``-`` and ``_``. Letters and digits are Unicode's: the
general categories L and N, as PCRE's ``[[:alnum:]]`` in Julia's Unicode mode. One difference
from Julia: a name ends at the end of the string (Julia's ``$`` also lets a final newline
through).
"""

from __future__ import annotations

import unicodedata
from typing import Optional

__all__ = ["NAME_RULE", "check_name", "name_prefix", "is_alnum"]

#: The rule, in the words an error gives.
NAME_RULE = (
    "a dataset name is segments separated by '/' or '.', each starting with a letter or a digit and "
    "going on with letters, digits, '-' and '_' (DataSets.jl's rule)"
)


def is_alnum(c: str) -> bool:
    """A Unicode letter (L*) or number (N*), as ``[[:alnum:]]`` in PCRE's Unicode mode."""
    if c.isascii():
        return c.isalnum()
    return unicodedata.category(c)[0] in "LN"


def name_prefix(s: str) -> int:
    """How many characters at the start of ``s`` form a name (0 if none does)."""
    if not s or not is_alnum(s[0]):
        return 0
    end = 1
    for i in range(1, len(s)):
        c = s[i]
        if c in "-_" or is_alnum(c):
            end = i + 1
        elif c in "./" and i + 1 < len(s) and is_alnum(s[i + 1]):
            end = i + 1  # a separator counts only when a letter or digit follows it
        else:
            break
    return end


def _repr(c: str) -> str:
    """A character in quotes, control characters escaped (as the Rust reference writes it)."""
    return repr(c)


def check_name(name: str) -> Optional[str]:
    """``None`` if ``name`` follows the rule, else what is wrong with it."""
    n = name_prefix(name)
    if n == len(name) and n > 0:
        return None
    if not name:
        why = "it is empty"
    elif n == 0:
        why = f"it starts with {_repr(name[0])}"
    else:
        why = f"{_repr(name[n])} at byte {len(name[:n].encode('utf-8'))} breaks it"
    return f"{_json_str(name)} is not a valid dataset name: {why}; {NAME_RULE}"


def _json_str(s: str) -> str:
    import json

    return json.dumps(s, ensure_ascii=False)

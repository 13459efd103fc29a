"""The bounds on the identity fields of a ``hello`` or an ``ident`` (spec §5.2, "Lengths").

What a node learns about its peers — and repeats in answers such as
``handoff.admin.Stats`` — stays small whatever a peer claims: each identity field has a
bound in UTF-8 bytes, in every version. The bound is part of the field's type, as a
fixed length is: a decoder refuses a longer field with ``malformed-header`` as it checks
the types of the known keys, whatever the kind (§6 rule 3, §11.2 step 2), as the
reference does; a node refuses to start with an identity of its own that breaks a bound.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["IDENTITY_BOUNDS", "MAX_CAPS", "MAX_CAP_BYTES", "check_identity", "field_problem"]

#: The most UTF-8 bytes of each bounded str field (§5.2).
IDENTITY_BOUNDS: dict = {
    "node": 64,
    "proc": 64,
    "name": 256,
    "host": 256,
    "lang": 32,
    "impl": 128,
    "listen": 1024,
    "unix": 1024,
}
#: The most entries of ``caps``, and the most UTF-8 bytes of each (§5.2).
MAX_CAPS = 32
MAX_CAP_BYTES = 64


def _utf8_len_over(text: str, bound: int) -> Optional[int]:
    """The UTF-8 length of ``text`` if it is over ``bound``, else ``None`` (without encoding
    a text that cannot be over: a character is 1 to 4 bytes)."""
    if len(text) * 4 <= bound:
        return None
    n = len(text.encode("utf-8", "surrogatepass"))
    return n if n > bound else None


def field_problem(key: str, value: Any) -> Optional[str]:
    """What is wrong with the identity field ``key`` holding ``value`` (a str, or for
    ``caps`` a list of str), or ``None`` if it is within its bound or not a bounded field."""
    if key == "caps":
        if len(value) > MAX_CAPS:
            return f"caps has {len(value)} entries, at most {MAX_CAPS} are allowed"
        for i, cap in enumerate(value):
            n = _utf8_len_over(cap, MAX_CAP_BYTES)
            if n is not None:
                return f"caps entry {i} is {n} bytes long, at most {MAX_CAP_BYTES} are allowed"
        return None
    bound = IDENTITY_BOUNDS.get(key)
    if bound is None or value is None:
        return None
    n = _utf8_len_over(value, bound)
    if n is not None:
        return f"{key} is {n} bytes long, at most {bound} are allowed"
    return None


def check_identity(who: Any) -> None:
    """Raises ``ValueError`` naming the first field of ``who`` (a ``Hello`` or an ``Ident``,
    or anything with those attributes) that breaks its bound, in table order."""
    for key in ("node", "name", "host", "proc", "lang", "impl", "caps", "listen", "unix"):
        problem = field_problem(key, getattr(who, key, None))
        if problem is not None:
            raise ValueError(f"this node's identity is too long for the wire format (spec §5.2): {problem}")

"""Values a decoded body holds that msgpack's own types do not say (spec §2, §8): an ext
value no reader turned into something else (:class:`Ext`), and a str whose bytes are not
UTF-8 (:class:`BadStr`), kept as the reference's generic reader keeps them. Both readers
of bodies make them: the engine's (``handoff._native.BodyReader``) and the pure-Python
reference's (``handoff_pure.body``)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Ext", "BadStr"]


class Ext(NamedTuple):
    """A msgpack extension value that no reader turned into something else."""

    code: int
    data: bytes


class BadStr(bytes):
    """A msgpack str whose bytes are not UTF-8 (kept, when reading leniently, so that a
    header key or ignored value like that can be ignored, as the reference does)."""

    __slots__ = ()

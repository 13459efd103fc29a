"""Encoding headers and messages in the canonical form of spec §2, for the pure-Python reference."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from handoff.wire.encode import packer
from handoff.wire.headers import Ident, Msg, TicketDesc

from .framing import frame_header
from .headers import Header, identity_map

__all__ = ["encode_header", "encode_message", "frame_plain_msg", "to_map"]

_LEN = struct.Struct(">I")
#: ``{"k": "msg", "t": `` and ``, "f": []}`` as :func:`encode_header` writes them.
_MSG_HEAD = b"\x84\xa1k\xa3msg\xa1t"
_MSG_B = b"\xa1b"
_MSG_TAIL = b"\xa1f\x90"


def to_map(header: Any) -> dict:
    """The canonical map (§2) of a header or descriptor: the reference's own types say it
    (``to_map()``); the ones :mod:`handoff.wire` names are written here."""
    if isinstance(header, Msg):
        return {"k": "msg", "t": header.t, "b": header.b, "f": [to_map(d) for d in header.f]}
    if isinstance(header, Ident):
        return identity_map("ident", header, {"caps": list(header.caps)})
    if isinstance(header, TicketDesc):
        m: dict = {"k": "ticket", "n": header.n, "owner": header.owner}
        if header.addr is not None:
            m["addr"] = header.addr
        m.update(lease=header.lease, token=bytes(header.token))
        if header.xxh3 is not None:
            m["xxh3"] = bytes(header.xxh3)
        else:
            m["digest"] = bytes(header.digest)
        m["ttl"] = header.ttl
        if header.lazy:
            m["lazy"] = True
        return m
    return header.to_map()


def encode_header(header: Header) -> bytes:
    """The header's msgpack bytes (without the length prefix), canonical."""
    return packer().pack(to_map(header))


def frame_plain_msg(type_name: str, body: bytes) -> bytes:
    """``frame_header(encode_header(Msg(type_name, body, [])))``, written directly: the
    canonical map of ``k``, ``t``, ``b`` and an empty ``f``, each value packed by the
    same packer (the tests check both give the same bytes)."""
    p = packer()
    h = b"".join((_MSG_HEAD, p.pack(type_name), _MSG_B, p.pack(body), _MSG_TAIL))
    return _LEN.pack(len(h)) + h


def encode_message(header: Header, frames: Iterable[bytes] = ()) -> bytes:
    """A whole message in one byte string (for small messages and tests)."""
    return frame_header(encode_header(header)) + b"".join(bytes(f) for f in frames)

"""The handoff wire format, versions 1, 2 and 3 (spec/WIRE.md): its types and encoding.

What the Python API names of the wire format: the headers and descriptors it names (a
ticket's description, an identity, a message: §6, §7), the limits a node sets (§9), the
error codes (§11), and the canonical packer of §2. Preambles and headers are read and
written, and the handshake is run, by the engine (``handoff_proto``); the pure-Python
reference's preamble, fixed limits, identity bounds, other headers, framing, decoder and
authentication proofs are ``handoff_pure.wire``.

One module per job, each importing only those above it in this list:

- :mod:`.errors` — :class:`WireError`;
- :mod:`.limits` — :class:`Limits`, and the nesting limit of a body (§9);
- :mod:`.headers` — ``TicketDesc``, ``Ident`` and ``Msg`` as dataclasses (§6, §7);
- :mod:`.encode` — the canonical packer (§2).
"""

from .encode import packer
from .errors import WireError
from .headers import Ident, Msg, TicketDesc
from .limits import DEFAULT_LIMITS, MAX_BODY_DEPTH, MAX_HASHED_KEYS, Limits

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_BODY_DEPTH",
    "MAX_HASHED_KEYS",
    "Ident",
    "Limits",
    "Msg",
    "TicketDesc",
    "WireError",
    "packer",
]  # fmt: skip

"""The handoff wire format, versions 1, 2 and 3 (spec/WIRE.md): its types and encoding.

What the Python API names of the wire format: the preamble (§3), the headers and
descriptors it names (a ticket's description, an identity, a message: §6, §7), the
identity bounds (§5.2), limits (§9), the error codes (§11), and the canonical packer of
§2. Headers are read and written, and the handshake is run, by the engine
(``handoff_proto``); the pure-Python reference's other headers, framing, decoder and
authentication proofs are ``handoff_pure.wire``.

One module per job, each importing only those above it in this list:

- :mod:`.errors` — :class:`WireError`;
- :mod:`.limits` — :class:`Limits` and the fixed limits of §9;
- :mod:`.preamble` — the preamble and version negotiation (§3);
- :mod:`.identity` — the bounds on the identity fields of a hello or an ident (§5.2);
- :mod:`.headers` — ``TicketDesc``, ``Ident`` and ``Msg`` as dataclasses (§6, §7);
- :mod:`.encode` — the canonical packer (§2).
"""

from .encode import packer
from .errors import WireError
from .headers import Ident, Msg, TicketDesc
from .limits import (
    DEFAULT_LIMITS,
    HANDSHAKE_HEADER_BYTES,
    MAX_BODY_DEPTH,
    MAX_HEADER_DEPTH,
    MAX_HEADER_VALUES,
    HANDSHAKE_HEADER_VALUES,
    MAX_MAP_ENTRIES,
    Limits,
)
from .identity import IDENTITY_BOUNDS, MAX_CAPS, MAX_CAP_BYTES, check_identity
from .preamble import (
    ACCEPTING_V1,
    ACCEPTING_V2,
    MAGIC,
    MAX_VERSION,
    MIN_VERSION,
    OUR_PREAMBLE,
    PREAMBLE_LEN,
    V1_ONLY,
    V2_ACCEPTING_V1,
    V2_DEFAULT,
    Preamble,
    our_preamble,
)

__all__ = [
    "ACCEPTING_V1",
    "ACCEPTING_V2",
    "DEFAULT_LIMITS",
    "HANDSHAKE_HEADER_BYTES",
    "IDENTITY_BOUNDS",
    "MAGIC",
    "MAX_BODY_DEPTH",
    "MAX_CAPS",
    "MAX_CAP_BYTES",
    "MAX_HEADER_DEPTH",
    "MAX_HEADER_VALUES",
    "HANDSHAKE_HEADER_VALUES",
    "MAX_MAP_ENTRIES",
    "MAX_VERSION",
    "MIN_VERSION",
    "OUR_PREAMBLE",
    "PREAMBLE_LEN",
    "V1_ONLY",
    "V2_ACCEPTING_V1",
    "V2_DEFAULT",
    "Ident",
    "Limits",
    "Msg",
    "Preamble",
    "TicketDesc",
    "WireError",
    "check_identity",
    "our_preamble",
    "packer",
]  # fmt: skip

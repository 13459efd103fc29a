"""The handoff wire format, versions 1, 2 and 3 (spec/WIRE.md): its types and encoding.

What the Python API names of the wire format: the preamble (§3), message framing (§4),
every header kind (§6) and frame descriptor (§7) as dataclasses, the identity bounds
(§5.2), limits (§9), the error codes (§11), and the canonical encoding of §2 (smallest
encodings, keys in the order of §6/§7, optional keys omitted), so that the bytes equal
the reference's. Headers are read and the handshake is run by the engine
(``handoff_proto``); the pure-Python reference's decoder and authentication proofs are
``handoff_pure.wire``.

One module per job, each importing only those above it in this list:

- :mod:`.errors` — :class:`WireError`;
- :mod:`.limits` — :class:`Limits` and the fixed limits of §9;
- :mod:`.preamble` — the preamble and version negotiation (§3);
- :mod:`.identity` — the bounds on the identity fields of a hello or an ident (§5.2);
- :mod:`.headers` — headers and descriptors as dataclasses (§6, §7);
- :mod:`.framing` — the length prefix (§4);
- :mod:`.encode` — canonical encoding (§2).
"""

from .encode import encode_header, encode_message, frame_plain_msg, packer
from .errors import WireError
from .framing import LEN_PREFIX, frame_header, header_length
from .headers import (
    DESCRIPTOR_KINDS,
    HEADER_KINDS,
    TCP_KINDS,
    TICKET_OPS,
    UNIX_KINDS,
    Auth,
    Challenge,
    Descriptor,
    Error,
    Forward,
    Forwarded,
    Header,
    Hello,
    Ident,
    Inline,
    Msg,
    Pull,
    Pulled,
    Ready,
    Release,
    Renew,
    Shm,
    Tag,
    TicketDesc,
    TicketError,
    Unlease,
)
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
    "DESCRIPTOR_KINDS",
    "HANDSHAKE_HEADER_BYTES",
    "HEADER_KINDS",
    "IDENTITY_BOUNDS",
    "LEN_PREFIX",
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
    "TCP_KINDS",
    "TICKET_OPS",
    "UNIX_KINDS",
    "V1_ONLY",
    "V2_ACCEPTING_V1",
    "V2_DEFAULT",
    "Auth",
    "Challenge",
    "Descriptor",
    "Error",
    "Forward",
    "Forwarded",
    "Header",
    "Hello",
    "Ident",
    "Inline",
    "Limits",
    "Msg",
    "Preamble",
    "Pull",
    "Pulled",
    "Ready",
    "Release",
    "Renew",
    "Shm",
    "Tag",
    "TicketDesc",
    "TicketError",
    "Unlease",
    "WireError",
    "check_identity",
    "encode_header",
    "encode_message",
    "frame_header",
    "frame_plain_msg",
    "header_length",
    "our_preamble",
    "packer",
]  # fmt: skip

"""The handoff wire format, versions 1, 2 and 3 (spec/WIRE.md), sans I/O.

Everything here works on bytes in memory: the preamble (§3), message framing (§4),
the handshake's headers and the authentication proof (§5), every header kind (§6),
frame descriptors (§7), limits (§9) and the error codes (§11). The node
(``handoff.node``) does the reading and writing around it.

Decoding follows the order of checks of §11.2, so that the first failing check names
the error, exactly as the test vectors expect. Encoding writes the canonical form of
§2 (smallest encodings, keys in the order of §6/§7, optional keys omitted), so that
the bytes equal the reference's.

One module per job, each importing only those above it in this list:

- :mod:`.errors` — :class:`WireError`;
- :mod:`.limits` — :class:`Limits` and the fixed limits of §9;
- :mod:`.preamble` — the preamble and version negotiation (§3);
- :mod:`.identity` — the bounds on the identity fields of a hello or an ident (§5.2);
- :mod:`.auth` — the authentication proofs (v1 §5.3, v2 §5.5, v3 §5.7);
- :mod:`.headers` — headers and descriptors as dataclasses (§6, §7);
- :mod:`.framing` — the length prefix (§4);
- :mod:`.reader` — a strict msgpack cursor for headers (§6 rules 1–5, §9);
- :mod:`.encode` — canonical encoding (§2);
- :mod:`.decode` — decoding and validation (§6, §7, §9, §11.2).
"""

from .auth import (
    AUTH_CONTEXT,
    AUTH_CONTEXT_V2,
    V3_ACCEPTOR_LABEL,
    V3_DIALER_LABEL,
    acceptor_proof,
    dialer_proof,
    proof,
    proof_v2,
    transcript_v3,
    verify,
    verify_acceptor_proof,
    verify_dialer_proof,
    verify_v2,
)
from .decode import (
    DESCRIPTOR_KEYS,
    HEADER_KEYS,
    DecodedMessage,
    carried_kinds,
    check_carried,
    decode_header,
    looks_plain,
    decode_message,
    unpack_header_value,
)
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
    "AUTH_CONTEXT",
    "AUTH_CONTEXT_V2",
    "DEFAULT_LIMITS",
    "DESCRIPTOR_KEYS",
    "DESCRIPTOR_KINDS",
    "HANDSHAKE_HEADER_BYTES",
    "HEADER_KEYS",
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
    "V3_ACCEPTOR_LABEL",
    "V3_DIALER_LABEL",
    "Auth",
    "Challenge",
    "DecodedMessage",
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
    "acceptor_proof",
    "carried_kinds",
    "check_identity",
    "check_carried",
    "decode_header",
    "looks_plain",
    "decode_message",
    "dialer_proof",
    "encode_header",
    "encode_message",
    "frame_header",
    "frame_plain_msg",
    "header_length",
    "our_preamble",
    "packer",
    "proof",
    "proof_v2",
    "transcript_v3",
    "unpack_header_value",
    "verify",
    "verify_acceptor_proof",
    "verify_dialer_proof",
    "verify_v2",
]  # fmt: skip

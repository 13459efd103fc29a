"""The pure-Python reference's wire format: :mod:`handoff.wire` (types, limits, encoding)
and what the reference adds to it, decoding and the authentication proofs, sans I/O.

Decoding follows the order of checks of §11.2, so that the first failing check names
the error, exactly as the test vectors expect. This package is the reference's own
reader: it never calls the extension (the engine reads headers with ``handoff_proto``).

- :mod:`.headers` — the headers and descriptors :mod:`handoff.wire` does not name (§6, §7);
- :mod:`.framing` — the length prefix (§4);
- :mod:`.encode` — encoding headers and messages (§2);
- :mod:`.auth` — the authentication proofs (v1 §5.3, v2 §5.5, v3 §5.7);
- :mod:`.reader` — a strict msgpack cursor for headers (§6 rules 1–5, §9);
- :mod:`.decode` — decoding and validation (§6, §7, §9, §11.2).
"""

from handoff.wire import *  # noqa: F401,F403  (the types, limits and encoding this package reads)
from handoff.wire import __all__ as _types

from .encode import encode_header, encode_message, frame_plain_msg, to_map
from . import identity as _identity
from . import limits as _limits
from . import preamble as _preamble
from .preamble import *  # noqa: F401,F403  (preambles and their negotiation, §3)
from .limits import *  # noqa: F401,F403  (the fixed header limits of §9)
from .identity import *  # noqa: F401,F403  (the bounds on identity fields, §5.2)
from .framing import LEN_PREFIX, frame_header, header_length, header_length_at
from .headers import (
    DESCRIPTOR_KINDS,
    HEADER_KINDS,
    TCP_KINDS,
    TICKET_OPS,
    UNIX_KINDS,
    UNIX_KINDS_WITH_CUDA,
    Auth,
    Challenge,
    Cuda,
    Descriptor,
    Error,
    Forward,
    Forwarded,
    Header,
    Hello,
    Inline,
    Pull,
    Pulled,
    Ready,
    Release,
    Renew,
    Shm,
    Tag,
    TicketError,
    Unlease,
    hello_of,
)
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

__all__ = [
    *_types,
    *_preamble.__all__,
    *_limits.__all__,
    *_identity.__all__,
    "DESCRIPTOR_KINDS",
    "HEADER_KINDS",
    "LEN_PREFIX",
    "TCP_KINDS",
    "TICKET_OPS",
    "UNIX_KINDS",
    "UNIX_KINDS_WITH_CUDA",
    "Auth",
    "Challenge",
    "Cuda",
    "Descriptor",
    "Error",
    "Forward",
    "Forwarded",
    "Header",
    "Hello",
    "Inline",
    "Pull",
    "Pulled",
    "Ready",
    "Release",
    "Renew",
    "Shm",
    "Tag",
    "TicketError",
    "Unlease",
    "encode_header",
    "encode_message",
    "frame_header",
    "frame_plain_msg",
    "to_map",
    "header_length",
    "header_length_at",
    "hello_of",
    "AUTH_CONTEXT",
    "AUTH_CONTEXT_V2",
    "V3_ACCEPTOR_LABEL",
    "V3_DIALER_LABEL",
    "acceptor_proof",
    "dialer_proof",
    "proof",
    "proof_v2",
    "transcript_v3",
    "verify",
    "verify_acceptor_proof",
    "verify_dialer_proof",
    "verify_v2",
    "DESCRIPTOR_KEYS",
    "HEADER_KEYS",
    "DecodedMessage",
    "carried_kinds",
    "check_carried",
    "decode_header",
    "looks_plain",
    "decode_message",
    "unpack_header_value",
]

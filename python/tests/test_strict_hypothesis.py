"""Property: every valid header, encoded in any valid way, decodes to the same header (spec §6:
"A decoder MUST accept every valid encoding of these types, canonical or not")."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from noncanonical import canonical, pack, randomly
from test_strict import _code_and_value, _with_noise, model_decode

from handoff_pure import wire


def u(bits: int):
    return st.integers(0, (1 << bits) - 1)


text = st.text(max_size=40)
# What a node says about itself has bounds in bytes (spec §5.2; `lang` the smallest, 32):
# 40 characters of text can be more in UTF-8.
ident = st.text(max_size=40).filter(lambda v: len(v.encode()) <= 32)
b32 = st.binary(min_size=32, max_size=32)

descriptor = st.one_of(
    st.builds(wire.Inline, u(32)),
    st.builds(
        lambda n, off, spare, lease, sealed: wire.Shm(n, off, off + n + spare, lease, sealed),
        u(32), u(40), u(40), u(64), st.booleans(),
    ),
    st.builds(
        wire.TicketDesc,
        n=u(32), owner=text, lease=u(64), token=b32, digest=b32, ttl=u(64), addr=st.none() | text, lazy=st.booleans(),
    ),
    st.builds(wire.Tag, text),
)  # fmt: skip

header = st.one_of(
    st.builds(
        wire.Hello,
        node=ident, name=ident, host=ident, pid=u(32), proc=ident, lang=ident, impl=ident, v=u(16),
        caps=st.lists(ident, max_size=5), nonce=b32, listen=st.none() | text, unix=st.none() | text,
    ),
    st.builds(wire.Auth, b32),
    st.just(wire.Ready()),
    st.builds(wire.Msg, text, st.binary(max_size=300), st.lists(descriptor, max_size=4)),
    st.builds(wire.Error, text, text),
    st.builds(wire.Release, st.lists(u(64), max_size=20)),
    st.builds(wire.Pull, u(64), u(64), b32, u(64), u(64)),
    st.builds(wire.Pulled, u(64), u(32)),
    st.builds(wire.Forward, u(64), u(64), b32, text),
    st.builds(wire.Forwarded, u(64), b32),
    st.builds(wire.TicketError, u(64), text, text),
    st.builds(wire.Unlease, u(64), b32),
    st.builds(wire.Renew, u(64), b32),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(header, st.randoms(use_true_random=False))
def test_any_encoding_of_a_valid_header_decodes_to_it(h, rng):
    canonical_bytes = wire.encode_header(h)
    assert pack(wire.to_map(h), canonical) == canonical_bytes
    assert wire.decode_header(canonical_bytes) == h
    noisy = pack(_with_noise(wire.to_map(h), rng), randomly(rng), shuffle=True)
    assert wire.decode_header(noisy) == h


edit = st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255))


@settings(max_examples=300, deadline=None)
@given(header, st.randoms(use_true_random=False), st.lists(edit, min_size=1, max_size=4))
def test_the_decoder_agrees_with_the_model_on_damaged_headers(h, rng, edits):
    """Any bytes near a valid header: the streaming decoder and the plain model of the rules agree."""
    b = bytearray(pack(_with_noise(wire.to_map(h), rng), randomly(rng), shuffle=True))
    for op, at, byte in edits:
        at %= len(b) + 1
        if op == 0 and at < len(b):
            b[at] = byte
        elif op == 1:
            b[at:at] = bytes([byte])
        elif op == 2:
            del b[at : at + 1 + byte % 4]
        else:
            del b[at:]
    data = bytes(b)
    assert _code_and_value(wire.decode_header, data) == _code_and_value(model_decode, data)

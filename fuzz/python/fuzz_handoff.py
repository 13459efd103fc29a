"""Coverage-guided fuzz targets (atheris, libFuzzer's engine) for the Python peer's decoders.

    python fuzz/python/fuzz_handoff.py TARGET [libFuzzer flags and corpus folders]

TARGET is one of:

- ``preamble``: ``Preamble.decode`` (and ``negotiate``) of arbitrary bytes;
- ``header``: ``decode_header`` of arbitrary bytes (the header after its length prefix), under
  the default limits and the handshake's (a 64 KiB header); a header that decodes re-encodes
  (``encode_header``) to bytes that decode to the same header and encode to the same bytes;
- ``message``: ``decode_message`` of arbitrary bytes as a TCP connection and a Unix socket
  carry them (``TCP_KINDS``, ``UNIX_KINDS``), under both limits; a message that decodes uses
  no more bytes than given, its frames are the inline descriptors' bytes, and written again
  (``encode_message``) it decodes to the same message;
- ``body``: ``handoff.codec.decode_body`` of ``[n][body…]`` with the first ``n % 4`` of three
  frames, without a registry or (bit 2 of ``n`` set) with one (``Resources`` with keys, a
  resolver and a data source, so resource keys bind and data handles resolve).

The Python decoders are slow under instrumentation, so each input is decoded once: the
input's length picks the limits (and for ``message`` the channel), and ``n`` the registry.

A decoder may raise ``WireError`` with a code its step of spec/WIRE.md §11.2 can produce; any
other exception, a wrong code or a broken invariant is a finding (atheris writes the input to
``crash-…`` in the artifact folder). scripts/fuzz runs these; only names that ``handoff_pure.wire``
and ``handoff.codec`` export are used, so a change of the modules' layout does not break them.

With ``HANDOFF_FUZZ_BODY_SEEDS=DIR`` the body target first writes seed bodies made by
``encode_body`` into DIR.
"""

from __future__ import annotations

import functools
import os
import sys

import atheris

with atheris.instrument_imports(include=["handoff", "handoff_pure"]):
    from handoff import codec as codec_module
    from handoff.codec import Buffer, decode_body, encode_body
    from handoff_pure import body as reference_body
    from handoff_pure.wire.decode import decode_header_strict
    from handoff.resources import ResourceKey, Resources
    from handoff.route import RouteError
    from handoff.spilled import SpilledFile
    from handoff_pure.wire import (
        DEFAULT_LIMITS,
        TCP_KINDS,
        UNIX_KINDS,
        Inline,
        Limits,
        Msg,
        Preamble,
        Pulled,
        WireError,
        decode_header,
        decode_message,
        during_handshake,
        encode_header,
        encode_message,
    )

#: The limits of an established connection, and those of the handshake (a 64 KiB header, §9).
LIMITS = (DEFAULT_LIMITS, during_handshake(DEFAULT_LIMITS))

PREAMBLE_CODES = {"truncated", "bad-magic", "handshake", "unsupported-version"}
HEADER_CODES = {
    "malformed-header",
    "unknown-kind",
    "too-many-frames",
    "unknown-descriptor",
    "frame-too-large",
    "message-too-large",
    "header-too-large",
    "handshake",
}
MESSAGE_CODES = HEADER_CODES | {"truncated", "unsupported-descriptor"}
BODY_CODES = {"bad-body", "bad-frame-ref", "unknown-resource"}


class Finding(AssertionError):
    """A decoder broke a rule the fuzzer checks."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Finding(message)


def expect_code(error: WireError, allowed: set, what: str) -> None:
    str(error)
    expect(error.code in allowed, f"{what}: unexpected error code {error.code!r} ({error})")


# --------------------------------------------------------------------------- preamble


def preamble(data: bytes) -> None:
    try:
        p = Preamble.decode(data)
    except WireError as e:
        expect_code(e, PREAMBLE_CODES, "Preamble.decode")
        return
    expect(p.encode() == data[:16], "a preamble re-encodes to other bytes")
    try:
        v = Preamble().negotiate(p)
    except WireError as e:
        expect_code(e, PREAMBLE_CODES, "negotiate")
        return
    expect(p.min_version <= v <= p.max_version, f"negotiated {v} outside {p}")


# --------------------------------------------------------------------------- header and message


def check_header(header, limits: Limits) -> None:
    encoded = encode_header(header)
    try:
        again = decode_header(encoded, limits)
    except WireError as e:
        raise Finding(f"a decoded header re-encodes to bytes that do not decode: {e}\n{header!r}") from None
    expect(again == header, f"a decoded header re-encodes to a different header:\n{header!r}\n{again!r}")
    expect(encode_header(again) == encoded, "the header encoding is not canonical")


def header(data: bytes) -> None:
    # One decode per input (the Python decoder is slow under instrumentation): the length's
    # parity picks the limits, so both are fuzzed and a finding reproduces from its bytes.
    limits = LIMITS[len(data) % 2]
    try:
        h = decode_header(data, limits)
    except WireError as e:
        expect_code(e, HEADER_CODES, "decode_header")
        # The path for plain msg headers refuses nothing: the two passes alone decide.
        return
    repr(h)
    check_header(h, limits)
    if data[:1] == b"\x84":  # where the path for plain msg headers may have read it
        try:
            strict = decode_header_strict(data, limits)
        except WireError as e:
            raise Finding(f"the fast path read a header the two passes refuse ({e}): {h!r}") from None
        expect(strict == h, f"the fast path and the two passes read it differently:\n{h!r}\n{strict!r}")


def message(data: bytes) -> None:
    # As in header(): the length picks the limits and the channel, one decode per input.
    limits = LIMITS[len(data) % 2]
    carried = (TCP_KINDS, UNIX_KINDS)[len(data) // 2 % 2]
    try:
        m = decode_message(data, limits, carried)
    except WireError as e:
        expect_code(e, MESSAGE_CODES, "decode_message")
        return
    repr(m)
    expect(m.consumed <= len(data), "consumed more than the input")
    if isinstance(m.header, Msg):
        for d in m.header.f:
            expect(d.kind in carried, f"a {d.kind} descriptor on a channel without it")
        expected = [d.n for d in m.header.f if isinstance(d, Inline)]
    elif isinstance(m.header, Pulled):
        expected = [m.header.n]
    else:
        expected = []
    got = [len(f) for f in m.frames]
    expect(got == expected, f"frame lengths {got} differ from the descriptors' {expected}")
    n = int.from_bytes(data[:4], "big")
    expect(m.consumed == 4 + n + sum(got), "frames do not end where the message does")
    check_header(m.header, limits)
    again = encode_message(m.header, [bytes(f) for f in m.frames])
    try:
        d = decode_message(again, limits, carried)
    except WireError as e:
        raise Finding(f"a decoded message written again does not decode: {e}") from None
    expect(d.header == m.header, "a message written again decodes to another header")
    expect([bytes(f) for f in d.frames] == [bytes(f) for f in m.frames], "... to other frames")
    expect(d.consumed == len(again), "... and uses other bytes")


# --------------------------------------------------------------------------- body

FRAMES = (b"", b"frame one", b"\x5a" * 4096)


class Pool:
    def __init__(self, size: int):
        self.size = size


class Catalog:
    """A data source (what a data handle binds to)."""

    def read(self, tag, start, end):  # pragma: no cover - never called by decoding
        return b""


def _resolve(key: str):
    if key.startswith("open:"):
        return Pool(len(key))
    if key.startswith("broken:"):
        raise RuntimeError("the fuzzer's resolver refuses it")
    return None


def _registry() -> Resources:
    r = Resources("fuzz")
    r.insert("db", Pool(4))
    r.insert("cache:reports", object())
    r.insert("catalog", Catalog())
    r.insert("text", "not a pool")
    r.add_resolver(_resolve, keys=["open:…", "broken:…"])
    return r


REGISTRY = _registry()


def body(data: bytes) -> None:
    if not data:
        return
    frames = [memoryview(f) for f in FRAMES[: data[0] % 4]]
    # Bit 2 of the first byte: decoded outside a node, or with the node's registry.
    resources = REGISTRY if data[0] & 4 else None
    try:
        value = decode_body(data[1:], frames, "fuzz.Value", resources)
    except WireError as e:
        expect_code(e, BODY_CODES, "decode_body")
        value = e
    except RouteError as e:
        # A route-aware value (a map under "handoff.route", such as a SpilledFile) that its
        # decoder refused: a clear error for this message, as WireError is for the others.
        value = e
    # The reader in use (the engine's, or the reference's C pass of bodies without
    # frames) and the reference's strict reader alone must decide alike (the same value,
    # or an error with the same code).
    reader, codec_module._reader = codec_module._reader, functools.partial(reference_body.read, fast=False)
    try:
        strict = decode_body(data[1:], frames, "fuzz.Value", resources)
    except (WireError, RouteError) as e:
        strict = e
    finally:
        codec_module._reader = reader
    if isinstance(value, Exception) or isinstance(strict, Exception):
        same = type(value) is type(strict) and getattr(value, "code", None) == getattr(strict, "code", None)
        expect(same, f"the reader in use and the strict reader disagree: {value!r} / {strict!r}")
    else:
        expect(
            repr(value) == repr(strict),
            f"the reader in use and the strict reader read other values: {value!r} / {strict!r}",
        )
    if isinstance(value, Exception):
        return
    repr(value)


def body_seeds() -> list:
    """Seed bodies made by the encoder: buffers, resource keys, a data handle, nesting."""
    handle = {
        "catalog": ResourceKey("catalog"),
        "tag": {"dataset": "0f" * 16, "name": "d", "path": "a/b", "size": 3},
        "fallback": Buffer(b"abc"),
    }
    values = [
        {"id": 7, "name": "job", "data": Buffer(b"x" * 9), "parts": [Buffer(b""), Buffer(b"\x5a" * 4096)]},
        {"pool": ResourceKey("db"), "cache": ResourceKey("cache:reports"), "open": ResourceKey("open:p")},
        {"blob": handle, "digest": b"\x00" * 32},
        [1, -1, 2**63, -(2**63), 1.5, True, None, "s", b"b", [[[{"k": [Buffer(b"q")]}]]]],
    ]
    # A route-aware value as it travels without a route (as to a remote peer: its bytes).
    values.append({"file": SpilledFile.write(b"spilled bytes", prefix="handoff-fuzz-seed-")})
    seeds = []
    for i, value in enumerate(values):
        encoded = encode_body(value)
        seeds.append((f"py-{i}", bytes([4 | (len(encoded.frames) % 4 or 3)]) + encoded.body))
    return seeds


TARGETS = {"preamble": preamble, "header": header, "message": message, "body": body}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer flags] [corpus folders]")
    name = sys.argv[1]
    seeds_dir = os.environ.get("HANDOFF_FUZZ_BODY_SEEDS")
    if name == "body" and seeds_dir:
        os.makedirs(seeds_dir, exist_ok=True)
        for seed_name, seed in body_seeds():
            path = os.path.join(seeds_dir, f"typed-{seed_name}")
            if not os.path.exists(path):
                with open(path, "wb") as f:
                    f.write(seed)
    atheris.Setup([sys.argv[0], *sys.argv[2:]], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()

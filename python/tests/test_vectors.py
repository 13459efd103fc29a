"""Every vector of spec/vectors/, checked as spec/vectors/README.md says (and as
crates/handoff-vectors/tests/vectors.rs does for the Rust reference)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from handoff_pure import wire
from handoff.codec import Buffer, decode_body, encode_body
from handoff.msgpack_values import Ext
from handoff_pure.msgpack_read import Pairs
from handoff.resources import ResourceKey
from handoff_pure.wire.identity import field_problem

#: spec/vectors/, or another set of vectors to check against (``HANDOFF_VECTORS=/path/to/vectors``).
VECTORS = Path(os.environ.get("HANDOFF_VECTORS") or Path(__file__).resolve().parents[2] / "spec" / "vectors")


def load_all():
    out = []
    for path in sorted(VECTORS.glob("*.json")):
        desc = json.loads(path.read_text())
        out.append((desc["name"], (VECTORS / desc["file"]).read_bytes(), desc))
    return out


ALL = load_all()
BY_NAME = {name: (data, desc) for name, data, desc in ALL}


class FrameRef:
    def __init__(self, index):
        self.index = index


def json_view(value):
    """The JSON view of README.md ("The JSON view of msgpack")."""
    if isinstance(value, Pairs):
        return {(k if isinstance(k, str) else str(k)): json_view(v) for k, v in value}
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(k)): json_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_view(v) for v in value]
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, FrameRef):
        return {"$frame": value.index}
    if isinstance(value, ResourceKey):
        return {"$resource": value.key}
    if isinstance(value, Ext):
        return {"$ext": value.code, "data": value.data.hex()}
    return value


def decode_to_json(data: bytes, desc: dict) -> dict:
    """Decodes a vector's bytes; returns the JSON result or raises WireError."""
    if desc["kind"] == "preamble":
        p = wire.Preamble.decode(data)
        # Negotiated by a side that sent the preamble `against` (a v1 one, or a v2 one).
        against = wire.Preamble(desc["against"]["min_version"], desc["against"]["max_version"])
        negotiated = against.negotiate(p)
        return {
            "decoded": {"min_version": p.min_version, "max_version": p.max_version, "flags": p.flags},
            "negotiated": negotiated,
        }
    unix = desc.get("channel") == "shm"
    # "caps": what the receiver announced; with "cuda" it takes cuda frames on a Unix socket (§7.10).
    cuda = "cuda" in desc.get("caps", ())
    # "stage": "handshake": read as before the connection is established (64 KiB, 1024 values).
    limits = wire.during_handshake(wire.DEFAULT_LIMITS) if desc.get("stage") == "handshake" else wire.DEFAULT_LIMITS
    m = wire.decode_message(data, limits, wire.carried_kinds(unix=unix, ticket=True, cuda=cuda))
    header = json_view(wire.unpack_header_value(m.header_bytes))
    # Keys a receiver ignores are not part of what the message decodes to, nor are known keys
    # whose value is nil (they count as absent), in the header and in its descriptors.
    header = {k: v for k, v in header.items() if not k.startswith("x-") and v is not None}
    if isinstance(header.get("f"), list):
        header["f"] = [{k: v for k, v in d.items() if v is not None} if isinstance(d, dict) else d for d in header["f"]]
    out = {"header": header, "frames": [{"$bin": bytes(f).hex()} for f in m.frames]}
    if isinstance(m.header, wire.Msg):
        refs = [FrameRef(i) for i in range(len(m.header.f))]
        out["body"] = json_view(decode_body(m.header.b, refs))
    return out


@pytest.mark.parametrize("name", [n for n, _, _ in ALL])
def test_vector(name):
    data, desc = BY_NAME[name]
    assert desc["name"] == name and desc["file"] == f"{name}.bin"
    if desc["valid"]:
        got = decode_to_json(data, desc)
        for key in ("header", "frames", "body", "decoded", "negotiated"):
            if key in desc:
                assert got[key] == desc[key], f"{name}: {key} differs"
    else:
        with pytest.raises(wire.WireError) as err:
            decode_to_json(data, desc)
        assert err.value.code == desc["error"], f"{name}: wrong error ({err.value})"


def test_stage_handshake_reads_with_the_handshake_header_limit():
    """A description with ``"stage": "handshake"`` is decoded with the 64 KiB limit of §5.1."""
    header = b"\x81\xa1k\xa5ready"
    header += b"\x00" * (wire.HANDSHAKE_HEADER_BYTES + 1 - len(header))  # trailing bytes: malformed
    data = wire.frame_header(header)
    for stage, code in ((None, "malformed-header"), ("handshake", "header-too-large")):
        desc = {"kind": "message", "stage": stage} if stage else {"kind": "message"}
        with pytest.raises(wire.WireError) as err:
            decode_to_json(data, desc)
        assert err.value.code == code


def test_the_full_set_is_there():
    assert len(ALL) >= 20
    assert sum(1 for _, _, d in ALL if not d["valid"]) >= 10


def _bin(j):
    return bytes.fromhex(j["$bin"])


def test_auth_vector_proofs_verify():
    data, desc = BY_NAME["auth"]
    a = desc["auth"]
    secret, prover, verifier = _bin(a["secret"]), _bin(a["prover_hello"]), _bin(a["verifier_hello"])
    mac = _bin(desc["header"]["mac"])
    assert wire.proof(secret, prover, verifier) == mac
    wire.verify(secret, mac, prover, verifier)
    wire.verify(secret, _bin(a["verifier_proof"]), verifier, prover)
    assert wire.proof(secret, verifier, prover) == _bin(a["verifier_proof"])
    for wrong in (b"wrong", secret + b"x", b""):
        with pytest.raises(wire.WireError) as err:
            wire.verify(wrong, mac, prover, verifier)
        assert err.value.code == "auth-failed"
    # A proof is bound to direction: reflecting it back fails.
    with pytest.raises(wire.WireError):
        wire.verify(secret, mac, verifier, prover)
    # The prover's hello is the `hello` vector without its prefix.
    assert prover == BY_NAME["hello"][0][4:]


def test_auth_v2_vector_proofs_verify():
    data, desc = BY_NAME["auth-v2"]
    a = desc["auth"]
    secret = _bin(a["secret"])
    pp, vp = _bin(a["prover_preamble"]), _bin(a["verifier_preamble"])
    pc, vc = _bin(a["prover_challenge"]), _bin(a["verifier_challenge"])
    mac = _bin(desc["header"]["mac"])
    assert wire.proof_v2(secret, pp, vp, pc, vc) == mac
    wire.verify_v2(secret, mac, pp, vp, pc, vc)
    wire.verify_v2(secret, _bin(a["verifier_proof"]), vp, pp, vc, pc)
    assert wire.proof_v2(secret, vp, pp, vc, pc) == _bin(a["verifier_proof"])
    for wrong in (b"wrong", secret + b"x", b""):
        with pytest.raises(wire.WireError) as err:
            wire.verify_v2(wrong, mac, pp, vp, pc, vc)
        assert err.value.code == "auth-failed"
    # Bound to direction, to the preambles as sent, and to its version.
    with pytest.raises(wire.WireError):
        wire.verify_v2(secret, mac, vp, pp, vc, pc)
    with pytest.raises(wire.WireError):
        wire.verify_v2(secret, mac, wire.V1_ONLY.encode(), vp, pc, vc)
    with pytest.raises(wire.WireError):
        wire.verify(secret, mac, pc, vc)
    # The inputs are the vectors: alpha's preamble and challenge, beta's preamble.
    assert pp == BY_NAME["preamble-v2"][0] and vp == BY_NAME["preamble-accept-v1"][0]
    assert pc == BY_NAME["challenge"][0][4:]
    assert wire.encode_header(wire.Challenge(2, bytes(range(100, 132)))) == vc


# ---------------------------------------------------------------- encoders reproduce the bytes


def hello_from(j) -> wire.Hello:
    return wire.Hello(
        node=j["node"],
        name=j["name"],
        host=j["host"],
        pid=j["pid"],
        proc=j["proc"],
        lang=j["lang"],
        impl=j["impl"],
        v=j["v"],
        caps=j["caps"],
        nonce=_bin(j["nonce"]),
        listen=j.get("listen"),
        unix=j.get("unix"),
    )


def descriptor_from(j):
    if j["k"] == "inline":
        return wire.Inline(j["n"])
    if j["k"] == "shm":
        return wire.Shm(j["n"], j["off"], j["size"], j["lease"], j["sealed"])
    if j["k"] == "ticket":
        return wire.TicketDesc(
            n=j["n"],
            owner=j["owner"],
            addr=j.get("addr"),
            lease=j["lease"],
            token=_bin(j["token"]),
            digest=_bin(j["digest"]),
            ttl=j["ttl"],
            lazy=j.get("lazy", False),
        )
    if j["k"] == "cuda":
        fields = ("n", "off", "lease", "token", "ipc", "device")
        return wire.Cuda(*(_bin(j[f]) if isinstance(j[f], dict) else j[f] for f in fields))
    raise AssertionError(j)


def header_from(j) -> wire.Header:
    k = j["k"]
    if k == "hello":
        return hello_from(j)
    if k == "challenge":
        return wire.Challenge(j["v"], _bin(j["nonce"]))
    if k == "ident":
        fields = ("node", "name", "host", "pid", "proc", "lang", "impl", "caps")
        return wire.Ident(*(j[f] for f in fields), listen=j.get("listen"), unix=j.get("unix"))
    if k == "auth":
        return wire.Auth(_bin(j["mac"]))
    if k == "ready":
        return wire.Ready()
    if k == "error":
        return wire.Error(j["code"], j["msg"])
    if k == "release":
        return wire.Release(j["leases"])
    if k == "msg":
        return wire.Msg(j["t"], _bin(j["b"]), [descriptor_from(d) for d in j["f"]])
    if k == "pull":
        return wire.Pull(j["req"], j["lease"], _bin(j["token"]), j["off"], j["n"])
    if k == "pulled":
        return wire.Pulled(j["req"], j["n"])
    if k == "forward":
        return wire.Forward(j["req"], j["lease"], _bin(j["token"]), j["to"])
    if k == "forwarded":
        return wire.Forwarded(j["req"], _bin(j["token"]))
    if k == "ticket-error":
        return wire.TicketError(j["req"], j["code"], j["msg"])
    if k == "unlease":
        return wire.Unlease(j["lease"], _bin(j["token"]))
    if k == "renew":
        return wire.Renew(j["lease"], _bin(j["token"]))
    raise AssertionError(k)


ENCODED_FROM_FIELDS = [
    "hello",
    "hello-same-host",
    "auth",
    "challenge",
    "ident",
    "ident-same-host",
    "auth-v2",
    "auth-v2-interleaved",
    "challenge-v3",
    "auth-v3-dialer",
    "auth-v3-acceptor",
    "auth-v3-reflected",
    "auth-v3-interleaved",
    "ident-name-at-limit",
    "ready",
    "error",
    "release",
    "msg-no-frames",
    "msg-shm-frame",
    "msg-shm-arena-window",
    "msg-ticket",
    "msg-ticket-lazy",
    "msg-resource-key",
    "msg-blob-handle",
    "msg-blob-handle-no-fallback",
    "msg-cuda",
    "ticket-pull",
    "ticket-pulled",
    "ticket-forward",
    "ticket-forwarded",
    "ticket-error",
    "ticket-unlease",
    "ticket-renew",
]


@pytest.mark.parametrize("name", ENCODED_FROM_FIELDS)
def test_encoder_reproduces(name):
    data, desc = BY_NAME[name]
    header = header_from(desc["header"])
    frames = [_bin(f) for f in desc["frames"]]
    assert wire.encode_message(header, frames) == data


@pytest.mark.parametrize(
    "name",
    [
        "preamble-v1",
        "preamble-newer-peer",
        "preamble-v2",
        "preamble-accept-v1",
        "preamble-v3",
        "preamble-accept-v2",
        "preamble-v3-meets-accept-v1",
    ],
)
def test_preamble_encoder_reproduces(name):
    data, desc = BY_NAME[name]
    d = desc["decoded"]
    assert wire.Preamble(d["min_version"], d["max_version"], d["flags"]).encode() == data


def test_our_preambles_are_the_vectors():
    """What this implementation sends: v3 only by default, 2..=3 when it accepts v2 peers,
    1..=3 when it accepts v1 peers; and what older implementations send, to play them."""
    assert wire.OUR_PREAMBLE.encode() == wire.our_preamble().encode() == BY_NAME["preamble-v3"][0]
    assert wire.our_preamble(accept_v2=True).encode() == BY_NAME["preamble-accept-v2"][0]
    assert wire.our_preamble(accept_v1=True).encode() == BY_NAME["preamble-v3-meets-accept-v1"][0]
    assert wire.V2_DEFAULT.encode() == BY_NAME["preamble-v2"][0]
    assert wire.V2_ACCEPTING_V1.encode() == BY_NAME["preamble-accept-v1"][0]
    assert wire.V1_ONLY.encode() == BY_NAME["preamble-v1"][0]


def test_msg_no_frames_body_from_value():
    data, _ = BY_NAME["msg-no-frames"]
    enc = encode_body({"seq": 7})
    assert enc.frames == []
    assert wire.encode_message(wire.Msg("handoff.Ping", enc.body, [])) == data


def test_msg_two_frames_from_value():
    data, _ = BY_NAME["msg-two-frames"]
    value = {"name": "blob", "seq": 300, "data": Buffer(b"hello world"), "meta": Buffer(bytes([0, 1, 2, 3]))}
    enc = encode_body(value)
    descs = [wire.Inline(f.nbytes) for f in enc.frames]
    assert wire.encode_message(wire.Msg("demo.Sample", enc.body, descs), enc.frames) == data
    # And back: frame references become the received frames.
    m = wire.decode_message(data)
    body = decode_body(m.header.b, m.frames)
    assert body["name"] == "blob" and body["seq"] == 300
    assert bytes(body["data"]) == b"hello world" and bytes(body["meta"]) == b"\x00\x01\x02\x03"
    assert isinstance(body["data"], memoryview)


def test_beta_hello_reproduces():
    _, desc = BY_NAME["auth"]
    beta = wire.Hello(
        node="00000000000000000000000000000001",
        name="beta",
        host="host-b",
        pid=7,
        proc="00000000000000000000000000000002",
        lang="python",
        impl="handoff-py/0.1.0",
        v=1,
        caps=["inline"],
        nonce=bytes(range(100, 132)),
    )
    assert wire.encode_header(beta) == _bin(desc["auth"]["verifier_hello"])


# ---------------------------------------------------------------- version 3 (WIRE.md §5.7, README "The version-3 proof vectors")

#: Every vector the revision of version 3 added (WIRE.md §13): each must be on disk.
V3_VECTORS = [
    "preamble-v3",
    "preamble-accept-v2",
    "preamble-v3-meets-accept-v2",
    "preamble-v2-peer-refused",
    "preamble-v3-meets-accept-v1",
    "challenge-v3",
    "auth-v3-dialer",
    "auth-v3-acceptor",
    "auth-v3-reflected",
    "auth-v3-interleaved",
    "auth-v2-interleaved",
    "ident-name-at-limit",
    "ident-name-too-long",
    "ident-too-many-caps",
    "hello-listen-too-long",
]
PROOF_V3 = ["auth-v3-dialer", "auth-v3-acceptor", "auth-v3-reflected", "auth-v3-interleaved"]


@pytest.mark.parametrize("name", V3_VECTORS)
def test_the_version_3_vectors_are_there(name):
    assert name in BY_NAME, f"vector {name} is missing from {VECTORS} (regenerate: cargo run -p handoff-vectors)"


def _v3_inputs(p: dict) -> tuple:
    secret = _bin(p["secret"])
    transcript = wire.transcript_v3(
        _bin(p["dialer_preamble"]),
        _bin(p["acceptor_preamble"]),
        _bin(p["dialer_challenge"]),
        _bin(p["acceptor_challenge"]),
    )
    return secret, transcript


def _verify_as(role: str, secret: bytes, mac: bytes, transcript: bytes, dialer_mac: bytes | None) -> None:
    if role == "dialer":
        wire.verify_dialer_proof(secret, mac, transcript)
    else:
        wire.verify_acceptor_proof(secret, mac, transcript, dialer_mac)


@pytest.mark.parametrize("name", PROOF_V3)
def test_proof_v3_vectors(name):
    assert name in BY_NAME, f"vector {name} is missing"
    _, desc = BY_NAME[name]
    p = desc["proof_v3"]
    role = p["role"]
    assert role in ("dialer", "acceptor")
    secret, transcript = _v3_inputs(p)
    mac = _bin(desc["header"]["mac"])
    dialer_mac = _bin(p["dialer_proof"]) if role == "acceptor" else None
    expected = (
        wire.dialer_proof(secret, transcript)
        if role == "dialer"
        else wire.acceptor_proof(secret, transcript, dialer_mac)
    )
    assert (expected == mac) is p["verifies"], name
    if not p["verifies"]:
        with pytest.raises(wire.WireError) as err:
            _verify_as(role, secret, mac, transcript, dialer_mac)
        assert err.value.code == "auth-failed"
        return
    _verify_as(role, secret, mac, transcript, dialer_mac)
    for wrong in (b"wrong", secret + b"x", b""):
        with pytest.raises(wire.WireError) as err:
            _verify_as(role, wrong, mac, transcript, dialer_mac)
        assert err.value.code == "auth-failed"
    # As the other role, it fails: the labels differ (for the dialer's proof, the acceptor's
    # check over it as the dialer proof; for the acceptor's, the dialer's check).
    with pytest.raises(wire.WireError):
        _verify_as("acceptor" if role == "dialer" else "dialer", secret, mac, transcript, mac)
    # And as a proof of version 2 or 1 over the same inputs.
    with pytest.raises(wire.WireError):
        wire.verify_v2(
            secret,
            mac,
            _bin(p["dialer_preamble"]),
            _bin(p["acceptor_preamble"]),
            _bin(p["dialer_challenge"]),
            _bin(p["acceptor_challenge"]),
        )
    with pytest.raises(wire.WireError):
        wire.verify(secret, mac, _bin(p["dialer_challenge"]), _bin(p["acceptor_challenge"]))


def test_the_v3_story():
    """The inputs are the other vectors: alpha (3..=3, `challenge-v3`) dials beta (2..=3,
    nonce 100..131); the acceptor's proof covers the dialer's; the reflected proof is alpha's."""
    dialer, acceptor = BY_NAME["auth-v3-dialer"][1], BY_NAME["auth-v3-acceptor"][1]
    for d in (dialer, acceptor, BY_NAME["auth-v3-reflected"][1]):
        p = d["proof_v3"]
        assert _bin(p["dialer_preamble"]) == BY_NAME["preamble-v3"][0]
        assert _bin(p["acceptor_preamble"]) == BY_NAME["preamble-accept-v2"][0]
        assert _bin(p["dialer_challenge"]) == BY_NAME["challenge-v3"][0][4:]
        assert _bin(p["acceptor_challenge"]) == wire.encode_header(wire.Challenge(3, bytes(range(100, 132))))
    assert BY_NAME["challenge-v3"][0] == wire.encode_message(wire.Challenge(3, bytes(range(32))))
    alpha = _bin(dialer["header"]["mac"])
    assert _bin(acceptor["proof_v3"]["dialer_proof"]) == alpha
    reflected = BY_NAME["auth-v3-reflected"][1]
    assert _bin(reflected["header"]["mac"]) == alpha, "alpha's own proof, sent back to alpha"
    # The transcript of the worked example: 152 bytes; the dialer's HMAC input 176.
    secret, transcript = _v3_inputs(dialer["proof_v3"])
    assert len(transcript) == 152 and len(wire.V3_DIALER_LABEL + transcript) == 176
    assert len(wire.V3_DIALER_LABEL) == 24 and len(wire.V3_ACCEPTOR_LABEL) == 26
    assert wire.V3_DIALER_LABEL[:12] != wire.V3_ACCEPTOR_LABEL[:12] != wire.AUTH_CONTEXT_V2[:12]


def test_the_v3_interleaving_vector_is_the_acceptors_proof_on_the_other_connection():
    """`auth-v3-interleaved`: N's acceptor proof on B (its challenges the other way round,
    over a dialer proof of 32 bytes of aa), presented on A as the dialer's proof."""
    _, desc = BY_NAME["auth-v3-interleaved"]
    p = desc["proof_v3"]
    secret = _bin(p["secret"])
    pre = _bin(p["dialer_preamble"])
    assert pre == _bin(p["acceptor_preamble"]) == wire.OUR_PREAMBLE.encode()
    on_a = (_bin(p["dialer_challenge"]), _bin(p["acceptor_challenge"]))
    assert wire.decode_header(on_a[0]).nonce == b"\x22" * 32 and wire.decode_header(on_a[1]).nonce == b"\x11" * 32
    on_b = wire.transcript_v3(pre, pre, on_a[1], on_a[0])
    assert wire.acceptor_proof(secret, on_b, b"\xaa" * 32) == _bin(desc["header"]["mac"])
    # The description says so itself: `written_as` holds B's inputs and the dialer proof the
    # mac covers, from which the mac is reproduced without the prose.
    w = p["written_as"]
    assert w["role"] == "acceptor"
    assert _bin(w["dialer_proof"]) == b"\xaa" * 32
    assert (_bin(w["dialer_challenge"]), _bin(w["acceptor_challenge"])) == (on_a[1], on_a[0])
    written = wire.transcript_v3(
        _bin(w["dialer_preamble"]),
        _bin(w["acceptor_preamble"]),
        _bin(w["dialer_challenge"]),
        _bin(w["acceptor_challenge"]),
    )
    assert written == on_b
    assert wire.acceptor_proof(secret, written, _bin(w["dialer_proof"])) == _bin(desc["header"]["mac"])


def test_the_v2_interleaving_vector_verifies():
    """`auth-v2-interleaved`: the §5.6 attack on version 2 works. N's own proof on B is the
    proof N expects from the attacker on A, and N's proof on A the one it expects on B."""
    _, desc = BY_NAME["auth-v2-interleaved"]
    a = desc["auth"]
    secret = _bin(a["secret"])
    pp, vp = _bin(a["prover_preamble"]), _bin(a["verifier_preamble"])
    pc, vc = _bin(a["prover_challenge"]), _bin(a["verifier_challenge"])
    mac = _bin(desc["header"]["mac"])
    assert pp == vp == wire.V2_DEFAULT.encode(), "the attacker sent N's own preamble"
    # On B, N's own challenge is what the attacker sent on A, and the attacker's is N's from A.
    assert wire.proof_v2(secret, vp, pp, pc, vc) == mac, "N wrote it, on B"
    wire.verify_v2(secret, mac, pp, vp, pc, vc)  # and accepts it on A
    forwarded = _bin(a["verifier_proof"])
    assert wire.proof_v2(secret, vp, pp, vc, pc) == forwarded, "N's proof on A"
    wire.verify_v2(secret, forwarded, pp, vp, vc, pc)  # accepted on B
    # The labels of version 3 defeat the same crossing.
    t = wire.transcript_v3(pp, vp, pc, vc)
    with pytest.raises(wire.WireError):
        wire.verify_dialer_proof(secret, mac, t)


@pytest.mark.parametrize("name", ["ident-name-too-long", "ident-too-many-caps", "hello-listen-too-long"])
def test_identity_length_vectors_break_exactly_one_bound(name):
    """Each invalid identity vector breaks a bound of §5.2 and nothing else: with the bounds
    lifted, it would decode."""
    assert name in BY_NAME, f"vector {name} is missing"
    data, desc = BY_NAME[name]
    assert not desc["valid"] and desc["error"] == "malformed-header"
    header = wire.unpack_header_value(data[4:])
    fields = dict(header)
    bounded = [k for k in fields if k in wire.IDENTITY_BOUNDS or k == "caps"]
    problems = [k for k in bounded if field_problem(k, fields[k])]
    assert len(problems) == 1, problems


def test_the_name_at_its_limit_is_256_bytes():
    _, desc = BY_NAME["ident-name-at-limit"]
    assert len(desc["header"]["name"].encode()) == wire.IDENTITY_BOUNDS["name"] == 256

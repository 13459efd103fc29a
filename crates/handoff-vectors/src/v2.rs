//! The vectors of protocol version 2 (`spec/WIRE.md` §3, §5.4, §5.5, §6.8, §6.9): its
//! preambles, the `challenge` and `ident` headers, the version-2 proof, and invalid
//! handshake headers. Every vector of version 1 holds in version 2 as well.

use handoff_wire::{auth, Header, Ident, Preamble};

/// What a version-2 implementation announces by default.
const V2: Preamble = Preamble::V2_ONLY;
/// What a version-2 implementation that accepts version-1 peers announces.
const V2_ACCEPTING_V1: Preamble = Preamble::range(1, 2);
use serde_json::{json, Value as Json};

use crate::fixtures::{
    bin_json, hello_fixture, hello_fixture_b, invalid, map, message, msgpack, preamble_vector, raw_message, s, Vector,
};

/// The secret of the `auth` and `auth-v2` vectors.
pub(crate) const SECRET: &[u8] = b"correct horse battery staple";

/// Alpha's identity: the fields of the `hello` vector but `v` and `nonce`.
pub(crate) fn ident_fixture() -> Ident {
    hello_fixture().ident()
}

pub(crate) fn ident_json(i: &Ident) -> Json {
    let mut j = json!({
        "k": "ident", "node": i.node_id, "name": i.name, "host": i.host_id, "pid": i.pid,
        "proc": i.process_id, "lang": i.language, "impl": i.implementation, "caps": i.capabilities,
    });
    if let Some(l) = &i.listen {
        j["listen"] = json!(l);
    }
    if let Some(u) = &i.unix {
        j["unix"] = json!(u);
    }
    j
}

/// The challenge of the side whose hello fixture is `nonce`'s: version 2.
fn challenge(nonce: &[u8]) -> Header<'static> {
    Header::Challenge {
        version: 2,
        nonce: nonce.to_vec(),
    }
}

pub(crate) fn valid_message(name: &'static str, header: &Header<'_>, view: Json, what: &str) -> Vector {
    Vector {
        name,
        bytes: message(header, &[]),
        description: json!({"kind": "message", "valid": true, "description": what, "header": view, "frames": []}),
    }
}

/// The identity fields of the `ident` vector as raw msgpack pairs, for the invalid ones.
pub(crate) fn ident_pairs() -> Vec<(&'static str, rmpv::Value)> {
    let i = ident_fixture();
    vec![
        ("k", s("ident")),
        ("node", s(&i.node_id)),
        ("name", s(&i.name)),
        ("host", s(&i.host_id)),
        ("pid", rmpv::Value::from(i.pid)),
        ("proc", s(&i.process_id)),
        ("lang", s(&i.language)),
        ("impl", s(&i.implementation)),
        ("caps", rmpv::Value::Array(vec![s("inline")])),
    ]
}

pub(crate) fn without(pairs: Vec<(&'static str, rmpv::Value)>, key: &str) -> Vec<(&'static str, rmpv::Value)> {
    pairs.into_iter().filter(|(k, _)| *k != key).collect()
}

pub(crate) fn raw(pairs: Vec<(&str, rmpv::Value)>) -> Vec<u8> {
    raw_message(&msgpack(&map(pairs)), &[])
}

/// Every vector of version 2, in a stable order.
pub(crate) fn vectors() -> Vec<Vector> {
    let mut v = vec![
        preamble_vector(
            "preamble-v2",
            V2,
            V2,
            "The preamble a version-2 implementation sends by default: version 2 only, so that a peer that has not proven the secret never gets a v1 hello out of it. Against itself: version 2.",
        ),
        preamble_vector(
            "preamble-accept-v1",
            V2_ACCEPTING_V1,
            Preamble::V1_ONLY,
            "The preamble of a version-2 node whose user accepts version-1 peers (1..=2), met by a version-1 implementation: both use version 1, whose hello reveals the node's identity before any proof.",
        ),
        preamble_vector(
            "preamble-v2-meets-accept-v1",
            V2_ACCEPTING_V1,
            V2,
            "A node that accepts version-1 peers (1..=2) meets a default version-2 node (2..=2): both use version 2.",
        ),
        preamble_vector(
            "preamble-v1-only-peer",
            Preamble::V1_ONLY,
            V2,
            "A version-1-only peer (1..=1) meets a default version-2 node (2..=2): no common version, on both sides alike.",
        ),
    ];

    let alpha = hello_fixture();
    let beta = hello_fixture_b();
    let alpha_challenge = challenge(&alpha.nonce);
    v.push(valid_message(
        "challenge",
        &alpha_challenge,
        json!({"k": "challenge", "v": 2, "nonce": bin_json(&alpha.nonce)}),
        "Alpha's challenge: the first message after the preambles in version 2, the version and a nonce, nothing about the sender.",
    ));
    let ident = ident_fixture();
    v.push(valid_message(
        "ident",
        &Header::Ident(ident.clone()),
        ident_json(&ident),
        "Alpha's ident: the identity fields of its hello, sent in version 2 only after it verified the peer's proof.",
    ));
    let same_host = Ident {
        capabilities: vec!["inline".into(), "shm".into()],
        unix: Some("unix:///run/user/1000/handoff/alpha-0123456789ab.sock".into()),
        ..ident.clone()
    };
    v.push(valid_message(
        "ident-same-host",
        &Header::Ident(same_host.clone()),
        ident_json(&same_host),
        "An ident from a node that offers shared memory: capability shm and its Unix socket.",
    ));

    // The version-2 proof: alpha sent 2..=2, beta (which accepts v1) 1..=2; they use v2.
    let (alpha_preamble, beta_preamble) = (V2.encode(), V2_ACCEPTING_V1.encode());
    let alpha_bytes = alpha_challenge.encode();
    let beta_bytes = challenge(&beta.nonce).encode();
    let alpha_sent = auth::Sent {
        preamble: &alpha_preamble,
        challenge: &alpha_bytes,
    };
    let beta_sent = auth::Sent {
        preamble: &beta_preamble,
        challenge: &beta_bytes,
    };
    let mac = auth::proof_v2(SECRET, alpha_sent, beta_sent);
    v.push(Vector {
        name: "auth-v2",
        bytes: message(&Header::Auth { mac: mac.to_vec() }, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The auth message alpha sends to beta in version 2. Its mac is HMAC-SHA256(secret, \"handoff-v2-auth\\0\" | alpha's preamble | beta's preamble | u32 len | alpha's challenge header | u32 len | beta's challenge header).",
            "header": {"k": "auth", "mac": bin_json(&mac)},
            "frames": [],
            "auth": {
                "secret": bin_json(SECRET),
                "prover_preamble": bin_json(&alpha_preamble),
                "verifier_preamble": bin_json(&beta_preamble),
                "prover_challenge": bin_json(&alpha_bytes),
                "verifier_challenge": bin_json(&beta_bytes),
                "verifier_proof": bin_json(&auth::proof_v2(SECRET, beta_sent, alpha_sent)),
            },
        }),
    });

    // The challenge in other valid encodings: keys reversed, map16, str8/str16, bin32, uint64.
    let mut noncanonical = vec![0xde, 0x00, 0x03];
    noncanonical.extend_from_slice(&[0xd9, 0x05]);
    noncanonical.extend_from_slice(b"nonce");
    noncanonical.extend_from_slice(&[0xc6, 0, 0, 0, 32]);
    noncanonical.extend_from_slice(&alpha.nonce);
    noncanonical.extend_from_slice(&[0xa1, b'v', 0xcf, 0, 0, 0, 0, 0, 0, 0, 2]);
    noncanonical.extend_from_slice(&[0xa1, b'k', 0xda, 0x00, 0x09]);
    noncanonical.extend_from_slice(b"challenge");
    v.push(Vector {
        name: "noncanonical-challenge",
        bytes: raw_message(&noncanonical, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The challenge of `challenge` in other encodings (keys reversed, map16, str8 key, str16 kind, bin32 nonce, uint64 v): the same header.",
            "header": {"k": "challenge", "v": 2, "nonce": bin_json(&alpha.nonce)}, "frames": [],
        }),
    });

    let challenge_pairs = |nonce: &[u8]| {
        vec![
            ("k", s("challenge")),
            ("v", rmpv::Value::from(2)),
            ("nonce", rmpv::Value::Binary(nonce.to_vec())),
        ]
    };
    v.push(invalid(
        "challenge-short-nonce",
        "message",
        raw(challenge_pairs(&alpha.nonce[..31])),
        "malformed-header",
        "A challenge whose nonce is 31 bytes: a nonce is exactly 32, in every kind.",
    ));
    v.push(invalid(
        "challenge-missing-nonce",
        "message",
        raw(without(challenge_pairs(&alpha.nonce), "nonce")),
        "malformed-header",
        "A challenge without its nonce.",
    ));
    // 7 values (the map, k, v, nonce with their keys), the ignored key and its array: 9, then nils.
    let mut bomb = challenge_pairs(&alpha.nonce);
    bomb.push(("x-pad", rmpv::Value::Array(vec![rmpv::Value::Nil; 1024 - 9 + 1])));
    let mut too_many = invalid(
        "challenge-too-many-values",
        "message",
        raw(bomb),
        "malformed-header",
        "A challenge of 1025 msgpack values (an ignored array of 1016 nils), read before the handshake completes: the most a peer that has proven nothing can send in version 2 is a challenge and an auth, each within the handshake limits.",
    );
    too_many.description["stage"] = json!("handshake");
    v.push(too_many);
    v.push(invalid(
        "ident-missing-node",
        "message",
        raw(without(ident_pairs(), "node")),
        "malformed-header",
        "An ident without `node`.",
    ));
    v.push(invalid(
        "ident-missing-caps",
        "message",
        raw(without(ident_pairs(), "caps")),
        "malformed-header",
        "An ident without `caps`.",
    ));
    let mut big_pid = ident_pairs();
    big_pid[4].1 = rmpv::Value::from(1u64 << 32);
    v.push(invalid(
        "ident-pid-too-large",
        "message",
        raw(big_pid),
        "malformed-header",
        "An ident whose pid is 2^32: `pid` is a u32, as in the hello.",
    ));
    v
}

//! The vectors of protocol version 3 (`spec/WIRE.md` §3, §5.6, §5.7, §5.2): its preambles,
//! its challenge, its two proofs and two proofs that must not verify, the attack on version
//! 2 that version 3 fixes, and the lengths of the identity fields. Every vector of versions
//! 1 and 2 holds in version 3 as well.

use handoff_wire::auth::{self, Role, Sent, Transcript};
use handoff_wire::identity_lengths as at_most;
use handoff_wire::{Header, Ident, Preamble};
use serde_json::{json, Value as Json};

use crate::fixtures::{bin_json, hello_fixture, hello_fixture_b, invalid, message, preamble_vector, s, Vector};
use crate::v2::{ident_fixture, ident_json, ident_pairs, raw, valid_message, SECRET};

/// A version-3 challenge with `nonce`.
fn challenge(nonce: &[u8]) -> Header<'static> {
    Header::Challenge {
        version: 3,
        nonce: nonce.to_vec(),
    }
}

/// An `auth` vector whose mac is checked as a version-3 proof of `role` over `transcript`
/// (and, for an acceptor's, answering `dialer_proof`).
fn proof_vector(
    name: &'static str,
    mac: [u8; 32],
    role: Role,
    transcript: &Transcript<'_>,
    dialer_proof: Option<[u8; 32]>,
    what: &str,
) -> Vector {
    let verifies = match role {
        Role::Dialer => auth::verify_dialer(SECRET, &mac, transcript).is_ok(),
        Role::Acceptor => auth::verify_acceptor(
            SECRET,
            &mac,
            transcript,
            &dialer_proof.expect("an acceptor answers a proof"),
        )
        .is_ok(),
    };
    let mut proof = inputs_json(role, transcript, dialer_proof);
    proof["secret"] = bin_json(SECRET);
    proof["verifies"] = json!(verifies);
    Vector {
        name,
        bytes: message(&Header::Auth { mac: mac.to_vec() }, &[]),
        description: json!({
            "kind": "message", "valid": true, "description": what,
            "header": {"k": "auth", "mac": bin_json(&mac)}, "frames": [], "proof_v3": proof,
        }),
    }
}

/// The inputs of a version-3 proof of `role` as the vectors write them: the role, the
/// transcript's four parts, and for an acceptor's proof the dialer's proof it covers.
fn inputs_json(role: Role, transcript: &Transcript<'_>, dialer_proof: Option<[u8; 32]>) -> Json {
    let mut inputs = json!({
        "role": role.as_str(),
        "dialer_preamble": bin_json(transcript.dialer.preamble),
        "acceptor_preamble": bin_json(transcript.acceptor.preamble),
        "dialer_challenge": bin_json(transcript.dialer.challenge),
        "acceptor_challenge": bin_json(transcript.acceptor.challenge),
    });
    if let Some(d) = dialer_proof {
        inputs["dialer_proof"] = bin_json(&d);
    }
    inputs
}

/// Every vector of version 3, in a stable order.
pub(crate) fn vectors() -> Vec<Vector> {
    let v2 = Preamble::V2_ONLY;
    let mut v = vec![
        preamble_vector(
            "preamble-v3",
            Preamble::OURS,
            Preamble::OURS,
            "The preamble a version-3 implementation sends by default: version 3 only, so that no peer can choose the reflectable proofs of versions 1 and 2 (WIRE.md §5.6). Against itself: version 3.",
        ),
        preamble_vector(
            "preamble-accept-v2",
            Preamble::ACCEPTING_V2,
            v2,
            "The preamble of a version-3 node whose user accepts version-2 peers (2..=3), met by a default version-2 implementation (2..=2): both use version 2, and with it the attack of WIRE.md §5.6.",
        ),
        preamble_vector(
            "preamble-v3-meets-accept-v2",
            Preamble::ACCEPTING_V2,
            Preamble::OURS,
            "A node that accepts version-2 peers (2..=3) meets a default version-3 node (3..=3): both use version 3.",
        ),
        preamble_vector(
            "preamble-v2-peer-refused",
            v2,
            Preamble::OURS,
            "A default version-2 peer (2..=2) meets a default version-3 node (3..=3): no common version, on both sides alike.",
        ),
        preamble_vector(
            "preamble-v3-meets-accept-v1",
            Preamble::ACCEPTING_V1,
            Preamble::OURS,
            "A version-3 node that accepts version-1 peers (1..=3) meets a default version-3 node: both use version 3.",
        ),
    ];

    // Alpha dials beta; alpha sent 3..=3, beta (which accepts v2) 2..=3; they use v3.
    let alpha = hello_fixture();
    let beta = hello_fixture_b();
    let alpha_challenge = challenge(&alpha.nonce);
    v.push(valid_message(
        "challenge-v3",
        &alpha_challenge,
        json!({"k": "challenge", "v": 3, "nonce": bin_json(&alpha.nonce)}),
        "Alpha's challenge in version 3: as in version 2, with `v` 3.",
    ));
    let (alpha_preamble, beta_preamble) = (Preamble::OURS.encode(), Preamble::ACCEPTING_V2.encode());
    let (alpha_bytes, beta_bytes) = (alpha_challenge.encode(), challenge(&beta.nonce).encode());
    let alpha_sent = Sent {
        preamble: &alpha_preamble,
        challenge: &alpha_bytes,
    };
    let beta_sent = Sent {
        preamble: &beta_preamble,
        challenge: &beta_bytes,
    };
    let t = Transcript::of(Role::Dialer, alpha_sent, beta_sent);
    let dialer = auth::dialer_proof(SECRET, &t);
    let acceptor = auth::acceptor_proof(SECRET, &t, &dialer);
    v.push(proof_vector(
        "auth-v3-dialer",
        dialer,
        Role::Dialer,
        &t,
        None,
        "Alpha dials beta: alpha's proof, HMAC-SHA256(secret, \"handoff-v3-dialer-proof\\0\" | transcript), where the transcript is alpha's preamble | beta's preamble | u32 len | alpha's challenge | u32 len | beta's challenge.",
    ));
    v.push(proof_vector(
        "auth-v3-acceptor",
        acceptor,
        Role::Acceptor,
        &t,
        Some(dialer),
        "Beta's answer, sent only after it verified alpha's: HMAC-SHA256(secret, \"handoff-v3-acceptor-proof\\0\" | transcript | alpha's proof).",
    ));
    v.push(proof_vector(
        "auth-v3-reflected",
        dialer,
        Role::Acceptor,
        &t,
        Some(dialer),
        "Alpha's own proof sent back to alpha as if it were beta's: a proof of one role never verifies as the other's.",
    ));

    // The attack of §5.6 against version 3: N's challenges on A and B crossed by the attacker.
    let n_preamble = Preamble::OURS.encode();
    let (on_a, on_b) = (challenge(&[0x11; 32]).encode(), challenge(&[0x22; 32]).encode());
    // On A the attacker dialed with N's challenge from B; on B with N's from A.
    let a = Transcript {
        dialer: sent(&n_preamble, &on_b),
        acceptor: sent(&n_preamble, &on_a),
    };
    let b = Transcript {
        dialer: sent(&n_preamble, &on_a),
        acceptor: sent(&n_preamble, &on_b),
    };
    // A dialer proof on B that the attacker cannot make (it has no secret): a stand-in.
    let unmakeable = [0xaa; 32];
    let n_on_b = auth::acceptor_proof(SECRET, &b, &unmakeable);
    let mut interleaved = proof_vector(
        "auth-v3-interleaved",
        n_on_b,
        Role::Dialer,
        &a,
        None,
        "The attack of WIRE.md section 5.6 against version 3: the attacker dialed node N twice and crossed N's challenges; the proof N would write as acceptor on connection B, presented on A as the dialer's proof, does not verify.",
    );
    // How the mac was made, so that it can be reproduced from the description alone: N's
    // acceptor proof over B's transcript and the dialer proof it covers.
    interleaved.description["proof_v3"]["written_as"] = inputs_json(Role::Acceptor, &b, Some(unmakeable));
    v.push(interleaved);

    // The same attack against version 2, which it breaks: N's proof on B verifies on A.
    let p2 = v2.encode();
    let (c2_a, c2_b) = (
        Header::Challenge {
            version: 2,
            nonce: vec![0x11; 32],
        }
        .encode(),
        Header::Challenge {
            version: 2,
            nonce: vec![0x22; 32],
        }
        .encode(),
    );
    // N's proof on B (own = its challenge on B, peer = the attacker's there, N's from A).
    let n_proof_on_b = auth::proof_v2(SECRET, sent(&p2, &c2_b), sent(&p2, &c2_a));
    // On A the attacker is the prover, with N's challenge from B as its own.
    let (prover, verifier) = (sent(&p2, &c2_b), sent(&p2, &c2_a));
    assert!(
        auth::verify_v2(SECRET, &n_proof_on_b, prover, verifier).is_ok(),
        "the attack works on v2"
    );
    v.push(Vector {
        name: "auth-v2-interleaved",
        bytes: message(&Header::Auth { mac: n_proof_on_b.to_vec() }, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The attack of WIRE.md section 5.6 against version 2: an attacker without the secret dialed node N twice (A and B) with N's own preamble and crossed N's challenges; this is N's proof on B, which the attacker forwards as its own on A, and which N accepts there. The reason version 2 is refused by default.",
            "header": {"k": "auth", "mac": bin_json(&n_proof_on_b)},
            "frames": [],
            "auth": {
                "secret": bin_json(SECRET),
                "prover_preamble": bin_json(prover.preamble),
                "verifier_preamble": bin_json(verifier.preamble),
                "prover_challenge": bin_json(prover.challenge),
                "verifier_challenge": bin_json(verifier.challenge),
                "verifier_proof": bin_json(&auth::proof_v2(SECRET, verifier, prover)),
            },
        }),
    });

    // The lengths of the identity fields (§5.2), at and past their bounds.
    let long_name = "n".repeat(at_most::NAME_BYTES as usize);
    let at_limit = Ident {
        name: long_name.clone(),
        ..ident_fixture()
    };
    v.push(valid_message(
        "ident-name-at-limit",
        &Header::Ident(at_limit.clone()),
        ident_json(&at_limit),
        "An ident whose name is 256 bytes, the most a name may have (WIRE.md section 5.2).",
    ));
    let mut too_long = ident_pairs();
    too_long[2].1 = s(&format!("{long_name}n"));
    v.push(invalid(
        "ident-name-too-long",
        "message",
        raw(too_long),
        "malformed-header",
        "An ident whose name is 257 bytes: the identity fields are bounded (WIRE.md section 5.2), so that what a node repeats about its peers stays small.",
    ));
    let mut many_caps = ident_pairs();
    many_caps[8].1 = rmpv::Value::Array((0..=at_most::CAPS).map(|i| s(&format!("cap{i}"))).collect());
    v.push(invalid(
        "ident-too-many-caps",
        "message",
        raw(many_caps),
        "malformed-header",
        "An ident with 33 capabilities: at most 32 (WIRE.md section 5.2).",
    ));
    let listen = format!("tcp://{}:7070", "h".repeat(at_most::ADDR_BYTES as usize));
    let hello = vec![
        ("k", s("hello")),
        ("node", s(&alpha.node_id)),
        ("name", s(&alpha.name)),
        ("host", s(&alpha.host_id)),
        ("pid", rmpv::Value::from(alpha.pid)),
        ("proc", s(&alpha.process_id)),
        ("lang", s(&alpha.language)),
        ("impl", s(&alpha.implementation)),
        ("v", rmpv::Value::from(1)),
        ("caps", rmpv::Value::Array(vec![s("inline")])),
        ("nonce", rmpv::Value::Binary(alpha.nonce.clone())),
        ("listen", s(&listen)),
    ];
    v.push(invalid(
        "hello-listen-too-long",
        "message",
        raw(hello),
        "malformed-header",
        "A version-1 hello whose listen address is over 1024 bytes: the bounds hold in every version (WIRE.md section 5.2).",
    ));
    v
}

/// What one side sent: its preamble and challenge.
fn sent<'a>(preamble: &'a [u8; 16], challenge: &'a [u8]) -> Sent<'a> {
    Sent { preamble, challenge }
}

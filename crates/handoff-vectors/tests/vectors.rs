//! Checks every vector in `spec/vectors/`: the files match the generator, and each
//! one decodes to what its JSON says (or fails with the error code it names).

use handoff_vectors::{all, decode_to_json, description_on_disk, json_view, vectors_dir, Vector};
use handoff_wire::auth::{self, Sent, Transcript};
use handoff_wire::framing::{decode_message_on, TCP_KINDS};
use handoff_wire::{Header, Limits, Preamble};
use serde_json::Value as Json;

fn on_disk() -> Vec<(String, Vec<u8>, Json)> {
    let dir = vectors_dir();
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("spec/vectors exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let json: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let bin = dir.join(json["file"].as_str().expect("file key"));
        let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        out.push((json["name"].as_str().unwrap().to_string(), bytes, json));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The bytes of a description's `{"$bin": hex}` value.
fn bin(v: &Json) -> Vec<u8> {
    hex::decode(v["$bin"].as_str().unwrap()).unwrap()
}

/// The preambles and challenges a v3 vector's transcript is made of, read from its JSON.
struct TranscriptInputs {
    preambles: ([u8; 16], [u8; 16]),
    challenges: (Vec<u8>, Vec<u8>),
}

impl TranscriptInputs {
    fn of(p: &Json) -> TranscriptInputs {
        let preamble = |key: &str| -> [u8; 16] { bin(&p[key]).try_into().expect("16 bytes") };
        TranscriptInputs {
            preambles: (preamble("dialer_preamble"), preamble("acceptor_preamble")),
            challenges: (bin(&p["dialer_challenge"]), bin(&p["acceptor_challenge"])),
        }
    }

    fn transcript(&self) -> Transcript<'_> {
        Transcript {
            dialer: Sent {
                preamble: &self.preambles.0,
                challenge: &self.challenges.0,
            },
            acceptor: Sent {
                preamble: &self.preambles.1,
                challenge: &self.challenges.1,
            },
        }
    }
}

#[test]
fn files_match_the_generator() {
    let disk = on_disk();
    let generated = all();
    assert_eq!(
        disk.len(),
        generated.len(),
        "spec/vectors is stale: run `cargo run -p handoff-vectors --bin gen-vectors`"
    );
    for v in &generated {
        let (_, bytes, json) = disk
            .iter()
            .find(|(n, _, _)| n == v.name)
            .unwrap_or_else(|| panic!("vector {} missing on disk: regenerate", v.name));
        assert_eq!(bytes, &v.bytes, "{}.bin differs from the generator: regenerate", v.name);
        assert_eq!(
            json,
            &description_on_disk(v),
            "{}.json differs from the generator",
            v.name
        );
    }
}

#[test]
fn every_vector_decodes_as_described() {
    let disk = on_disk();
    assert!(
        disk.len() >= 20,
        "expected the full set of vectors, found {}",
        disk.len()
    );
    let mut invalid = 0;
    for (name, bytes, json) in disk {
        let v = Vector {
            name: "on-disk",
            bytes,
            description: json.clone(),
        };
        let result = decode_to_json(&v);
        if json["valid"] == Json::Bool(true) {
            let got = result.unwrap_or_else(|e| panic!("{name}: valid vector failed to decode: {e}"));
            for key in ["header", "frames", "body", "decoded", "negotiated"] {
                if let Some(expected) = json.get(key) {
                    assert_eq!(&got[key], expected, "{name}: {key} differs");
                }
            }
        } else {
            invalid += 1;
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{name}: invalid vector decoded without error"));
            assert_eq!(
                err.code(),
                json["error"].as_str().unwrap(),
                "{name}: wrong error ({err})"
            );
        }
    }
    assert!(invalid >= 10, "expected invalid vectors too");
}

#[test]
fn auth_vector_proofs_verify() {
    let (_, _, json) = on_disk().into_iter().find(|(n, _, _)| n == "auth").unwrap();
    let a = &json["auth"];
    let secret = bin(&a["secret"]);
    let prover = bin(&a["prover_hello"]);
    let verifier = bin(&a["verifier_hello"]);
    let mac = bin(&json["header"]["mac"]);
    handoff_wire::auth::verify(&secret, &mac, &prover, &verifier).unwrap();
    handoff_wire::auth::verify(&secret, &bin(&a["verifier_proof"]), &verifier, &prover).unwrap();
    assert!(handoff_wire::auth::verify(b"wrong", &mac, &prover, &verifier).is_err());
}

#[test]
fn auth_v2_vector_proofs_verify() {
    let disk = on_disk();
    let bytes = |name: &str| disk.iter().find(|(n, _, _)| n == name).unwrap().1.clone();
    check_v2_proof(&disk.iter().find(|(n, _, _)| n == "auth-v2").unwrap().2);
    let a = &disk.iter().find(|(n, _, _)| n == "auth-v2").unwrap().2["auth"];
    // The inputs are the other vectors: alpha's preamble and challenge, beta's preamble.
    assert_eq!(bin(&a["prover_preamble"]), bytes("preamble-v2"));
    assert_eq!(bin(&a["verifier_preamble"]), bytes("preamble-accept-v1"));
    assert_eq!(bin(&a["prover_challenge"]), bytes("challenge")[4..].to_vec());
}

/// The attack of WIRE.md §5.6 on version 2 is real: the proof an attacker without the secret
/// got out of node N on one connection verifies as the attacker's on the other.
#[test]
fn the_v2_interleaving_attack_vector_verifies() {
    let disk = on_disk();
    let json = &disk.iter().find(|(n, _, _)| n == "auth-v2-interleaved").unwrap().2;
    check_v2_proof(json);
    let a = &json["auth"];
    assert_eq!(
        a["prover_preamble"], a["verifier_preamble"],
        "the attacker sent N's own preamble"
    );
}

/// Checks a vector's `auth` object as a version-2 proof.
fn check_v2_proof(json: &Json) {
    let a = &json["auth"];
    let secret = bin(&a["secret"]);
    let preamble = |key: &str| -> [u8; 16] { bin(&a[key]).try_into().expect("16 bytes") };
    let (pp, vp) = (preamble("prover_preamble"), preamble("verifier_preamble"));
    let (pc, vc) = (bin(&a["prover_challenge"]), bin(&a["verifier_challenge"]));
    let prover = Sent {
        preamble: &pp,
        challenge: &pc,
    };
    let verifier = Sent {
        preamble: &vp,
        challenge: &vc,
    };
    let mac = bin(&json["header"]["mac"]);
    assert_eq!(auth::proof_v2(&secret, prover, verifier).to_vec(), mac);
    auth::verify_v2(&secret, &mac, prover, verifier).unwrap();
    auth::verify_v2(&secret, &bin(&a["verifier_proof"]), verifier, prover).unwrap();
    assert!(auth::verify_v2(b"wrong", &mac, prover, verifier).is_err());
    assert!(auth::verify_v2(&secret, &mac, verifier, prover).is_err());
    let forged = Preamble::V1_ONLY.encode();
    let downgraded = Sent {
        preamble: &forged,
        ..prover
    };
    assert!(auth::verify_v2(&secret, &mac, downgraded, verifier).is_err());
    assert!(auth::verify(&secret, &mac, &pc, &vc).is_err(), "not a v1 proof");
}

/// The version-3 proofs (WIRE.md §5.7): the two that verify do so only as their own role and
/// with the secret; the reflected and interleaved ones do not verify at all.
#[test]
fn v3_proof_vectors_verify_exactly_as_described() {
    let disk = on_disk();
    let bytes = |name: &str| disk.iter().find(|(n, _, _)| n == name).unwrap().1.clone();
    let mut seen = Vec::new();
    for (name, _, json) in &disk {
        let Some(p) = json.get("proof_v3") else {
            continue;
        };
        seen.push(name.clone());
        let secret = bin(&p["secret"]);
        let inputs = TranscriptInputs::of(p);
        let t = inputs.transcript();
        let mac = bin(&json["header"]["mac"]);
        let verifies = p["verifies"].as_bool().expect("verifies");
        let (expected, as_role, as_other) = match p["role"].as_str() {
            Some("dialer") => (
                auth::dialer_proof(&secret, &t).to_vec(),
                auth::verify_dialer(&secret, &mac, &t),
                auth::verify_acceptor(&secret, &mac, &t, &mac),
            ),
            Some("acceptor") => {
                let d = bin(&p["dialer_proof"]);
                (
                    auth::acceptor_proof(&secret, &t, &d).to_vec(),
                    auth::verify_acceptor(&secret, &mac, &t, &d),
                    auth::verify_dialer(&secret, &mac, &t),
                )
            }
            other => panic!("{name}: role {other:?}"),
        };
        assert_eq!(expected == mac, verifies, "{name}");
        assert_eq!(as_role.is_ok(), verifies, "{name}");
        if let Err(e) = as_role {
            assert_eq!(e.code(), "auth-failed", "{name}");
        }
        if verifies {
            assert!(as_other.is_err(), "{name}: verifies as the other role too");
            assert!(auth::verify_dialer(b"wrong", &mac, &t).is_err());
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "auth-v3-acceptor",
            "auth-v3-dialer",
            "auth-v3-interleaved",
            "auth-v3-reflected"
        ],
        "the proof vectors"
    );
    // The story's inputs are the other vectors.
    let dialer = &disk.iter().find(|(n, _, _)| n == "auth-v3-dialer").unwrap().2["proof_v3"];
    assert_eq!(bin(&dialer["dialer_preamble"]), bytes("preamble-v3"));
    assert_eq!(bin(&dialer["acceptor_preamble"]), bytes("preamble-accept-v2"));
    assert_eq!(bin(&dialer["dialer_challenge"]), bytes("challenge-v3")[4..].to_vec());
    let acceptor = &disk.iter().find(|(n, _, _)| n == "auth-v3-acceptor").unwrap().2;
    assert_eq!(
        acceptor["proof_v3"]["dialer_proof"],
        disk.iter().find(|(n, _, _)| n == "auth-v3-dialer").unwrap().2["header"]["mac"]
    );
    // The interleaved mac is reproducible from its description: N's acceptor proof over B's
    // transcript (A's challenges the other way round) and the dialer proof it covers.
    let interleaved = &disk.iter().find(|(n, _, _)| n == "auth-v3-interleaved").unwrap().2;
    let (p, w) = (&interleaved["proof_v3"], &interleaved["proof_v3"]["written_as"]);
    assert_eq!(w["role"], "acceptor");
    assert_eq!(
        (&w["dialer_challenge"], &w["acceptor_challenge"]),
        (&p["acceptor_challenge"], &p["dialer_challenge"]),
        "B's challenges are A's crossed"
    );
    let inputs_b = TranscriptInputs::of(w);
    let on_b = inputs_b.transcript();
    assert_eq!(
        auth::acceptor_proof(&bin(&p["secret"]), &on_b, &bin(&w["dialer_proof"])).to_vec(),
        bin(&interleaved["header"]["mac"])
    );
}

/// What the reference sends is what the preamble vectors say.
#[test]
fn our_preambles_are_the_vectors() {
    let disk = on_disk();
    let bytes = |name: &str| disk.iter().find(|(n, _, _)| n == name).unwrap().1.clone();
    assert_eq!(Preamble::OURS.encode().to_vec(), bytes("preamble-v3"));
    assert_eq!(
        Preamble::ours(false, true).encode().to_vec(),
        bytes("preamble-accept-v2")
    );
    assert_eq!(
        Preamble::ours(true, false).encode().to_vec(),
        bytes("preamble-v3-meets-accept-v1")
    );
    assert_eq!(Preamble::V2_ONLY.encode().to_vec(), bytes("preamble-v2"));
    assert_eq!(Preamble::V1_ONLY.encode().to_vec(), bytes("preamble-v1"));
}

/// The limits and descriptor kinds a vector is decoded with (its `stage` and `channel`).
fn receiver(json: &Json) -> (Limits, &'static [&'static str]) {
    let limits = match json["stage"].as_str() {
        Some("handshake") => Limits::default().during_handshake(),
        None => Limits::default(),
        Some(other) => panic!("unknown stage {other:?}"),
    };
    (limits, handoff_vectors::receiver_kinds(json))
}

/// What the reference decoder built, not only what a generic msgpack reader sees: every
/// valid message vector's header, decoded and encoded again (canonically), has the JSON view
/// its description expects.
#[test]
fn decoded_headers_re_encode_to_the_expected_view() {
    let mut checked = 0;
    for (name, bytes, json) in on_disk() {
        if json["kind"] != "message" || json["valid"] != Json::Bool(true) {
            continue;
        }
        let (limits, kinds) = receiver(&json);
        let m = decode_message_on(&bytes, &limits, kinds).unwrap_or_else(|e| panic!("{name}: {e}"));
        let canonical = m.header.encode();
        let value = rmpv::decode::read_value(&mut &canonical[..]).expect("the reference encoder writes msgpack");
        assert_eq!(json_view(&value, None).unwrap(), json["header"], "{name}");
        checked += 1;
    }
    assert!(checked >= 29, "{checked} valid message vectors");
}

/// The non-canonical vectors decode to the very headers of their canonical counterparts.
#[test]
fn non_canonical_vectors_decode_as_their_canonical_counterparts() {
    let disk = on_disk();
    let header = |name: &str| {
        let (_, bytes, _) = disk
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{name}"));
        let m = decode_message_on(bytes, &Limits::default(), TCP_KINDS).unwrap();
        (
            m.header.encode(),
            m.frames.iter().map(|f| f.to_vec()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(header("noncanonical-msg"), header("msg-ticket"));
    assert_eq!(header("noncanonical-ticket-pull"), header("ticket-pull"));
    assert_eq!(header("noncanonical-challenge"), header("challenge"));
    let (hello, _) = header("hello");
    let Header::Hello(mut expected) = Header::decode(&hello, &Limits::default()).unwrap() else {
        panic!("hello is a hello")
    };
    expected.listen = None;
    assert_eq!(header("noncanonical-hello").0, Header::Hello(expected).encode());
    // And none of them is canonical itself.
    for (noncanonical, canonical) in [
        ("noncanonical-msg", "msg-ticket"),
        ("noncanonical-ticket-pull", "ticket-pull"),
        ("noncanonical-challenge", "challenge"),
    ] {
        let bytes = |n: &str| disk.iter().find(|(name, _, _)| name == n).unwrap().1.clone();
        assert_ne!(bytes(noncanonical), bytes(canonical));
    }
}

/// `"stage": "handshake"` matters: the same bytes read on an established connection get past
/// the handshake limits (header bytes, values).
#[test]
fn the_handshake_stage_lowers_the_header_limit() {
    let staged: Vec<_> = on_disk()
        .into_iter()
        .filter(|(_, _, json)| json["stage"] == "handshake")
        .collect();
    assert!(staged.len() >= 2);
    for (name, bytes, json) in staged {
        let (limits, kinds) = receiver(&json);
        assert_eq!(limits.max_header_bytes, handoff_wire::HANDSHAKE_HEADER_BYTES);
        let established = decode_message_on(&bytes, &Limits::default(), kinds);
        if json["valid"] == Json::Bool(true) {
            assert!(established.is_ok(), "{name}");
        } else {
            // Refused only because of the stage: accepted, or refused for another reason, later.
            let later = established.err().map(|e| e.code());
            assert_ne!(later, json["error"].as_str(), "{name}");
        }
    }
}

/// The `digests` of `msg-ticket-xxh3`: this implementation's BLAKE3 and XXH3-128 give the hashes the
/// vector states, for the fixture buffer and for `abc` (spec §7.5).
#[test]
fn ticket_digests_match_the_vector() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors/msg-ticket-xxh3.json"),
    )
    .unwrap();
    let json: Json = serde_json::from_str(&text).unwrap();
    let d = &json["digests"];
    let buffer: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let hex_of = |x: handoff_wire::TicketDigest| hex::encode(x.as_bytes());
    assert_eq!(hex_of(handoff_wire::TicketDigest::blake3_of(&buffer)), d["blake3"]);
    assert_eq!(hex_of(handoff_wire::TicketDigest::xxh3_of(&buffer)), d["xxh3_128"]);
    assert_eq!(
        hex_of(handoff_wire::TicketDigest::blake3_of(b"abc")),
        d["abc"]["blake3"]
    );
    assert_eq!(
        hex_of(handoff_wire::TicketDigest::xxh3_of(b"abc")),
        d["abc"]["xxh3_128"]
    );
    // XXH3-128 of "abc" as xxhsum -H2 prints it (the canonical form): the spec's byte order.
    assert_eq!(d["abc"]["xxh3_128"], "06b05ab6733a618578af5f94892f3950");
}

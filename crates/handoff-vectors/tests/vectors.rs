//! Checks every vector in `spec/vectors/`: the files match the generator, and each
//! one decodes to what its JSON says (or fails with the error code it names).

use handoff_vectors::{all, decode_to_json, description_on_disk, vectors_dir, Vector};
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
    let bin = |v: &Json| hex::decode(v["$bin"].as_str().unwrap()).unwrap();
    let a = &json["auth"];
    let secret = bin(&a["secret"]);
    let prover = bin(&a["prover_hello"]);
    let verifier = bin(&a["verifier_hello"]);
    let mac = bin(&json["header"]["mac"]);
    handoff_wire::auth::verify(&secret, &mac, &prover, &verifier).unwrap();
    handoff_wire::auth::verify(&secret, &bin(&a["verifier_proof"]), &verifier, &prover).unwrap();
    assert!(handoff_wire::auth::verify(b"wrong", &mac, &prover, &verifier).is_err());
}

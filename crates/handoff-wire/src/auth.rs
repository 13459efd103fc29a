//! Challenge–response authentication with the cluster secret (HMAC-SHA256).
//!
//! Version 1 (`spec/WIRE.md` §5.3): each side's proof covers its own hello and the peer's
//! hello, and so the peer's fresh nonce. Version 2 (§5.5): each side's proof covers both
//! preambles and both challenges, under another context string. Either way a proof cannot be
//! replayed on another connection, is bound to its direction, and reveals nothing of the
//! secret; and a proof of one version never verifies in the other.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::preamble::PREAMBLE_LEN;
use crate::WireError;

/// Domain-separation prefix of every version-1 proof.
pub const AUTH_CONTEXT: &[u8] = b"handoff-v1-auth\0";

/// Domain-separation prefix of every version-2 proof (as long as v1's, and different).
pub const AUTH_CONTEXT_V2: &[u8] = b"handoff-v2-auth\0";

fn keyed(secret: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC accepts keys of any length")
}

fn with_len(mac: &mut Hmac<Sha256>, bytes: &[u8]) {
    mac.update(&(bytes.len() as u32).to_be_bytes());
    mac.update(bytes);
}

fn mac_over(secret: &[u8], prover_hello: &[u8], verifier_hello: &[u8]) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    mac.update(AUTH_CONTEXT);
    with_len(&mut mac, prover_hello);
    with_len(&mut mac, verifier_hello);
    mac
}

fn failed() -> WireError {
    WireError::AuthFailed("the peer's proof does not match our cluster secret (wrong secret?)".into())
}

/// The version-1 proof a side sends: `HMAC-SHA256(secret, AUTH_CONTEXT | len | own hello |
/// len | peer hello)`, where each hello is the exact header bytes that side sent and `len`
/// is a big-endian u32.
pub fn proof(secret: &[u8], own_hello: &[u8], peer_hello: &[u8]) -> [u8; 32] {
    mac_over(secret, own_hello, peer_hello).finalize().into_bytes().into()
}

/// Checks the peer's version-1 proof in constant time.
pub fn verify(secret: &[u8], peer_proof: &[u8], peer_hello: &[u8], own_hello: &[u8]) -> Result<(), WireError> {
    mac_over(secret, peer_hello, own_hello)
        .verify_slice(peer_proof)
        .map_err(|_| failed())
}

/// What one side sent in a version-2 handshake before its proof: its preamble and its
/// `challenge` header, exactly as they travelled (the header without its length prefix).
#[derive(Debug, Clone, Copy)]
pub struct Sent<'a> {
    /// The 16 bytes of the side's preamble.
    pub preamble: &'a [u8; PREAMBLE_LEN],
    /// The side's challenge header bytes.
    pub challenge: &'a [u8],
}

fn mac_over_v2(secret: &[u8], prover: Sent<'_>, verifier: Sent<'_>) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    mac.update(AUTH_CONTEXT_V2);
    mac.update(prover.preamble);
    mac.update(verifier.preamble);
    with_len(&mut mac, prover.challenge);
    with_len(&mut mac, verifier.challenge);
    mac
}

/// The version-2 proof a side sends (`spec/WIRE.md` §5.5): `HMAC-SHA256(secret,
/// AUTH_CONTEXT_V2 | own preamble | peer preamble | len | own challenge | len | peer
/// challenge)`, with `len` a big-endian u32. Covering the preambles authenticates the
/// version negotiation: a preamble changed in flight fails the proof.
pub fn proof_v2(secret: &[u8], own: Sent<'_>, peer: Sent<'_>) -> [u8; 32] {
    mac_over_v2(secret, own, peer).finalize().into_bytes().into()
}

/// Checks the peer's version-2 proof in constant time (the peer is the prover: its
/// preamble and challenge come first).
pub fn verify_v2(secret: &[u8], peer_proof: &[u8], peer: Sent<'_>, own: Sent<'_>) -> Result<(), WireError> {
    mac_over_v2(secret, peer, own)
        .verify_slice(peer_proof)
        .map_err(|_| failed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Preamble;

    #[test]
    fn proofs_verify_only_with_the_same_secret() {
        let a = b"hello-a";
        let b = b"hello-b";
        let p = proof(b"s3cret", a, b);
        verify(b"s3cret", &p, a, b).unwrap();
        assert_eq!(verify(b"other", &p, a, b).unwrap_err().code(), "auth-failed");
        // A proof is bound to direction: reflecting it back fails.
        assert!(verify(b"s3cret", &p, b, a).is_err());
    }

    #[test]
    fn v2_proofs_bind_secret_direction_preambles_and_version() {
        let (pa, pb) = (Preamble::OURS.encode(), Preamble::ACCEPTING_V1.encode());
        let a = Sent {
            preamble: &pa,
            challenge: b"challenge-a",
        };
        let b = Sent {
            preamble: &pb,
            challenge: b"challenge-b",
        };
        let p = proof_v2(b"s3cret", a, b);
        verify_v2(b"s3cret", &p, a, b).unwrap();
        assert_eq!(verify_v2(b"other", &p, a, b).unwrap_err().code(), "auth-failed");
        assert!(verify_v2(b"s3cret", &p, b, a).is_err(), "bound to direction");
        // A preamble changed in flight: the verifier saw another one than the prover sent.
        let forged = Preamble::V1_ONLY.encode();
        let seen = Sent { preamble: &forged, ..a };
        assert!(verify_v2(b"s3cret", &p, seen, b).is_err(), "covers the preambles");
        // The versions never verify each other's proofs, whatever the bytes.
        assert_ne!(proof(b"s3cret", b"challenge-a", b"challenge-b"), p);
        assert_ne!(AUTH_CONTEXT, AUTH_CONTEXT_V2);
        assert_eq!(AUTH_CONTEXT.len(), AUTH_CONTEXT_V2.len());
    }
}

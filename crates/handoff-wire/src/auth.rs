//! Challenge–response authentication with the cluster secret (HMAC-SHA256).
//!
//! Version 1 (`spec/WIRE.md` §5.3): each side's proof covers its own hello and the peer's
//! hello, and so the peer's fresh nonce. Version 2 (§5.5): each side's proof covers both
//! preambles and both challenges, under another context string. Neither is bound to the
//! role of the prover, and so a peer without the secret can authenticate by making two
//! connections' nodes write each other's proofs (§5.6).
//!
//! Version 3 (§5.7): the proofs cover the whole transcript — both preambles and both
//! challenges, ordered by role — under a label that names the prover's role, and the
//! acceptor's proof covers the dialer's too. A proof of one role never verifies as the
//! other's, and a proof of one version never verifies in another.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::preamble::PREAMBLE_LEN;
use crate::WireError;

/// Domain-separation prefix of every version-1 proof.
pub const AUTH_CONTEXT: &[u8] = b"handoff-v1-auth\0";

/// Domain-separation prefix of every version-2 proof (as long as v1's, and different).
pub const AUTH_CONTEXT_V2: &[u8] = b"handoff-v2-auth\0";

/// The label of a version-3 dialer's proof (§5.7).
pub const DIALER_LABEL_V3: &[u8] = b"handoff-v3-dialer-proof\0";

/// The label of a version-3 acceptor's proof (§5.7).
pub const ACCEPTOR_LABEL_V3: &[u8] = b"handoff-v3-acceptor-proof\0";

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

/// The two roles on a connection (`spec/WIRE.md` §1): the side that connected, and the side
/// that took the connection from a listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the connection.
    Dialer,
    /// The side that accepted it.
    Acceptor,
}

impl Role {
    /// The other side's role.
    pub fn peer(self) -> Role {
        match self {
            Role::Dialer => Role::Acceptor,
            Role::Acceptor => Role::Dialer,
        }
    }

    /// `"dialer"` or `"acceptor"`, as the spec and the vectors write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Dialer => "dialer",
            Role::Acceptor => "acceptor",
        }
    }
}

/// What a version-3 proof covers: what each role sent before the proofs, ordered by role,
/// not by "own" and "peer", so that both sides build the same bytes (§5.7).
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    /// The dialer's preamble and challenge, as they travelled.
    pub dialer: Sent<'a>,
    /// The acceptor's preamble and challenge, as they travelled.
    pub acceptor: Sent<'a>,
}

impl<'a> Transcript<'a> {
    /// The transcript of a side in `role` that sent `own` and received `peer`.
    pub fn of(role: Role, own: Sent<'a>, peer: Sent<'a>) -> Transcript<'a> {
        match role {
            Role::Dialer => Transcript {
                dialer: own,
                acceptor: peer,
            },
            Role::Acceptor => Transcript {
                dialer: peer,
                acceptor: own,
            },
        }
    }

    fn feed(&self, mac: &mut Hmac<Sha256>) {
        mac.update(self.dialer.preamble);
        mac.update(self.acceptor.preamble);
        with_len(mac, self.dialer.challenge);
        with_len(mac, self.acceptor.challenge);
    }
}

fn dialer_mac(secret: &[u8], transcript: &Transcript<'_>) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    mac.update(DIALER_LABEL_V3);
    transcript.feed(&mut mac);
    mac
}

fn acceptor_mac(secret: &[u8], transcript: &Transcript<'_>, dialer_proof: &[u8]) -> Hmac<Sha256> {
    let mut mac = keyed(secret);
    mac.update(ACCEPTOR_LABEL_V3);
    transcript.feed(&mut mac);
    mac.update(dialer_proof);
    mac
}

/// The version-3 dialer's proof: `HMAC-SHA256(secret, DIALER_LABEL_V3 | transcript)`.
pub fn dialer_proof(secret: &[u8], transcript: &Transcript<'_>) -> [u8; 32] {
    dialer_mac(secret, transcript).finalize().into_bytes().into()
}

/// The version-3 acceptor's proof: `HMAC-SHA256(secret, ACCEPTOR_LABEL_V3 | transcript |
/// dialer_proof)`; it answers exactly the dialer's proof it verified.
pub fn acceptor_proof(secret: &[u8], transcript: &Transcript<'_>, dialer_proof: &[u8]) -> [u8; 32] {
    acceptor_mac(secret, transcript, dialer_proof)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks, in constant time, that `proof` is the dialer's version-3 proof over `transcript`.
pub fn verify_dialer(secret: &[u8], proof: &[u8], transcript: &Transcript<'_>) -> Result<(), WireError> {
    dialer_mac(secret, transcript).verify_slice(proof).map_err(|_| failed())
}

/// Checks, in constant time, that `proof` is the acceptor's version-3 proof over
/// `transcript`, answering `dialer_proof`.
pub fn verify_acceptor(
    secret: &[u8],
    proof: &[u8],
    transcript: &Transcript<'_>,
    dialer_proof: &[u8],
) -> Result<(), WireError> {
    acceptor_mac(secret, transcript, dialer_proof)
        .verify_slice(proof)
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

    #[test]
    fn v3_proofs_bind_the_role_and_the_transcript() {
        let (pd, pa) = (Preamble::OURS.encode(), Preamble::ACCEPTING_V2.encode());
        let d = Sent {
            preamble: &pd,
            challenge: b"challenge-d",
        };
        let a = Sent {
            preamble: &pa,
            challenge: b"challenge-a",
        };
        // Both sides build the same transcript from their own point of view.
        let seen_by_dialer = Transcript::of(Role::Dialer, d, a);
        let seen_by_acceptor = Transcript::of(Role::Acceptor, a, d);
        let dp = dialer_proof(b"s3cret", &seen_by_dialer);
        verify_dialer(b"s3cret", &dp, &seen_by_acceptor).unwrap();
        let ap = acceptor_proof(b"s3cret", &seen_by_acceptor, &dp);
        verify_acceptor(b"s3cret", &ap, &seen_by_dialer, &dp).unwrap();
        assert_eq!(
            verify_dialer(b"other", &dp, &seen_by_acceptor).unwrap_err().code(),
            "auth-failed"
        );
        // Reflection: a proof of one role never verifies as the other's.
        assert!(verify_acceptor(b"s3cret", &dp, &seen_by_dialer, &dp).is_err());
        assert!(verify_dialer(b"s3cret", &ap, &seen_by_acceptor).is_err());
        // Swapping the roles of the same bytes (the interleaving of §5.6) changes the proof.
        let swapped = Transcript::of(Role::Dialer, a, d);
        assert!(verify_dialer(b"s3cret", &dp, &swapped).is_err());
        // The acceptor's proof answers one dialer proof only.
        assert!(verify_acceptor(b"s3cret", &ap, &seen_by_dialer, &[0; 32]).is_err());
        // A preamble changed in flight fails.
        let forged = Preamble::V2_ONLY.encode();
        let changed = Transcript::of(Role::Acceptor, a, Sent { preamble: &forged, ..d });
        assert!(verify_dialer(b"s3cret", &dp, &changed).is_err());
        // No label is a prefix of another, of any version.
        for (x, y) in [
            (DIALER_LABEL_V3, ACCEPTOR_LABEL_V3),
            (DIALER_LABEL_V3, AUTH_CONTEXT_V2),
            (ACCEPTOR_LABEL_V3, AUTH_CONTEXT_V2),
            (DIALER_LABEL_V3, AUTH_CONTEXT),
        ] {
            assert_ne!(x[..12], y[..12]);
        }
        assert_eq!(Role::Dialer.peer(), Role::Acceptor);
    }
}

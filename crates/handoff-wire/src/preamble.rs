//! The 16 bytes each side sends first, and version negotiation.

use crate::WireError;

/// The magic bytes that open every handoff connection.
pub const MAGIC: [u8; 8] = *b"HANDOFF\0";
/// Length of the preamble in bytes.
pub const PREAMBLE_LEN: usize = 16;
/// Lowest protocol version this implementation speaks (when its user accepts v1 peers).
pub const MIN_VERSION: u16 = 1;
/// Highest protocol version this implementation speaks.
pub const MAX_VERSION: u16 = 3;

/// The preamble: magic, the range of versions a side speaks, and reserved flags.
///
/// Layout (big-endian): `magic[8] | min_version u16 | max_version u16 | flags u32 (0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// Lowest version spoken.
    pub min_version: u16,
    /// Highest version spoken.
    pub max_version: u16,
    /// Reserved; version 1, 2 and 3 senders write 0 and receivers ignore it.
    pub flags: u32,
}

impl Preamble {
    /// The preamble this implementation sends by default: version 3 only (`spec/WIRE.md`
    /// §3). Versions 1 and 2 let a peer without the secret authenticate by reflecting the
    /// nodes' own proofs (§5.6), and version 1 says who the node is before any proof.
    pub const OURS: Preamble = Preamble::range(3, MAX_VERSION);

    /// The preamble of a node whose user accepts version-2 peers while a cluster upgrades:
    /// versions 2 and 3. Any peer can then choose version 2, and with it the attack of §5.6.
    pub const ACCEPTING_V2: Preamble = Preamble::range(2, MAX_VERSION);

    /// The preamble of a node whose user accepts version-1 peers: versions 1 to 3 (which
    /// accepts version 2 as well; a range has no holes). With a v1-only peer it runs the v1
    /// handshake, whose hello reveals the node's identity before any proof (§5.4).
    pub const ACCEPTING_V1: Preamble = Preamble::range(MIN_VERSION, MAX_VERSION);

    /// What a version-2 implementation sends by default (for tests, vectors and tools that
    /// play one).
    pub const V2_ONLY: Preamble = Preamble::range(2, 2);

    /// What an implementation of version 1 only sends (for tests and tools that play one).
    pub const V1_ONLY: Preamble = Preamble::range(1, 1);

    /// The preamble that announces the versions `min..=max`, with no flags.
    pub const fn range(min: u16, max: u16) -> Preamble {
        Preamble {
            min_version: min,
            max_version: max,
            flags: 0,
        }
    }

    /// The preamble to send: [`Preamble::ACCEPTING_V1`] if the user accepts v1 peers, else
    /// [`Preamble::ACCEPTING_V2`] if it accepts v2 peers, else [`Preamble::OURS`].
    pub const fn ours(accept_v1: bool, accept_v2: bool) -> Preamble {
        if accept_v1 {
            Preamble::ACCEPTING_V1
        } else if accept_v2 {
            Preamble::ACCEPTING_V2
        } else {
            Preamble::OURS
        }
    }

    /// Encodes the preamble into its 16 bytes.
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut out = [0u8; PREAMBLE_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.min_version.to_be_bytes());
        out[10..12].copy_from_slice(&self.max_version.to_be_bytes());
        out[12..16].copy_from_slice(&self.flags.to_be_bytes());
        out
    }

    /// Decodes a preamble, checking the magic.
    pub fn decode(bytes: &[u8]) -> Result<Preamble, WireError> {
        if bytes.len() < PREAMBLE_LEN {
            return Err(WireError::Truncated {
                what: "preamble",
                needed: PREAMBLE_LEN as u64,
                available: bytes.len() as u64,
            });
        }
        let mut got = [0u8; 8];
        got.copy_from_slice(&bytes[..8]);
        if got != MAGIC {
            return Err(WireError::BadMagic { expected: MAGIC, got });
        }
        let min_version = u16::from_be_bytes([bytes[8], bytes[9]]);
        let max_version = u16::from_be_bytes([bytes[10], bytes[11]]);
        let flags = u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        if min_version > max_version || min_version == 0 {
            return Err(WireError::Handshake(format!(
                "preamble announces an empty version range {min_version}..={max_version}"
            )));
        }
        Ok(Preamble {
            min_version,
            max_version,
            flags,
        })
    }

    /// The version both sides use: the highest one both speak.
    pub fn negotiate(&self, peer: &Preamble) -> Result<u16, WireError> {
        let chosen = self.max_version.min(peer.max_version);
        if chosen < self.min_version.max(peer.min_version) {
            return Err(WireError::UnsupportedVersion {
                our_min: self.min_version,
                our_max: self.max_version,
                peer_min: peer.min_version,
                peer_max: peer.max_version,
            });
        }
        Ok(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_negotiate() {
        let p = Preamble::OURS;
        assert_eq!(Preamble::decode(&p.encode()).unwrap(), p);
        assert_eq!(p.negotiate(&p).unwrap(), 3);
        let future = Preamble::range(4, 5);
        assert_eq!(p.negotiate(&future).unwrap_err().code(), "unsupported-version");
        let newer_but_compatible = Preamble::range(1, 5);
        assert_eq!(p.negotiate(&newer_but_compatible).unwrap(), 3);
        assert_eq!(Preamble::V1_ONLY.negotiate(&newer_but_compatible).unwrap(), 1);
    }

    #[test]
    fn older_versions_only_by_consent() {
        // The default refuses peers that speak nothing newer than 1 or 2, on both sides alike.
        for old in [Preamble::V1_ONLY, Preamble::V2_ONLY, Preamble::range(1, 2)] {
            assert_eq!(
                Preamble::OURS.negotiate(&old).unwrap_err().code(),
                "unsupported-version"
            );
            assert_eq!(
                old.negotiate(&Preamble::OURS).unwrap_err().code(),
                "unsupported-version"
            );
        }
        // Accepting v2 runs v2 with a v2 peer and v3 with any node that speaks it; not v1.
        let v2 = Preamble::ours(false, true);
        assert_eq!(v2.negotiate(&Preamble::V2_ONLY).unwrap(), 2);
        assert_eq!(v2.negotiate(&Preamble::OURS).unwrap(), 3);
        assert_eq!(
            v2.negotiate(&Preamble::V1_ONLY).unwrap_err().code(),
            "unsupported-version"
        );
        // Accepting v1 accepts v2 too (a range has no holes).
        let v1 = Preamble::ours(true, false);
        assert_eq!(v1.negotiate(&Preamble::V1_ONLY).unwrap(), 1);
        assert_eq!(v1.negotiate(&Preamble::V2_ONLY).unwrap(), 2);
        assert_eq!(v1.negotiate(&Preamble::OURS).unwrap(), 3);
        assert_eq!(Preamble::ours(false, false), Preamble::OURS);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Preamble::decode(b"GET / HTTP/1.1\r\n").unwrap_err().code(), "bad-magic");
        assert_eq!(Preamble::decode(b"HANDOFF").unwrap_err().code(), "truncated");
    }
}

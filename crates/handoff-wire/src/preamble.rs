//! The 16 bytes each side sends first, and version negotiation.

use crate::WireError;

/// The magic bytes that open every handoff connection.
pub const MAGIC: [u8; 8] = *b"HANDOFF\0";
/// Length of the preamble in bytes.
pub const PREAMBLE_LEN: usize = 16;
/// Lowest protocol version this implementation speaks (when its user accepts v1 peers).
pub const MIN_VERSION: u16 = 1;
/// Highest protocol version this implementation speaks.
pub const MAX_VERSION: u16 = 2;

/// The preamble: magic, the range of versions a side speaks, and reserved flags.
///
/// Layout (big-endian): `magic[8] | min_version u16 | max_version u16 | flags u32 (0)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// Lowest version spoken.
    pub min_version: u16,
    /// Highest version spoken.
    pub max_version: u16,
    /// Reserved; version 1 and 2 senders write 0 and receivers ignore it.
    pub flags: u32,
}

impl Preamble {
    /// The preamble this implementation sends by default: version 2 only (`spec/WIRE.md`
    /// §3), so that a peer that has not proven the secret never gets a v1 hello out of it.
    pub const OURS: Preamble = Preamble {
        min_version: 2,
        max_version: MAX_VERSION,
        flags: 0,
    };

    /// The preamble of a node whose user accepts version-1 peers: versions 1 and 2. With a
    /// v1-only peer it runs the v1 handshake, whose hello reveals the node's identity before
    /// any proof (§5.4).
    pub const ACCEPTING_V1: Preamble = Preamble {
        min_version: MIN_VERSION,
        max_version: MAX_VERSION,
        flags: 0,
    };

    /// What an implementation of version 1 only sends (for tests and tools that play one).
    pub const V1_ONLY: Preamble = Preamble {
        min_version: 1,
        max_version: 1,
        flags: 0,
    };

    /// The preamble to send: [`Preamble::ACCEPTING_V1`] if the user accepts v1 peers, else
    /// [`Preamble::OURS`].
    pub const fn ours(accept_v1: bool) -> Preamble {
        if accept_v1 {
            Preamble::ACCEPTING_V1
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
        assert_eq!(p.negotiate(&p).unwrap(), 2);
        let future = Preamble {
            min_version: 3,
            max_version: 4,
            flags: 0,
        };
        assert_eq!(p.negotiate(&future).unwrap_err().code(), "unsupported-version");
        let newer_but_compatible = Preamble {
            min_version: 1,
            max_version: 5,
            flags: 0,
        };
        assert_eq!(p.negotiate(&newer_but_compatible).unwrap(), 2);
        assert_eq!(Preamble::V1_ONLY.negotiate(&newer_but_compatible).unwrap(), 1);
    }

    #[test]
    fn version_1_only_by_consent() {
        // The default refuses a v1-only peer, on both sides alike.
        let v1 = Preamble::V1_ONLY;
        assert_eq!(Preamble::OURS.negotiate(&v1).unwrap_err().code(), "unsupported-version");
        assert_eq!(v1.negotiate(&Preamble::OURS).unwrap_err().code(), "unsupported-version");
        // A node that accepts v1 runs v1 with it, and v2 with any node that speaks it.
        assert_eq!(Preamble::ours(true).negotiate(&v1).unwrap(), 1);
        assert_eq!(v1.negotiate(&Preamble::ours(true)).unwrap(), 1);
        assert_eq!(Preamble::ours(true).negotiate(&Preamble::OURS).unwrap(), 2);
        assert_eq!(Preamble::ours(false), Preamble::OURS);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Preamble::decode(b"GET / HTTP/1.1\r\n").unwrap_err().code(), "bad-magic");
        assert_eq!(Preamble::decode(b"HANDOFF").unwrap_err().code(), "truncated");
    }
}

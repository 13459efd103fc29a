//! What a receiver accepts before it rejects a message.

/// The header limit before the handshake completes (`spec/WIRE.md` §5.1, §9): 64 KiB. A
/// side reads every header before it is established with at most this limit, whatever its
/// general one; see [`Limits::during_handshake`].
pub const HANDSHAKE_HEADER_BYTES: u32 = 65_536;

/// Msgpack values a header may hold before the handshake completes (§9): 1024. A valid
/// hello holds about 30; a peer that has proven nothing gets little work done for it.
pub const HANDSHAKE_HEADER_VALUES: u32 = 1024;

/// Limits a receiver enforces on every message, before it allocates for it.
///
/// A message that exceeds one is rejected with the matching [`WireError`](crate::WireError)
/// and the connection is closed; the node keeps serving its other peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest msgpack header, in bytes (the body of a message travels inside it).
    pub max_header_bytes: u32,
    /// Most frame descriptors in one message.
    pub max_frames: u32,
    /// Largest single frame, in bytes.
    pub max_frame_bytes: u64,
    /// Largest sum of all frames of one message (inline and shared), in bytes.
    pub max_message_bytes: u64,
    /// Most msgpack values in one header, counted as §9 counts them (65 536 by the spec;
    /// [`HANDSHAKE_HEADER_VALUES`] before the handshake completes).
    pub max_header_values: u32,
}

impl Limits {
    /// The defaults of spec version 1: 16 MiB header, 1024 frames, 4 GiB per frame, 16 GiB per message.
    pub const DEFAULT: Limits = Limits {
        max_header_bytes: 16 << 20,
        max_frames: 1024,
        max_frame_bytes: 4 << 30,
        max_message_bytes: 16 << 30,
        max_header_values: crate::header::MAX_HEADER_VALUES,
    };

    /// The limits to read a header with before the handshake completes: these, with the
    /// header limit lowered to [`HANDSHAKE_HEADER_BYTES`] and the value limit to
    /// [`HANDSHAKE_HEADER_VALUES`] (if they are not lower already).
    pub fn during_handshake(&self) -> Limits {
        Limits {
            max_header_bytes: self.max_header_bytes.min(HANDSHAKE_HEADER_BYTES),
            max_header_values: self.max_header_values.min(HANDSHAKE_HEADER_VALUES),
            ..*self
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

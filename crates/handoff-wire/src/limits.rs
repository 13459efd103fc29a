//! What a receiver accepts before it rejects a message.

/// The header limit before the handshake completes (`spec/WIRE.md` §5.1, §9): 64 KiB. A
/// side reads every header before it is established with at most this limit, whatever its
/// general one; see [`Limits::during_handshake`].
pub const HANDSHAKE_HEADER_BYTES: u32 = 65_536;

/// Msgpack values a header may hold before the handshake completes (§9): 1024. A valid
/// hello holds about 30; a peer that has proven nothing gets little work done for it.
pub const HANDSHAKE_HEADER_VALUES: u32 = 1024;

/// The lengths of the identity fields of a `hello` or an `ident` (`spec/WIRE.md` §5.2), in
/// bytes of UTF-8: a longer one is `malformed-header`, and a node refuses to start with one.
pub mod identity {
    /// `node` and `proc` (ids are 32 characters).
    pub const ID_BYTES: u32 = 64;
    /// `name`.
    pub const NAME_BYTES: u32 = 256;
    /// `host`.
    pub const HOST_BYTES: u32 = 256;
    /// `lang`.
    pub const LANG_BYTES: u32 = 32;
    /// `impl`.
    pub const IMPL_BYTES: u32 = 128;
    /// Entries of `caps`.
    pub const CAPS: u32 = 32;
    /// Bytes of one entry of `caps`.
    pub const CAP_BYTES: u32 = 64;
    /// `listen` and `unix`.
    pub const ADDR_BYTES: u32 = 1024;
}

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

    /// The limits a node sends within: the defaults of spec §9, or these where smaller. A
    /// node that accepts more than the defaults still sends nothing a peer with the
    /// defaults must refuse (Python: `handoff._native.limits_for_sending`; the pure-Python
    /// reference's own: `handoff_pure.outgoing.send_limits`).
    pub fn for_sending(&self) -> Limits {
        let d = Limits::DEFAULT;
        Limits {
            max_header_bytes: self.max_header_bytes.min(d.max_header_bytes),
            max_frames: self.max_frames.min(d.max_frames),
            max_frame_bytes: self.max_frame_bytes.min(d.max_frame_bytes),
            max_message_bytes: self.max_message_bytes.min(d.max_message_bytes),
            ..*self
        }
    }
}

impl Limits {
    /// Checks an outgoing message against these limits before it is written (spec §9: a
    /// node never sends what a receiver with these limits must refuse): the header's length
    /// and the frames' count, sizes and sum, in the order a receiver checks them.
    pub fn check_outgoing(
        &self,
        header_len: usize,
        frames: impl ExactSizeIterator<Item = u64>,
    ) -> Result<(), crate::WireError> {
        use crate::WireError;
        if header_len as u64 > u64::from(self.max_header_bytes) {
            return Err(WireError::HeaderTooLarge {
                len: header_len as u64,
                limit: self.max_header_bytes.into(),
            });
        }
        if frames.len() as u64 > u64::from(self.max_frames) {
            return Err(WireError::TooManyFrames {
                count: frames.len() as u64,
                limit: self.max_frames.into(),
            });
        }
        let mut total: u64 = 0;
        for (index, len) in frames.enumerate() {
            if len > self.max_frame_bytes {
                return Err(WireError::FrameTooLarge {
                    index,
                    len,
                    limit: self.max_frame_bytes,
                });
            }
            total = total.saturating_add(len);
            if total > self.max_message_bytes {
                return Err(WireError::MessageTooLarge {
                    len: total,
                    limit: self.max_message_bytes,
                });
            }
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_messages_are_held_to_what_a_receiver_accepts() {
        let l = Limits::DEFAULT;
        assert!(
            l.check_outgoing(16 << 20, [4u64 << 30].into_iter()).is_ok(),
            "at the limits"
        );
        let code = |r: Result<(), crate::WireError>| r.unwrap_err().code();
        assert_eq!(
            code(l.check_outgoing((16 << 20) + 1, [].into_iter())),
            "header-too-large"
        );
        assert_eq!(
            code(l.check_outgoing(10, vec![1u64; 1025].into_iter())),
            "too-many-frames"
        );
        assert_eq!(
            code(l.check_outgoing(10, [(4u64 << 30) + 1].into_iter())),
            "frame-too-large"
        );
        assert_eq!(
            code(l.check_outgoing(10, vec![4u64 << 30; 5].into_iter())),
            "message-too-large"
        );
    }
}

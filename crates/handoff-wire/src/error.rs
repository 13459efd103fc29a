//! Errors a wire decoder reports, each with a stable machine-readable code.

use thiserror::Error;

/// Everything that can be wrong with bytes received from a peer.
///
/// Every variant has a stable [`code`](WireError::code) that the spec
/// (`spec/WIRE.md`) and the test vectors use, so that implementations in other
/// languages report the same error for the same bytes.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The input ended before the structure it announced was complete.
    #[error("truncated input: {what} needs {needed} bytes, only {available} present")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes that were needed.
        needed: u64,
        /// Bytes that were there.
        available: u64,
    },
    /// The connection did not start with the handoff magic bytes.
    #[error(
        "bad preamble: expected magic {expected:02x?}, got {got:02x?} ({})",
        bad_magic_hint(got)
    )]
    BadMagic {
        /// The magic we expect.
        expected: [u8; 8],
        /// The first bytes we got.
        got: [u8; 8],
    },
    /// The two sides share no protocol version.
    #[error("no common protocol version: we speak {our_min}..={our_max}, the peer speaks {peer_min}..={peer_max}")]
    UnsupportedVersion {
        /// Lowest version we speak.
        our_min: u16,
        /// Highest version we speak.
        our_max: u16,
        /// Lowest version the peer speaks.
        peer_min: u16,
        /// Highest version the peer speaks.
        peer_max: u16,
    },
    /// The header length prefix exceeds the receiver's limit.
    #[error("header of {len} bytes exceeds the limit of {limit} bytes")]
    HeaderTooLarge {
        /// Announced header length.
        len: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// The header lists more frames than the receiver allows.
    #[error("message has {count} frames, the limit is {limit}")]
    TooManyFrames {
        /// Frames announced.
        count: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// One frame is larger than the receiver allows.
    #[error("frame {index} of {len} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// Index of the frame.
        index: usize,
        /// Announced length.
        len: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// The frames together are larger than the receiver allows.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// Total announced length.
        len: u64,
        /// The receiver's limit.
        limit: u64,
    },
    /// The header is not a msgpack map of the documented shape.
    #[error("malformed header: {0}")]
    MalformedHeader(String),
    /// The header's `k` field names a kind of message this version does not know.
    #[error("unknown message kind {0:?}")]
    UnknownKind(String),
    /// A frame descriptor has a kind this version does not know.
    #[error("frame {index}: unknown descriptor kind {kind:?}")]
    UnknownDescriptor {
        /// Index of the descriptor.
        index: usize,
        /// The kind given.
        kind: String,
    },
    /// A descriptor kind is specified but cannot travel on this channel or is not implemented yet.
    #[error("frame {index}: descriptor kind {kind:?} is not supported on this connection")]
    UnsupportedDescriptor {
        /// Index of the descriptor.
        index: usize,
        /// The kind given.
        kind: String,
    },
    /// The body refers to a frame that does not exist, or uses a frame twice.
    #[error("body refers to frame {index}, but the message has {count} frames")]
    BadFrameRef {
        /// The index referenced.
        index: u64,
        /// Frames in the message.
        count: usize,
    },
    /// The body refers to a resource key the receiving node cannot bind. (Transparent: its
    /// text is the resource error's, which is not repeated as a source.)
    #[error(transparent)]
    UnknownResource(#[from] crate::resource::ResourceError),
    /// The body could not be decoded into the requested type.
    #[error("cannot decode body of type {type_name:?}: {reason}")]
    BadBody {
        /// Type name in the header.
        type_name: String,
        /// What went wrong.
        reason: String,
    },
    /// Shared-memory descriptors that do not match the message: missing, unexpected,
    /// too many, or a segment whose size or seals differ from what the header says.
    #[error("bad shared-memory descriptor: {0}")]
    BadShm(String),
    /// A message arrived for a type name the receiver has not registered.
    #[error("unknown type name {name:?}; this node knows: {known}")]
    UnknownType {
        /// The type name in the header.
        name: String,
        /// The registered names, comma separated.
        known: String,
    },
    /// A handshake message came at the wrong time or with wrong content.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The peer's proof of the cluster secret did not verify.
    #[error("authentication failed: {0}")]
    AuthFailed(String),
    /// The handshake did not complete in time, or the peer stopped sending in the middle
    /// of a message for longer than the receiver allows.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The receiver runs as many connections or handshakes as it allows; try again later.
    #[error("overloaded: {0}")]
    Overloaded(String),
}

impl WireError {
    /// The stable code of this error, as written in `spec/WIRE.md` and the vectors.
    pub fn code(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::BadMagic { .. } => "bad-magic",
            WireError::UnsupportedVersion { .. } => "unsupported-version",
            WireError::HeaderTooLarge { .. } => "header-too-large",
            WireError::TooManyFrames { .. } => "too-many-frames",
            WireError::FrameTooLarge { .. } => "frame-too-large",
            WireError::MessageTooLarge { .. } => "message-too-large",
            WireError::MalformedHeader(_) => "malformed-header",
            WireError::UnknownKind(_) => "unknown-kind",
            WireError::UnknownDescriptor { .. } => "unknown-descriptor",
            WireError::UnsupportedDescriptor { .. } => "unsupported-descriptor",
            WireError::BadFrameRef { .. } => "bad-frame-ref",
            WireError::UnknownResource(_) => "unknown-resource",
            WireError::BadBody { .. } => "bad-body",
            WireError::BadShm(_) => "bad-shm",
            WireError::UnknownType { .. } => "unknown-type",
            WireError::Handshake(_) => "handshake",
            WireError::AuthFailed(_) => "auth-failed",
            WireError::Timeout(_) => "timeout",
            WireError::Overloaded(_) => "overloaded",
        }
    }
}

/// What a wrong preamble most likely means: a peer that started a TLS handshake (a record
/// `16 03 ..`, spec §3.1) where this node expected plain bytes, or something that is not a
/// handoff node at all.
fn bad_magic_hint(got: &[u8; 8]) -> &'static str {
    if got[0] == 0x16 && got[1] == 0x03 {
        "the first byte 0x16 starts a TLS handshake: the peer speaks TLS and this node has no TLS (turn TLS on \
         here too, or off there)"
    } else {
        "is the peer a handoff node?"
    }
}

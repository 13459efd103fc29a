//! Ticket requests waiting on a connection for the owner's answer, and the answers the
//! connection's read loop hands them.

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::Result;

/// An owner's answer to a pull or forward.
pub(crate) enum Answer {
    /// Pulled bytes (and their BLAKE3, when asked for).
    Bytes(Bytes, Option<[u8; 32]>),
    /// A new holder's token.
    Token(Vec<u8>),
    /// An answer that does not fit the request (bytes of another length, bytes to a
    /// forward): read past and dropped; says what came.
    Mismatch(String),
}

/// A request waiting for its answer on one connection.
pub(crate) struct Pending {
    pub(crate) tx: oneshot::Sender<Result<Answer>>,
    /// Hash the pulled bytes as they arrive (a whole-buffer redemption checks the digest).
    pub(crate) hash: bool,
    /// For a pull, the bytes asked for: a `pulled` of any other length is not read into
    /// memory (spec §9.1).
    pub(crate) len: Option<u64>,
}

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

/// Where the answer to a request waiting on a connection goes (the engine's
/// `ticket_requests` table keeps what each asked for).
pub(crate) type Waiter = oneshot::Sender<Result<Answer>>;

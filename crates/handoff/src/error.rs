//! The runtime's error type.

use handoff_wire::{EncodeError, WireError};
use thiserror::Error;

/// What can go wrong while running a node, connecting or exchanging messages.
#[derive(Debug, Error)]
pub enum Error {
    /// A socket or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The peer sent bytes that break the wire format, or a handshake step failed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A value could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The peer rejected us or something we sent, and closed the connection.
    #[error("peer {peer} refused: {message} [{code}]")]
    Refused {
        /// The peer's name or address.
        peer: String,
        /// The stable error code the peer sent.
        code: String,
        /// The peer's explanation.
        message: String,
    },
    /// The connection to a peer is closed.
    #[error("connection to peer {0} is closed")]
    PeerClosed(String),
    /// No peer of that name is connected.
    #[error("no peer named {name:?} is connected; connected peers: {known}")]
    UnknownPeer {
        /// The name asked for.
        name: String,
        /// The connected peers, comma separated.
        known: String,
    },
    /// An envelope was decoded as a type other than the one it carries.
    #[error("envelope carries type {got:?}, not {expected:?}")]
    TypeMismatch {
        /// The type asked for.
        expected: &'static str,
        /// The type in the envelope.
        got: String,
    },
    /// The owner of a ticket refused a pull or forward (the connection stays open).
    #[error("owner {owner} refused {what} of lease {lease}: {message} [{code}]")]
    TicketRefused {
        /// The owner's node name (or id).
        owner: String,
        /// The lease.
        lease: u64,
        /// What was asked: `pull`, `forward`.
        what: &'static str,
        /// Stable code: `unknown-lease`, `bad-token`, `expired`, `out-of-range`.
        code: String,
        /// The owner's explanation.
        message: String,
    },
    /// The owner of a ticket could not be reached or went away before answering.
    #[error("cannot redeem lease {lease} ({len} bytes) from owner {owner}: {reason}")]
    OwnerLost {
        /// The owner's node name (or id).
        owner: String,
        /// The lease.
        lease: u64,
        /// Bytes of the buffer.
        len: u64,
        /// What happened.
        reason: String,
    },
    /// Pulled bytes do not match the ticket's digest.
    #[error("bytes of lease {lease} from owner {owner} do not match the ticket's digest")]
    Corrupt {
        /// The owner.
        owner: String,
        /// The lease.
        lease: u64,
    },
    /// Issuing a ticket would pin more bytes than the node allows.
    #[error("cannot lease {bytes} more bytes to {peer}: {reason}")]
    LeaseCap {
        /// The peer the ticket was for.
        peer: String,
        /// Bytes asked for.
        bytes: u64,
        /// Which cap, and how full it is.
        reason: String,
    },
    /// A message this node will not send, because a receiver would have to refuse it
    /// (`spec/WIRE.md` §9); nothing of it was written and the connection is unharmed.
    #[error(
        "not sending {type_name} to {peer}: {reason}; a receiver must refuse that (spec WIRE.md §9): \
         send large data as buffers, or split the value"
    )]
    Unsendable {
        /// The type of the value.
        type_name: String,
        /// The peer it was for.
        peer: String,
        /// The limit it breaks.
        reason: Box<WireError>,
    },
    /// An operation did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The node was shut down.
    #[error("node is shut down")]
    NodeClosed,
    /// A setting or address is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The TLS handshake with a peer failed (`spec/WIRE.md` §3.1).
    #[error("TLS with {peer} failed: {reason}")]
    Tls {
        /// The peer's address.
        peer: String,
        /// What went wrong, and what to fix.
        reason: String,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

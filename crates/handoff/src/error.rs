//! The runtime's error type.

use handoff_wire::{EncodeError, WireError};
use thiserror::Error;

/// What can go wrong while running a node, connecting or exchanging messages.
///
/// A variant that wraps another error (`Io`) says only what was being done in its
/// `Display`, and gives the cause as its [`source`](std::error::Error::source), as Rust's
/// error conventions ask: print an error with its chain (`{:#}` of an `anyhow::Error`, or
/// [`Error::chain`]) to see both, each once.
#[derive(Debug, Error)]
pub enum Error {
    /// A socket or file operation failed. `Display` is the context alone; the I/O error is
    /// the `source`.
    #[error("{context}")]
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
    /// This error followed by its sources, `: ` between them, each once: what a log line
    /// or a message to a peer should show.
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<handoff_sys::same_host::SameHostError> for Error {
    fn from(e: handoff_sys::same_host::SameHostError) -> Error {
        match e {
            handoff_sys::same_host::SameHostError::Io { what, source } => Error::io(what, source),
            handoff_sys::same_host::SameHostError::Refused(why) => Error::Config(why),
        }
    }
}

/// An error and its sources, displayed as one line (see [`Error::chain`]).
#[derive(Debug, Clone, Copy)]
pub struct Chain<'e>(pub &'e (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its sources, as anyhow's `{:#}` and `Chain` print them.
    fn chain_of(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
        let mut out = vec![e.to_string()];
        let mut next = e.source();
        while let Some(s) = next {
            out.push(s.to_string());
            next = s.source();
        }
        out
    }

    /// No link of the chain repeats the text of the link after it: a cause is said once.
    fn assert_said_once(e: &(dyn std::error::Error + 'static)) {
        let links = chain_of(e);
        for pair in links.windows(2) {
            assert!(
                !pair[0].contains(&pair[1]),
                "{:?} repeats its source {:?} (chain: {links:?})",
                pair[0],
                pair[1]
            );
        }
    }

    #[test]
    fn an_io_error_is_named_once_in_its_chain() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = Error::io("connecting to 127.0.0.1:1", refused);
        assert_said_once(&e);
        assert_eq!(e.to_string(), "connecting to 127.0.0.1:1");
        let shown = e.chain().to_string();
        assert_eq!(shown, "connecting to 127.0.0.1:1: Connection refused");
        assert_eq!(shown.matches("refused").count(), 1, "{shown}");
    }

    #[test]
    fn wrapped_errors_are_named_once_in_their_chain() {
        let resource = handoff_wire::ResourceError::Unknown {
            key: "db".into(),
            node: "n".into(),
            available: vec![],
        };
        let cases = [
            Error::Wire(WireError::UnknownResource(resource)),
            Error::Wire(WireError::AuthFailed("wrong secret".into())),
            Error::Encode(EncodeError("no".into())),
            Error::PeerClosed("p".into()),
            Error::Refused {
                peer: "p".into(),
                code: "auth-failed".into(),
                message: "m".into(),
            },
        ];
        for e in &cases {
            assert_said_once(e);
        }
    }
}

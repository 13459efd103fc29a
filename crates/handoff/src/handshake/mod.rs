//! The connection handshake over a stream: preambles, then the sequence of the negotiated
//! version, then ready.
//!
//! Both sides run the same steps (the protocol is symmetric), each writing before it
//! reads, so neither waits on the other. Until the handshake completes a side accepts
//! little (spec §5.1): headers of at most 64 KiB, no file descriptors, a bounded time,
//! and it can be told to give up its place to a newer connection.
//!
//! The versions differ only between the preambles and `ready` (spec §5.4, §5.7): [`v1`]
//! sends a hello, which says who we are before any proof; [`v2`] sends a challenge, proves
//! the secret, and says who we are only to a peer whose proof it verified; [`v3`] (the
//! default, and the only one a node runs unless its user accepts older peers) does the same
//! with proofs bound to each side's role and the whole transcript, the acceptor proving
//! second, so that a peer without the secret cannot reflect the nodes' own proofs (§5.6).

mod conversation;
pub(crate) mod nonces;
mod v1;
mod v2;
mod v3;

use std::time::Duration;

use handoff_wire::auth::Role;
use handoff_wire::{Endpoint, Header, Ident, Limits, Preamble, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

pub(crate) use conversation::{send_error, DRAIN_BYTES, DRAIN_TIME};
use conversation::{Conversation, ERROR_WRITE_LIMIT};

use crate::io::{write_all, FdSource, MessageReader};
use crate::Result;

/// Capabilities of this implementation, the same in protocol versions 1, 2 and 3 (`shm` only
/// where the node has a Unix socket for same-host peers).
pub(crate) const CAPABILITIES: &[&str] = &["inline", "shm", "ticket", handoff_wire::CAP_XXH3];

/// What we know about the peer once the handshake succeeded.
pub(crate) struct Handshaken {
    /// What the peer said about itself: its v1 hello's identity fields, or its v2 ident.
    pub(crate) ident: Ident,
    /// The protocol version the preambles chose.
    pub(crate) version: u16,
}

/// Checks a peer's authenticated identity before we send `ready` (node-id uniqueness, §5.1).
pub(crate) type Admit<'a> = &'a (dyn Fn(&Ident) -> std::result::Result<(), WireError> + Send + Sync);

/// What we say about ourselves in a handshake, and what we check the peer against.
pub(crate) struct OurSide<'a> {
    pub(crate) me: &'a Endpoint,
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    pub(crate) secret: &'a [u8],
    /// The limits of an established connection; the handshake applies the smaller
    /// handshake header limit on top (spec §9).
    pub(crate) limits: &'a Limits,
    /// When the handshake must be complete.
    pub(crate) deadline: tokio::time::Instant,
    /// How long a write may make no progress.
    pub(crate) write_timeout: Duration,
    /// The node-id check before `ready` (v1 step 6, v2 step 7).
    pub(crate) admit: Admit<'a>,
    /// The preamble we send: by default version 3 only; from version 2 or 1 when the node
    /// accepts such peers (spec §3).
    pub(crate) preamble: Preamble,
    /// Whether we dialed this connection or accepted it (version 3 depends on it, §5.7).
    pub(crate) role: Role,
    /// The nonces this node recently sent as a dialer (version 3, §5.7 step 3).
    pub(crate) dialed: &'a nonces::DialerNonces,
}

/// Runs the handshake; on any failure the peer is told why (when possible) and an error returned.
pub(crate) async fn handshake<R, W>(
    reader: &mut MessageReader<R>,
    writer: &mut W,
    ours: OurSide<'_>,
    label: &str,
    mut evicted: Option<oneshot::Receiver<()>>,
) -> Result<Handshaken>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    let OurSide {
        me,
        listen,
        unix,
        secret,
        limits,
        deadline,
        write_timeout,
        admit,
        preamble,
        role,
        dialed,
    } = ours;
    let mut talk = Conversation::new(
        reader,
        writer,
        label,
        limits.during_handshake(),
        deadline,
        write_timeout,
        &mut evicted,
    );
    let own_preamble = preamble.encode();
    talk.write(&own_preamble).await?;
    let peer_preamble = talk.read_preamble().await?;
    let version = match Preamble::decode(&peer_preamble).and_then(|p| preamble.negotiate(&p)) {
        Ok(v) => v,
        Err(e) => return talk.refuse(e).await,
    };

    let ident = Ident {
        node_id: me.node_id.clone(),
        name: me.name.clone(),
        host_id: me.host_id.clone(),
        pid: std::process::id(),
        process_id: me.process_id.clone(),
        language: me.language.clone(),
        implementation: concat!("handoff-rs/", env!("CARGO_PKG_VERSION")).to_string(),
        capabilities: me.capabilities.clone(),
        listen,
        unix,
    };
    let peer_preamble: [u8; 16] = peer_preamble[..].try_into().expect("a preamble is 16 bytes");
    let preambles = (&own_preamble, &peer_preamble);
    let peer = match version {
        1 => v1::exchange(&mut talk, secret, ident).await?,
        2 => v2::exchange(&mut talk, secret, preambles, ident).await?,
        3 => v3::exchange(&mut talk, secret, (role, dialed), preambles, ident).await?,
        other => {
            let e = WireError::Handshake(format!("no handshake for protocol version {other}"));
            return talk.refuse(e).await;
        }
    };
    if let Err(e) = admit(&peer) {
        return talk.refuse(e).await;
    }

    talk.send(&Header::Ready).await?;
    let ready = talk.read("ready").await?;
    talk.expect(&ready, "ready").await?;
    talk.established();
    Ok(Handshaken { ident: peer, version })
}

/// Refuses a connection the node cannot take at all (too many connections): our preamble,
/// then, once the peer's whole preamble arrived (an error goes only to a peer that showed it
/// speaks the format, spec §3, §11.3; we wait for it a second at most),
/// `error {code: "overloaded"}` (readable by every version, §12), then close.
pub(crate) async fn refuse_overloaded<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    preamble: Preamble,
    why: String,
) {
    let _ = write_all(stream, &preamble.encode(), ERROR_WRITE_LIMIT).await;
    let mut theirs = [0u8; handoff_wire::preamble::PREAMBLE_LEN];
    let read = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.read_exact(&mut theirs)).await;
    if matches!(read, Ok(Ok(_))) {
        send_error(stream, &WireError::Overloaded(why)).await;
    }
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.shutdown()).await;
}

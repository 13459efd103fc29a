//! The connection handshake over a stream: preambles, then the sequence of the negotiated
//! version, then ready.
//!
//! Both sides run the same steps (the protocol is symmetric), each writing before it
//! reads, so neither waits on the other. Until the handshake completes a side accepts
//! little (spec §5.1): headers of at most 64 KiB, no file descriptors, a bounded time,
//! and it can be told to give up its place to a newer connection.
//!
//! The versions differ only between the preambles and `ready` (spec §5.4): [`v1`] sends a
//! hello, which says who we are before any proof; [`v2`] (the default) sends a challenge,
//! proves the secret, and says who we are only to a peer whose proof it verified.

mod v1;
mod v2;

use std::time::Duration;

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Endpoint, Header, Ident, Limits, Preamble, WireError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::io::{write_all, FdSource, MessageReader};
use crate::{Error, Result};

/// Capabilities of this implementation, the same in protocol versions 1 and 2 (`shm` only
/// where the node has a Unix socket for same-host peers).
pub(crate) const CAPABILITIES: &[&str] = &["inline", "shm", "ticket"];

/// The longest an `error` may take to write before we close anyway.
const ERROR_WRITE_LIMIT: Duration = Duration::from_secs(1);
/// What we read and drop after sending an `error`, before closing (spec §11.3).
pub(crate) const DRAIN_BYTES: usize = 1 << 20;
/// How long we wait for that.
pub(crate) const DRAIN_TIME: Duration = Duration::from_secs(1);

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
    /// The preamble we send: by default version 2 only; versions 1 and 2 when the node
    /// accepts v1 peers (spec §3).
    pub(crate) preamble: Preamble,
}

/// Sends an `error` header to the peer, best effort and bounded in time, before we close.
pub(crate) async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, err: &WireError) {
    let mut out = Vec::new();
    encode_header_into(
        &Header::Error {
            code: err.code().to_string(),
            message: err.to_string(),
        },
        &mut out,
    );
    let _ = write_all(w, &out, ERROR_WRITE_LIMIT).await;
}

/// Refuses a connection: the error, our sending side shut down first (so the error is
/// delivered and not reset away), what the peer still sends read and dropped for a moment
/// when it may still be talking, then the error returned (the caller drops the socket).
async fn fail<R, W>(reader: &mut MessageReader<R>, writer: &mut W, err: WireError) -> Error
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    send_error(writer, &err).await;
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, writer.shutdown()).await;
    // A silent or evicted peer has nothing to drain; waiting for it would only hold the slot.
    if !matches!(err, WireError::Timeout(_) | WireError::Overloaded(_)) {
        reader.drain(DRAIN_BYTES, DRAIN_TIME).await;
    }
    err.into()
}

/// Why a handshake step stopped: a result, or an outside reason to give up.
enum Stop<T> {
    Done(Result<T>),
    TimedOut,
    Evicted,
}

/// Runs one step of the handshake within the deadline, unless evicted first.
async fn step<T>(
    deadline: tokio::time::Instant,
    evicted: &mut Option<oneshot::Receiver<()>>,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Stop<T> {
    let evict = async {
        match evicted.as_mut() {
            Some(rx) => {
                // A dropped sender (the slot was released) is not an eviction.
                if rx.await.is_err() {
                    std::future::pending::<()>().await
                }
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = fut => Stop::Done(r),
        _ = tokio::time::sleep_until(deadline) => Stop::TimedOut,
        _ = evict => Stop::Evicted,
    }
}

/// The check on the peer's capabilities (v1: on its hello, step 3; v2: on its ident, step 7).
fn check_capabilities(capabilities: &[String]) -> std::result::Result<(), WireError> {
    if capabilities.iter().any(|c| c == "inline") {
        return Ok(());
    }
    Err(WireError::Handshake(format!(
        "the peer lacks the capability \"inline\" that every node announces (it has: {})",
        capabilities.join(", ")
    )))
}

/// The handshake of one connection: reader, writer, and what bounds it.
struct Conversation<'r, 'w, 'e, R, W> {
    reader: &'r mut MessageReader<R>,
    writer: &'w mut W,
    label: &'r str,
    limits: Limits,
    deadline: tokio::time::Instant,
    write_timeout: Duration,
    evicted: &'e mut Option<oneshot::Receiver<()>>,
}

impl<R, W> Conversation<'_, '_, '_, R, W>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    async fn refuse<T>(&mut self, err: WireError) -> Result<T> {
        Err(fail(self.reader, self.writer, err).await)
    }

    /// Turns a stopped step into its result, refusing the connection on a timeout or an eviction.
    async fn settle<T>(&mut self, stop: Stop<T>) -> Result<T> {
        match stop {
            Stop::Done(r) => r,
            Stop::TimedOut => {
                // Said to the peer too, which proved nothing: it names neither side.
                let e = WireError::Timeout("the handshake did not complete in time".into());
                self.refuse(e).await
            }
            Stop::Evicted => {
                let e =
                    WireError::Overloaded("too many handshakes in progress; this one was the oldest, try again".into());
                self.refuse(e).await
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let write = write_all(self.writer, bytes, self.write_timeout);
        let stop = step(self.deadline, self.evicted, async {
            write
                .await
                .map_err(|e| Error::io(format!("handshake with {}", self.label), e))
        })
        .await;
        self.settle(stop).await
    }

    /// Writes a header and returns its bytes without the length prefix.
    async fn send(&mut self, header: &Header<'_>) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(128);
        encode_header_into(header, &mut out);
        self.write(&out).await?;
        Ok(out.split_off(4))
    }

    /// Reads the peer's next header (its exact bytes and the decoded header) for `what`.
    async fn read(&mut self, what: &str) -> Result<bytes::Bytes> {
        let limits = self.limits;
        let read = self.reader.read_header(&limits);
        let stop = step(self.deadline, self.evicted, read).await;
        let header = match self.settle(stop).await {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(Error::PeerClosed(format!(
                    "{} (during the handshake, waiting for {what})",
                    self.label
                )))
            }
            Err(Error::Wire(e)) => return self.refuse(e).await,
            Err(other) => return Err(other),
        };
        // Descriptors ride on the first byte of the message that carries them (spec §7.2), and
        // a read that brings some ends with that message's bytes: while bytes after this
        // header are buffered, waiting descriptors may be the next message's (after `ready`,
        // a legitimate one), so they are judged at the next read, or by the read loop.
        let ahead = self.reader.buffered();
        let fds = self.reader.stream_mut();
        if fds.take_fd_error().is_some() || (fds.pending_fds() > 0 && ahead == 0) {
            let e = WireError::BadShm("file descriptors arrived before the handshake completed".into());
            return self.refuse(e).await;
        }
        Ok(header)
    }

    /// Decodes a header that must be `what`; anything else refuses the connection (unless
    /// the peer itself reported an error, which we do not answer).
    /// The kinds of both versions are decoded alike; one that is not `what` (a hello on a v2
    /// connection, a challenge on a v1 one) is a `handshake` error (spec §5.1, §11.2 step 3).
    async fn expect<'h>(&mut self, bytes: &'h [u8], what: &str) -> Result<Header<'h>> {
        let header = match Header::decode(bytes, &self.limits) {
            Ok(h) => h,
            Err(e) => return self.refuse(e).await,
        };
        let wanted = header.kind() == what;
        match header {
            h if wanted => Ok(h),
            Header::Error { code, message } => Err(Error::Refused {
                peer: self.label.to_string(),
                code,
                message,
            }),
            other => {
                let e = WireError::Handshake(format!("expected {what}, got a {:?} header", other.kind()));
                self.refuse(e).await
            }
        }
    }
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
    } = ours;
    let mut talk = Conversation {
        reader,
        writer,
        label,
        limits: limits.during_handshake(),
        deadline,
        write_timeout,
        evicted: &mut evicted,
    };
    let own_preamble = preamble.encode();
    talk.write(&own_preamble).await?;
    let peer_preamble = {
        let read = talk.reader.read_preamble();
        let stop = step(deadline, talk.evicted, read).await;
        talk.settle(stop).await?
    };
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
    let peer = match version {
        1 => v1::exchange(&mut talk, secret, ident).await?,
        2 => {
            let peer_preamble: [u8; 16] = peer_preamble[..].try_into().expect("a preamble is 16 bytes");
            v2::exchange(&mut talk, secret, (&own_preamble, &peer_preamble), ident).await?
        }
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
    talk.reader.established();
    Ok(Handshaken { ident: peer, version })
}

/// Refuses a connection the node cannot take at all (too many connections): our preamble
/// and `error {code: "overloaded"}` (readable by every version, spec §12), then close.
pub(crate) async fn refuse_overloaded<W: AsyncWrite + Unpin>(writer: &mut W, preamble: Preamble, why: String) {
    let _ = write_all(writer, &preamble.encode(), ERROR_WRITE_LIMIT).await;
    send_error(writer, &WireError::Overloaded(why)).await;
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, writer.shutdown()).await;
}

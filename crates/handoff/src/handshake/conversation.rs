//! One handshake's conversation: writing and reading its headers within the deadline,
//! giving up when evicted, and refusing the connection (the peer told why) when a step fails.
//! Both protocol versions (`v1`, `v2`) talk through it.

use std::time::Duration;

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Header, Limits, WireError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::io::{write_all, FdSource, MessageReader};
use crate::{Error, Result};

/// The longest an `error` may take to write before we close anyway.
pub(super) const ERROR_WRITE_LIMIT: Duration = Duration::from_secs(1);
/// What we read and drop after sending an `error`, before closing (spec §11.3).
pub(crate) const DRAIN_BYTES: usize = 1 << 20;
/// How long we wait for that.
pub(crate) const DRAIN_TIME: Duration = Duration::from_secs(1);

/// The longest explanation an `error` carries (spec §6.5): it may quote what the peer sent.
pub(crate) const MAX_ERROR_TEXT: usize = 1024;

/// `text` cut to at most [`MAX_ERROR_TEXT`] bytes, on a character boundary, with a mark.
fn clipped(text: String) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let mut keep = MAX_ERROR_TEXT - 32;
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{} … ({} more bytes)", &text[..keep], text.len() - keep)
}

/// Sends an `error` header to the peer, best effort and bounded in time, before we close.
pub(crate) async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, err: &WireError) {
    let mut out = Vec::new();
    encode_header_into(
        &Header::Error {
            code: err.code().to_string(),
            message: clipped(err.to_string()),
        },
        &mut out,
    );
    let _ = write_all(w, &out, ERROR_WRITE_LIMIT).await;
}

/// Refuses a connection: the error (only to a peer that sent its whole preamble, spec §3,
/// §11.3: one that has not shown it speaks the format gets none), our sending side shut
/// down first (so the error is delivered and not reset away), what the peer still sends
/// read and dropped for a moment when it may still be talking, then the error returned
/// (the caller drops the socket).
async fn fail<R, W>(reader: &mut MessageReader<R>, writer: &mut W, err: WireError, tell: bool) -> Error
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if tell {
        send_error(writer, &err).await;
    }
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, writer.shutdown()).await;
    // A silent or evicted peer has nothing to drain; waiting for it would only hold the slot.
    // Nor has one that sent descriptors before it proved anything: it is cut off at once.
    if tell
        && !matches!(
            err,
            WireError::Timeout(_) | WireError::Overloaded(_) | WireError::BadShm(_)
        )
    {
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
pub(super) fn check_capabilities(capabilities: &[String]) -> std::result::Result<(), WireError> {
    if capabilities.iter().any(|c| c == "inline") {
        return Ok(());
    }
    Err(WireError::Handshake(format!(
        "the peer lacks the capability \"inline\" that every node announces (it has: {})",
        capabilities.join(", ")
    )))
}

/// The handshake of one connection: reader, writer, and what bounds it.
pub(super) struct Conversation<'r, 'w, 'e, R, W> {
    reader: &'r mut MessageReader<R>,
    writer: &'w mut W,
    label: &'r str,
    limits: Limits,
    deadline: tokio::time::Instant,
    write_timeout: Duration,
    evicted: &'e mut Option<oneshot::Receiver<()>>,
    /// Whether the peer's whole preamble arrived: only then may an `error` go out.
    preamble_in: bool,
}

impl<'r, 'w, 'e, R, W> Conversation<'r, 'w, 'e, R, W>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    /// A conversation on `reader` and `writer`, bounded by `limits` and `deadline`; `evicted`
    /// fires when the node needs this handshake's place for a newer one.
    pub(super) fn new(
        reader: &'r mut MessageReader<R>,
        writer: &'w mut W,
        label: &'r str,
        limits: Limits,
        deadline: tokio::time::Instant,
        write_timeout: Duration,
        evicted: &'e mut Option<oneshot::Receiver<()>>,
    ) -> Self {
        Conversation {
            reader,
            writer,
            label,
            limits,
            deadline,
            write_timeout,
            evicted,
            preamble_in: false,
        }
    }

    /// Reads the peer's preamble.
    pub(super) async fn read_preamble(&mut self) -> Result<bytes::Bytes> {
        let read = self.reader.read_preamble();
        let stop = step(self.deadline, self.evicted, read).await;
        let read = self.settle(stop).await;
        self.check_fds().await?;
        let preamble = read?;
        self.preamble_in = true;
        Ok(preamble)
    }

    /// The handshake is over: the reader takes the limits of an established connection, and
    /// file descriptors are welcome from the next message on.
    pub(super) fn established(&mut self) {
        self.reader.established();
        self.reader.stream_mut().established();
    }

    pub(super) async fn refuse<T>(&mut self, err: WireError) -> Result<T> {
        Err(fail(self.reader, self.writer, err, self.preamble_in).await)
    }

    /// Descriptors that came before the connection was established (spec §5.1): the reader
    /// closed them as they arrived and failed its read; here the connection is refused.
    async fn check_fds(&mut self) -> Result<()> {
        let fds = self.reader.stream_mut();
        if let Some(problem) = fds.take_fd_error() {
            let e = WireError::BadShm(format!("{problem}; they were closed"));
            return self.refuse(e).await;
        }
        Ok(())
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

    pub(super) async fn write(&mut self, bytes: &[u8]) -> Result<()> {
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
    pub(super) async fn send(&mut self, header: &Header<'_>) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(128);
        encode_header_into(header, &mut out);
        self.write(&out).await?;
        Ok(out.split_off(4))
    }

    /// Reads the peer's next header (its exact bytes and the decoded header) for `what`.
    pub(super) async fn read(&mut self, what: &str) -> Result<bytes::Bytes> {
        let limits = self.limits;
        let read = self.reader.read_header(&limits);
        let stop = step(self.deadline, self.evicted, read).await;
        let read = self.settle(stop).await;
        self.check_fds().await?;
        let header = match read {
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
        // No read of the handshake goes past the message it reads, so nothing of the next
        // message (after `ready`, a legitimate one with descriptors) can have arrived; and the
        // reader refuses every descriptor until it is established (checked above).
        debug_assert_eq!(self.reader.buffered(), 0, "a handshake read went past its message");
        debug_assert_eq!(self.reader.stream_mut().pending_fds(), 0);
        Ok(header)
    }

    /// Decodes a header that must be `what`; anything else refuses the connection (unless
    /// the peer itself reported an error, which we do not answer).
    /// The kinds of both versions are decoded alike; one that is not `what` (a hello on a v2
    /// connection, a challenge on a v1 one) is a `handshake` error (spec §5.1, §11.2 step 3).
    pub(super) async fn expect<'h>(&mut self, bytes: &'h [u8], what: &str) -> Result<Header<'h>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_explanations_are_clipped_on_a_character_boundary() {
        assert_eq!(clipped("short".into()), "short");
        let long = "é".repeat(2000);
        let c = clipped(long);
        assert!(c.len() <= MAX_ERROR_TEXT, "{}", c.len());
        assert!(c.ends_with("more bytes)"));
    }
}

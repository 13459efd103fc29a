//! Reading and writing the wire format on a byte stream (the I/O around `handoff-wire`).

use std::io::IoSlice;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use handoff_wire::Buffer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Error, Result};

/// Reads the handshake from a fresh stream, never past the item the handshake engine reads
/// (its `wants`): so every descriptor that arrives before the connection is established came
/// with a handshake byte, and those of the first message after `ready` are never taken for
/// them (spec §5.1). The established connection's engine then takes the stream over.
pub(crate) struct HandshakeReader<R> {
    stream: R,
    label: String,
}

impl<R: AsyncRead + Unpin> HandshakeReader<R> {
    pub(crate) fn new(stream: R, label: String) -> Self {
        HandshakeReader { stream, label }
    }

    /// One read of at most `most` bytes; empty at the end of the stream.
    pub(crate) async fn read_some(&mut self, most: usize) -> Result<Bytes> {
        let mut buf = BytesMut::with_capacity(most);
        (&mut self.stream)
            .take(most as u64)
            .read_buf(&mut buf)
            .await
            .map_err(|e| Error::io(format!("reading from {}", self.label), e))?;
        Ok(buf.freeze())
    }

    /// The stream, for the established connection's engine.
    pub(crate) fn into_stream(self) -> R {
        self.stream
    }
}

/// After an error was sent: reads and drops what still arrives until the peer closes,
/// `max_bytes` were read or `max_time` passed, so that closing the socket does not reset
/// the connection while the peer's data is unread (which can destroy the error in flight,
/// spec §11.3).
pub(crate) async fn drain<R: AsyncRead + Unpin>(stream: &mut R, max_bytes: usize, max_time: Duration) {
    let deadline = tokio::time::Instant::now() + max_time;
    let mut read = 0;
    let mut scratch = [0u8; 8192];
    while read < max_bytes {
        match tokio::time::timeout_at(deadline, stream.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => read += n,
            _ => return,
        }
    }
}

impl<R> HandshakeReader<R> {
    /// The stream (for the descriptors a Unix socket collected).
    pub(crate) fn stream_mut(&mut self) -> &mut R {
        &mut self.stream
    }
}

/// A stream that may carry file descriptors beside its bytes (a Unix socket does).
pub(crate) trait FdSource {
    /// Takes every descriptor that arrived, in order (the engine judges them).
    fn drain_fds(&mut self) -> Vec<std::os::fd::OwnedFd>;
    /// A problem with the descriptors seen while reading.
    fn take_fd_error(&mut self) -> Option<String>;
}

impl FdSource for tokio::net::tcp::OwnedReadHalf {
    fn drain_fds(&mut self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }
    fn take_fd_error(&mut self) -> Option<String> {
        None
    }
}

/// Writes every byte of `head` and `frames` with vectored writes straight from their
/// memory. Each write must make progress within `stall` (a peer that reads nothing cannot
/// hold the writer forever): past it the write fails with `TimedOut`.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    stream: &mut W,
    head: &[u8],
    frames: &[Buffer],
    stall: Duration,
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + frames.len());
    if !head.is_empty() {
        slices.push(IoSlice::new(head));
    }
    slices.extend(frames.iter().filter(|f| !f.is_empty()).map(|f| IoSlice::new(f)));
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = tokio::time::timeout(stall, stream.write_vectored(rest))
            .await
            .map_err(|_| stalled_write(stall))??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    flush_within(stream, stall).await
}

/// Writes a preamble or a whole small message, each write within `stall` as above.
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(
    stream: &mut W,
    bytes: &[u8],
    stall: Duration,
) -> std::io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = tokio::time::timeout(stall, stream.write(rest))
            .await
            .map_err(|_| stalled_write(stall))??;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        rest = &rest[n..];
    }
    flush_within(stream, stall).await
}

/// Flushes what the stream buffers itself: nothing for a socket, the last TLS records for a
/// TLS stream (which may hold them when the socket was full), within `stall` as above.
/// A socket is flushed at its first poll, so no timer is set for it: only a flush that has
/// to wait (TLS behind a full socket) is timed.
async fn flush_within<W: AsyncWrite + Unpin>(stream: &mut W, stall: Duration) -> std::io::Result<()> {
    let at_once = std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *stream).poll_flush(cx) {
        std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    match at_once {
        Some(r) => r,
        None => tokio::time::timeout(stall, stream.flush())
            .await
            .map_err(|_| stalled_write(stall))?,
    }
}

/// The error of a write that made no progress for `stall`.
pub(crate) fn stalled_write(stall: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the peer read nothing for {stall:?}"),
    )
}

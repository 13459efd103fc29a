//! Reading and writing the wire format on a byte stream (the I/O around `handoff-wire`).

use std::io::IoSlice;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use handoff_wire::framing::{header_len, LEN_PREFIX};
use handoff_wire::{Buffer, Limits, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Error, Result};
use handoff_proto::recv_buffers::{RecvPool, MIN_POOLED};

const READ_CHUNK: usize = 64 * 1024;

/// Frames at least this large are hashed on a helper thread while they arrive.
const HASH_BEHIND_MIN: usize = 8 << 20;
/// Bytes handed to the helper thread at a time.
const HASH_BEHIND_STEP: usize = 1 << 20;

/// Reads preambles, headers and frames from a stream through a small read buffer;
/// large frames are read straight into pooled buffers, with no copy in between.
///
/// Once the first byte of a message has arrived, every later read of that message must
/// make progress within the progress timeout (spec §9.1), so a peer that stalls in the
/// middle of a message cannot hold what it announced for as long as it likes. Between
/// messages a connection may stay idle.
pub(crate) struct MessageReader<R> {
    stream: R,
    buf: BytesMut,
    label: String,
    /// During the handshake the read buffer grows only as needed (a connection that has
    /// not proven anything costs a few bytes, not a read-ahead buffer), and no read goes
    /// past the end of the item being read: so every file descriptor that arrives before
    /// the connection is established came with a handshake byte, and those of the first
    /// message after `ready` are never taken for them (spec §5.1).
    handshaking: bool,
    progress_timeout: Duration,
}

impl<R: AsyncRead + Unpin> MessageReader<R> {
    pub(crate) fn new(stream: R, label: String, progress_timeout: Duration) -> Self {
        MessageReader {
            stream,
            buf: BytesMut::new(),
            label,
            handshaking: true,
            progress_timeout,
        }
    }

    /// The handshake is over: read ahead in chunks from now on.
    pub(crate) fn established(&mut self) {
        self.handshaking = false;
    }

    /// One read from the stream into the buffer, of at most `most` bytes when given; inside
    /// a message it must make progress within the progress timeout.
    async fn read_more(&mut self, what: &'static str, inside: bool, most: Option<usize>) -> Result<usize> {
        let most = most.map_or(u64::MAX, |m| m as u64);
        let mut limited = (&mut self.stream).take(most);
        let read = limited.read_buf(&mut self.buf);
        let n = if inside {
            tokio::time::timeout(self.progress_timeout, read)
                .await
                .map_err(|_| self.stalled(what))?
        } else {
            read.await
        };
        n.map_err(|e| Error::io(format!("reading from {}", self.label), e))
    }

    fn stalled(&self, what: &str) -> Error {
        WireError::Timeout(format!(
            "{} sent nothing for {:?} in the middle of a message (waiting for its {what})",
            self.label, self.progress_timeout
        ))
        .into()
    }

    /// Reads until at least `n` bytes are buffered. Returns `false` if the stream
    /// ended cleanly before any byte of this item arrived.
    async fn fill(&mut self, n: usize, what: &'static str, at_boundary: bool) -> Result<bool> {
        while self.buf.len() < n {
            let missing = n - self.buf.len();
            if self.buf.capacity() - self.buf.len() < missing.min(READ_CHUNK) {
                let want = if self.handshaking {
                    missing
                } else {
                    missing.max(READ_CHUNK)
                };
                self.buf.reserve(want);
            }
            // Waiting for the first byte of a message is idling, not a stall.
            let inside = !(at_boundary && self.buf.is_empty());
            let most = self.handshaking.then_some(missing);
            if self.read_more(what, inside, most).await? == 0 {
                if at_boundary && self.buf.is_empty() {
                    return Ok(false);
                }
                return Err(WireError::Truncated {
                    what,
                    needed: n as u64,
                    available: self.buf.len() as u64,
                }
                .into());
            }
        }
        Ok(true)
    }

    /// One read of at most `most` bytes (the handshake engine's `wants`, so that nothing
    /// past the item it reads is taken), or what is buffered; empty at the end of the stream.
    pub(crate) async fn read_some(&mut self, most: usize) -> Result<Bytes> {
        if self.buf.is_empty() {
            self.buf.reserve(most);
            self.read_more("handshake", false, Some(most)).await?;
        }
        let n = self.buf.len().min(most);
        Ok(self.buf.split_to(n).freeze())
    }

    /// The length of the next header, checked against `limits`, without consuming it;
    /// `None` at a clean end of stream. Lets the caller make room for a large header
    /// before reading it.
    pub(crate) async fn next_header_len(&mut self, limits: &Limits) -> Result<Option<usize>> {
        if !self.fill(LEN_PREFIX, "header length", true).await? {
            return Ok(None);
        }
        let prefix = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
        Ok(Some(header_len(prefix, limits)?))
    }

    /// The header whose length [`next_header_len`](Self::next_header_len) returned.
    pub(crate) async fn read_header_of(&mut self, len: usize) -> Result<Bytes> {
        self.fill(LEN_PREFIX + len, "header", false).await?;
        self.buf.advance(LEN_PREFIX);
        Ok(self.buf.split_to(len).freeze())
    }

    /// Reads and drops the next `len` bytes (a `pulled` nobody waits for), through the
    /// small read buffer: nothing of that size is allocated.
    pub(crate) async fn discard(&mut self, len: u64) -> Result<()> {
        let mut left = len;
        loop {
            let have = (self.buf.len() as u64).min(left);
            self.buf.advance(have as usize);
            left -= have;
            if left == 0 {
                return Ok(());
            }
            if self.buf.capacity() < READ_CHUNK {
                self.buf.reserve(READ_CHUNK);
            }
            if self.read_more("discarded bytes", true, None).await? == 0 {
                return Err(WireError::Truncated {
                    what: "pulled bytes",
                    needed: len,
                    available: len - left,
                }
                .into());
            }
        }
    }

    /// After an error was sent: reads and drops what still arrives until the peer closes,
    /// `max_bytes` were read or `max_time` passed, so that closing the socket does not
    /// reset the connection while the peer's data is unread (which can destroy the error
    /// in flight, spec §11.3).
    pub(crate) async fn drain(&mut self, max_bytes: usize, max_time: Duration) {
        self.buf.clear();
        let deadline = tokio::time::Instant::now() + max_time;
        let mut read = 0;
        let mut scratch = [0u8; 8192];
        while read < max_bytes {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut scratch)).await {
                Ok(Ok(n)) if n > 0 => read += n,
                _ => return,
            }
        }
    }

    /// The next inline frame of `len` bytes.
    pub(crate) async fn read_frame(&mut self, len: u64, pool: &RecvPool) -> Result<Bytes> {
        self.read_frame_hashing(len, pool, None).await
    }

    /// Like [`read_frame`](Self::read_frame); with a hasher, also feeds it every byte as it
    /// arrives, so that checking a digest overlaps with the transfer instead of following it.
    pub(crate) async fn read_frame_hashing(
        &mut self,
        len: u64,
        pool: &RecvPool,
        mut hasher: Option<&mut blake3::Hasher>,
    ) -> Result<Bytes> {
        let len = usize::try_from(len).map_err(|_| WireError::FrameTooLarge {
            index: 0,
            len,
            limit: usize::MAX as u64,
        })?;
        if len < MIN_POOLED {
            self.fill(len, "frame", false).await?;
            let bytes = self.buf.split_to(len).freeze();
            if let Some(h) = hasher {
                h.update(&bytes);
            }
            return Ok(bytes);
        }
        let mut target = pool.take(len);
        // Kept as an address so the future stays `Send`; turned into slices as needed.
        let base_addr = target.as_mut_slice().as_mut_ptr() as usize;
        let base = || base_addr as *mut u8;
        let buffered = self.buf.len().min(len);
        // SAFETY: `base` points at `len` bytes that `target` owns and keeps in place until it
        // is frozen below; each slice made from it covers bytes no other live slice does.
        unsafe { std::slice::from_raw_parts_mut(base(), buffered) }.copy_from_slice(&self.buf[..buffered]);
        self.buf.advance(buffered);
        // Large frames are hashed on a helper thread, behind the reads.
        // SAFETY: only ranges already read are pushed, never written again; `behind` is
        // finished or dropped (which waits for the thread) before `target` is.
        let behind = match hasher.is_some() && len >= HASH_BEHIND_MIN {
            true => Some(unsafe { crate::hashing::HashBehind::start(base()) }).filter(|b| b.is_running()),
            false => None,
        };
        let step = if behind.is_some() { HASH_BEHIND_STEP } else { 256 << 10 };
        let mut hashed = 0;
        let mut filled = buffered;
        while filled < len {
            // SAFETY: `filled..len` has not been read yet, and no other slice covers it.
            let free = unsafe { std::slice::from_raw_parts_mut(base().add(filled), len - filled) };
            let n = tokio::time::timeout(self.progress_timeout, self.stream.read(free))
                .await
                .map_err(|_| self.stalled("frame"))?
                .map_err(|e| Error::io(format!("reading from {}", self.label), e))?;
            if n == 0 {
                return Err(WireError::Truncated {
                    what: "frame",
                    needed: len as u64,
                    available: filled as u64,
                }
                .into());
            }
            filled += n;
            // Hash in runs of at least `step`: large updates use blake3's widest SIMD.
            if filled - hashed >= step {
                if let Some(b) = &behind {
                    b.push(hashed, filled);
                } else if let Some(h) = hasher.as_deref_mut() {
                    // SAFETY: `hashed..filled` was read and is not written again.
                    h.update(unsafe { std::slice::from_raw_parts(base().add(hashed), filled - hashed) });
                }
                hashed = filled;
            }
        }
        if let Some(h) = hasher {
            if let Some(b) = behind {
                b.push(hashed, len);
                if let Some(done) = b.finish().await {
                    *h = done;
                }
            } else {
                // SAFETY: as above.
                h.update(unsafe { std::slice::from_raw_parts(base().add(hashed), len - hashed) });
            }
        }
        Ok(target.freeze())
    }
}

impl<R> MessageReader<R> {
    /// The stream (for the descriptors a Unix socket collected).
    pub(crate) fn stream_mut(&mut self) -> &mut R {
        &mut self.stream
    }

    /// Bytes read ahead and not yet consumed.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// A stream that may carry file descriptors beside its bytes (a Unix socket does).
pub(crate) trait FdSource {
    /// Takes the next `n` descriptors that arrived, in order (`None`: fewer arrived).
    fn take_fds(&mut self, n: usize) -> Option<Vec<std::os::fd::OwnedFd>>;
    /// The handshake is over: descriptors may arrive from now on. Until then every one is
    /// closed on arrival and fails the read (spec §5.1).
    fn established(&mut self);
    /// Descriptors that arrived and no header has claimed.
    fn pending_fds(&self) -> usize;
    /// A problem with the descriptors seen while reading.
    fn take_fd_error(&mut self) -> Option<String>;
}

impl FdSource for tokio::net::tcp::OwnedReadHalf {
    fn take_fds(&mut self, n: usize) -> Option<Vec<std::os::fd::OwnedFd>> {
        (n == 0).then(Vec::new)
    }
    fn established(&mut self) {}
    fn pending_fds(&self) -> usize {
        0
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

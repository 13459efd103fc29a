//! Reading and writing the wire format on a byte stream (the I/O around `handoff-wire`).

use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use handoff_wire::framing::{header_len, LEN_PREFIX};
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::{Buffer, Limits, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pool::{RecvPool, MIN_POOLED};
use crate::{Error, Result};

const READ_CHUNK: usize = 64 * 1024;

/// Frames at least this large are hashed on a helper thread while they arrive.
const HASH_BEHIND_MIN: usize = 8 << 20;
/// Bytes handed to the helper thread at a time.
const HASH_BEHIND_STEP: usize = 1 << 20;

/// Reads preambles, headers and frames from a stream through a small read buffer;
/// large frames are read straight into pooled buffers, with no copy in between.
pub(crate) struct MessageReader<R> {
    stream: R,
    buf: BytesMut,
    label: String,
}

impl<R: AsyncRead + Unpin> MessageReader<R> {
    pub(crate) fn new(stream: R, label: String) -> Self {
        MessageReader {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            label,
        }
    }

    /// Reads until at least `n` bytes are buffered. Returns `false` if the stream
    /// ended cleanly before any byte of this item arrived.
    async fn fill(&mut self, n: usize, what: &'static str, at_boundary: bool) -> Result<bool> {
        while self.buf.len() < n {
            if self.buf.capacity() - self.buf.len() < READ_CHUNK.min(n - self.buf.len()) {
                self.buf.reserve(READ_CHUNK.max(n - self.buf.len()));
            }
            let read = self
                .stream
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| Error::io(format!("reading from {}", self.label), e))?;
            if read == 0 {
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

    /// The peer's 16-byte preamble.
    pub(crate) async fn read_preamble(&mut self) -> Result<Bytes> {
        self.fill(PREAMBLE_LEN, "preamble", false).await?;
        Ok(self.buf.split_to(PREAMBLE_LEN).freeze())
    }

    /// The next header's bytes (without the length prefix), or `None` at a clean end of stream.
    pub(crate) async fn read_header(&mut self, limits: &Limits) -> Result<Option<Bytes>> {
        if !self.fill(LEN_PREFIX, "header length", true).await? {
            return Ok(None);
        }
        let prefix = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
        let len = header_len(prefix, limits)?;
        self.fill(LEN_PREFIX + len, "header", false).await?;
        self.buf.advance(LEN_PREFIX);
        Ok(Some(self.buf.split_to(len).freeze()))
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
            let n = self
                .stream
                .read(free)
                .await
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
    /// Descriptors that arrived and no header has claimed.
    fn pending_fds(&self) -> usize;
    /// A problem with the descriptors seen while reading.
    fn take_fd_error(&mut self) -> Option<String>;
}

impl FdSource for tokio::net::tcp::OwnedReadHalf {
    fn take_fds(&mut self, n: usize) -> Option<Vec<std::os::fd::OwnedFd>> {
        (n == 0).then(Vec::new)
    }
    fn pending_fds(&self) -> usize {
        0
    }
    fn take_fd_error(&mut self) -> Option<String> {
        None
    }
}

impl FdSource for crate::unix::FdReader {
    fn take_fds(&mut self, n: usize) -> Option<Vec<std::os::fd::OwnedFd>> {
        crate::unix::FdReader::take_fds(self, n)
    }
    fn pending_fds(&self) -> usize {
        crate::unix::FdReader::pending_fds(self)
    }
    fn take_fd_error(&mut self) -> Option<String> {
        self.take_error()
    }
}

/// Writes every byte of `head` and `frames` with vectored writes straight from their memory.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    stream: &mut W,
    head: &[u8],
    frames: &[Buffer],
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + frames.len());
    if !head.is_empty() {
        slices.push(IoSlice::new(head));
    }
    slices.extend(frames.iter().filter(|f| !f.is_empty()).map(|f| IoSlice::new(f)));
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = stream.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Writes a preamble or a whole small message.
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(stream: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await
}

//! A byte stream that reads ahead into a fixed buffer of its own: what TLS reads its TCP
//! socket through.
//!
//! rustls asks its transport for at most 4 KiB at a time (its deframer grows by that much
//! per read), so a TLS stream read straight from its socket makes four or five `recv`
//! calls for each 16 KiB record. Read through [`ReadAhead`], one `recv` takes whatever the
//! socket holds, up to the buffer's size, and rustls's small reads are served from memory.
//!
//! The buffer is fixed in size and made only when [`ReadAhead::read_ahead`] is called
//! (after the TLS handshake): before that every read goes straight to the stream, so a
//! connection that has proven nothing costs no buffer. Bytes held in the buffer are
//! invisible to the event loop's readiness, so a read that finds the buffer non-empty never
//! waits: it returns them at once, and only a read that finds the buffer empty polls the
//! stream.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose reads go through a buffer of its own once [`read_ahead`](Self::read_ahead)
/// made one; writes pass straight through.
pub(crate) struct ReadAhead<S> {
    inner: S,
    /// Empty until `read_ahead`; then its size never changes.
    buf: Box<[u8]>,
    /// The bytes read and not yet handed out: `buf[start..end]`.
    start: usize,
    end: usize,
}

impl<S> ReadAhead<S> {
    /// `inner`, read straight through until [`read_ahead`](Self::read_ahead) is called.
    pub(crate) fn new(inner: S) -> ReadAhead<S> {
        ReadAhead {
            inner,
            buf: Box::default(),
            start: 0,
            end: 0,
        }
    }

    /// From now on reads of the stream take up to `size` bytes at a time into this buffer
    /// (made once; later calls change nothing).
    pub(crate) fn read_ahead(&mut self, size: usize) {
        if self.buf.is_empty() {
            self.buf = vec![0u8; size].into_boxed_slice();
        }
    }

    /// The stream read through.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Bytes read ahead and not yet handed out.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.start == this.end {
            if out.remaining() >= this.buf.len() {
                // No buffer yet, or the caller's is as large: read straight into it.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut into = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut into))?;
            this.start = 0;
            this.end = into.filled().len();
            if this.end == 0 {
                return Poll::Ready(Ok(())); // the end of the stream
            }
        }
        let n = out.remaining().min(this.end - this.start);
        out.put_slice(&this.buf[this.start..this.start + n]);
        this.start += n;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_straight_through_until_told_then_ahead_in_order() {
        let (mut far, near) = tokio::io::duplex(1 << 20);
        let mut r = ReadAhead::new(near);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        far.write_all(&data[..10]).await.unwrap();
        let mut got = [0u8; 4];
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, &data[..4]);
        assert_eq!(r.buffered(), 0, "no buffer before read_ahead: nothing read ahead");
        r.read_ahead(64 << 10);
        far.write_all(&data[10..]).await.unwrap();
        let mut out = vec![0u8; data.len() - 4];
        // Small reads (as rustls makes), served from the buffer, then one large one.
        let mut pos = 0;
        while pos < 20_000 {
            let n = r.read(&mut out[pos..pos + 4096]).await.unwrap();
            assert!(n > 0);
            pos += n;
        }
        assert!(
            r.buffered() > 0,
            "a small read took more from the stream than it asked for"
        );
        r.read_exact(&mut out[pos..]).await.unwrap();
        assert_eq!(out, data[4..]);
        drop(far);
        assert_eq!(r.read(&mut got).await.unwrap(), 0, "the end of the stream");
    }

    #[tokio::test]
    async fn never_holds_more_than_its_buffer() {
        let (mut far, near) = tokio::io::duplex(1 << 20);
        let mut r = ReadAhead::new(near);
        r.read_ahead(1000);
        far.write_all(&[5u8; 100_000]).await.unwrap();
        let mut one = [0u8; 1];
        r.read_exact(&mut one).await.unwrap();
        assert_eq!(r.buffered(), 999);
        assert_eq!(r.buf.len(), 1000);
    }
}

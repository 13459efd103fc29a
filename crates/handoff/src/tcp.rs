//! A TCP connection's two halves, plain or inside TLS (`spec/WIRE.md` §3.1): what the read
//! loop reads and what the link writes, whichever the connection is.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::io::FdSource;
use crate::tls::TlsSocket;

/// A TCP connection after its TLS handshake, if it has one.
pub(crate) enum TcpConn {
    /// Plain TCP.
    Plain(TcpStream),
    /// Inside TLS (either side of the TLS handshake).
    Tls(Box<tokio_rustls::TlsStream<TlsSocket>>),
}

impl TcpConn {
    /// Splits the connection into the read half (for the read loop) and the write half (for
    /// the link).
    pub(crate) fn split(self) -> (TcpReader, TcpWriter) {
        match self {
            TcpConn::Plain(stream) => {
                let (r, w) = stream.into_split();
                (TcpReader::Plain(r), TcpWriter::Plain(w))
            }
            TcpConn::Tls(stream) => {
                let fd = stream.get_ref().0.get_ref().as_raw_fd();
                let vectored = stream.is_write_vectored();
                let shared = Arc::new(SharedTls {
                    stream: Mutex::new(*stream),
                    waiting: [Mutex::new(None), Mutex::new(None)],
                });
                (
                    TcpReader::Tls(shared.clone()),
                    TcpWriter::Tls {
                        half: shared,
                        fd,
                        vectored,
                    },
                )
            }
        }
    }
}

/// A TLS stream that the read loop and the link share: one TLS session serves both
/// directions, so each poll of either half takes the stream for that poll.
///
/// Unlike `tokio::io::split` (a blocking mutex), a half that finds the other one inside the
/// stream waits as a task, not as a thread: the writer holds the stream while it encrypts
/// and writes up to 64 KiB of records, and a read loop blocked on the mutex for that long
/// held one of the runtime's workers, which then ran nothing else (the raw TLS stream of
/// `handoff bench`, one task for both directions, never waits so).
pub(crate) struct SharedTls {
    stream: Mutex<tokio_rustls::TlsStream<TlsSocket>>,
    /// The waker of the half (0: read, 1: write) that found the stream taken, woken when
    /// the other half lets go of it.
    waiting: [Mutex<Option<Waker>>; 2],
}

const READ: usize = 0;
const WRITE: usize = 1;

impl SharedTls {
    /// Runs `f` on the stream for half `me`; `Pending` (and a wake-up when the other half
    /// is done) if the other half has it now.
    fn poll_with<R>(
        &self,
        me: usize,
        cx: &mut Context<'_>,
        f: impl FnOnce(Pin<&mut tokio_rustls::TlsStream<TlsSocket>>, &mut Context<'_>) -> Poll<R>,
    ) -> Poll<R> {
        let mut stream = match self.stream.try_lock() {
            Ok(stream) => stream,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                *self.waiting[me].lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
                // Again, after registering: the other half may have let go in between, and
                // its wake-up would then have found no waker.
                match self.stream.try_lock() {
                    Ok(stream) => stream,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return Poll::Pending,
                }
            }
        };
        let result = f(Pin::new(&mut *stream), cx);
        drop(stream);
        let other = self.waiting[1 - me]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = other {
            waker.wake();
        }
        result
    }
}

/// The read half of a TCP connection.
pub(crate) enum TcpReader {
    Plain(OwnedReadHalf),
    Tls(Arc<SharedTls>),
}

/// The write half of a TCP connection.
pub(crate) enum TcpWriter {
    Plain(OwnedWriteHalf),
    /// `fd` is the socket's descriptor, valid while this half lives (it keeps the stream).
    Tls {
        half: Arc<SharedTls>,
        fd: RawFd,
        vectored: bool,
    },
}

impl TcpWriter {
    /// The socket, to shut it down in both directions when a write stalls.
    pub(crate) fn socket(&self) -> BorrowedFd<'_> {
        match self {
            TcpWriter::Plain(w) => w.as_ref().as_fd(),
            // SAFETY: the write half holds the TLS stream, and with it the socket, open for
            // as long as `self` is borrowed.
            TcpWriter::Tls { fd, .. } => unsafe { BorrowedFd::borrow_raw(*fd) },
        }
    }
}

impl AsyncRead for TcpReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            TcpReader::Plain(r) => Pin::new(r).poll_read(cx, buf),
            TcpReader::Tls(shared) => shared.poll_with(READ, cx, |s, cx| s.poll_read(cx, buf)),
        }
    }
}

impl FdSource for TcpReader {
    fn drain_fds(&mut self) -> Vec<std::os::fd::OwnedFd> {
        Vec::new()
    }
    fn take_fd_error(&mut self) -> Option<String> {
        None
    }
}

impl AsyncWrite for TcpWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write(cx, buf),
            TcpWriter::Tls { half, .. } => half.poll_with(WRITE, cx, |s, cx| s.poll_write(cx, buf)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            TcpWriter::Tls { half, .. } => half.poll_with(WRITE, cx, |s, cx| s.poll_write_vectored(cx, bufs)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            TcpWriter::Plain(w) => w.is_write_vectored(),
            TcpWriter::Tls { vectored, .. } => *vectored,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_flush(cx),
            TcpWriter::Tls { half, .. } => half.poll_with(WRITE, cx, |s, cx| s.poll_flush(cx)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_shutdown(cx),
            TcpWriter::Tls { half, .. } => half.poll_with(WRITE, cx, |s, cx| s.poll_shutdown(cx)),
        }
    }
}

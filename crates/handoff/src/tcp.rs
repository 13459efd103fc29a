//! A TCP connection's two halves, plain or inside TLS (`spec/WIRE.md` §3.1): what the read
//! loop reads and what the link writes, whichever the connection is.
//!
//! Inside TLS, both halves share the connection's TLS session (the engine's,
//! `handoff_proto::tls_session`) and lend it the socket without waiting ([`TryIo`]); a half
//! that must wait asks tokio for the socket's readiness.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{ready, Context, Poll, Waker};

use handoff_proto::tls_session::{TlsRead, TlsSession};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::io::FdSource;

/// A TCP connection after its TLS handshake, if it has one.
pub(crate) enum TcpConn {
    /// Plain TCP.
    Plain(TcpStream),
    /// Inside TLS (either side of the TLS handshake).
    Tls(TlsTcp),
}

/// A TCP socket and its TLS session, after the TLS handshake.
pub(crate) struct TlsTcp {
    tcp: Arc<TcpStream>,
    session: Arc<SharedSession>,
}

impl TlsTcp {
    pub(crate) fn new(tcp: TcpStream, session: TlsSession) -> TlsTcp {
        TlsTcp {
            tcp: Arc::new(tcp),
            session: Arc::new(SharedSession {
                session: Mutex::new(session),
                waiting: [Mutex::new(None), Mutex::new(None)],
            }),
        }
    }
}

/// A TLS session failure, as an I/O error's inner error (`tls::explain_io` finds it).
#[derive(Debug)]
pub(crate) struct TlsFailed(pub(crate) String);

impl std::fmt::Display for TlsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFailed {}

/// The socket as a TLS session reads and writes it: without waiting (`WouldBlock` when it
/// cannot go on now, and tokio forgets the readiness it had).
pub(crate) struct TryIo<'a>(pub(crate) &'a TcpStream);

impl Read for TryIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for TryIo<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
            TcpConn::Tls(TlsTcp { tcp, session }) => (
                TcpReader::Tls {
                    tcp: tcp.clone(),
                    session: session.clone(),
                },
                TcpWriter::Tls {
                    tcp,
                    session,
                    closing: false,
                },
            ),
        }
    }
}

/// The TLS session that the read loop and the link share: one session serves both
/// directions, so each poll of either half takes it for that poll.
///
/// A half that finds the other one inside the session waits as a task, not as a thread:
/// the writer holds the session while it encrypts up to 256 KiB, and a read loop blocked on
/// the mutex for that long would hold one of the runtime's workers, which then ran nothing
/// else.
pub(crate) struct SharedSession {
    session: Mutex<TlsSession>,
    /// The waker of the half (0: read, 1: write) that found the session taken, woken when
    /// the other half lets go of it.
    waiting: [Mutex<Option<Waker>>; 2],
}

const READ: usize = 0;
const WRITE: usize = 1;

impl SharedSession {
    /// Runs `f` on the session for half `me`; `Pending` (and a wake-up when the other half
    /// is done) if the other half has it now.
    fn poll_with<R>(&self, me: usize, cx: &mut Context<'_>, f: impl FnOnce(&mut TlsSession) -> R) -> Poll<R> {
        let mut session = match self.try_take() {
            Some(session) => session,
            None => {
                *self.waiting[me].lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
                // Again, after registering: the other half may have let go in between, and
                // its wake-up would then have found no waker.
                match self.try_take() {
                    Some(session) => session,
                    None => return Poll::Pending,
                }
            }
        };
        let result = f(&mut session);
        drop(session);
        let other = self.waiting[1 - me]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = other {
            waker.wake();
        }
        Poll::Ready(result)
    }

    fn try_take(&self) -> Option<MutexGuard<'_, TlsSession>> {
        match self.session.try_lock() {
            Ok(session) => Some(session),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// The read half of a TCP connection.
pub(crate) enum TcpReader {
    Plain(OwnedReadHalf),
    Tls {
        tcp: Arc<TcpStream>,
        session: Arc<SharedSession>,
    },
}

/// The write half of a TCP connection.
pub(crate) enum TcpWriter {
    Plain(OwnedWriteHalf),
    Tls {
        tcp: Arc<TcpStream>,
        session: Arc<SharedSession>,
        /// close_notify was queued (the write direction is being shut down).
        closing: bool,
    },
}

impl TcpWriter {
    /// The socket, to shut it down in both directions when a write stalls.
    pub(crate) fn socket(&self) -> BorrowedFd<'_> {
        match self {
            TcpWriter::Plain(w) => w.as_ref().as_fd(),
            TcpWriter::Tls { tcp, .. } => tcp.as_fd(),
        }
    }
}

/// The error of a failed TLS session, for the stream's reader or writer.
fn failed(why: String) -> std::io::Error {
    std::io::Error::other(TlsFailed(why))
}

impl AsyncRead for TcpReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let (tcp, session) = match self.get_mut() {
            TcpReader::Plain(r) => return Pin::new(r).poll_read(cx, buf),
            TcpReader::Tls { tcp, session } => (tcp, session),
        };
        loop {
            let read = ready!(session.poll_with(READ, cx, |s| s.read(&mut TryIo(tcp), buf.initialize_unfilled())));
            match read {
                TlsRead::Bytes(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                TlsRead::Failed(why) => return Poll::Ready(Err(failed(why))),
                TlsRead::WouldBlock => ready!(tcp.poll_read_ready(cx))?,
            }
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
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let (tcp, session) = match self.get_mut() {
            TcpWriter::Plain(w) => return Pin::new(w).poll_write_vectored(cx, bufs),
            TcpWriter::Tls { tcp, session, .. } => (tcp, session),
        };
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            // 0: the session holds as much as it may until the socket takes records.
            match ready!(session.poll_with(WRITE, cx, |s| s.write(&mut TryIo(tcp), bufs)))? {
                0 => ready!(tcp.poll_write_ready(cx))?,
                n => return Poll::Ready(Ok(n)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            TcpWriter::Plain(w) => w.is_write_vectored(),
            TcpWriter::Tls { .. } => true,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let (tcp, session) = match self.get_mut() {
            TcpWriter::Plain(w) => return Pin::new(w).poll_flush(cx),
            TcpWriter::Tls { tcp, session, .. } => (tcp, session),
        };
        loop {
            if ready!(session.poll_with(WRITE, cx, |s| s.flush(&mut TryIo(tcp))))? {
                return Poll::Ready(Ok(()));
            }
            ready!(tcp.poll_write_ready(cx))?;
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut *self {
            TcpWriter::Plain(w) => return Pin::new(w).poll_shutdown(cx),
            TcpWriter::Tls { session, closing, .. } if !*closing => {
                ready!(session.poll_with(WRITE, cx, TlsSession::close_notify));
                *closing = true;
            }
            TcpWriter::Tls { .. } => {}
        }
        ready!(self.as_mut().poll_flush(cx))?;
        Poll::Ready(rustix::net::shutdown(self.socket(), rustix::net::Shutdown::Write).map_err(Into::into))
    }
}

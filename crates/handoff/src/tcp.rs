//! A TCP connection's two halves, plain or inside TLS (`spec/WIRE.md` §3.1): what the read
//! loop reads and what the link writes, whichever the connection is.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
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
                let (r, w) = tokio::io::split(*stream);
                (TcpReader::Tls(r), TcpWriter::Tls { half: w, fd })
            }
        }
    }
}

/// The read half of a TCP connection.
pub(crate) enum TcpReader {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<tokio_rustls::TlsStream<TlsSocket>>),
}

/// The write half of a TCP connection.
pub(crate) enum TcpWriter {
    Plain(OwnedWriteHalf),
    /// `fd` is the socket's descriptor, valid while this half lives (it keeps the stream).
    Tls {
        half: WriteHalf<tokio_rustls::TlsStream<TlsSocket>>,
        fd: RawFd,
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
            TcpReader::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl FdSource for TcpReader {
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

impl AsyncWrite for TcpWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write(cx, buf),
            TcpWriter::Tls { half, .. } => Pin::new(half).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            TcpWriter::Tls { half, .. } => Pin::new(half).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            TcpWriter::Plain(w) => w.is_write_vectored(),
            TcpWriter::Tls { half, .. } => half.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_flush(cx),
            TcpWriter::Tls { half, .. } => Pin::new(half).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            TcpWriter::Plain(w) => Pin::new(w).poll_shutdown(cx),
            TcpWriter::Tls { half, .. } => Pin::new(half).poll_shutdown(cx),
        }
    }
}

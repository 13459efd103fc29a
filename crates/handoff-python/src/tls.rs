//! TLS between hosts (spec §3.1) for connections driven from Python's event loop: the
//! session is the engine's (`handoff_proto::tls_session`), shared with the tokio driver;
//! this module lends it the socket as a non-blocking reader and writer.

use std::io::{IoSlice, Read, Write};
use std::os::fd::BorrowedFd;

/// The socket as the TLS session reads and writes it: non-blocking `recv` and `send`
/// (`WouldBlock` when the socket cannot go on now).
pub(crate) struct SocketIo<'a>(pub(crate) BorrowedFd<'a>);

impl Read for SocketIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match rustix::io::read(self.0, buf) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Write for SocketIo<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match rustix::net::send(self.0, buf, rustix::net::SendFlags::NOSIGNAL) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Err(std::io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match crate::socket::send(self.0, bufs, &[]) {
            Ok(Some(n)) => Ok(n),
            Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(e),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

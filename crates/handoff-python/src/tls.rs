//! TLS between hosts (spec §3.1) for connections driven from Python's event loop: rustls is
//! sans-IO, so the connection's TLS session lives here, between the socket and the engine.
//! Bytes read from the socket go through it to the engine as plaintext; what the engine
//! queues goes through it as TLS records. The configurations, the opening check and the
//! words for failures are the engine's (`handoff_proto::tls`).

use std::io::{IoSlice, Read, Write};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use handoff_proto::tls::{explain, server_name, Configs};
use rustls::{ClientConnection, Connection, ServerConnection};

/// Plaintext rustls takes ahead of the socket: past this much waiting to be written as
/// records, the connection's queue waits instead (so a large frame is not encrypted into
/// memory all at once).
const BUFFERED: usize = 256 << 10;

/// One connection's TLS session.
pub(crate) struct TlsLayer {
    conn: Connection,
    /// How errors name the peer.
    peer: String,
}

/// The socket as rustls reads it: a non-blocking `recv`.
struct SocketIo<'a>(BorrowedFd<'a>);

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

/// What a read through TLS brought.
pub(crate) enum TlsRead {
    /// Plaintext bytes (0: the peer ended the stream).
    Bytes(usize),
    /// Nothing now: wait for the socket.
    WouldBlock,
    /// The TLS session failed: why, in words that say what to fix.
    Failed(String),
}

impl TlsLayer {
    /// The dialing side, checking the peer's certificate against `host` (the host part of
    /// the address dialed, or the name the node was told to expect).
    pub(crate) fn client(configs: &Configs, host: &str, peer: &str) -> Result<TlsLayer, String> {
        let name = server_name(host)?;
        let conn = ClientConnection::new(Arc::clone(&configs.client), name).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsLayer::new(conn.into(), peer))
    }

    /// The accepting side, asking for the peer's certificate.
    pub(crate) fn server(configs: &Configs, peer: &str) -> Result<TlsLayer, String> {
        let conn = ServerConnection::new(Arc::clone(&configs.server)).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsLayer::new(conn.into(), peer))
    }

    fn new(mut conn: Connection, peer: &str) -> TlsLayer {
        conn.set_buffer_limit(Some(BUFFERED));
        TlsLayer {
            conn,
            peer: peer.to_string(),
        }
    }

    /// Reads plaintext into `buf`, taking TLS records from the socket as needed.
    pub(crate) fn read(&mut self, socket: BorrowedFd<'_>, buf: &mut [u8]) -> TlsRead {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return TlsRead::Bytes(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // The socket ended without TLS's close_notify: the engine judges what was
                // cut (a message cut short fails there).
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return TlsRead::Bytes(0),
                Err(e) => return TlsRead::Failed(format!("TLS: {e}")),
            }
            match self.conn.read_tls(&mut SocketIo(socket)) {
                Ok(0) => {
                    // The end of the socket: rustls says whether that was clean.
                    if let Err(e) = self.conn.process_new_packets() {
                        return TlsRead::Failed(explain(&e, &self.peer));
                    }
                    return match self.conn.reader().read(buf) {
                        Ok(n) => TlsRead::Bytes(n),
                        Err(_) => TlsRead::Bytes(0),
                    };
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return TlsRead::WouldBlock,
                Err(e) => return TlsRead::Failed(format!("reading from {}: {e}", self.peer)),
            }
            if let Err(e) = self.conn.process_new_packets() {
                // Tell the peer (an alert) as far as the socket takes it now.
                let _ = self.flush(socket);
                return TlsRead::Failed(explain(&e, &self.peer));
            }
            // Handshake messages to answer with.
            if let Err(e) = self.flush(socket) {
                return TlsRead::Failed(format!("writing to {}: {e}", self.peer));
            }
        }
    }

    /// Encrypts as much of `parts` as rustls takes now and writes records to the socket;
    /// returns the plaintext bytes taken.
    pub(crate) fn write(&mut self, socket: BorrowedFd<'_>, parts: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let taken = self.conn.writer().write_vectored(parts)?;
        self.flush(socket)?;
        Ok(taken)
    }

    /// Writes the records waiting, as far as the socket takes them now; whether all went.
    pub(crate) fn flush(&mut self, socket: BorrowedFd<'_>) -> std::io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut SocketIo(socket)) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether records wait to be written.
    pub(crate) fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Ends our sending direction with TLS's close_notify (queued; flushed with the rest).
    pub(crate) fn close_notify(&mut self) {
        self.conn.send_close_notify();
    }
}

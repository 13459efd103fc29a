//! [`StreamIo`]: one connection's byte stream as both drivers read and write it without
//! waiting: the engine's write queue (`handoff_proto::outgoing`), the TLS session on a TCP
//! connection with TLS (`handoff_proto::tls_session`), the descriptors a Unix socket
//! passes, and how far writing got or why it failed.
//!
//! It never waits. Each call does what the socket allows now and says `WouldBlock` where
//! it stopped, so that a driver knows to wait for readiness: the tokio driver runs each call
//! inside its socket's `try_io` (which then forgets the readiness it had), the asyncio driver
//! after `add_reader`/`add_writer` fired.

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use handoff_proto::outgoing::Outgoing;
use handoff_proto::shm::buffers::PassFd;
use handoff_proto::tls_session::{TlsRead, TlsSession};

use crate::Received;

/// The socket as a TLS session reads and writes it: non-blocking `recv` and `send`
/// (`WouldBlock` when the socket cannot go on now).
pub struct FdIo<'a>(pub BorrowedFd<'a>);

impl Read for FdIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match rustix::io::read(self.0, buf) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Err(ErrorKind::WouldBlock.into()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Write for FdIo<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        crate::send(self.0, bufs, &[])?.ok_or_else(|| ErrorKind::WouldBlock.into())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A TLS session failure, as an I/O error's inner error (in words that say what to fix):
/// [`TlsFailed::of`] finds it again.
#[derive(Debug)]
pub struct TlsFailed(pub String);

impl TlsFailed {
    /// The TLS failure inside `e`, if it is one.
    pub fn of(e: &std::io::Error) -> Option<&str> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<TlsFailed>())
            .map(|failed| failed.0.as_str())
    }
}

impl std::fmt::Display for TlsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFailed {}

/// Why writing failed, and the stream offset written by then.
#[derive(Debug, Clone)]
struct Failed {
    kind: ErrorKind,
    why: String,
    at: u64,
}

impl Failed {
    /// The failure, as the error of a send it ends.
    fn error(&self) -> std::io::Error {
        std::io::Error::new(self.kind, self.why.clone())
    }
}

/// One connection's stream: its write queue, its TLS session and how writing went.
pub struct StreamIo {
    out: Outgoing,
    tls: Option<Box<TlsSession>>,
    /// With TLS: the stream offset up to which every record is on the socket.
    tls_through: u64,
    /// Every send of bytes after its offset fails with it.
    failed: Option<Failed>,
    /// Our sending direction ends once the queue is written (TLS's close_notify last).
    shut: bool,
    /// TLS's close_notify was queued.
    close_notified: bool,
    /// The socket's sending direction was shut down.
    shut_done: bool,
}

impl StreamIo {
    /// A stream, inside `tls` if given.
    pub fn new(tls: Option<TlsSession>) -> StreamIo {
        StreamIo {
            out: Outgoing::default(),
            tls: tls.map(Box::new),
            tls_through: 0,
            failed: None,
            shut: false,
            close_notified: false,
            shut_done: false,
        }
    }

    /// The write queue.
    pub fn out(&self) -> &Outgoing {
        &self.out
    }

    /// The write queue, to push to (nothing is pushed once the stream failed or is shut:
    /// see [`StreamIo::takes_more`]).
    pub fn out_mut(&mut self) -> &mut Outgoing {
        &mut self.out
    }

    /// The TLS session, if the stream has one.
    pub fn tls(&self) -> Option<&TlsSession> {
        self.tls.as_deref()
    }

    /// The TLS session, to run its handshake.
    pub fn tls_mut(&mut self) -> Option<&mut TlsSession> {
        self.tls.as_deref_mut()
    }

    /// Drops the TLS session before it was used (a plain peer where TLS is required is
    /// answered in plain text).
    pub fn drop_tls(&mut self) {
        self.tls = None;
    }

    /// Whether bytes may still be queued: writing has not failed and our sending direction
    /// is not ending.
    pub fn takes_more(&self) -> bool {
        self.failed.is_none() && !self.shut
    }

    /// Why sending is over, if it is: the failure, or that the stream is closing.
    pub fn refusal(&self) -> Option<std::io::Error> {
        match &self.failed {
            Some(f) => Some(f.error()),
            None if self.shut => Some(std::io::Error::new(ErrorKind::BrokenPipe, "the connection is closing")),
            None => None,
        }
    }

    /// Whether writing failed.
    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Whether our sending direction was shut down on the socket.
    pub fn shut_done(&self) -> bool {
        self.shut_done
    }

    /// Whether the stream is written up to offset `end`: the queue that far, and every TLS
    /// record made of it.
    pub fn written(&self, end: u64) -> bool {
        self.out.written() >= end && (self.tls.is_none() || self.tls_through >= end)
    }

    /// The error of a send whose bytes end at `end`, if writing failed before them.
    pub fn failed_before(&self, end: u64) -> Option<std::io::Error> {
        match &self.failed {
            Some(f) if end > f.at => Some(f.error()),
            _ => None,
        }
    }

    /// Whether TLS records wait to be written.
    pub fn tls_waiting(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Whether anything waits to be written (queued bytes or TLS records) on a stream
    /// that has not failed.
    pub fn wants_write(&self) -> bool {
        self.failed.is_none() && (!self.out.is_empty() || self.tls_waiting())
    }

    /// When what waits to be written will have made no progress for `write_timeout`.
    pub fn write_deadline(&self, write_timeout: Duration) -> Option<Instant> {
        self.out.write_deadline(write_timeout, self.tls_waiting())
    }

    /// One read into `buf`, through TLS when the stream has it; `WouldBlock` when nothing
    /// is there now. With `take_fds` false, descriptors that come are closed by the kernel
    /// and only counted by `truncated` ([`crate::recv`]). A TLS failure is an error whose
    /// inner error is a [`TlsFailed`]. What TLS queued while reading (an alert, a key
    /// update) waits for the next [`StreamIo::flush`].
    pub fn read(&mut self, fd: BorrowedFd<'_>, buf: &mut [u8], take_fds: bool) -> std::io::Result<Received> {
        let Some(tls) = self.tls.as_deref_mut() else {
            return crate::recv(fd, buf, take_fds)?.ok_or_else(|| ErrorKind::WouldBlock.into());
        };
        match tls.read(&mut FdIo(fd), buf) {
            TlsRead::Bytes(bytes) => Ok(Received {
                bytes,
                fds: Vec::new(),
                truncated: false,
            }),
            TlsRead::WouldBlock => Err(ErrorKind::WouldBlock.into()),
            TlsRead::Failed(why) => Err(std::io::Error::other(TlsFailed(why))),
        }
    }

    /// Writes what is queued, as far as the socket takes it now, and ends our sending
    /// direction once it is all written if [`StreamIo::shut`] asked for that.
    ///
    /// `Ok` when nothing waits any more; `WouldBlock` when the socket took what it could.
    /// Any other error fails the stream: what is queued goes, the socket is shut down in
    /// both directions (so that its reader ends too), and every later send of bytes fails
    /// with it.
    pub fn flush(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        if let Some(f) = &self.failed {
            return Err(f.error());
        }
        let written = self.write_queued(fd).and_then(|()| {
            if self.shut && self.out.is_empty() {
                self.end_stream(fd)
            } else {
                Ok(())
            }
        });
        match written {
            Err(e) if e.kind() != ErrorKind::WouldBlock => {
                self.fail(fd, e.kind(), e.to_string());
                Err(e)
            }
            Ok(()) if self.wants_write() => Err(ErrorKind::WouldBlock.into()),
            other => other,
        }
    }

    /// Asks for our sending direction to end once the queue is written (TLS's
    /// close_notify after every byte queued before it, then the socket's); done by
    /// [`StreamIo::flush`].
    pub fn shut(&mut self) {
        self.shut = true;
    }

    /// Shuts our sending direction down now, whatever is still queued.
    pub fn shut_now(&mut self, fd: BorrowedFd<'_>) {
        self.shut = true;
        if !self.shut_done {
            self.shut_done = true;
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Write);
        }
    }

    /// Fails the stream: what is queued goes, and the socket is shut down in both
    /// directions.
    pub fn fail(&mut self, fd: BorrowedFd<'_>, kind: ErrorKind, why: String) {
        if self.failed.is_none() {
            self.failed = Some(Failed {
                kind,
                why,
                at: self.out.written(),
            });
            self.out.clear();
            let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
        }
    }

    /// Fails the stream because the peer read nothing for `write_timeout` (spec §9.1), in
    /// the words both drivers use.
    pub fn fail_stalled(&mut self, fd: BorrowedFd<'_>, write_timeout: Duration) {
        let why = format!(
            "no progress for {} s (the peer reads nothing); the connection is closed",
            write_timeout.as_secs_f64()
        );
        self.fail(fd, ErrorKind::TimedOut, why);
    }

    fn end_stream(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        if let Some(tls) = self.tls.as_deref_mut() {
            if !self.close_notified {
                self.close_notified = true;
                tls.close_notify();
            }
            if !tls.flush(&mut FdIo(fd))? {
                return Err(ErrorKind::WouldBlock.into());
            }
        }
        self.shut_now(fd);
        Ok(())
    }

    fn write_queued(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let StreamIo {
            out, tls, tls_through, ..
        } = self;
        let mut io = FdIo(fd);
        while !out.is_empty() {
            if let Some(tls) = tls.as_deref_mut() {
                // Every record made so far is on the socket: the stream is written that far.
                if tls.flush(&mut io)? {
                    *tls_through = out.written();
                }
            }
            let t = out.transmit();
            let sent = match tls.as_deref_mut() {
                // (No descriptors on TCP.)
                Some(tls) => match tls.write(&mut io, &t.slices)? {
                    0 => return Err(ErrorKind::WouldBlock.into()),
                    n => n,
                },
                None => {
                    let fds: Vec<BorrowedFd<'_>> = t.fds.iter().map(PassFd::as_fd).collect();
                    match crate::send(fd, &t.slices, &fds)? {
                        Some(n) => n,
                        None => return Err(ErrorKind::WouldBlock.into()),
                    }
                }
            };
            out.advance(sent, Instant::now());
        }
        if let Some(tls) = tls.as_deref_mut() {
            if tls.flush(&mut io)? {
                *tls_through = out.written();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn queued_bytes_arrive_in_order_and_the_stream_says_how_far_it_got() {
        let (a, b) = pair();
        let mut io = StreamIo::new(None);
        let now = Instant::now();
        io.out_mut().push(Bytes::from_static(b"hello "), now);
        io.out_mut().push(Bytes::from_static(b"world"), now);
        io.flush(a.as_fd()).unwrap();
        assert!(io.written(11));
        let mut other = StreamIo::new(None);
        let mut buf = [0u8; 32];
        let got = other.read(b.as_fd(), &mut buf, true).unwrap();
        assert_eq!(&buf[..got.bytes], b"hello world");
        let e = other.read(b.as_fd(), &mut buf, true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "nothing more there now");
    }

    #[test]
    fn a_full_socket_says_would_block_and_the_rest_goes_later() {
        let (a, b) = pair();
        let mut io = StreamIo::new(None);
        let big = Bytes::from(vec![7u8; 8 << 20]);
        io.out_mut().push(big, Instant::now());
        let e = io.flush(a.as_fd()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(!io.written(8 << 20));
        let mut reader = StreamIo::new(None);
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        while total < 8 << 20 {
            match reader.read(b.as_fd(), &mut buf, false) {
                Ok(got) => total += got.bytes,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let _ = io.flush(a.as_fd());
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(io.written(8 << 20));
        assert!(io.flush(a.as_fd()).is_ok());
    }

    #[test]
    fn a_failed_write_fails_later_sends_and_shuts_the_socket_both_ways() {
        let (a, b) = pair();
        drop(b);
        let mut io = StreamIo::new(None);
        io.out_mut().push(Bytes::from_static(b"x"), Instant::now());
        let e = io.flush(a.as_fd()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BrokenPipe);
        assert!(io.has_failed() && !io.takes_more());
        assert!(io.failed_before(1).is_some(), "the byte was not written");
        assert!(io.failed_before(0).is_none(), "nothing before it failed");
        assert_eq!(io.flush(a.as_fd()).unwrap_err().kind(), ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_shut_stream_ends_after_what_was_queued() {
        let (a, b) = pair();
        let mut io = StreamIo::new(None);
        io.out_mut().push(Bytes::from_static(b"last words"), Instant::now());
        io.shut();
        assert!(!io.takes_more());
        io.flush(a.as_fd()).unwrap();
        assert!(io.shut_done());
        let mut reader = StreamIo::new(None);
        let mut buf = [0u8; 32];
        let got = reader.read(b.as_fd(), &mut buf, false).unwrap();
        assert_eq!(&buf[..got.bytes], b"last words");
        assert_eq!(
            reader.read(b.as_fd(), &mut buf, false).unwrap().bytes,
            0,
            "then the end"
        );
    }
}

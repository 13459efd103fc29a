//! [`Socket`]: one connection's socket as its read loop and every sender share it — the
//! engine's write queue (`handoff_proto::outgoing`), the TLS session on a TCP connection
//! with TLS (`handoff_proto::tls_session`), and the reads with the descriptors a Unix
//! socket passes.
//!
//! Nothing waits inside the lock: a sender queues its message and writes what the socket
//! takes now; if bytes of its message are still queued, it waits for the socket to be
//! writable and writes again (any waiter writes for all). Control bytes the read loop
//! queues (answers, releases) are written by a task of their own when the socket did not
//! take them at once. A write that makes no progress for the write timeout fails the
//! connection, and the socket is shut down in both directions, so that its reader ends
//! too and only that peer's sends fail (spec §9.1).

use std::io::{IoSlice, Read, Write};
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use handoff_proto::outgoing::Outgoing;
use handoff_proto::shm::buffers::PassFd;
use handoff_proto::tls_session::{TlsRead, TlsSession};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Notify;

/// The socket itself.
pub(crate) enum Raw {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Raw {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Raw::Tcp(s) => s.as_fd(),
            Raw::Unix(s) => s.as_fd(),
        }
    }

    async fn ready(&self, interest: Interest) -> std::io::Result<()> {
        match self {
            Raw::Tcp(s) => s.ready(interest).await.map(drop),
            Raw::Unix(s) => s.ready(interest).await.map(drop),
        }
    }
}

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

/// A TLS session failure, as an I/O error's inner error (`tls::explain_io` finds it).
#[derive(Debug)]
pub(crate) struct TlsFailed(pub(crate) String);

impl std::fmt::Display for TlsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFailed {}

/// What one read brought.
pub(crate) struct Received {
    /// Bytes read; 0 at the end of the stream.
    pub(crate) bytes: usize,
    /// Descriptors that came with them (a Unix socket's).
    pub(crate) fds: Vec<OwnedFd>,
    /// Whether more descriptors came than one read takes (the kernel closed the rest).
    pub(crate) truncated: bool,
}

struct State {
    out: Outgoing,
    /// The TLS session, on a TCP connection with TLS: records it made wait here too.
    tls: Option<TlsSession>,
    /// With TLS: the stream offset up to which every record is on the socket.
    tls_through: u64,
    /// Why writing failed, and the stream offset written by then: every send of bytes
    /// after it fails with it.
    failed: Option<(std::io::ErrorKind, String, u64)>,
    /// Our sending direction ends once the queue is written (TLS's close_notify last).
    shut: bool,
    /// TLS's close_notify was queued.
    close_notified: bool,
    /// The socket's sending direction was shut down.
    shut_done: bool,
    /// A task writes what is queued.
    flusher: bool,
}

/// One connection's socket, shared by its read loop and its senders.
pub(crate) struct Socket {
    raw: Raw,
    /// The connection runs inside TLS (fixed at creation).
    tls: bool,
    state: Mutex<State>,
    /// Bytes were written, or writing failed: whoever waits on the queue looks again.
    progress: Notify,
    /// The state was let go: a task waiting for it tries again.
    unlocked: Notify,
    /// Leases of the peer's segments whose last view here was dropped: `release`s to send.
    /// Apart from the state: a view's last reference may be dropped while the state is
    /// held (a queued frame written or cleared), and its release must not wait for it.
    releases: Mutex<Vec<u64>>,
    /// A task is on its way to write the releases.
    release_task: AtomicBool,
    write_timeout: Duration,
    /// Where flusher tasks run (a view may be dropped on any thread).
    runtime: tokio::runtime::Handle,
}

/// The state, held; letting it go wakes the tasks waiting for it.
struct Guard<'a> {
    /// Always `Some` until dropped.
    state: Option<MutexGuard<'a, State>>,
    unlocked: &'a Notify,
}

impl Deref for Guard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.state.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.state.as_mut().expect("held until dropped")
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Let go first: a task woken now finds the state free.
        self.state = None;
        self.unlocked.notify_waiters();
    }
}

impl State {
    /// Whether the stream is written up to offset `end`: the queue that far, and every
    /// TLS record made of it.
    fn written(&self, end: u64) -> bool {
        self.out.written() >= end && (self.tls.is_none() || self.tls_through >= end)
    }

    /// The error of a send whose bytes end at `end`, if writing failed before them.
    fn failed_before(&self, end: u64) -> Option<std::io::Error> {
        match &self.failed {
            Some((kind, why, at)) if end > *at => Some(std::io::Error::new(*kind, why.clone())),
            _ => None,
        }
    }

    /// Whether TLS records wait to be written.
    fn tls_waiting(&self) -> bool {
        self.tls.as_ref().is_some_and(TlsSession::wants_write)
    }
}

fn stalled(stall: Duration) -> (std::io::ErrorKind, String) {
    (
        std::io::ErrorKind::TimedOut,
        format!("the peer read nothing for {stall:?}"),
    )
}

impl Socket {
    /// A TCP connection, inside `tls` if given (after its TLS handshake).
    pub(crate) fn tcp(stream: TcpStream, tls: Option<TlsSession>, write_timeout: Duration) -> Arc<Socket> {
        Socket::new(Raw::Tcp(stream), tls, write_timeout)
    }

    /// A Unix socket to a same-host node.
    pub(crate) fn unix(stream: UnixStream, write_timeout: Duration) -> Arc<Socket> {
        Socket::new(Raw::Unix(stream), None, write_timeout)
    }

    fn new(raw: Raw, tls: Option<TlsSession>, write_timeout: Duration) -> Arc<Socket> {
        Arc::new(Socket {
            raw,
            tls: tls.is_some(),
            state: Mutex::new(State {
                out: Outgoing::default(),
                tls,
                tls_through: 0,
                failed: None,
                shut: false,
                close_notified: false,
                shut_done: false,
                flusher: false,
            }),
            progress: Notify::new(),
            unlocked: Notify::new(),
            releases: Mutex::default(),
            release_task: AtomicBool::new(false),
            write_timeout,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The state, for a task: it waits as a task while another holds the state (a TLS
    /// write holds it while it encrypts up to 256 KiB), instead of blocking one of the
    /// runtime's threads, which would then run nothing else.
    async fn lock_async(&self) -> Guard<'_> {
        if let Some(state) = self.try_lock() {
            return state;
        }
        loop {
            let unlocked = self.unlocked.notified();
            tokio::pin!(unlocked);
            unlocked.as_mut().enable();
            if let Some(state) = self.try_lock() {
                return state;
            }
            unlocked.await;
        }
    }

    fn try_lock(&self) -> Option<Guard<'_>> {
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(Guard {
            state: Some(state),
            unlocked: &self.unlocked,
        })
    }

    /// One read into `buf` (through TLS when the connection has it), waiting until the
    /// socket has something. With `take_fds` false, descriptors that come are closed by the
    /// kernel and only counted by `truncated` (see [`handoff_sys::recv`]).
    pub(crate) async fn read(self: &Arc<Self>, buf: &mut [u8], take_fds: bool) -> std::io::Result<Received> {
        loop {
            let got = match &self.raw {
                Raw::Unix(s) => s.try_io(Interest::READABLE, || {
                    match handoff_sys::recv(s.as_fd(), buf, take_fds) {
                        Ok(Some(got)) => Ok(Received {
                            bytes: got.bytes,
                            fds: got.fds,
                            truncated: got.truncated,
                        }),
                        Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                        Err(e) => Err(e),
                    }
                }),
                // Plain TCP reads without the state: only TLS shares the session.
                Raw::Tcp(s) if !self.tls => s.try_read(buf).map(|bytes| Received {
                    bytes,
                    fds: Vec::new(),
                    truncated: false,
                }),
                Raw::Tcp(s) => {
                    let mut state = self.lock_async().await;
                    let bytes = match state.tls.as_mut() {
                        None => s.try_read(buf),
                        Some(tls) => match tls.read(&mut TryIo(s), buf) {
                            TlsRead::Bytes(n) => Ok(n),
                            TlsRead::WouldBlock => Err(std::io::ErrorKind::WouldBlock.into()),
                            TlsRead::Failed(why) => Err(std::io::Error::other(TlsFailed(why))),
                        },
                    };
                    // What TLS queued while reading (an alert, a key update) goes now.
                    if state.tls_waiting() {
                        self.flush(&mut state);
                        self.flush_later(&mut state);
                    }
                    bytes.map(|bytes| Received {
                        bytes,
                        fds: Vec::new(),
                        truncated: false,
                    })
                }
            };
            match got {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.raw.ready(Interest::READABLE).await?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }

    /// After an error was sent: reads and drops what still arrives until the peer closes,
    /// `max_bytes` were read or `max_time` passed, so that closing the socket does not
    /// reset the connection while the peer's data is unread (which can destroy the error in
    /// flight, spec §11.3). Descriptors that come are closed by the kernel.
    pub(crate) async fn drain(self: &Arc<Self>, max_bytes: usize, max_time: Duration) {
        let deadline = tokio::time::Instant::now() + max_time;
        let mut read = 0;
        let mut scratch = vec![0u8; 8192];
        while read < max_bytes {
            match tokio::time::timeout_at(deadline, self.read(&mut scratch, false)).await {
                Ok(Ok(got)) if got.bytes > 0 => read += got.bytes,
                _ => return,
            }
        }
    }

    /// Queues `head` (with `fds` on its first byte) and `frames`, and waits until they are
    /// written: a whole message, a handshake's bytes or a control header.
    pub(crate) async fn send(&self, head: Bytes, fds: Vec<PassFd>, frames: Vec<Bytes>) -> std::io::Result<()> {
        let end = {
            let mut state = self.lock_async().await;
            if let Some((kind, why, _)) = &state.failed {
                return Err(std::io::Error::new(*kind, why.clone()));
            }
            if state.shut {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the connection is closing",
                ));
            }
            let now = Instant::now();
            state.out.push_with_fds(head, fds, now);
            for frame in frames {
                state.out.push(frame, now);
            }
            self.flush(&mut state);
            state.out.queued()
        };
        self.written(end).await
    }

    /// Waits until the stream is written up to offset `end`, writing when the socket takes
    /// more; fails the connection past the write timeout without progress.
    async fn written(&self, end: u64) -> std::io::Result<()> {
        loop {
            let deadline = {
                let mut state = self.lock_async().await;
                if !state.written(end) {
                    self.flush(&mut state);
                }
                if let Some(e) = state.failed_before(end) {
                    return Err(e);
                }
                if state.written(end) {
                    return Ok(());
                }
                state
                    .out
                    .write_deadline(self.write_timeout, state.tls_waiting())
                    .unwrap_or_else(|| Instant::now() + self.write_timeout)
            };
            match tokio::time::timeout_at(deadline.into(), self.raw.ready(Interest::WRITABLE)).await {
                Ok(ready) => ready?,
                Err(_) => {
                    let mut state = self.lock_async().await;
                    self.fail(&mut state, stalled(self.write_timeout));
                }
            }
        }
    }

    /// Writes what is queued, as far as the socket takes it now; a write error fails the
    /// connection.
    fn flush(&self, state: &mut State) {
        if state.failed.is_some() {
            return;
        }
        let before = state.out.written();
        if let Err(e) = self.write_queued(state) {
            self.fail(state, (e.kind(), e.to_string()));
            return;
        }
        if state.out.written() > before {
            self.progress.notify_waiters();
        }
        if state.shut && state.out.is_empty() {
            self.end_stream(state);
        }
    }

    /// Ends our sending direction once the queue is written: TLS's close_notify first
    /// (after every byte queued before it), then the socket's.
    fn end_stream(&self, state: &mut State) {
        if let (Raw::Tcp(s), Some(tls)) = (&self.raw, state.tls.as_mut()) {
            if !state.close_notified {
                state.close_notified = true;
                tls.close_notify();
            }
            if !matches!(tls.flush(&mut TryIo(s)), Ok(true)) {
                return;
            }
        }
        if !state.shut_done {
            state.shut_done = true;
            let _ = rustix::net::shutdown(self.raw.fd(), rustix::net::Shutdown::Write);
        }
    }

    fn write_queued(&self, state: &mut State) -> std::io::Result<()> {
        let State {
            out, tls, tls_through, ..
        } = state;
        let releases = std::mem::take(&mut *self.releases.lock().unwrap_or_else(PoisonError::into_inner));
        out.push_releases(&releases, Instant::now());
        while !out.is_empty() {
            if let (Raw::Tcp(s), Some(tls)) = (&self.raw, tls.as_mut()) {
                // Every record made so far is on the socket: the stream is written that far.
                if tls.flush(&mut TryIo(s))? {
                    *tls_through = out.written();
                }
            }
            let t = out.transmit();
            let sent = match (&self.raw, tls.as_mut()) {
                (Raw::Tcp(s), Some(tls)) => match tls.write(&mut TryIo(s), &t.slices)? {
                    0 => Err(std::io::ErrorKind::WouldBlock.into()),
                    n => Ok(n),
                },
                (Raw::Tcp(s), None) => s.try_write_vectored(&t.slices),
                (Raw::Unix(s), _) => {
                    let fds: Vec<BorrowedFd<'_>> = t.fds.iter().map(PassFd::as_fd).collect();
                    s.try_io(Interest::WRITABLE, || {
                        handoff_sys::send(s.as_fd(), &t.slices, &fds)?.ok_or(std::io::ErrorKind::WouldBlock.into())
                    })
                }
            };
            match sent {
                Ok(n) => out.advance(n, Instant::now()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if let (Raw::Tcp(s), Some(tls)) = (&self.raw, tls.as_mut()) {
            if tls.flush(&mut TryIo(s))? {
                *tls_through = out.written();
            }
        }
        Ok(())
    }

    /// Fails the connection: what is queued goes, and the socket is shut down in both
    /// directions (the reader ends too).
    fn fail(&self, state: &mut State, why: (std::io::ErrorKind, String)) {
        if state.failed.is_none() {
            state.failed = Some((why.0, why.1, state.out.written()));
            state.out.clear();
            let _ = rustix::net::shutdown(self.raw.fd(), rustix::net::Shutdown::Both);
        }
        self.progress.notify_waiters();
    }

    /// Queues a control header the peer's requests made us send (an answer, a refusal)
    /// and, for a pull, the bytes pulled; written now as far as the socket takes them, the
    /// rest by a task.
    pub(crate) async fn queue_control(self: &Arc<Self>, head: Bytes, pulled: Option<Bytes>) {
        let mut state = self.lock_async().await;
        if state.failed.is_some() || state.shut {
            return;
        }
        let now = Instant::now();
        match pulled {
            Some(bytes) => state.out.push_pulled_answer(head, bytes, now),
            None => state.out.push_control(head, now),
        }
        self.flush(&mut state);
        self.flush_later(&mut state);
    }

    /// Queues a `release` of the peer's lease (a view's last drop, on any thread, maybe
    /// while this socket's state is held further up the stack): written now if the state
    /// is free, else by a task.
    pub(crate) fn queue_release(self: &Arc<Self>, lease: u64) {
        self.releases.lock().unwrap_or_else(PoisonError::into_inner).push(lease);
        match self.try_lock() {
            Some(mut state) => {
                self.flush(&mut state);
                self.flush_later(&mut state);
            }
            // One task at a time: it takes every release queued by then.
            None if !self.release_task.swap(true, Ordering::AcqRel) => {
                let socket = Arc::downgrade(self);
                self.runtime.spawn(async move {
                    let Some(socket) = Weak::upgrade(&socket) else { return };
                    socket.release_task.store(false, Ordering::Release);
                    let mut state = socket.lock_async().await;
                    socket.flush(&mut state);
                    socket.flush_later(&mut state);
                });
            }
            None => {}
        }
    }

    /// Starts a task that writes what the socket did not take, unless one runs.
    fn flush_later(self: &Arc<Self>, state: &mut State) {
        if (state.out.is_empty() && !state.tls_waiting()) || state.flusher || state.failed.is_some() {
            return;
        }
        state.flusher = true;
        let end = state.out.queued();
        let socket = Arc::downgrade(self);
        self.runtime.spawn(async move {
            let Some(socket) = Weak::upgrade(&socket) else { return };
            let _ = socket.written(end).await;
            let mut state = socket.lock_async().await;
            state.flusher = false;
            socket.flush_later(&mut state);
        });
    }

    /// Waits until the peer's answers drained (or the connection failed).
    pub(crate) async fn drained(&self, max_pull_answers: usize) {
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let backed_up = {
                let state = self.lock_async().await;
                state.failed.is_none() && state.out.backed_up(max_pull_answers)
            };
            if !backed_up {
                return;
            }
            notified.await;
        }
    }

    /// Shuts our sending direction down once what is queued is written (TLS's close_notify
    /// last), within `limit`; the peer then sees the end of the stream.
    pub(crate) async fn shutdown_writing(&self, limit: Duration) {
        self.say_and_shutdown(Vec::new(), limit).await;
    }

    /// Queues `last` (an `error`, say) as the last bytes of the stream, and shuts our
    /// sending direction down once they are written, within `limit` (then at once).
    pub(crate) async fn say_and_shutdown(&self, last: Vec<u8>, limit: Duration) {
        let end = {
            let mut state = self.lock_async().await;
            if !state.shut && state.failed.is_none() {
                state.out.push(Bytes::from(last), Instant::now());
            }
            state.shut = true;
            self.flush(&mut state);
            state.out.queued()
        };
        // Our bytes, then TLS's close_notify, then the socket's end.
        let finish = async {
            self.written(end).await?;
            loop {
                {
                    let mut state = self.lock_async().await;
                    self.flush(&mut state);
                    if state.shut_done || state.failed.is_some() {
                        return Ok(());
                    }
                }
                self.raw.ready(Interest::WRITABLE).await?;
            }
        };
        let _: Result<std::io::Result<()>, _> = tokio::time::timeout(limit, finish).await;
        let mut state = self.lock_async().await;
        if !state.shut_done {
            state.shut_done = true;
            let _ = rustix::net::shutdown(self.raw.fd(), rustix::net::Shutdown::Write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::Header;
    use tokio::io::AsyncReadExt;

    fn pair(write_timeout: Duration) -> (Arc<Socket>, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (Socket::unix(a, write_timeout), b)
    }

    #[tokio::test]
    async fn a_send_whose_bytes_a_stall_threw_away_fails_and_so_do_later_ones() {
        let (socket, _peer_reads_nothing) = pair(Duration::from_millis(200));
        let big = Bytes::from(vec![7u8; 32 << 20]);
        let waiting = {
            let socket = socket.clone();
            let big = big.clone();
            tokio::spawn(async move { socket.send(Bytes::from_static(b"h"), Vec::new(), vec![big]).await })
        };
        let second = socket.send(Bytes::from_static(b"h2"), Vec::new(), vec![big]).await;
        let first = waiting.await.unwrap();
        for r in [first, second] {
            let e = r.expect_err("the bytes were never written");
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
            assert!(e.to_string().contains("read nothing"), "{e}");
        }
        let later = socket.send(Bytes::from_static(b"x"), Vec::new(), Vec::new()).await;
        assert!(later.is_err());
    }

    #[tokio::test]
    async fn a_release_queued_while_the_state_is_held_is_written_later_not_deadlocked() {
        let (socket, mut peer) = pair(Duration::from_secs(5));
        {
            let _held = socket.lock_async().await;
            // A view's last drop while the state is held (same thread): no deadlock.
            socket.queue_release(7);
            socket.queue_release(8);
        }
        let mut got = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), peer.read(&mut got))
            .await
            .expect("the releases arrive")
            .unwrap();
        let header = Header::decode(&got[4..n], &handoff_wire::Limits::DEFAULT).unwrap();
        assert!(matches!(header, Header::Release { leases } if leases == vec![7, 8]));
    }

    #[tokio::test]
    async fn the_last_bytes_arrive_before_the_end_of_the_stream_and_nothing_after_them() {
        let (socket, mut peer) = pair(Duration::from_secs(5));
        socket
            .send(Bytes::from_static(b"first "), Vec::new(), Vec::new())
            .await
            .unwrap();
        socket.say_and_shutdown(b"last".to_vec(), Duration::from_secs(5)).await;
        let refused = socket.send(Bytes::from_static(b"late"), Vec::new(), Vec::new()).await;
        assert!(refused.is_err(), "nothing follows the last bytes");
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut all))
            .await
            .expect("the end of the stream comes")
            .unwrap();
        assert_eq!(all, b"first last");
    }
}

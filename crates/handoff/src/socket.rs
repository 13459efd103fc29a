//! [`Socket`]: one connection's socket as its read loop and every sender share it. What
//! is read and written, through the engine's write queue and the TLS session, is
//! `handoff_sys::stream::StreamIo`'s (shared with the asyncio driver); this module waits for
//! the socket, the state's lock and the write timeout as tasks.
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
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use handoff_proto::shm::buffers::PassFd;
use handoff_proto::ticket_leases::OwnerAnswer;
use handoff_proto::tls_session::TlsSession;
use handoff_sys::stream::StreamIo;
use handoff_sys::Received;
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

    /// Runs `op` on the socket if tokio saw it ready; a `WouldBlock` from it makes tokio
    /// forget that readiness, so that the next wait waits.
    fn try_io<R>(
        &self,
        interest: Interest,
        op: impl FnOnce(BorrowedFd<'_>) -> std::io::Result<R>,
    ) -> std::io::Result<R> {
        match self {
            Raw::Tcp(s) => s.try_io(interest, || op(s.as_fd())),
            Raw::Unix(s) => s.try_io(interest, || op(s.as_fd())),
        }
    }
}

/// A TCP stream as a TLS handshake reads and writes it: without waiting (`WouldBlock` when
/// it cannot go on now, and tokio forgets the readiness it had).
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

struct State {
    io: StreamIo,
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

/// Hands what a dropped [`Socket::send`] queued to a flusher task (forgotten once written).
struct FinishOnDrop<'a>(Option<&'a Arc<Socket>>);

impl Drop for FinishOnDrop<'_> {
    fn drop(&mut self) {
        let Some(socket) = self.0.take() else { return };
        // On the socket's runtime: the future may be dropped on any thread.
        let runtime = socket.runtime.clone();
        let socket = Arc::downgrade(socket);
        runtime.spawn(async move {
            let Some(socket) = Weak::upgrade(&socket) else { return };
            let mut state = socket.lock_async().await;
            socket.flush_later(&mut state);
        });
    }
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
                io: StreamIo::new(tls),
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
            let got = if self.tls {
                let mut state = self.lock_async().await;
                let got = self
                    .raw
                    .try_io(Interest::READABLE, |fd| state.io.read(fd, buf, take_fds));
                // What TLS queued while reading (an alert, a key update) goes now.
                if state.io.tls_waiting() {
                    self.flush(&mut state);
                    self.flush_later(&mut state);
                }
                got
            } else {
                // Without TLS nothing but the kernel's socket is shared: no lock.
                self.raw.try_io(Interest::READABLE, |fd| {
                    handoff_sys::recv(fd, buf, take_fds)?.ok_or_else(|| std::io::ErrorKind::WouldBlock.into())
                })
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
    /// written: a whole message or a control header. `queued` is called once they are in
    /// the stream: from then on they are written in full even if this wait is dropped (a
    /// task takes over), so that the peer never gets half a message.
    pub(crate) async fn send(
        self: &Arc<Self>,
        head: Bytes,
        fds: Vec<PassFd>,
        frames: Vec<Bytes>,
        queued: impl FnOnce(),
    ) -> std::io::Result<()> {
        let end = self.queue(head, fds, frames).await?;
        queued();
        let finish = FinishOnDrop(Some(self));
        let written = self.written(end).await;
        std::mem::forget(finish);
        written
    }

    /// Queues `head` (with `fds` on its first byte) and `frames` and writes what the socket
    /// takes now; the end of them in the stream.
    pub(crate) async fn queue(&self, head: Bytes, fds: Vec<PassFd>, frames: Vec<Bytes>) -> std::io::Result<u64> {
        let mut state = self.lock_async().await;
        if let Some(refused) = state.io.refusal() {
            return Err(refused);
        }
        let now = Instant::now();
        let out = state.io.out_mut();
        out.push_with_fds(head, fds, now);
        for frame in frames {
            out.push(frame, now);
        }
        self.flush(&mut state);
        Ok(state.io.out().queued())
    }

    /// Waits until the stream is written up to offset `end`, writing when the socket takes
    /// more; fails the connection past the write timeout without progress.
    pub(crate) async fn written(&self, end: u64) -> std::io::Result<()> {
        loop {
            let deadline = {
                let mut state = self.lock_async().await;
                if !state.io.written(end) {
                    self.flush(&mut state);
                }
                if let Some(e) = state.io.failed_before(end) {
                    return Err(e);
                }
                if state.io.written(end) {
                    return Ok(());
                }
                state
                    .io
                    .write_deadline(self.write_timeout)
                    .unwrap_or_else(|| Instant::now() + self.write_timeout)
            };
            match tokio::time::timeout_at(deadline.into(), self.raw.ready(Interest::WRITABLE)).await {
                Ok(ready) => ready?,
                Err(_) => {
                    let mut state = self.lock_async().await;
                    state.io.fail_stalled(self.raw.fd(), self.write_timeout);
                    self.progress.notify_waiters();
                }
            }
        }
    }

    /// Writes what is queued (with the `release`s of views dropped meanwhile), as far as
    /// the socket takes it now; a write error fails the connection.
    fn flush(&self, state: &mut State) {
        let releases = std::mem::take(&mut *self.releases.lock().unwrap_or_else(PoisonError::into_inner));
        if !releases.is_empty() && state.io.takes_more() {
            state.io.out_mut().push_releases(&releases, Instant::now());
        }
        let before = state.io.out().written();
        // What failed stays in the stream: every waiter finds it there.
        let _ = self.raw.try_io(Interest::WRITABLE, |fd| state.io.flush(fd));
        if state.io.out().written() > before || state.io.has_failed() {
            self.progress.notify_waiters();
        }
    }

    /// Queues the owner's answer to the peer's ticket request (bytes pulled, a refusal);
    /// written now as far as the socket takes it, the rest by a task.
    pub(crate) async fn queue_answer(self: &Arc<Self>, answer: OwnerAnswer) {
        let mut state = self.lock_async().await;
        if !state.io.takes_more() {
            return;
        }
        answer.queue_reply(state.io.out_mut(), Instant::now());
        self.flush(&mut state);
        self.flush_later(&mut state);
    }

    /// Queues one of our `unlease`s without waiting for it to be written (written now as
    /// far as the socket takes it, the rest by a task); `false` when it is dropped instead:
    /// the connection is closing, or too many wait unwritten (`Outgoing::push_unlease`).
    pub(crate) async fn queue_unlease(self: &Arc<Self>, bytes: Bytes) -> bool {
        let mut state = self.lock_async().await;
        if !state.io.takes_more() || !state.io.out_mut().push_unlease(bytes, Instant::now()) {
            return false;
        }
        self.flush(&mut state);
        self.flush_later(&mut state);
        true
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
        if !state.io.wants_write() || state.flusher || state.io.has_failed() {
            return;
        }
        state.flusher = true;
        let end = state.io.out().queued();
        let socket = Arc::downgrade(self);
        self.runtime.spawn(async move {
            let Some(socket) = Weak::upgrade(&socket) else { return };
            let _ = socket.written(end).await;
            let mut state = socket.lock_async().await;
            state.flusher = false;
            socket.flush_later(&mut state);
        });
    }

    /// Shuts the socket down in both directions now: our reader sees its end, and what is
    /// still queued fails to be written (every waiting sender is woken to find out).
    pub(crate) fn abort(&self) {
        let _ = rustix::net::shutdown(self.raw.fd(), rustix::net::Shutdown::Both);
        self.progress.notify_waiters();
    }

    /// Waits until the peer's answers drained (or the connection failed).
    pub(crate) async fn drained(&self, max_pull_answers: usize) {
        loop {
            let notified = self.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let backed_up = {
                let state = self.lock_async().await;
                !state.io.has_failed() && state.io.out().backed_up(max_pull_answers)
            };
            if !backed_up {
                return;
            }
            notified.await;
        }
    }

    /// Queues `last` (an `error`, say) as the last bytes of the stream, and shuts our
    /// sending direction down once they are written, within `limit` (then at once).
    pub(crate) async fn say_and_shutdown(&self, last: Vec<u8>, limit: Duration) {
        let end = {
            let mut state = self.lock_async().await;
            if state.io.takes_more() {
                state.io.out_mut().push(Bytes::from(last), Instant::now());
            }
            state.io.shut();
            self.flush(&mut state);
            state.io.out().queued()
        };
        // Our bytes, then TLS's close_notify, then the socket's end.
        let finish = async {
            self.written(end).await?;
            loop {
                {
                    let mut state = self.lock_async().await;
                    self.flush(&mut state);
                    if state.io.shut_done() || state.io.has_failed() {
                        return Ok(());
                    }
                }
                self.raw.ready(Interest::WRITABLE).await?;
            }
        };
        let _: Result<std::io::Result<()>, _> = tokio::time::timeout(limit, finish).await;
        self.lock_async().await.io.shut_now(self.raw.fd());
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
            tokio::spawn(async move {
                socket
                    .send(Bytes::from_static(b"h"), Vec::new(), vec![big], || {})
                    .await
            })
        };
        let second = socket
            .send(Bytes::from_static(b"h2"), Vec::new(), vec![big], || {})
            .await;
        let first = waiting.await.unwrap();
        for r in [first, second] {
            let e = r.expect_err("the bytes were never written");
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
            assert!(e.to_string().contains("the peer reads nothing"), "{e}");
        }
        let later = socket
            .send(Bytes::from_static(b"x"), Vec::new(), Vec::new(), || {})
            .await;
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
            .send(Bytes::from_static(b"first "), Vec::new(), Vec::new(), || {})
            .await
            .unwrap();
        socket.say_and_shutdown(b"last".to_vec(), Duration::from_secs(5)).await;
        let refused = socket
            .send(Bytes::from_static(b"late"), Vec::new(), Vec::new(), || {})
            .await;
        assert!(refused.is_err(), "nothing follows the last bytes");
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut all))
            .await
            .expect("the end of the stream comes")
            .unwrap();
        assert_eq!(all, b"first last");
    }
}

//! The same-host transport: a Unix stream socket that carries the wire format plus
//! file descriptors (SCM_RIGHTS) for shared-memory frames.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

use crate::io::FdSource;
use crate::{Error, Result};

pub(crate) use handoff_proto::inbound::MAX_FDS_PER_READ;

/// The read side: an `AsyncRead` that also collects the descriptors that arrive, for the
/// engine to judge: before `ready` the handshake refuses any (spec §5.1), after it the
/// established connection matches them to the `shm` frames that announce them.
pub(crate) struct FdReader {
    stream: Arc<UnixStream>,
    fds: VecDeque<OwnedFd>,
    error: Option<String>,
}

impl FdReader {
    pub(crate) fn new(stream: Arc<UnixStream>) -> FdReader {
        FdReader {
            stream,
            fds: VecDeque::new(),
            error: None,
        }
    }

    /// A descriptor problem seen while reading (more than one read takes).
    pub(crate) fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }

    fn recv(&mut self, buf: &mut ReadBuf<'_>) -> std::io::Result<usize> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        // SAFETY: recvmsg writes initialised bytes only; we mark exactly those as filled.
        let unfilled = unsafe { buf.unfilled_mut() };
        let dst: &mut [u8] = unsafe { &mut *(unfilled as *mut [MaybeUninit<u8>] as *mut [u8]) };
        let mut iov = [IoSliceMut::new(dst)];
        let msg = rustix::net::recvmsg(self.stream.as_fd(), &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                self.fds.extend(fds);
            }
        }
        if msg.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            // The kernel closed the ones that did not fit; the engine fails the connection.
            self.error = Some(format!("a message carried more than {MAX_FDS_PER_READ} descriptors"));
        }
        Ok(msg.bytes)
    }
}

impl AsyncRead for FdReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let this = &mut *self;
            let stream = this.stream.clone();
            match stream.try_io(Interest::READABLE, || this.recv(buf)) {
                Ok(n) => {
                    // SAFETY: `recv` initialised `n` bytes of the unfilled part.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl FdSource for FdReader {
    fn drain_fds(&mut self) -> Vec<OwnedFd> {
        self.fds.drain(..).collect()
    }
    fn take_fd_error(&mut self) -> Option<String> {
        self.take_error()
    }
}

/// The write side: `AsyncWrite` for plain bytes, plus [`send_with_fds`](UnixWriter::send_with_fds).
pub(crate) struct UnixWriter {
    stream: Arc<UnixStream>,
}

impl UnixWriter {
    pub(crate) fn new(stream: Arc<UnixStream>) -> UnixWriter {
        UnixWriter { stream }
    }

    /// The socket, to shut it down in both directions when a write stalls.
    pub(crate) fn socket(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Writes `head` with `fds` attached to its first byte, then the rest of `head`; each
    /// write must make progress within `stall`.
    pub(crate) async fn send_with_fds(
        &mut self,
        head: &[u8],
        fds: &[BorrowedFd<'_>],
        stall: std::time::Duration,
    ) -> std::io::Result<()> {
        let mut sent = 0;
        if !fds.is_empty() {
            loop {
                tokio::time::timeout(stall, self.stream.writable())
                    .await
                    .map_err(|_| crate::io::stalled_write(stall))??;
                let attempt = self.stream.try_io(Interest::WRITABLE, || {
                    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
                    let mut control = SendAncillaryBuffer::new(&mut space);
                    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
                        return Err(std::io::Error::other("too many descriptors for one message"));
                    }
                    rustix::net::sendmsg(
                        self.stream.as_fd(),
                        &[IoSlice::new(head)],
                        &mut control,
                        SendFlags::NOSIGNAL,
                    )
                    .map_err(std::io::Error::from)
                });
                match attempt {
                    Ok(n) => {
                        sent = n;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
        }
        crate::io::write_all(self, &head[sent..], stall).await
    }
}

impl AsyncWrite for UnixWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write_vectored(bufs) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(rustix::net::shutdown(self.stream.as_fd(), rustix::net::Shutdown::Write).map_err(Into::into))
    }
}

/// The folder for this user's node sockets: `$HANDOFF_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/handoff`, else `/tmp/handoff-UID`; created with mode 0700, and
/// refused if another user owns it or others can enter it.
pub(crate) fn runtime_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = rustix::process::geteuid().as_raw();
    let dir = if let Some(d) = std::env::var_os("HANDOFF_RUNTIME_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        Path::new(&d).join("handoff")
    } else {
        PathBuf::from(format!("/tmp/handoff-{uid}"))
    };
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) => {
            return Err(Error::io(
                format!("creating the runtime directory {}", dir.display()),
                e,
            ))
        }
    }
    let meta = std::fs::metadata(&dir).map_err(|e| Error::io(format!("checking {}", dir.display()), e))?;
    if meta.uid() != uid {
        return Err(Error::Config(format!(
            "the runtime directory {} belongs to uid {}, not to us (uid {uid}); set HANDOFF_RUNTIME_DIR",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("restricting {} to mode 0700", dir.display()), e))?;
    }
    Ok(dir)
}

/// Checks that the process at the other end of `stream` runs as our user.
pub(crate) fn check_peer_uid(stream: &UnixStream) -> Result<()> {
    let cred = stream
        .peer_cred()
        .map_err(|e| Error::io("reading the peer's credentials (SO_PEERCRED)", e))?;
    let ours = rustix::process::geteuid().as_raw();
    if cred.uid() != ours {
        return Err(Error::Config(format!(
            "refusing a same-host peer running as uid {} (we are uid {ours}, pid {:?})",
            cred.uid(),
            cred.pid()
        )));
    }
    Ok(())
}

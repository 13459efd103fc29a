//! The system calls that handoff's two drivers (tokio in crate `handoff`, asyncio in
//! `handoff-python`) share, kept out of the engine (`handoff-proto` does no I/O): a
//! non-blocking `recvmsg` that collects the descriptors a Unix socket passes, a gathering
//! `sendmsg` with descriptors on its first byte, and the keepalive that bounds a silent TCP
//! peer. What the descriptors mean, and whether they are allowed, is the engine's to decide.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use handoff_proto::inbound::MAX_FDS_PER_READ;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendFlags};

/// What one read brought.
pub struct Received {
    /// Bytes read; 0 at the end of the stream.
    pub bytes: usize,
    /// Descriptors that came with them.
    pub fds: Vec<OwnedFd>,
    /// Whether more descriptors came than one read takes (they were closed by the kernel).
    pub truncated: bool,
}

/// One `recvmsg` into `buf`; `None` when nothing is there to read now.
pub fn recv(socket: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<Option<Received>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(msg) => break msg,
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    Ok(Some(Received {
        bytes: msg.bytes,
        fds,
        truncated: msg.flags.contains(ReturnFlags::CTRUNC),
    }))
}

/// One gathering `sendmsg` of `parts`, with `fds` on its first byte; `None` when the socket
/// takes nothing now.
pub fn send(socket: BorrowedFd<'_>, parts: &[IoSlice<'_>], fds: &[BorrowedFd<'_>]) -> std::io::Result<Option<usize>> {
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(rustix::net::SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one message"));
    }
    loop {
        match rustix::net::sendmsg(socket, parts, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => return Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Keepalive probes and `TCP_USER_TIMEOUT`, so that a silent TCP peer fails reads and
/// writes with `ETIMEDOUT` within `timeout` (the plan is the engine's,
/// `handoff_proto::bounds::keepalive_plan`).
pub fn set_tcp_timeout(socket: BorrowedFd<'_>, timeout: std::time::Duration) -> Result<(), String> {
    use rustix::net::sockopt;
    use std::time::Duration;
    let (idle, interval, probes) = handoff_proto::bounds::keepalive_plan(timeout)?;
    let set = || -> rustix::io::Result<()> {
        sockopt::set_socket_keepalive(socket, true)?;
        sockopt::set_tcp_keepidle(socket, Duration::from_secs(idle.into()))?;
        sockopt::set_tcp_keepintvl(socket, Duration::from_secs(interval.into()))?;
        sockopt::set_tcp_keepcnt(socket, probes)?;
        sockopt::set_tcp_user_timeout(socket, (timeout.as_millis().min(u128::from(u32::MAX))) as u32)
    };
    set().map_err(|e| format!("setting TCP keepalive for a {timeout:?} timeout: {e}"))
}

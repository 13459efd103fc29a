//! The system calls that handoff's two drivers (tokio in crate `handoff`, asyncio in
//! `handoff-python`) share, kept out of the engine (`handoff-proto` does no I/O): a
//! non-blocking `recvmsg` that collects the descriptors a Unix socket passes, a gathering
//! `sendmsg` with descriptors on its first byte, and the keepalive that bounds a silent TCP
//! peer; and [`stream::StreamIo`], a connection's stream read and written through its write
//! queue and TLS session without waiting; and [`hash_thread::HashThread`], which hashes a large
//! pulled answer while it arrives; and [`same_host`], where a node's Unix socket lives and
//! who may connect to it. What the descriptors mean, and whether they are allowed, is the engine's to decide.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

pub mod hash_thread;
pub mod same_host;
pub mod stream;

use handoff_proto::inbound::MAX_FDS_PER_READ;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendFlags};

/// What one read brought.
#[derive(Debug)]
pub struct Received {
    /// Bytes read; 0 at the end of the stream.
    pub bytes: usize,
    /// Descriptors that came with them.
    pub fds: Vec<OwnedFd>,
    /// Whether more descriptors came than one read takes (they were closed by the kernel).
    pub truncated: bool,
}

/// One `recvmsg` into `buf`; `None` when nothing is there to read now.
///
/// With `take_fds` false the read offers no room for descriptors: any that came are closed
/// by the kernel before they reach this process's table, and only `truncated` says they
/// came. A connection that may not carry descriptors yet (the handshake, spec §5.1) reads
/// this way, so that a flood of them costs it no descriptor at all.
pub fn recv(socket: BorrowedFd<'_>, buf: &mut [u8], take_fds: bool) -> std::io::Result<Option<Received>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
    let room = if take_fds { space.len() } else { 0 };
    let mut control = RecvAncillaryBuffer::new(&mut space[..room]);
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

/// Whether process `pid` has exited (or is a zombie, whose memory is gone): then its
/// mappings of our segments are gone too, and the segments may be reused. `false` while it
/// runs, or when that cannot be told (a process of another namespace).
pub fn process_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis (which may contain spaces).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Segments kept for peers whose connection closed while their process lived: each goes
/// back to the pool once its process has exited (`park_until_exit`).
static PARKED: std::sync::Mutex<Vec<(u32, Vec<handoff_proto::shm::buffers::Held>)>> = std::sync::Mutex::new(Vec::new());
/// A thread sweeps [`PARKED`].
static SWEEPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// How often the sweep looks at the parked peers' processes.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// What the leases of a closed connection kept, ended as the peer's process allows: our
/// segments go back to the pool at once if process `pid` has exited (its mappings are
/// gone), else when it exits (a thread looks every 50 ms while any wait), so that no
/// send writes into a segment a live receiver still maps. With no pid known, the segments
/// are retired: never reused.
pub fn end_leases_of(pid: Option<u32>, kept: Vec<handoff_proto::shm::buffers::Held>) {
    match pid {
        Some(pid) if !process_exited(pid) && !kept.is_empty() => {
            let mut parked = PARKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            parked.push((pid, kept));
            if !SWEEPING.swap(true, std::sync::atomic::Ordering::AcqRel) {
                std::thread::spawn(sweep_parked);
            }
        }
        Some(_) => drop(kept),
        None => kept.iter().for_each(handoff_proto::shm::buffers::Held::retire),
    }
}

fn sweep_parked() {
    loop {
        std::thread::sleep(SWEEP_EVERY);
        let mut parked = PARKED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (gone, alive): (Vec<_>, Vec<_>) = std::mem::take(&mut *parked)
            .into_iter()
            .partition(|(pid, _)| process_exited(*pid));
        *parked = alive;
        let done = parked.is_empty();
        if done {
            SWEEPING.store(false, std::sync::atomic::Ordering::Release);
        }
        drop(parked);
        // Dropped with the lock let go: what a lease held may be an application's buffer,
        // whose drop waits for Python's GIL, and a thread holding the GIL may be waiting for
        // this lock (a connection closing, `end_leases_of`).
        drop(gone);
        if done {
            return;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// The tests count this process's descriptors: one at a time.
    static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Sends one byte with `n` descriptors (copies of the sender's socket) and reads it back.
    /// Returns how many descriptors the read handed over, whether it says more came, and
    /// how many it opened in this process.
    fn one_byte_with_fds(n: usize, take_fds: bool) -> (usize, bool, usize) {
        let _one_at_a_time = COUNTING.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let fds: Vec<BorrowedFd<'_>> = (0..n).map(|_| a.as_fd()).collect();
        assert_eq!(send(a.as_fd(), &[IoSlice::new(b"x")], &fds).unwrap(), Some(1));
        let before = open_descriptors();
        let mut buf = [0u8; 4];
        let got = recv(b.as_fd(), &mut buf, take_fds).unwrap().expect("the byte is there");
        let opened = open_descriptors() - before;
        assert_eq!(got.bytes, 1);
        (got.fds.len(), got.truncated, opened)
    }

    #[test]
    fn a_read_with_room_takes_the_descriptors() {
        assert_eq!(one_byte_with_fds(3, true), (3, false, 3));
    }

    #[test]
    fn a_read_without_room_opens_none_and_says_some_came() {
        let (taken, truncated, opened) = one_byte_with_fds(MAX_FDS_PER_READ, false);
        assert_eq!(taken, 0);
        assert_eq!(opened, 0, "the kernel closed them before they reached this process");
        assert!(truncated, "the read learns that descriptors came");
    }

    #[test]
    fn a_process_has_exited_once_it_is_a_zombie_or_gone() {
        assert!(!process_exited(std::process::id()), "this one runs");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped yet: a zombie, whose memory (and mappings) are gone.
        while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .contains(") Z")
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(process_exited(pid), "a zombie");
        child.wait().unwrap();
        assert!(process_exited(pid), "reaped");
    }

    #[test]
    fn a_read_without_room_and_no_descriptors_is_not_truncated() {
        assert_eq!(one_byte_with_fds(0, false), (0, false, 0));
    }
}

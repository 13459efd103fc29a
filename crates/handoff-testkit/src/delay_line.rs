//! A TCP delay line: a relay that holds every byte for a set time in each direction before
//! passing it on, for round-trip tests where the kernel has no `netem` (see `scripts/netlab`).
//!
//! Each accepted connection gets its own connection to the target and, per direction, a
//! pipe and two threads: a reader that `splice`s what arrives into the pipe and notes how
//! many bytes came when, and a writer that sleeps until each arrival's time plus the delay
//! and then `splice`s those bytes on. The bytes never enter user space, so the line costs
//! the machine little CPU beside the two hosts it joins, as a wire would. Plain threads
//! and `clock_nanosleep` (with the thread's timer slack set to 1 ns) keep the delay exact to
//! a few microseconds, where an async runtime's timer wheel rounds to a millisecond.
//!
//! Bounds: each direction of each connection holds at most what its pipe holds (asked for
//! [`PIPE_BYTES`]; the kernel may grant less) and notes at most [`MAX_ARRIVALS`] arrivals;
//! when either is full the reader waits, so a sender that outruns the line is slowed by
//! TCP, as by a full link. At most [`MAX_CONNECTIONS`] connections are relayed at once;
//! more are closed at accept.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::num::NonZeroU64;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};

/// Bytes one direction of one connection asks its pipe to hold.
pub const PIPE_BYTES: usize = 4 << 20;
/// Arrivals one direction of one connection may have noted and not yet passed on.
pub const MAX_ARRIVALS: usize = 4096;
/// Connections relayed at once.
pub const MAX_CONNECTIONS: usize = 64;

/// A running delay line: accepts on [`DelayLine::addr`] and relays to its target until the
/// process exits.
#[derive(Debug)]
pub struct DelayLine {
    addr: SocketAddr,
}

impl DelayLine {
    /// Listens on `listen` and relays each connection to `target`, delaying each direction
    /// by `one_way`.
    pub fn start(listen: SocketAddr, target: SocketAddr, one_way: Duration) -> io::Result<DelayLine> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicUsize::new(0));
        thread::Builder::new()
            .name("delay-accept".into())
            .spawn(move || accept_loop(listener, target, one_way, open))?;
        Ok(DelayLine { addr })
    }

    /// The address the line accepts on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn accept_loop(listener: TcpListener, target: SocketAddr, one_way: Duration, open: Arc<AtomicUsize>) {
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            eprintln!("delay-line: over {MAX_CONNECTIONS} connections; closed a new one");
            continue;
        }
        let open = open.clone();
        let spawned = thread::Builder::new().name("delay-conn".into()).spawn(move || {
            if let Err(e) = relay(client, target, one_way) {
                eprintln!("delay-line: a connection to {target} ended: {e}");
            }
            open.fetch_sub(1, Ordering::SeqCst);
        });
        if let Err(e) = spawned {
            eprintln!("delay-line: cannot start a relay thread: {e}");
        }
    }
}

/// Relays one connection both ways until both directions have ended.
fn relay(client: TcpStream, target: SocketAddr, one_way: Duration) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        // Both threads of a direction wait in `poll` (see `read_side`).
        s.set_nonblocking(true)?;
    }
    let up = direction(client.try_clone()?, server.try_clone()?, one_way)?;
    let down = direction(server, client, one_way)?;
    for t in up.into_iter().chain(down) {
        let _ = t.join();
    }
    Ok(())
}

/// How many bytes arrived, and when; `None` for the end of the stream.
type Arrival = Option<(usize, Instant)>;

/// Starts the reader and writer threads of one direction, `from` → `to`.
fn direction(from: TcpStream, to: TcpStream, one_way: Duration) -> io::Result<Vec<thread::JoinHandle<()>>> {
    let (pipe_out, pipe_in) = pipe_with(PipeFlags::CLOEXEC)?;
    // A larger pipe than the default 64 KiB, so that a fast link's bytes in flight fit.
    // Without CAP_SYS_RESOURCE the kernel grants at most fs.pipe-max-size (1 MiB by
    // default); with less, the line is only slower.
    if fcntl_setpipe_size(&pipe_in, PIPE_BYTES).is_err() {
        let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok());
        if let Some(max) = max {
            let _ = fcntl_setpipe_size(&pipe_in, max.min(PIPE_BYTES));
        }
    }
    let (arrived_tx, arrived_rx) = sync_channel::<Arrival>(MAX_ARRIVALS);
    let from_again = from.try_clone()?;
    let reader = thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || read_side(from, pipe_in, arrived_tx))?;
    let writer = thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || write_side(to, from_again, one_way, pipe_out, arrived_rx))?;
    Ok(vec![reader, writer])
}

/// Waits until `fd` is ready for `what` (readable or writable).
fn wait_for(fd: &TcpStream, what: PollFlags) -> io::Result<()> {
    let mut fds = [PollFd::new(fd, what)];
    poll(&mut fds, None)?;
    Ok(())
}

/// Moves what arrives on `from` into the pipe, noting each arrival.
///
/// The socket is non-blocking and the reader waits for data in `poll`, not in `splice`:
/// a `splice` into a pipe holds the pipe's lock while it waits, which would stop the
/// writer from taking bytes out of the same pipe.
fn read_side(from: TcpStream, pipe_in: OwnedFd, arrived: SyncSender<Arrival>) {
    loop {
        if wait_for(&from, PollFlags::IN).is_err() {
            break;
        }
        match splice(&from, None, &pipe_in, None, PIPE_BYTES, SpliceFlags::MOVE) {
            Ok(0) => break,
            Ok(n) => {
                if arrived.send(Some((n, Instant::now()))).is_err() {
                    break;
                }
            }
            Err(e) if e == Errno::AGAIN || e == Errno::INTR => continue,
            Err(_) => break,
        }
    }
    let _ = arrived.send(None);
    let _ = from.shutdown(Shutdown::Read);
}

/// Passes each arrival's bytes from the pipe to `to` once they are due. At the end of the
/// stream it closes `to` for writing; if `to` fails, it closes both sockets, so that
/// neither direction waits on a connection that is gone.
fn write_side(to: TcpStream, from: TcpStream, one_way: Duration, pipe_out: OwnedFd, arrived: Receiver<Arrival>) {
    // Sleep to the microsecond, not to the default 50 µs of slack.
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
    while let Ok(Some((mut left, at))) = arrived.recv() {
        let due = at + one_way;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        while left > 0 {
            match splice(&pipe_out, None, &to, None, left, SpliceFlags::MOVE) {
                Ok(n) if n > 0 => left -= n,
                Err(e) if (e == Errno::AGAIN || e == Errno::INTR) && wait_for(&to, PollFlags::OUT).is_ok() => {}
                _ => {
                    let _ = to.shutdown(Shutdown::Both);
                    let _ = from.shutdown(Shutdown::Both);
                    return;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An echo server on loopback; returns its address.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => s.write_all(&buf[..n]).unwrap(),
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Duration {
        let mut back = vec![0u8; msg.len()];
        let started = Instant::now();
        s.write_all(msg).unwrap();
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
        started.elapsed()
    }

    #[test]
    fn a_round_trip_takes_twice_the_delay_and_bytes_arrive_intact() {
        let echo = echo_server();
        let line = DelayLine::start("127.0.0.1:0".parse().unwrap(), echo, Duration::from_millis(5)).unwrap();
        let mut s = TcpStream::connect(line.addr()).unwrap();
        s.set_nodelay(true).unwrap();
        let mut times: Vec<Duration> = (0..9u8).map(|i| round_trip(&mut s, &[i; 100])).collect();
        times.sort();
        let median = times[4];
        assert!(
            median >= Duration::from_millis(10),
            "round trip {median:?} under 2 x 5 ms"
        );
        assert!(
            median < Duration::from_millis(14),
            "round trip {median:?} far over 2 x 5 ms"
        );
        // A large message, bigger than one direction's pipe, comes back whole.
        let big: Vec<u8> = (0..(2 * PIPE_BYTES + 12345)).map(|i| (i % 251) as u8).collect();
        let mut writer = s.try_clone().unwrap();
        let sent = big.clone();
        let t = thread::spawn(move || writer.write_all(&sent).unwrap());
        let mut back = vec![0u8; big.len()];
        s.read_exact(&mut back).unwrap();
        t.join().unwrap();
        assert!(back == big, "the large message came back changed");
    }

    #[test]
    fn a_closed_end_closes_the_other() {
        let echo = echo_server();
        let line = DelayLine::start("127.0.0.1:0".parse().unwrap(), echo, Duration::from_millis(1)).unwrap();
        let mut s = TcpStream::connect(line.addr()).unwrap();
        round_trip(&mut s, b"hello");
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "the echo's end did not close");
    }
}

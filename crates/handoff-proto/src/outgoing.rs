//! A connection's write queue, with no I/O: the bytes queued for the peer in order, the
//! descriptors that ride on some of them, and the bounds of spec §9.1 on what a peer that
//! reads nothing can make us hold.
//!
//! A driver pushes whole messages and control headers, asks [`Outgoing::transmit`] for
//! what one write may take (a `sendmsg`'s slices and descriptors), and tells the queue how
//! many bytes went ([`Outgoing::advance`]). Answers to the peer's requests are counted
//! until they are written: past [`MAX_CONTROL_BACKLOG`] bytes, or as many pulled answers
//! as the node allows, the connection reads no more of the peer's requests
//! ([`Outgoing::backed_up`]). A write that makes no progress for the write timeout fails
//! the connection ([`Outgoing::write_deadline`]).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::time::{Duration, Instant};

use bytes::Bytes;

use handoff_wire::framing::encode_header_into;
use handoff_wire::Header;

use crate::outbound::MAX_RELEASES_PER_MESSAGE;
use crate::shm::buffers::PassFd;

/// Control bytes (answers, refusals, releases) a connection queues for a peer that does
/// not read them before it stops reading that peer's requests.
pub const MAX_CONTROL_BACKLOG: u64 = 1 << 20;

/// Bytes of our `unlease`s a connection keeps queued unwritten (an owner that reads
/// nothing): past it a further `unlease` is dropped, and the hold ends by its deadline at
/// the owner (spec §9.1). They never stop the connection's reader: they come from our own
/// drops, not from reading the peer.
pub const MAX_UNLEASE_BACKLOG: u64 = 1 << 20;

/// The most slices one write gathers.
pub const MAX_SLICES: usize = 64;

/// Bytes queued to write, in order, and the descriptors that ride on some of them.
#[derive(Default)]
pub struct Outgoing {
    parts: VecDeque<Bytes>,
    /// Descriptors to pass, each with the stream offset of the byte they go with (a
    /// message's first).
    fds: VecDeque<(u64, Vec<PassFd>)>,
    /// Stream offsets: bytes written so far, and the end of what is queued.
    written: u64,
    queued: u64,
    /// Where each queued answer to a peer's pull ends on the stream.
    pulled_answers: VecDeque<u64>,
    /// Other control bytes the peer's requests made us queue: where each ends on the
    /// stream and its length, and their sum while unwritten.
    control: VecDeque<(u64, u64)>,
    control_bytes: u64,
    /// Our `unlease`s, likewise: where each ends and its length, and their sum unwritten.
    unleases: VecDeque<(u64, u64)>,
    unlease_bytes: u64,
    /// When a write last made progress, while bytes wait.
    last_progress: Option<Instant>,
}

/// What one write may take: slices of the queue in order, and the descriptors that go
/// with the first byte (none, or those of the message it starts).
pub struct Transmit<'a> {
    /// The bytes, never past the first byte of the next message with descriptors.
    pub slices: Vec<IoSlice<'a>>,
    /// The descriptors to pass with the first byte.
    pub fds: &'a [PassFd],
}

impl Outgoing {
    /// Queues `bytes` (a message's or a header's) at `now`.
    pub fn push(&mut self, bytes: Bytes, now: Instant) {
        if self.parts.is_empty() {
            // The write timeout counts from when bytes start to wait.
            self.last_progress = Some(now);
        }
        self.queued += bytes.len() as u64;
        if !bytes.is_empty() {
            self.parts.push_back(bytes);
        }
    }

    /// Queues `head` with `fds` on its first byte.
    pub fn push_with_fds(&mut self, head: Bytes, fds: Vec<PassFd>, now: Instant) {
        if !fds.is_empty() {
            self.fds.push_back((self.queued, fds));
        }
        self.push(head, now);
    }

    /// Queues control bytes the peer's requests made us send (an answer, a refusal).
    pub fn push_control(&mut self, bytes: Bytes, now: Instant) {
        let len = bytes.len() as u64;
        self.push(bytes, now);
        self.control.push_back((self.queued, len));
        self.control_bytes += len;
    }

    /// Queues one of our `unlease`s, unless [`MAX_UNLEASE_BACKLOG`] bytes of them wait
    /// unwritten already: `false` when it is dropped.
    pub fn push_unlease(&mut self, bytes: Bytes, now: Instant) -> bool {
        let len = bytes.len() as u64;
        if self.unlease_bytes + len > MAX_UNLEASE_BACKLOG {
            return false;
        }
        self.push(bytes, now);
        self.unleases.push_back((self.queued, len));
        self.unlease_bytes += len;
        true
    }

    /// Queues `release` messages for `leases` of the peer's segments whose last view was
    /// dropped, as many leases to a message as spec §9.1 allows.
    pub fn push_releases(&mut self, leases: &[u64], now: Instant) {
        for chunk in leases.chunks(MAX_RELEASES_PER_MESSAGE) {
            let mut head = Vec::with_capacity(16 + chunk.len() * 9);
            encode_header_into(&Header::Release { leases: chunk.to_vec() }, &mut head);
            self.push(Bytes::from(head), now);
        }
    }

    /// Queues the answer to a peer's pull: its header, counted as control bytes, then the
    /// bytes pulled, counted among the pulled answers until written.
    pub fn push_pulled_answer(&mut self, head: Bytes, bytes: Bytes, now: Instant) {
        self.push_control(head, now);
        self.push(bytes, now);
        self.pulled_answers.push_back(self.queued);
    }

    /// Bytes written so far: the stream offset a message queued before ends at, once
    /// written, is at most this.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The stream offset where what is queued ends.
    pub fn queued(&self) -> u64 {
        self.queued
    }

    /// Whether nothing waits to be written.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Answers to the peer's pulls queued and not yet written.
    pub fn pulled_answers(&self) -> usize {
        self.pulled_answers.len()
    }

    /// Whether the peer leaves our answers unread: `max_pull_answers` pulled answers queued
    /// (at least one), or more than [`MAX_CONTROL_BACKLOG`] other control bytes. The
    /// connection then reads none of the peer's requests until they drain.
    pub fn backed_up(&self, max_pull_answers: usize) -> bool {
        self.pulled_answers.len() >= max_pull_answers.max(1) || self.control_bytes > MAX_CONTROL_BACKLOG
    }

    /// When bytes that wait (here, or `more_waiting` elsewhere: TLS records) will have made
    /// no progress for `write_timeout`.
    pub fn write_deadline(&self, write_timeout: Duration, more_waiting: bool) -> Option<Instant> {
        let waiting = !self.is_empty() || more_waiting;
        self.last_progress
            .filter(|_| waiting)
            .map(|since| since + write_timeout)
    }

    /// What the next write may take (nothing when the queue is empty).
    pub fn transmit(&self) -> Transmit<'_> {
        // Descriptors go with their message's first byte, and a write never reaches past
        // the first byte of the next message that has some.
        let fds = match self.fds.front() {
            Some((at, fds)) if *at == self.written => fds.as_slice(),
            _ => &[],
        };
        let mut limit = self
            .fds
            .iter()
            .find(|(at, _)| *at > self.written)
            .map_or(u64::MAX, |(at, _)| at - self.written);
        let mut slices = Vec::with_capacity(self.parts.len().min(MAX_SLICES));
        for part in self.parts.iter().take(MAX_SLICES) {
            if limit == 0 {
                break;
            }
            let take = (part.len() as u64).min(limit) as usize;
            slices.push(IoSlice::new(&part[..take]));
            limit -= take as u64;
        }
        Transmit { slices, fds }
    }

    /// `n` bytes of the last [`transmit`](Self::transmit) were written at `now` (its
    /// descriptors with them, when `n > 0`).
    pub fn advance(&mut self, mut n: usize, now: Instant) {
        if n > 0 && self.fds.front().is_some_and(|(at, _)| *at == self.written) {
            self.fds.pop_front();
        }
        self.written += n as u64;
        self.last_progress = Some(now);
        while self.pulled_answers.front().is_some_and(|end| *end <= self.written) {
            self.pulled_answers.pop_front();
        }
        while let Some(&(end, len)) = self.control.front() {
            if end > self.written {
                break;
            }
            self.control.pop_front();
            self.control_bytes -= len;
        }
        while let Some(&(end, len)) = self.unleases.front() {
            if end > self.written {
                break;
            }
            self.unleases.pop_front();
            self.unlease_bytes -= len;
        }
        while n > 0 {
            let first = self.parts.front_mut().expect("bytes were written from the queue");
            if n >= first.len() {
                n -= first.len();
                self.parts.pop_front();
            } else {
                let _ = first.split_to(n);
                n = 0;
            }
        }
    }

    /// Drops what was queued (the connection is gone); its descriptors close.
    pub fn clear(&mut self) {
        self.parts.clear();
        self.fds.clear();
        self.pulled_answers.clear();
        self.control.clear();
        self.control_bytes = 0;
        self.unleases.clear();
        self.unlease_bytes = 0;
        self.written = self.queued;
        self.last_progress = None;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use super::*;

    fn fd() -> PassFd {
        let fd: OwnedFd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        PassFd::Received(std::sync::Arc::new(fd))
    }

    fn written(out: &Outgoing) -> Vec<u8> {
        out.transmit().slices.iter().flat_map(|s| s.to_vec()).collect()
    }

    #[test]
    fn bytes_go_in_order_and_partial_writes_resume_mid_part() {
        let now = Instant::now();
        let mut out = Outgoing::default();
        out.push(Bytes::from_static(b"abc"), now);
        out.push(Bytes::new(), now);
        out.push(Bytes::from_static(b"de"), now);
        assert_eq!(written(&out), b"abcde");
        out.advance(2, now);
        assert_eq!(written(&out), b"cde");
        out.advance(3, now);
        assert!(out.is_empty());
    }

    #[test]
    fn descriptors_ride_on_their_message_first_byte_and_no_write_crosses_the_next() {
        let now = Instant::now();
        let mut out = Outgoing::default();
        out.push(Bytes::from_static(b"plain"), now);
        out.push_with_fds(Bytes::from_static(b"head1"), vec![fd()], now);
        out.push_with_fds(Bytes::from_static(b"head2"), vec![fd(), fd()], now);
        let t = out.transmit();
        assert!(t.fds.is_empty());
        assert_eq!(t.slices.iter().map(|s| s.len()).sum::<usize>(), 5, "stops before head1");
        out.advance(5, now);
        let t = out.transmit();
        assert_eq!(t.fds.len(), 1);
        assert_eq!(t.slices.iter().map(|s| s.len()).sum::<usize>(), 5, "stops before head2");
        out.advance(1, now);
        // The descriptors went with the first byte: the rest of head1 goes without.
        assert!(out.transmit().fds.is_empty());
        out.advance(4, now);
        assert_eq!(out.transmit().fds.len(), 2);
    }

    #[test]
    fn unread_answers_back_up_until_written() {
        let now = Instant::now();
        let mut out = Outgoing::default();
        out.push_pulled_answer(Bytes::from_static(b"h"), Bytes::from(vec![0u8; 10]), now);
        assert_eq!(out.pulled_answers(), 1);
        assert!(!out.backed_up(2));
        assert!(out.backed_up(1));
        out.advance(11, now);
        assert!(!out.backed_up(1));
        out.push_control(Bytes::from(vec![0u8; MAX_CONTROL_BACKLOG as usize + 1]), now);
        assert!(out.backed_up(64));
        out.advance(MAX_CONTROL_BACKLOG as usize, now);
        assert!(out.backed_up(64), "one byte still unwritten");
        out.advance(1, now);
        assert!(!out.backed_up(64));
    }

    #[test]
    fn releases_go_in_messages_of_at_most_the_allowed_count() {
        let mut out = Outgoing::default();
        let leases: Vec<u64> = (0..MAX_RELEASES_PER_MESSAGE as u64 + 1).collect();
        out.push_releases(&leases, Instant::now());
        assert_eq!(out.parts.len(), 2);
        let header = Header::decode(&out.parts[1][4..], &handoff_wire::Limits::DEFAULT).unwrap();
        assert!(matches!(header, Header::Release { leases } if leases == vec![MAX_RELEASES_PER_MESSAGE as u64]));
    }

    #[test]
    fn the_write_deadline_counts_from_the_last_progress_while_bytes_wait() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let mut out = Outgoing::default();
        assert_eq!(out.write_deadline(timeout, false), None);
        out.push(Bytes::from_static(b"abcd"), t0);
        assert_eq!(out.write_deadline(timeout, false), Some(t0 + timeout));
        let t1 = t0 + Duration::from_secs(3);
        out.advance(2, t1);
        assert_eq!(out.write_deadline(timeout, false), Some(t1 + timeout));
        out.advance(2, t1);
        assert_eq!(out.write_deadline(timeout, false), None);
        assert_eq!(
            out.write_deadline(timeout, true),
            Some(t1 + timeout),
            "TLS records wait"
        );
        out.push(Bytes::from_static(b"x"), t1);
        out.clear();
        assert!(out.is_empty());
        assert_eq!(out.write_deadline(timeout, false), None);
    }

    #[test]
    fn unleases_are_dropped_past_their_backlog_and_never_stop_the_reader() {
        let now = Instant::now();
        let mut out = Outgoing::default();
        let one = Bytes::from(vec![0u8; 1024]);
        let mut kept = 0;
        while out.push_unlease(one.clone(), now) {
            kept += 1;
        }
        assert_eq!(kept as u64, MAX_UNLEASE_BACKLOG / 1024);
        assert!(!out.backed_up(64), "our unleases do not stop reading the peer");
        let n = out.transmit().slices.iter().map(|s| s.len()).sum();
        out.advance(n, now);
        assert!(out.push_unlease(one, now), "room again once written");
    }
}

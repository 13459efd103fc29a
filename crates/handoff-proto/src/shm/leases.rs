//! The sender's shared-memory leases on one same-host connection (spec §7.4): what the
//! sender keeps alive for its peer until the peer releases each lease, bounded in bytes and
//! count (spec §9.1), and the decision of which frames go through shared memory at all.
//!
//! The book neither locks nor waits: a driver keeps it behind its own lock, and a send that
//! finds no room waits (or fails) as the node is configured, asking again after a release.

use std::collections::HashMap;

/// Leases held for one peer, each on a handle `T` that keeps a segment alive.
#[derive(Debug)]
pub struct ShmLeases<T> {
    held: HashMap<u64, (T, u64)>,
    bytes: u64,
    next: u64,
    max_bytes: u64,
    max_leases: usize,
}

impl<T> ShmLeases<T> {
    /// A book of at most `max_bytes` and `max_leases` for one peer.
    pub fn new(max_bytes: u64, max_leases: usize) -> ShmLeases<T> {
        ShmLeases {
            held: HashMap::new(),
            bytes: 0,
            next: 1,
            max_bytes,
            max_leases,
        }
    }

    /// Leases `held` (`bytes` of shared memory) to the peer; when the peer holds as much as
    /// it may, gives `held` back with the reason. A lease is never refused to a peer that
    /// holds none, so one large frame always goes.
    pub fn try_lease(&mut self, held: T, bytes: u64) -> Result<u64, (T, String)> {
        let room = self.held.is_empty() || (self.bytes + bytes <= self.max_bytes && self.held.len() < self.max_leases);
        if !room {
            let reason = format!(
                "{} bytes in {} shared-memory leases are held for it (at most {} bytes and {} leases), \
                 and it released none in time",
                self.bytes,
                self.held.len(),
                self.max_bytes,
                self.max_leases
            );
            return Err((held, reason));
        }
        let lease = self.next;
        self.next += 1;
        self.bytes += bytes;
        self.held.insert(lease, (held, bytes));
        Ok(lease)
    }

    /// Ends the leases the peer released; returns how many were held (unknown ones, already
    /// ended, are skipped).
    pub fn release(&mut self, leases: &[u64]) -> usize {
        let mut ended = 0;
        for l in leases {
            if let Some((_, bytes)) = self.held.remove(l) {
                self.bytes -= bytes;
                ended += 1;
            }
        }
        ended
    }

    /// Ends every lease (the peer is gone); returns how many there were.
    pub fn release_all(&mut self) -> usize {
        self.release_all_with(|_| {})
    }

    /// Ends every lease and hands over what they kept (a driver keeps it while the peer's
    /// process may still map it).
    pub fn take_all(&mut self) -> Vec<T> {
        self.bytes = 0;
        self.held.drain().map(|(_, (kept, _))| kept).collect()
    }

    /// Ends every lease, after `each` saw what it kept (to retire the segments of a peer
    /// whose process may still map them); returns how many there were.
    pub fn release_all_with(&mut self, mut each: impl FnMut(&T)) -> usize {
        let n = self.held.len();
        for (kept, _) in self.held.values() {
            each(kept);
        }
        self.held.clear();
        self.bytes = 0;
        n
    }

    /// Leases outstanding, and the bytes they keep alive.
    pub fn held(&self) -> (usize, u64) {
        (self.held.len(), self.bytes)
    }

    /// The same figures as [`LeaseStats`].
    pub fn stats(&self) -> LeaseStats {
        LeaseStats {
            count: self.held.len(),
            bytes: self.bytes as usize,
        }
    }
}

/// Leases a node holds for a peer: buffers kept alive until the peer releases them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseStats {
    /// Leases outstanding.
    pub count: usize,
    /// Bytes they keep alive.
    pub bytes: usize,
}

impl std::ops::Add for LeaseStats {
    type Output = LeaseStats;

    fn add(self, other: LeaseStats) -> LeaseStats {
        LeaseStats {
            count: self.count + other.count,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// The leases a node holds for all its peers: each peer's, summed.
impl std::iter::Sum for LeaseStats {
    fn sum<I: Iterator<Item = LeaseStats>>(iter: I) -> LeaseStats {
        iter.fold(LeaseStats::default(), |acc, l| acc + l)
    }
}

/// How one frame of a message goes to a same-host peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameRoute {
    /// The frame already lies in a segment the peer may map: pass that segment.
    Segment,
    /// Copy the frame into a pooled segment and pass that.
    CopyIn,
    /// Copy the frame into a fresh segment sealed against writes (the node sends only
    /// sealed segments).
    CopySealed,
    /// Write the frame's bytes inline.
    Inline,
}

/// Where one frame goes: `passing` descriptors already ride on this message (one read takes
/// at most `max_fds`, so frames past that go inline); `in_segment` says whether the frame
/// lies in a shared segment, and `segment_sealed` whether that segment is sealed.
pub fn route_frame(
    len: usize,
    in_segment: bool,
    segment_sealed: bool,
    passing: usize,
    max_fds: usize,
    threshold: usize,
    sealed_only: bool,
) -> FrameRoute {
    if passing >= max_fds {
        return FrameRoute::Inline;
    }
    if in_segment && (!sealed_only || segment_sealed) {
        return FrameRoute::Segment;
    }
    if len >= threshold && len > 0 {
        return if sealed_only {
            FrameRoute::CopySealed
        } else {
            FrameRoute::CopyIn
        };
    }
    FrameRoute::Inline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_bound_but_always_one() {
        let mut book = ShmLeases::new(100, 2);
        let a = book.try_lease("a", 80).unwrap();
        let (back, why) = book.try_lease("b", 80).unwrap_err();
        assert_eq!(back, "b");
        assert!(why.contains("80 bytes in 1"), "{why}");
        assert_eq!(
            book.release(&[a, a, 99]),
            1,
            "unknown and repeated releases are skipped"
        );
        let big = book.try_lease("big", 1000).expect("alone, a lease over the bound goes");
        assert_eq!(book.held(), (1, 1000));
        book.try_lease("c", 1).unwrap_err();
        assert_eq!(book.release_all(), 1);
        assert_eq!(book.held(), (0, 0));
        assert_ne!(big, a, "ids are not reused");
    }

    #[test]
    fn lease_stats_are_the_book_s_figures_and_sum_over_peers() {
        let mut one = ShmLeases::new(1000, 8);
        let mut two = ShmLeases::new(1000, 8);
        one.try_lease("a", 100).unwrap();
        one.try_lease("b", 20).unwrap();
        two.try_lease("c", 7).unwrap();
        assert_eq!(one.stats(), LeaseStats { count: 2, bytes: 120 });
        let all: LeaseStats = [one.stats(), two.stats(), LeaseStats::default()].into_iter().sum();
        assert_eq!(all, LeaseStats { count: 3, bytes: 127 });
        assert_eq!(
            std::iter::empty::<LeaseStats>().sum::<LeaseStats>(),
            LeaseStats::default()
        );
    }

    #[test]
    fn frames_take_the_route_their_memory_and_size_allow() {
        assert_eq!(route_frame(10, true, false, 0, 4, 1000, false), FrameRoute::Segment);
        assert_eq!(route_frame(10, true, false, 0, 4, 1000, true), FrameRoute::Inline);
        assert_eq!(route_frame(5000, true, false, 0, 4, 1000, true), FrameRoute::CopySealed);
        assert_eq!(route_frame(5000, false, false, 0, 4, 1000, false), FrameRoute::CopyIn);
        assert_eq!(
            route_frame(5000, false, false, 4, 4, 1000, false),
            FrameRoute::Inline,
            "no room for a descriptor"
        );
        assert_eq!(route_frame(0, false, false, 0, 4, 0, false), FrameRoute::Inline);
    }
}

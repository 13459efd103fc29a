//! The inbox: received messages waiting for the application, one queue per connection,
//! taken fairly by bytes.
//!
//! A single queue would let a peer that sends a flood put every other peer's messages
//! behind its own. Here `Node::recv` serves the connections that have messages by deficit
//! round-robin: each turn gives a connection a quantum of bytes of credit, and it is served
//! while its credit covers its next message. A peer's messages stay in order; a peer that
//! sends large messages gets its share in bytes, not in messages, so a peer that sends a
//! small one now and then is served within a turn whatever the others have queued. How
//! many messages wait is bounded by the receive budget, which every envelope holds a share
//! of.
//!
//! The queue neither locks nor waits: a driver keeps it behind its own lock and wakes its
//! receivers when [`Inbox::push`] says the inbox had been empty (or always, as it likes).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::bounds::MESSAGE_OVERHEAD;

/// What the inbox needs to know of a message.
pub trait Queued {
    /// The connection it came on (any value unique among the node's live connections).
    fn connection(&self) -> usize;
    /// What it weighs in the turns: the bytes it holds in the receive budget.
    fn weight(&self) -> u64;
}

/// Credit a connection gains per turn, in bytes: about one small message (its bytes plus
/// the fixed overhead every message is charged), so that small messages go round-robin
/// and large ones get their share in bytes.
const QUANTUM: u64 = 2 * MESSAGE_OVERHEAD;

struct PeerQueue<T> {
    messages: VecDeque<T>,
    /// Bytes this connection may still be served before its next turn ends.
    credit: u64,
}

impl<T> Default for PeerQueue<T> {
    fn default() -> Self {
        PeerQueue {
            messages: VecDeque::new(),
            credit: 0,
        }
    }
}

/// Hashes a connection's key (an address, most likely) by one multiplication: the keys
/// are the node's own, so nobody can choose them to collide.
#[derive(Default)]
struct ConnectionHasher(u64);

impl Hasher for ConnectionHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, key: usize) {
        // The high half folded into the low one: addresses are aligned, so the product's
        // low bits alone would leave most buckets unused.
        let h = (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// Messages for the application, taken fairly from each connection.
pub struct Inbox<T> {
    /// Messages waiting, by connection.
    by_peer: HashMap<usize, PeerQueue<T>, BuildHasherDefault<ConnectionHasher>>,
    /// Connections with messages waiting, in the order of their turns.
    turns: VecDeque<usize>,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox {
            by_peer: HashMap::default(),
            turns: VecDeque::new(),
        }
    }
}

impl<T: Queued> Inbox<T> {
    /// Adds a message behind the others of its connection; returns whether the inbox had
    /// been empty.
    pub fn push(&mut self, message: T) -> bool {
        let was_empty = self.turns.is_empty();
        let k = message.connection();
        // A connection's queue stays when it empties (a connection whose messages are taken
        // as they come then costs no map change per message); the empty ones are dropped
        // once they outnumber the busy ones, so they stay bounded by them.
        if !self.by_peer.contains_key(&k) && self.by_peer.len() >= 2 * self.turns.len() + 16 {
            self.by_peer.retain(|_, q| !q.messages.is_empty());
        }
        let queue = self.by_peer.entry(k).or_default();
        let had_none = queue.messages.is_empty();
        queue.messages.push_back(message);
        if had_none {
            self.turns.push_back(k);
        }
        was_empty
    }

    /// The next message by the turns, if any waits.
    pub fn try_pop(&mut self) -> Option<T> {
        let q = self;
        if q.turns.is_empty() {
            return None;
        }
        loop {
            // One round: each connection in turn is served if its credit covers its next
            // message, else it gains a quantum and the turn passes on.
            for _ in 0..q.turns.len() {
                let k = *q.turns.front().expect("not empty");
                let alone = q.turns.len() == 1;
                let queue = q.by_peer.get_mut(&k).expect("a connection with a turn has messages");
                let next = queue
                    .messages
                    .front()
                    .expect("a connection with a turn has messages")
                    .weight();
                if queue.credit >= next || alone {
                    let envelope = queue.messages.pop_front().expect("checked");
                    queue.credit = queue.credit.saturating_sub(next);
                    if queue.messages.is_empty() {
                        // Its turn ends: it starts afresh when a message comes (a queue that
                        // grew long gives its memory back).
                        queue.credit = 0;
                        if queue.messages.capacity() > 64 {
                            queue.messages = VecDeque::new();
                        }
                        q.turns.pop_front();
                    }
                    return Some(envelope);
                }
                queue.credit += QUANTUM;
                q.turns.rotate_left(1);
            }
            // Nobody could be served in a whole round (large messages only): skip the
            // rounds it takes until the first one can, all at once.
            let waiting = || q.by_peer.values().filter(|p| !p.messages.is_empty());
            let rounds = waiting()
                .map(|p| p.messages[0].weight().saturating_sub(p.credit).div_ceil(QUANTUM))
                .min()
                .unwrap_or(1)
                .max(1);
            for p in q.by_peer.values_mut().filter(|p| !p.messages.is_empty()) {
                p.credit += (rounds - 1) * QUANTUM;
            }
        }
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Drops every waiting message (the node shuts down).
    pub fn clear(&mut self) {
        self.by_peer.clear();
        self.turns.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct M(usize, u64, u32);
    impl Queued for M {
        fn connection(&self) -> usize {
            self.0
        }
        fn weight(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn the_queues_of_idle_connections_stay_bounded() {
        let mut inbox = Inbox::default();
        for k in 0..1000 {
            inbox.push(M(k, 10, 0));
            assert_eq!(inbox.try_pop().map(|m| m.0), Some(k));
        }
        assert!(inbox.is_empty());
        assert!(inbox.by_peer.len() <= 17, "{} queues kept", inbox.by_peer.len());
        // A busy connection's queue is never dropped with the idle ones.
        inbox.push(M(5000, 10, 1));
        inbox.push(M(5000, 10, 2));
        for k in 0..100 {
            inbox.push(M(k, 10, 0));
        }
        let from_busy: Vec<u32> = std::iter::from_fn(|| inbox.try_pop())
            .filter(|m| m.0 == 5000)
            .map(|m| m.2)
            .collect();
        assert_eq!(from_busy, [1, 2], "in order, none lost");
    }

    #[test]
    fn a_flood_does_not_hold_back_another_connections_small_message() {
        let mut inbox = Inbox::default();
        assert!(inbox.push(M(1, 1 << 20, 0)), "the inbox was empty");
        for i in 1..100 {
            assert!(!inbox.push(M(1, 1 << 20, i)));
        }
        inbox.push(M(2, MESSAGE_OVERHEAD, 0));
        let order: Vec<_> = std::iter::from_fn(|| inbox.try_pop())
            .take(3)
            .map(|m| (m.0, m.2))
            .collect();
        assert!(
            order.contains(&(2, 0)),
            "the small message is served within a turn: {order:?}"
        );
        let rest: Vec<_> = std::iter::from_fn(|| inbox.try_pop()).map(|m| m.2).collect();
        assert!(
            rest.windows(2).all(|w| w[0] < w[1]),
            "a connection's messages stay in order"
        );
        assert!(inbox.is_empty());
    }
}

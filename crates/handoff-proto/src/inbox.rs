//! The inbox: received messages waiting for the application, one queue per connection,
//! taken fairly by bytes. Both drivers run this one queue: the tokio node, and the Python
//! node on the engine (through the extension's `Inbox`).
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
//! **Sparse connections first** (as fq_codel does for packets, RFC 8290): a connection
//! whose queue was empty when its message arrived (a peer with one request out at a time,
//! waiting for its answer) is served before the connections that have a backlog, for one
//! quantum; a larger message waits for its share in the round. A flood cannot use this: a
//! connection keeps its place among the sparse ones only while it has nothing queued.
//!
//! **Open connections first.** Messages of a connection that has closed stay (nothing a
//! peer sent before it left is lost), but they are served only when no open connection has
//! a message waiting ([`Inbox::closed`]): their peer waits for no answer.
//!
//! The queue neither locks nor waits: a driver keeps it behind its own lock and wakes its
//! receivers when [`Inbox::push`] says the inbox had been empty (or always, as it likes).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::bounds::MESSAGE_OVERHEAD;

/// What the inbox needs to know of a message.
pub trait Queued {
    /// The connection it came on (any value unique among the node's live connections).
    fn connection(&self) -> usize;
    /// What it weighs in the turns: the bytes it holds in the receive budget.
    fn weight(&self) -> u64;
}

/// Credit a connection gains per turn, in bytes, unless the driver says otherwise: about
/// one small message (its bytes plus the fixed overhead every message is charged), so that
/// small messages go round-robin and large ones get their share in bytes.
pub const QUANTUM: u64 = 2 * MESSAGE_OVERHEAD;

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

type Keyed<V> = HashMap<usize, V, BuildHasherDefault<ConnectionHasher>>;

/// Messages for the application, taken fairly from each connection: sparse connections
/// first, then open ones by deficit round-robin, then closed ones.
pub struct Inbox<T> {
    /// Messages waiting, by connection.
    by_peer: Keyed<PeerQueue<T>>,
    /// Open connections whose queue was empty when their message came, in that order.
    sparse: VecDeque<usize>,
    /// Open connections with a backlog, in the order of their turns.
    turns: VecDeque<usize>,
    /// Closed connections whose messages still wait, in the order of their turns.
    closed_turns: VecDeque<usize>,
    /// The connections in `closed_turns`.
    closed: HashSet<usize, BuildHasherDefault<ConnectionHasher>>,
    /// Credit a connection gains per turn.
    quantum: u64,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox::with_quantum(QUANTUM)
    }
}

impl<T> Inbox<T> {
    /// An inbox whose connections gain `quantum` bytes of credit per turn (at least 1).
    pub fn with_quantum(quantum: u64) -> Inbox<T> {
        Inbox {
            by_peer: Keyed::default(),
            sparse: VecDeque::new(),
            turns: VecDeque::new(),
            closed_turns: VecDeque::new(),
            closed: HashSet::default(),
            quantum: quantum.max(1),
        }
    }

    /// Connections with messages waiting.
    fn busy(&self) -> usize {
        self.sparse.len() + self.turns.len() + self.closed_turns.len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.busy() == 0
    }

    /// How many messages wait.
    pub fn len(&self) -> usize {
        self.by_peer.values().map(|q| q.messages.len()).sum()
    }

    /// Drops every waiting message (the node shuts down).
    pub fn clear(&mut self) {
        *self = Inbox::with_quantum(self.quantum);
    }

    /// The connection `k` has closed: what it sent waits until no open connection has a
    /// message (nothing is dropped).
    pub fn closed(&mut self, k: usize) {
        let waiting = self.by_peer.get(&k).is_some_and(|q| !q.messages.is_empty());
        if !waiting || !self.closed.insert(k) {
            return;
        }
        self.sparse.retain(|&c| c != k);
        self.turns.retain(|&c| c != k);
        self.closed_turns.push_back(k);
    }

    /// Ends `k`'s turn after its last message was taken: it starts afresh when a message
    /// comes (a queue that grew long gives its memory back).
    fn emptied(&mut self, k: usize) {
        let queue = self.by_peer.get_mut(&k).expect("served");
        queue.credit = 0;
        if queue.messages.capacity() > 64 {
            queue.messages = VecDeque::new();
        }
        self.closed.remove(&k);
    }
}

impl<T: Queued> Inbox<T> {
    /// Adds a message behind the others of its connection; returns whether the inbox had
    /// been empty.
    pub fn push(&mut self, message: T) -> bool {
        let was_empty = self.is_empty();
        let k = message.connection();
        // A connection's queue stays when it empties (a connection whose messages are taken
        // as they come then costs no map change per message); the empty ones are dropped
        // once they outnumber the busy ones, so they stay bounded by them.
        if !self.by_peer.contains_key(&k) && self.by_peer.len() >= 2 * self.busy() + 16 {
            self.by_peer.retain(|_, q| !q.messages.is_empty());
        }
        let queue = self.by_peer.entry(k).or_default();
        let had_none = queue.messages.is_empty();
        queue.messages.push_back(message);
        if had_none {
            if self.closed.contains(&k) {
                self.closed_turns.push_back(k);
            } else {
                queue.credit = self.quantum;
                self.sparse.push_back(k);
            }
        }
        was_empty
    }

    /// The next message, if any waits: a sparse connection's, else by the turns of the
    /// open connections, else by those of the closed ones.
    pub fn try_pop(&mut self) -> Option<T> {
        while let Some(message) = self.pop_sparse() {
            if let Some(message) = message {
                return Some(message);
            }
        }
        let closed = self.turns.is_empty();
        self.pop_turn(closed)
    }

    /// The first sparse connection's next message if its credit covers it (`Some(None)`:
    /// it moved to the turns instead); `None` when no connection is sparse.
    fn pop_sparse(&mut self) -> Option<Option<T>> {
        let k = *self.sparse.front()?;
        let queue = self.by_peer.get_mut(&k).expect("a sparse connection has messages");
        let weight = queue
            .messages
            .front()
            .expect("a sparse connection has messages")
            .weight();
        if weight > queue.credit {
            // More than a quantum (a large message): it waits for its share in the round.
            self.sparse.pop_front();
            self.turns.push_back(k);
            return Some(None);
        }
        let message = queue.messages.pop_front().expect("checked");
        queue.credit -= weight;
        if queue.messages.is_empty() {
            self.sparse.pop_front();
            self.emptied(k);
        } else if queue.credit == 0 {
            // Its quantum is spent and it has more: it joins the round of the backlogged.
            queue.credit = self.quantum;
            self.sparse.pop_front();
            self.turns.push_back(k);
        }
        Some(Some(message))
    }

    /// The next message by the turns of the open connections (or of the closed ones).
    fn pop_turn(&mut self, closed: bool) -> Option<T> {
        let quantum = self.quantum;
        let ring = if closed {
            &mut self.closed_turns
        } else {
            &mut self.turns
        };
        if ring.is_empty() {
            return None;
        }
        loop {
            // One round: each connection in turn is served if its credit covers its next
            // message, else it gains a quantum and the turn passes on.
            for _ in 0..ring.len() {
                let k = *ring.front().expect("not empty");
                let alone = ring.len() == 1;
                let queue = self.by_peer.get_mut(&k).expect("a connection with a turn has messages");
                let next = queue
                    .messages
                    .front()
                    .expect("a connection with a turn has messages")
                    .weight();
                if queue.credit >= next || alone {
                    let message = queue.messages.pop_front().expect("checked");
                    queue.credit = queue.credit.saturating_sub(next);
                    if queue.messages.is_empty() {
                        ring.pop_front();
                        self.emptied(k);
                    }
                    return Some(message);
                }
                queue.credit += quantum;
                ring.rotate_left(1);
            }
            // Nobody could be served in a whole round (large messages only): skip the
            // rounds it takes until the first one can, all at once.
            let rounds = ring
                .iter()
                .map(|k| {
                    let p = &self.by_peer[k];
                    p.messages[0].weight().saturating_sub(p.credit).div_ceil(quantum)
                })
                .min()
                .unwrap_or(1)
                .max(1);
            for k in ring.iter() {
                self.by_peer.get_mut(k).expect("has messages").credit += (rounds - 1) * quantum;
            }
        }
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
    fn a_sparse_connection_goes_before_the_backlogs_and_closed_ones_go_last() {
        let mut inbox = Inbox::default();
        let small = MESSAGE_OVERHEAD + 76;
        for k in 1..=25 {
            for i in 0..50 {
                inbox.push(M(k, small, i));
            }
        }
        // Every flooder now has a backlog and is in the round.
        for _ in 0..30 {
            inbox.try_pop();
        }
        // A peer with one message out at a time is served next, each time.
        for seq in 0..5 {
            inbox.push(M(100, small, seq));
            assert_eq!(inbox.try_pop().map(|m| (m.0, m.2)), Some((100, seq)));
            inbox.try_pop();
        }
        inbox.closed(1);
        let left = inbox.len();
        let order: Vec<(usize, u32)> = std::iter::from_fn(|| inbox.try_pop()).map(|m| (m.0, m.2)).collect();
        assert_eq!(order.len(), left, "nothing is lost");
        let first_of_gone = order
            .iter()
            .position(|m| m.0 == 1)
            .expect("connection 1 had messages left");
        let gone: Vec<u32> = order[first_of_gone..].iter().map(|m| m.1).collect();
        assert!(
            order[first_of_gone..].iter().all(|m| m.0 == 1),
            "after every open connection's"
        );
        assert!(gone.windows(2).all(|w| w[0] < w[1]), "in order");
        assert!(inbox.is_empty() && inbox.closed.is_empty());
    }

    #[test]
    fn a_large_message_on_a_sparse_connection_waits_for_its_share() {
        let mut inbox = Inbox::default();
        for i in 0..3 {
            inbox.push(M(1, QUANTUM, i));
        }
        inbox.try_pop();
        inbox.push(M(2, 10 * QUANTUM, 0));
        inbox.push(M(3, 10, 0));
        let order: Vec<usize> = std::iter::from_fn(|| inbox.try_pop()).map(|m| m.0).collect();
        assert_eq!(order[0], 3, "the small sparse one first: {order:?}");
        assert_eq!(order.len(), 4);
    }

    #[test]
    fn a_closed_connection_with_nothing_waiting_changes_nothing() {
        let mut inbox = Inbox::default();
        inbox.closed(4);
        inbox.push(M(4, 10, 0));
        inbox.push(M(5, 10, 0));
        let order: Vec<usize> = std::iter::from_fn(|| inbox.try_pop()).map(|m| m.0).collect();
        assert_eq!(order, [4, 5], "served as an open connection");
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

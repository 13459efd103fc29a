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

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::envelope::Envelope;
use handoff_proto::bounds::MESSAGE_OVERHEAD;

/// Credit a connection gains per turn, in bytes: about one small message (its bytes plus
/// the fixed overhead every message is charged), so that small messages go round-robin
/// and large ones get their share in bytes.
const QUANTUM: u64 = 2 * MESSAGE_OVERHEAD;

#[derive(Default)]
struct PeerQueue {
    messages: VecDeque<Envelope>,
    /// Bytes this connection may still be served before its next turn ends.
    credit: u64,
}

#[derive(Default)]
struct Queues {
    /// Messages waiting, by connection (the address of its `PeerInner`).
    by_peer: HashMap<usize, PeerQueue>,
    /// Connections with messages waiting, in the order of their turns.
    turns: VecDeque<usize>,
}

/// Messages for the application, taken fairly from each connection.
#[derive(Default)]
pub(crate) struct Inbox {
    queues: Mutex<Queues>,
    arrived: Notify,
}

fn key(envelope: &Envelope) -> usize {
    std::sync::Arc::as_ptr(&envelope.from.0) as usize
}

/// What a message weighs in the turns: the bytes it holds in the budget.
fn weight(envelope: &Envelope) -> u64 {
    envelope.permit.as_ref().map_or(MESSAGE_OVERHEAD, |p| p.bytes())
}

impl Inbox {
    /// Adds a message behind the others of its connection.
    pub(crate) fn push(&self, envelope: Envelope) {
        let k = key(&envelope);
        let mut q = self.queues.lock().expect("inbox lock");
        let queue = q.by_peer.entry(k).or_default();
        let was_empty = queue.messages.is_empty();
        queue.messages.push_back(envelope);
        if was_empty {
            q.turns.push_back(k);
        }
        drop(q);
        self.arrived.notify_one();
    }

    fn try_pop(&self) -> Option<Envelope> {
        let mut q = self.queues.lock().expect("inbox lock");
        let q = &mut *q;
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
                let next = weight(queue.messages.front().expect("a connection with a turn has messages"));
                if queue.credit >= next || alone {
                    let envelope = queue.messages.pop_front().expect("checked");
                    queue.credit = queue.credit.saturating_sub(next);
                    if queue.messages.is_empty() {
                        q.by_peer.remove(&k);
                        q.turns.pop_front();
                    }
                    return Some(envelope);
                }
                queue.credit += QUANTUM;
                q.turns.rotate_left(1);
            }
            // Nobody could be served in a whole round (large messages only): skip the
            // rounds it takes until the first one can, all at once.
            let rounds = q
                .by_peer
                .values()
                .map(|p| weight(&p.messages[0]).saturating_sub(p.credit).div_ceil(QUANTUM))
                .min()
                .unwrap_or(1)
                .max(1);
            for p in q.by_peer.values_mut() {
                p.credit += (rounds - 1) * QUANTUM;
            }
        }
    }

    /// The next message, waiting until there is one.
    pub(crate) async fn pop(&self) -> Envelope {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(e) = self.try_pop() {
                // Another receiver may be waiting for the next one.
                if !self.is_empty() {
                    self.arrived.notify_one();
                }
                return e;
            }
            arrived.await;
        }
    }

    fn is_empty(&self) -> bool {
        self.queues.lock().expect("inbox lock").turns.is_empty()
    }

    /// Drops every waiting message (the node shuts down).
    pub(crate) fn clear(&self) {
        let mut q = self.queues.lock().expect("inbox lock");
        q.by_peer.clear();
        q.turns.clear();
    }
}

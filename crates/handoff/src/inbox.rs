//! The inbox: received messages waiting for the application, one queue per connection,
//! taken in turn.
//!
//! A single queue would let a peer that sends a flood put every other peer's messages
//! behind its own. Here `Node::recv` takes one message from each connection that has any,
//! round-robin: a peer's messages stay in order, and a busy peer delays another by at most
//! one message of its own per turn. How many messages wait is bounded by the receive
//! budget, which every envelope holds a share of.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::envelope::Envelope;

#[derive(Default)]
struct Queues {
    /// Messages waiting, by connection (the address of its `PeerInner`).
    by_peer: HashMap<usize, VecDeque<Envelope>>,
    /// Connections with messages waiting, in the order of their next turn.
    turns: VecDeque<usize>,
}

/// Messages for the application, taken one connection at a time.
#[derive(Default)]
pub(crate) struct Inbox {
    queues: Mutex<Queues>,
    arrived: Notify,
}

fn key(envelope: &Envelope) -> usize {
    std::sync::Arc::as_ptr(&envelope.from.0) as usize
}

impl Inbox {
    /// Adds a message behind the others of its connection.
    pub(crate) fn push(&self, envelope: Envelope) {
        let k = key(&envelope);
        let mut q = self.queues.lock().expect("inbox lock");
        let queue = q.by_peer.entry(k).or_default();
        if queue.is_empty() {
            q.turns.push_back(k);
        }
        q.by_peer.get_mut(&k).expect("just added").push_back(envelope);
        drop(q);
        self.arrived.notify_one();
    }

    fn try_pop(&self) -> Option<Envelope> {
        let mut q = self.queues.lock().expect("inbox lock");
        let k = q.turns.pop_front()?;
        let queue = q.by_peer.get_mut(&k).expect("a connection with a turn has messages");
        let envelope = queue.pop_front().expect("a connection with a turn has messages");
        if queue.is_empty() {
            q.by_peer.remove(&k);
        } else {
            q.turns.push_back(k);
        }
        Some(envelope)
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

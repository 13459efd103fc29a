//! The node's inbox (`handoff_proto::inbox`) behind a lock, and `Node::recv`'s wait for it.

use std::sync::Mutex;

use handoff_proto::bounds::MESSAGE_OVERHEAD;
use handoff_proto::inbox::{self, Queued};
use tokio::sync::Notify;

use crate::envelope::Envelope;

impl Queued for Envelope {
    fn connection(&self) -> usize {
        std::sync::Arc::as_ptr(&self.from.0) as usize
    }

    fn weight(&self) -> u64 {
        self.permit.as_ref().map_or(MESSAGE_OVERHEAD, |p| p.bytes())
    }
}

/// Messages for the application, taken fairly from each connection.
#[derive(Default)]
pub(crate) struct Inbox {
    queues: Mutex<inbox::Inbox<Envelope>>,
    arrived: Notify,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, inbox::Inbox<Envelope>> {
        self.queues.lock().expect("inbox lock")
    }

    /// Adds a message behind the others of its connection.
    pub(crate) fn push(&self, envelope: Envelope) {
        self.lock().push(envelope);
        self.arrived.notify_one();
    }

    /// The next message, waiting until there is one.
    pub(crate) async fn pop(&self) -> Envelope {
        // A message waiting already (the common case under load) registers no waiter.
        if let Some(e) = self.take() {
            return e;
        }
        let next = crate::wait::until(&self.arrived, None, None, || self.take()).await;
        next.expect("no deadline")
    }

    /// The next message if one waits, passing the turn on to another receiver when more do.
    pub(crate) fn take(&self) -> Option<Envelope> {
        let (next, more) = {
            let mut q = self.lock();
            let next = q.try_pop();
            (next, !q.is_empty())
        };
        if next.is_some() && more {
            // Another receiver may be waiting for the next one.
            self.arrived.notify_one();
        }
        next
    }

    /// `peer`'s connection has closed: what it sent waits until no open connection has a
    /// message.
    pub(crate) fn closed(&self, peer: &crate::Peer) {
        self.lock().closed(std::sync::Arc::as_ptr(&peer.0) as usize);
    }

    /// Drops every waiting message (the node shuts down).
    pub(crate) fn clear(&self) {
        // Taken out first: dropping envelopes gives room back, which must not run under the lock.
        let dropped = std::mem::take(&mut *self.lock());
        drop(dropped);
    }
}

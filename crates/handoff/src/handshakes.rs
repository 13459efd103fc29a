//! The bound on handshakes in progress on accepted connections (spec §9.1): when a new
//! one would pass it, the oldest gives way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The handshakes a node runs now, oldest first. When a new one would pass the bound, the
/// oldest is told to give up its place: a connection that has proven nothing cannot keep
/// a newer one, perhaps a legitimate peer, out.
pub(crate) struct Handshakes {
    max: usize,
    next_id: AtomicU64,
    running: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
}

/// A place among the handshakes in progress; given back when dropped.
pub(crate) struct HandshakeSlot {
    id: u64,
    handshakes: Arc<Handshakes>,
}

impl Handshakes {
    pub(crate) fn new(max: usize) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            max: max.max(1),
            next_id: AtomicU64::new(1),
            running: Mutex::default(),
        })
    }

    /// A place for a new handshake, evicting the oldest if all are taken; the receiver
    /// fires when this one is evicted in turn.
    pub(crate) fn enter(self: &Arc<Self>) -> (HandshakeSlot, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut running = self.running.lock().expect("handshakes lock");
        while running.len() >= self.max {
            if let Some((_, oldest)) = running.pop_front() {
                let _ = oldest.send(());
            }
        }
        running.push_back((id, tx));
        (
            HandshakeSlot {
                id,
                handshakes: self.clone(),
            },
            rx,
        )
    }

    /// Handshakes in progress now.
    pub(crate) fn count(&self) -> usize {
        self.running.lock().expect("handshakes lock").len()
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut running = self.handshakes.running.lock().expect("handshakes lock");
        if let Some(pos) = running.iter().position(|(id, _)| *id == self.id) {
            running.remove(pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_gives_way() {
        let h = Handshakes::new(2);
        let (a, mut a_rx) = h.enter();
        let (_b, mut b_rx) = h.enter();
        assert!(a_rx.try_recv().is_err());
        let (_c, _) = h.enter();
        assert!(a_rx.try_recv().is_ok(), "a was the oldest");
        assert!(b_rx.try_recv().is_err());
        assert_eq!(h.count(), 2);
        drop(a);
        assert_eq!(h.count(), 2, "a had already left");
    }
}

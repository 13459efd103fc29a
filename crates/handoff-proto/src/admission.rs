//! Admission of handshakes on accepted connections (spec §9.1 `max_handshakes`): when a new
//! one would pass the bound, the oldest gives way.
//!
//! A connection that has proven nothing cannot keep a newer one, perhaps a legitimate peer,
//! out. The table neither waits nor wakes: [`Admission::enter`] hands back the eviction
//! tokens of the handshakes that must give way, and the driver delivers them (a tokio
//! driver's token is a oneshot sender; the engine's [`Handshake::evict`](crate::Handshake::evict)
//! is what the evicted handshake then calls).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The handshakes a node runs now, oldest first, each with the token that evicts it.
pub struct Admission<T> {
    max: usize,
    next_id: AtomicU64,
    running: Mutex<VecDeque<(u64, T)>>,
}

/// A place among the handshakes in progress; given back when dropped.
pub struct Slot<T> {
    id: u64,
    admission: Arc<Admission<T>>,
}

impl<T> Admission<T> {
    /// A table of at most `max` handshakes at once (at least 1).
    pub fn new(max: usize) -> Arc<Admission<T>> {
        Arc::new(Admission {
            max: max.max(1),
            next_id: AtomicU64::new(1),
            running: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, T)>> {
        // The table holds plain entries; a panic elsewhere while it was locked leaves it usable.
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for a new handshake that `evict` will end; returns it with the tokens of the
    /// oldest handshakes that must give way for it (the driver delivers them).
    pub fn enter(self: &Arc<Self>, evict: T) -> (Slot<T>, Vec<T>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut running = self.lock();
        let mut evicted = Vec::new();
        while running.len() >= self.max {
            if let Some((_, oldest)) = running.pop_front() {
                evicted.push(oldest);
            }
        }
        running.push_back((id, evict));
        let slot = Slot {
            id,
            admission: self.clone(),
        };
        (slot, evicted)
    }

    /// Handshakes in progress now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        let mut running = self.admission.lock();
        if let Some(pos) = running.iter().position(|(id, _)| *id == self.id) {
            running.remove(pos);
        }
    }
}

/// Why a node with `connections` established refuses one more accepted connection at once
/// (spec §9.1 `max_connections`, said as `overloaded` to a peer that proved nothing: no
/// name, nothing that identifies the node); `None` while there is room.
pub fn over_connections(connections: usize, max_connections: usize) -> Option<String> {
    (connections >= max_connections)
        .then(|| format!("this node has {max_connections} connections, as many as it allows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_past_the_bound_is_refused_without_naming_the_node() {
        assert_eq!(over_connections(1, 2), None);
        assert_eq!(
            over_connections(3, 2).unwrap(),
            "this node has 2 connections, as many as it allows"
        );
    }

    #[test]
    fn the_oldest_handshake_gives_way() {
        let h = Admission::new(2);
        let (a, none) = h.enter("a");
        assert!(none.is_empty());
        let (_b, none) = h.enter("b");
        assert!(none.is_empty());
        let (_c, evicted) = h.enter("c");
        assert_eq!(evicted, ["a"], "a was the oldest");
        assert_eq!(h.count(), 2);
        drop(a);
        assert_eq!(h.count(), 2, "a had already left");
    }
}

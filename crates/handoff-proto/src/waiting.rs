//! Who waits on one of the engine's tables (the receive budget, the lease table), so that a
//! change wakes a driver only while someone waits: most room is given back, and most holds
//! end, with nobody waiting, and a wake that nobody needs still costs the driver something
//! (a notification under a lock, a byte in a wake pipe).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::budget::Waker;

/// The waits in progress on one table.
#[derive(Debug, Default)]
pub struct Waiting(AtomicUsize);

impl Waiting {
    /// Counts a wait until the guard is dropped. A waiter counts itself before it tries (and
    /// so locks the table): if the table's waker sees no waiter, the waiter's try comes
    /// after the change.
    pub fn enter(&self) -> Counted<'_> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted(self)
    }

    /// Whether a wait is in progress.
    pub fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }

    /// A waker for the table that calls `wake` only while a wait is in progress.
    pub fn gate(self: &Arc<Self>, wake: impl Fn() + Send + Sync + 'static) -> Waker {
        let waiting = self.clone();
        Box::new(move || {
            if waiting.any() {
                wake()
            }
        })
    }
}

/// One wait in progress ([`Waiting::enter`]), counted until dropped.
#[derive(Debug)]
pub struct Counted<'a>(&'a Waiting);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_gated_waker_wakes_only_while_someone_waits() {
        let waiting = Arc::new(Waiting::default());
        let woken = Arc::new(AtomicUsize::new(0));
        let count = woken.clone();
        let waker = waiting.gate(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        waker();
        assert_eq!(woken.load(Ordering::SeqCst), 0, "nobody waits");
        let first = waiting.enter();
        let second = waiting.enter();
        waker();
        drop(first);
        assert!(waiting.any(), "one wait is left");
        waker();
        drop(second);
        assert!(!waiting.any());
        waker();
        assert_eq!(woken.load(Ordering::SeqCst), 2);
    }
}

//! Hashing a large frame on a helper thread while the rest of it arrives.
//!
//! Reading a frame from a socket and hashing it are both CPU work; on one thread they add
//! up. [`HashBehind`] hashes the parts already received on a thread of its own, so the
//! reading thread goes straight back to the socket and the hash is (almost) done when the
//! last byte lands.

use std::sync::mpsc;
use std::thread::JoinHandle;

/// A raw pointer to bytes that another thread may read (see [`HashBehind::start`]).
struct SharedPtr(*const u8);
// SAFETY: the pointer is only read, in ranges the owner promised not to write (`start`).
unsafe impl Send for SharedPtr {}

/// Hashes ranges of one buffer, in order, on a helper thread.
pub(crate) struct HashBehind {
    ranges: Option<mpsc::Sender<(usize, usize)>>,
    result: Option<tokio::sync::oneshot::Receiver<blake3::Hasher>>,
    thread: Option<JoinHandle<()>>,
}

impl HashBehind {
    /// Starts the helper thread for the buffer at `base`.
    ///
    /// # Safety
    /// Every range later passed to [`push`](Self::push) must stay valid and unchanged until
    /// [`finish`](Self::finish) returns or this value is dropped (dropping waits for the
    /// thread).
    pub(crate) unsafe fn start(base: *const u8) -> HashBehind {
        let (tx, rx) = mpsc::channel::<(usize, usize)>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let base = SharedPtr(base);
        let thread = std::thread::Builder::new()
            .name("handoff-hash".into())
            .spawn(move || {
                let base = base;
                let mut hasher = blake3::Hasher::new();
                while let Ok((start, end)) = rx.recv() {
                    // SAFETY: the caller of `start` keeps this range valid and unchanged.
                    let part = unsafe { std::slice::from_raw_parts(base.0.add(start), end - start) };
                    hasher.update(part);
                }
                let _ = done_tx.send(hasher);
            })
            .ok();
        HashBehind {
            ranges: Some(tx),
            result: Some(done_rx),
            thread,
        }
    }

    /// Whether the helper thread runs (it may fail to start; then hash inline instead).
    pub(crate) fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// Queues `start..end` for hashing (ranges must follow each other).
    pub(crate) fn push(&self, start: usize, end: usize) {
        if let Some(tx) = &self.ranges {
            let _ = tx.send((start, end));
        }
    }

    /// Waits for every queued range to be hashed; the hasher.
    pub(crate) async fn finish(mut self) -> Option<blake3::Hasher> {
        self.ranges.take();
        let hasher = self.result.take()?.await.ok();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        hasher
    }
}

impl Drop for HashBehind {
    fn drop(&mut self) {
        // On an early return the buffer is about to go: wait until the thread stops reading it.
        self.ranges.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

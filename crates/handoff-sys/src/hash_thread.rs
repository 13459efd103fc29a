//! [`HashThread`]: a driver's [`HashBehind`], hashing a large `pulled` answer on a helper
//! thread while the rest of it arrives.
//!
//! Reading from a socket and hashing are both CPU work; on one thread they add up. Here the
//! engine hands the helper each run of bytes as it lands, the reading thread goes straight
//! back to the socket, and the hash is (almost) done when the last byte lands.

use std::sync::mpsc;
use std::thread::JoinHandle;

use handoff_proto::inbound::HashBehind;

/// Hashes runs of one answer's bytes, in order, on a helper thread.
pub struct HashThread {
    /// Each run as (address, length).
    ranges: Option<mpsc::Sender<(usize, usize)>>,
    thread: Option<JoinHandle<blake3::Hasher>>,
}

impl HashThread {
    /// A helper thread, or `None` if none could start (the engine then hashes inline).
    pub fn start() -> Option<Box<dyn HashBehind>> {
        let (tx, rx) = mpsc::channel::<(usize, usize)>();
        let thread = std::thread::Builder::new()
            .name("handoff-hash".into())
            .spawn(move || {
                let mut hasher = blake3::Hasher::new();
                while let Ok((at, len)) = rx.recv() {
                    // SAFETY: the engine keeps every run it handed over in place and unchanged
                    // until this hasher is dropped or finished (`HashBehind::arrived`), and
                    // both wait for this thread to stop.
                    hasher.update(unsafe { std::slice::from_raw_parts(at as *const u8, len) });
                }
                hasher
            })
            .ok()?;
        Some(Box::new(HashThread {
            ranges: Some(tx),
            thread: Some(thread),
        }))
    }
}

impl HashBehind for HashThread {
    fn arrived(&mut self, bytes: &[u8]) {
        if let Some(tx) = &self.ranges {
            let _ = tx.send((bytes.as_ptr() as usize, bytes.len()));
        }
    }

    /// Waits for every run to be hashed: the digest, or `None` if the thread died.
    fn finish(self: Box<Self>) -> Option<[u8; 32]> {
        let mut this = *self;
        this.ranges.take();
        let hasher = this.thread.take()?.join().ok()?;
        Some(*hasher.finalize().as_bytes())
    }
}

impl Drop for HashThread {
    fn drop(&mut self) {
        // Dropped early (the connection failed): the buffer is about to go, so wait until
        // the thread stops reading it.
        self.ranges.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_handed_over_in_order_hash_as_the_whole() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut behind = HashThread::start().expect("a thread starts");
        for run in data.chunks(65_536) {
            behind.arrived(run);
        }
        let digest = behind.finish();
        assert_eq!(digest, Some(*blake3::hash(&data).as_bytes()));
    }
}

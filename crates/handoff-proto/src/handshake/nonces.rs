//! The nonces a node recently sent as a dialer (spec §5.7 step 3).
//!
//! Every relayed version-3 handshake starts with a dialer's proof: an acceptor proves only
//! after the dialer did. So to relay one of a node's own handshakes back into it — the
//! attack of §5.8 where a node is made to dial an attacker, who dials the node back and
//! crosses the challenges so that the node's own dialer proof verifies on a connection it
//! accepted — the attacker must present, as its challenge on the accepted connection, a
//! nonce the node sent as a dialer. No transcript can reveal that relay; remembering those
//! nonces does. (Two different nodes, in one process or not, legitimately see each other's
//! dialer nonces: the set is the node's own.)
//!
//! How long: a proof the node wrote on a dialed connection can verify on an accepted one
//! only while both handshakes are in progress, so a nonce is kept for twice the node's
//! handshake timeout (by default 20 s), then forgotten.
//!
//! Bound: the set holds what the node itself dialed in that window — a peer that has not
//! proven the secret cannot make a node dial — and at most [`MAX_REMEMBERED`] nonces; past
//! that the oldest is forgotten first.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most dialer nonces a node remembers at once (about 4 MiB at most).
pub const MAX_REMEMBERED: usize = 65_536;

#[derive(Default, Debug)]
struct Remembered {
    order: VecDeque<(Instant, [u8; 32])>,
    set: HashSet<[u8; 32]>,
}

impl Remembered {
    fn forget_expired(&mut self, now: Instant) {
        while let Some((until, nonce)) = self.order.front().copied() {
            if until > now && self.order.len() <= MAX_REMEMBERED {
                break;
            }
            self.order.pop_front();
            self.set.remove(&nonce);
        }
    }
}

/// The nonces one node sent as a dialer within its window.
#[derive(Debug)]
pub struct DialerNonces {
    window: Duration,
    remembered: Mutex<Remembered>,
}

impl DialerNonces {
    /// The set of a node whose handshakes last at most `handshake_timeout`.
    pub fn new(handshake_timeout: Duration) -> DialerNonces {
        DialerNonces {
            window: handshake_timeout.saturating_mul(2),
            remembered: Mutex::new(Remembered::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Remembered> {
        // The set holds plain bytes; a panic elsewhere while it was locked leaves it usable.
        self.remembered.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers `nonce`, which this node is about to send in a challenge as a dialer,
    /// until `now` plus the window.
    pub fn remember(&self, nonce: [u8; 32], now: Instant) {
        let mut r = self.lock();
        if r.set.insert(nonce) {
            r.order.push_back((now + self.window, nonce));
        }
        r.forget_expired(now);
    }

    /// Whether `nonce` is one this node sent as a dialer within the window before `now`.
    pub fn sent_as_dialer(&self, nonce: &[u8], now: Instant) -> bool {
        let Ok(nonce) = <[u8; 32]>::try_from(nonce) else {
            return false;
        };
        let mut r = self.lock();
        r.forget_expired(now);
        r.set.contains(&nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialer_nonces_are_remembered_for_the_window_and_acceptor_nonces_are_not() {
        let nonces = DialerNonces::new(Duration::from_millis(50));
        let t0 = Instant::now();
        let dialer = [1u8; 32];
        let acceptor = [2u8; 32];
        nonces.remember(dialer, t0);
        assert!(nonces.sent_as_dialer(&dialer, t0));
        assert!(!nonces.sent_as_dialer(&acceptor, t0));
        assert!(!nonces.sent_as_dialer(&[0u8; 31], t0), "not a nonce at all");
        assert!(
            nonces.sent_as_dialer(&dialer, t0 + Duration::from_millis(99)),
            "kept for the window"
        );
        assert!(
            !nonces.sent_as_dialer(&dialer, t0 + Duration::from_millis(100)),
            "forgotten after twice the timeout"
        );
        // Another node's set is its own.
        let other = DialerNonces::new(Duration::from_secs(10));
        nonces.remember([3u8; 32], t0);
        assert!(!other.sent_as_dialer(&[3u8; 32], t0));
    }

    #[test]
    fn the_set_is_bounded_and_forgets_the_oldest() {
        let mut r = Remembered::default();
        let now = Instant::now();
        for i in 0..(MAX_REMEMBERED + 10) as u64 {
            let mut n = [0u8; 32];
            n[..8].copy_from_slice(&i.to_be_bytes());
            r.set.insert(n);
            r.order.push_back((now + Duration::from_secs(60), n));
            r.forget_expired(now);
        }
        assert_eq!(r.order.len(), MAX_REMEMBERED);
        assert_eq!(r.set.len(), MAX_REMEMBERED);
        assert!(!r.set.contains(&[0u8; 32]), "the oldest went first");
        r.forget_expired(now + Duration::from_secs(61));
        assert!(r.order.is_empty() && r.set.is_empty(), "and all of them once expired");
    }
}

//! The receive budget: bytes (and messages) that peers' messages occupy from the moment a
//! connection starts reading them until the application takes them with `Node::recv`.
//!
//! A connection asks for room before it reads a message's frames (and before it reads a
//! large header); while there is none it stops reading its socket until room is given back
//! (the driver learns of it from the waker it set, or from [`Budget::generation`]): the
//! peer's sends back up, and only that peer slows down. A message that does not fit is
//! admitted alone — when nothing else of that peer (for the per-peer bound), or nothing at
//! all (for the total), is buffered — so that a message up to the message limit always
//! gets through and nothing deadlocks on a single large message.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a driver runs when room is given back, to wake the connections that wait for it.
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// The node-wide side of the budget.
pub struct Budget {
    max_total: u64,
    max_per_peer: u64,
    /// What any peer may hold whatever the others hold (its guaranteed share).
    min_per_peer: u64,
    max_messages_per_peer: usize,
    used: Mutex<u64>,
    /// Times room was given back: a connection that found no room waits until it changes.
    generation: AtomicU64,
    waker: OnceLock<Waker>,
}

/// One peer's share of the budget.
#[derive(Default)]
pub struct Account {
    bytes: AtomicU64,
    messages: AtomicUsize,
    /// Of `bytes`, those of tickets taken ahead of their pull ([`Permit::try_expand_ahead`]).
    tickets: AtomicU64,
}

impl Account {
    /// Bytes this peer has buffered now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Messages this peer has buffered now.
    pub fn messages(&self) -> usize {
        self.messages.load(Ordering::Acquire)
    }

    /// Of the bytes buffered now, those of tickets redeemed on receipt (room taken ahead of
    /// their pull): the reader's bounds are raised by them while it waits for answers
    /// ([`crate::receive::room_slack`]).
    pub fn ticket_bytes(&self) -> u64 {
        self.tickets.load(Ordering::Acquire)
    }
}

/// Room taken from the budget; given back when dropped.
pub struct Permit {
    budget: Arc<Budget>,
    account: Arc<Account>,
    bytes: u64,
    messages: usize,
    /// Of `bytes`, those of tickets taken ahead of their pull.
    tickets: u64,
}

impl Budget {
    /// A budget of `max_total` bytes for all peers, `max_per_peer` bytes and
    /// `max_messages_per_peer` messages for each, of which `min_per_peer` bytes are any
    /// peer's whatever the others hold.
    pub fn new(max_total: u64, max_per_peer: u64, min_per_peer: u64, max_messages_per_peer: usize) -> Arc<Budget> {
        Arc::new(Budget {
            max_total,
            max_per_peer,
            min_per_peer: min_per_peer.min(max_per_peer),
            max_messages_per_peer: max_messages_per_peer.max(1),
            used: Mutex::new(0),
            generation: AtomicU64::new(0),
            waker: OnceLock::new(),
        })
    }

    /// Sets what runs each time room is given back (once; later calls are ignored).
    pub fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    /// How many times room was given back so far: a driver that found no room reads it
    /// before asking, and asks again once it changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Bytes buffered for all peers now.
    pub fn used(&self) -> u64 {
        *self.used.lock().expect("budget lock")
    }

    /// The bound on one peer's bytes.
    pub fn max_per_peer(&self) -> u64 {
        self.max_per_peer
    }

    /// Takes room now, or `None` if the bounds — each raised by `slack` bytes — do not
    /// allow it yet.
    pub fn try_acquire(
        self: &Arc<Self>,
        account: &Arc<Account>,
        bytes: u64,
        messages: usize,
        slack: u64,
    ) -> Option<Permit> {
        let mut used = self.used.lock().expect("budget lock");
        let peer_bytes = account.bytes.load(Ordering::Acquire);
        let peer_messages = account.messages.load(Ordering::Acquire);
        let peer_empty = peer_bytes == 0 && peer_messages == 0;
        let peer_fits = peer_bytes.saturating_add(bytes) <= self.max_per_peer.saturating_add(slack)
            && peer_messages + messages <= self.max_messages_per_peer;
        let total_fits = used.saturating_add(bytes) <= self.max_total.saturating_add(slack);
        let within_share = peer_bytes.saturating_add(bytes) <= self.min_per_peer
            && peer_messages + messages <= self.max_messages_per_peer;
        if !within_share && (!(peer_fits || peer_empty) || !(total_fits || *used == 0)) {
            return None;
        }
        *used += bytes;
        account.bytes.fetch_add(bytes, Ordering::AcqRel);
        account.messages.fetch_add(messages, Ordering::AcqRel);
        Some(Permit {
            budget: self.clone(),
            account: account.clone(),
            bytes,
            messages,
            tickets: 0,
        })
    }

    fn give_back(&self, account: &Account, bytes: u64, messages: usize) {
        {
            let mut used = self.used.lock().expect("budget lock");
            *used -= bytes;
            account.bytes.fetch_sub(bytes, Ordering::AcqRel);
            account.messages.fetch_sub(messages, Ordering::AcqRel);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(wake) = self.waker.get() {
            wake();
        }
    }
}

impl Permit {
    /// Like [`Budget::try_acquire`], for more room in this permit; counts as alone when this
    /// permit is all its peer (or the node) has buffered, so a message whose large header
    /// already holds room is never stuck behind itself.
    pub fn try_expand(&mut self, bytes: u64, messages: usize, slack: u64) -> bool {
        self.expand(bytes, messages, slack, 0)
    }

    /// Room for the tickets of this permit's message that the node redeems on receipt,
    /// taken before they are pulled (spec §9.1): `false` while the bounds do not allow it.
    /// `behind` is the room held by that peer's messages read after this one, which wait
    /// for it to keep their order: they do not count against its being alone, so a ticket
    /// up to the message limit gets through once the application has taken that peer's
    /// earlier messages.
    pub fn try_expand_ahead(&mut self, bytes: u64, behind: u64) -> bool {
        if !self.expand(bytes, 0, 0, behind) {
            return false;
        }
        self.tickets += bytes;
        self.account.tickets.fetch_add(bytes, Ordering::AcqRel);
        true
    }

    fn expand(&mut self, bytes: u64, messages: usize, slack: u64, behind: u64) -> bool {
        let budget = &self.budget;
        let mut used = budget.used.lock().expect("budget lock");
        let peer_bytes = self.account.bytes.load(Ordering::Acquire);
        let peer_messages = self.account.messages.load(Ordering::Acquire);
        let peer_alone =
            peer_bytes.saturating_sub(behind) == self.bytes && (behind > 0 || peer_messages == self.messages);
        let peer_fits = peer_bytes.saturating_add(bytes) <= budget.max_per_peer.saturating_add(slack)
            && peer_messages + messages <= budget.max_messages_per_peer;
        let total_alone = used.saturating_sub(behind) == self.bytes;
        let total_fits = used.saturating_add(bytes) <= budget.max_total.saturating_add(slack);
        let within_share = peer_bytes.saturating_add(bytes) <= budget.min_per_peer
            && peer_messages + messages <= budget.max_messages_per_peer;
        if !within_share && (!(peer_fits || peer_alone) || !(total_fits || total_alone)) {
            return false;
        }
        *used += bytes;
        self.account.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.account.messages.fetch_add(messages, Ordering::AcqRel);
        self.bytes += bytes;
        self.messages += messages;
        true
    }

    /// Bytes this permit holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.tickets > 0 {
            self.account.tickets.fetch_sub(self.tickets, Ordering::AcqRel);
        }
        self.budget.give_back(&self.account, self.bytes, self.messages);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("bytes", &self.bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_waits_for_room_and_a_large_message_goes_alone() {
        let budget = Budget::new(1000, 400, 0, 10);
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        budget.set_waker(Box::new(move || {
            w.fetch_add(1, Ordering::AcqRel);
        }));
        let a = Arc::new(Account::default());
        let b = Arc::new(Account::default());
        let first = budget.try_acquire(&a, 300, 1, 0).unwrap();
        assert!(budget.try_acquire(&a, 200, 1, 0).is_none(), "over a's share");
        let other = budget.try_acquire(&b, 400, 1, 0).expect("b has its own share");
        // A message larger than a peer's share is admitted once that peer has nothing buffered.
        assert!(budget.try_acquire(&a, 900, 1, 0).is_none());
        let seen = budget.generation();
        assert!(budget.try_acquire(&a, 500, 1, 0).is_none(), "a waits");
        drop(first);
        assert_ne!(budget.generation(), seen, "the waiting driver sees room was given back");
        assert_eq!(woken.load(Ordering::Acquire), 1, "and its waker ran");
        let big = budget
            .try_acquire(&a, 500, 1, 0)
            .expect("admitted alone once a's buffer is empty");
        assert_eq!(big.bytes(), 500);
        assert_eq!(budget.used(), 900);
        drop((big, other));
        assert_eq!(budget.used(), 0);
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn message_counts() {
        let budget = Budget::new(1 << 30, 1 << 30, 0, 2);
        let a = Arc::new(Account::default());
        let _one = budget.try_acquire(&a, 10, 1, 0).unwrap();
        let mut two = budget.try_acquire(&a, 10, 1, 0).unwrap();
        assert!(budget.try_acquire(&a, 10, 1, 0).is_none(), "two messages per peer");
        assert!(two.try_expand_ahead(1000, 0));
        assert_eq!(a.bytes(), 1020);
        drop(two);
        assert_eq!(a.bytes(), 10);
    }

    #[test]
    fn tickets_wait_for_room_and_go_alone_ahead_of_the_messages_behind_them() {
        let budget = Budget::new(1 << 30, 1000, 0, 10);
        let a = Arc::new(Account::default());
        let earlier = budget.try_acquire(&a, 100, 1, 0).unwrap();
        let mut first = budget.try_acquire(&a, 100, 1, 0).unwrap();
        let _behind = budget.try_acquire(&a, 100, 1, 0).unwrap();
        assert!(
            !first.try_expand_ahead(800, 100),
            "an earlier message not yet taken holds room"
        );
        assert!(first.try_expand_ahead(700, 100), "it fits");
        assert_eq!(a.bytes(), 1000);
        drop(first);
        // A ticket larger than the whole share waits until the earlier message is taken,
        // then goes alone ahead of the one behind it.
        let mut second = budget.try_acquire(&a, 100, 1, 0).unwrap();
        assert!(!second.try_expand_ahead(5000, 100));
        drop(earlier);
        assert!(second.try_expand_ahead(5000, 100), "alone but for what waits behind it");
        assert_eq!(a.bytes(), 5200);
    }

    #[test]
    fn a_permit_expands_alone_past_the_share() {
        let budget = Budget::new(1000, 100, 0, 10);
        let a = Arc::new(Account::default());
        let mut header = budget.try_acquire(&a, 80, 0, 0).unwrap();
        assert!(
            header.try_expand(500, 1, 0),
            "the only thing a has buffered: admitted alone"
        );
        assert_eq!(a.bytes(), 580);
        let b = Arc::new(Account::default());
        let mut other = budget.try_acquire(&b, 50, 0, 0).unwrap();
        assert!(!other.try_expand(900, 1, 0), "over the total while a holds room");
        drop(header);
        assert!(other.try_expand(900, 1, 0), "alone in the node now");
    }

    #[test]
    fn a_small_message_is_never_stuck_behind_another_peers_large_one() {
        let budget = Budget::new(100, 50, 10, 10);
        let big = Arc::new(Account::default());
        let small = Arc::new(Account::default());
        let _alone = budget.try_acquire(&big, 10_000, 1, 0).expect("admitted alone");
        assert!(
            budget.try_acquire(&small, 20, 1, 0).is_none(),
            "over its guaranteed share"
        );
        let a = budget
            .try_acquire(&small, 6, 1, 0)
            .expect("within its guaranteed share");
        let b = budget.try_acquire(&small, 4, 1, 0).expect("still within it");
        assert!(budget.try_acquire(&small, 1, 1, 0).is_none(), "the share is used up");
        drop((a, b));
    }
}

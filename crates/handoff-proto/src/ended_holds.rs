//! The holds on other nodes' buffers that ended here (their last handle dropped), each
//! owing its owner an `unlease` (spec §7.7) that a driver sends on a connection it has to
//! that owner; never by dialing, never waiting for the write, so that an owner that reads
//! nothing delays only its own. At most [`MAX_ENDED_HOLDS`] wait (§9.1): past it a hold
//! ends by its deadline at the owner instead.

use std::sync::{Mutex, MutexGuard, PoisonError};

use handoff_wire::TicketClaim;

/// Most ended holds waiting for their `unlease` (a driver that stopped taking them, say).
pub const MAX_ENDED_HOLDS: usize = 65_536;

/// Ended holds whose `unlease` the driver has yet to send.
#[derive(Default)]
pub struct EndedHolds(Mutex<Vec<TicketClaim>>);

impl EndedHolds {
    fn lock(&self) -> MutexGuard<'_, Vec<TicketClaim>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Owes `claim`'s owner its `unlease`; false (nothing kept) when [`MAX_ENDED_HOLDS`]
    /// wait already.
    pub fn push(&self, claim: &TicketClaim) -> bool {
        let mut waiting = self.lock();
        if waiting.len() >= MAX_ENDED_HOLDS {
            return false;
        }
        waiting.push(claim.clone());
        true
    }

    /// Takes every hold waiting, oldest first.
    pub fn take(&self) -> Vec<TicketClaim> {
        std::mem::take(&mut *self.lock())
    }

    /// How many wait now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(lease: u64) -> TicketClaim {
        TicketClaim {
            len: 1,
            owner: "owner".into(),
            addr: None,
            lease,
            token: vec![0; 32],
            digest: handoff_wire::TicketDigest::Xxh3([0; 16]),
            ttl_ms: 1000,
            lazy: true,
        }
    }

    #[test]
    fn at_most_so_many_wait_and_take_empties_in_order() {
        let holds = EndedHolds::default();
        for lease in 0..MAX_ENDED_HOLDS as u64 {
            assert!(holds.push(&claim(lease)));
        }
        assert!(!holds.push(&claim(u64::MAX)), "past the bound nothing is kept");
        assert_eq!(holds.len(), MAX_ENDED_HOLDS);
        let taken = holds.take();
        assert_eq!(taken.first().map(|c| c.lease), Some(0));
        assert_eq!(taken.last().map(|c| c.lease), Some(MAX_ENDED_HOLDS as u64 - 1));
        assert!(holds.is_empty());
        assert!(holds.push(&claim(7)), "room again once taken");
    }
}

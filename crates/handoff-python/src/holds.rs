//! The holds on other nodes' buffers whose last handle was dropped here, waiting for the
//! event loop to send each its `unlease` (spec §7.6). Node-level state, below both the
//! engine that keeps it and the tickets that add to it.

use std::sync::{Mutex, MutexGuard};

/// A hold that ended here: its `unlease` is owed to the owner.
pub(crate) struct EndedHold {
    pub(crate) owner: String,
    pub(crate) lease: u64,
    pub(crate) token: Vec<u8>,
}

/// Most ended holds waiting for their `unlease` (a loop that stopped taking them, say).
pub(crate) const MAX_ENDED_HOLDS: usize = 65_536;

/// Holds whose last handle was dropped, waiting for the loop to send their `unlease`.
#[derive(Default)]
pub(crate) struct EndedHolds(Mutex<Vec<EndedHold>>);

impl EndedHolds {
    /// The holds waiting, to add to (at most [`MAX_ENDED_HOLDS`]).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<EndedHold>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes every hold waiting.
    pub(crate) fn take(&self) -> Vec<EndedHold> {
        std::mem::take(&mut *self.lock())
    }
}

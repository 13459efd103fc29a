//! In-process single flight: one task per key does the work, the others wait for it and then find the result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Per-key async locks, removed when nobody holds or waits for them.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    keys: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// The turn of one task for one key.
pub(crate) struct Flight<'a> {
    flights: &'a Flights,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Flights {
    /// Waits for the turn on `key`.
    pub async fn enter(&self, key: String) -> Flight<'_> {
        let lock = self
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = lock.lock_owned().await;
        Flight {
            flights: self,
            key,
            guard: Some(guard),
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut keys = self.flights.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lock) = keys.get(&self.key) {
            // Only the map holds it: no task holds or waits for this key any more.
            if Arc::strong_count(lock) == 1 {
                keys.remove(&self.key);
            }
        }
    }
}

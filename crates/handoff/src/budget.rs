//! Waiting for room in the receive budget (`handoff_proto::budget`), the tokio way: the
//! budget's waker notifies a [`Notify`] that waiting connections listen to.

use std::ops::Deref;
use std::sync::Arc;

pub(crate) use handoff_proto::budget::{Account, Budget, Permit};
use tokio::sync::Notify;

/// The node's receive budget and what wakes the connections waiting for room in it.
pub(crate) struct RecvBudget {
    budget: Arc<Budget>,
    freed: Arc<Notify>,
}

impl RecvBudget {
    /// A budget with the bounds of [`Budget::new`].
    pub(crate) fn new(max_total: u64, max_per_peer: u64, min_per_peer: u64, max_messages_per_peer: usize) -> Self {
        let budget = Budget::new(max_total, max_per_peer, min_per_peer, max_messages_per_peer);
        let freed = Arc::new(Notify::new());
        let wake = freed.clone();
        budget.set_waker(Box::new(move || wake.notify_waiters()));
        RecvBudget { budget, freed }
    }

    /// Takes room for `bytes` and `messages` in `account`, waiting until there is some.
    /// Cancel-safe: dropping the future takes nothing.
    pub(crate) async fn acquire(&self, account: &Arc<Account>, bytes: u64, messages: usize) -> Permit {
        // Room at once (the common case) registers no waiter.
        if let Some(p) = self.budget.try_acquire(account, bytes, messages, 0) {
            return p;
        }
        let attempt = || self.budget.try_acquire(account, bytes, messages, 0);
        crate::wait::until(&self.freed, None, None, attempt)
            .await
            .expect("no deadline")
    }

    /// What wakes the connections waiting for room.
    pub(crate) fn freed(&self) -> &Notify {
        &self.freed
    }
}

impl Deref for RecvBudget {
    type Target = Arc<Budget>;

    fn deref(&self) -> &Arc<Budget> {
        &self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_connection_is_woken_when_room_is_given_back() {
        let budget = Arc::new(RecvBudget::new(1000, 400, 0, 10));
        let a = Arc::new(Account::default());
        let first = budget.acquire(&a, 300, 1).await;
        let waiting = {
            let budget = budget.clone();
            let a = a.clone();
            tokio::spawn(async move { budget.acquire(&a, 500, 1).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        drop(first);
        let big = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("admitted alone once a's buffer is empty")
            .unwrap();
        assert_eq!(big.bytes(), 500);
    }
}

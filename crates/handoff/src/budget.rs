//! Waiting for room in the receive budget (`handoff_proto::budget`), the tokio way: the
//! budget's waker notifies a [`Notify`] that waiting connections listen to.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use handoff_proto::budget::{Account, Budget, Permit};
use handoff_proto::waiting::Waiting;
use tokio::sync::Notify;

/// The node's receive budget and what wakes the connections waiting for room in it.
pub(crate) struct RecvBudget {
    budget: Arc<Budget>,
    freed: Arc<Notify>,
    /// Waits in progress: room given back wakes nobody (and takes no lock) while there are
    /// none.
    waiting: Arc<Waiting>,
}

impl RecvBudget {
    /// Waits, the tokio way, for room in `budget` (a node's, `NodeCore::budget`).
    pub(crate) fn over(budget: Arc<Budget>) -> Self {
        let freed = Arc::new(Notify::new());
        let waiting = Arc::new(Waiting::default());
        let wake = freed.clone();
        // A waiter counts itself before it tries (and so locks the budget): if this sees
        // none, the waiter's try comes after the room was given back.
        budget.set_waker(waiting.gate(move || wake.notify_waiters()));
        RecvBudget { budget, freed, waiting }
    }

    /// Takes room for `bytes` and `messages` in `account`, waiting until there is some.
    /// Cancel-safe: dropping the future takes nothing.
    pub(crate) async fn acquire(&self, account: &Arc<Account>, bytes: u64, messages: usize) -> Permit {
        // Room at once (the common case) registers no waiter.
        if let Some(p) = self.budget.try_acquire(account, bytes, messages, 0) {
            return p;
        }
        self.wait_for(None, || self.budget.try_acquire(account, bytes, messages, 0))
            .await
    }

    /// Tries `attempt` until it succeeds, again each time room is given back and, if given,
    /// every `recheck` ([`crate::wait::until`]).
    pub(crate) async fn wait_for<T>(&self, recheck: Option<Duration>, attempt: impl FnMut() -> Option<T>) -> T {
        let _counted = self.waiting.enter();
        crate::wait::until(&self.freed, None, recheck, attempt)
            .await
            .expect("no deadline")
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
        let budget = Arc::new(RecvBudget::over(Budget::new(1000, 400, 0, 10)));
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

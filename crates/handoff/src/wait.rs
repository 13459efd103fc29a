//! The driver's one way to wait for a state of the engine. The engine's tables never wait:
//! a `try_` call says "not now", and their waker (a [`Notify`] here) says when something
//! changed. This driver tries, and sleeps until the waker, a recheck interval or a deadline,
//! then tries again.

use std::time::Duration;

use handoff_proto::ticket_leases::WhenFull;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Error, Result};

/// Tries `attempt` until it gives `Some`, trying again each time `changed` is notified and,
/// if given, every `recheck` (for what changes without a notification); `None` once
/// `deadline` has passed (a deadline of now tries once). Cancel-safe when `attempt` is.
pub(crate) async fn until<T>(
    changed: &Notify,
    deadline: Option<Instant>,
    recheck: Option<Duration>,
    mut attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    loop {
        // Registered before the attempt: a change right after it still wakes us.
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(done) = attempt() {
            return Some(done);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return None;
        }
        let wake = match (deadline, recheck.map(|r| now + r)) {
            (Some(d), Some(r)) => Some(d.min(r)),
            (d, r) => d.or(r),
        };
        match wake {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, notified).await;
            }
            None => notified.await,
        }
    }
}

/// Takes a lease of `bytes` for `peer`, waiting as `when_full` says while the caps leave no
/// room: `attempt` gives the lease or says why not; the last reason goes into
/// [`Error::LeaseCap`]. A wait never ends a live lease to make room.
pub(crate) async fn for_lease<T>(
    changed: &Notify,
    when_full: WhenFull,
    peer: &str,
    bytes: u64,
    mut attempt: impl FnMut() -> std::result::Result<T, String>,
) -> Result<T> {
    let give_up = Instant::now()
        + match when_full {
            WhenFull::Wait(d) => d,
            WhenFull::Fail => Duration::ZERO,
        };
    let mut refused = String::new();
    let attempt = || attempt().map_err(|r| refused = r).ok();
    match until(changed, Some(give_up), None, attempt).await {
        Some(lease) => Ok(lease),
        None => Err(Error::LeaseCap {
            peer: peer.to_string(),
            bytes,
            reason: refused,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_the_state_changes_or_at_its_deadline() {
        let changed = Arc::new(Notify::new());
        let ready = Arc::new(AtomicUsize::new(0));
        let (c, r) = (changed.clone(), ready.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            r.store(1, Ordering::SeqCst);
            c.notify_waiters();
        });
        let start = Instant::now();
        let got = until(&changed, None, None, || {
            (ready.load(Ordering::SeqCst) == 1).then_some(7)
        })
        .await;
        assert_eq!((got, start.elapsed()), (Some(7), Duration::from_secs(5)));

        let start = Instant::now();
        let deadline = Some(start + Duration::from_secs(2));
        assert_eq!(until(&changed, deadline, None, || None::<()>).await, None);
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert_eq!(
            until(&changed, Some(Instant::now()), None, || None::<()>).await,
            None,
            "tries once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_finds_a_change_nobody_announced() {
        let changed = Notify::new();
        let tries = AtomicUsize::new(0);
        let start = Instant::now();
        let got = until(&changed, None, Some(Duration::from_millis(50)), || {
            (tries.fetch_add(1, Ordering::SeqCst) == 3).then_some(())
        })
        .await;
        assert_eq!((got, start.elapsed()), (Some(()), Duration::from_millis(150)));
    }
}

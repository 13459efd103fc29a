//! How long idle shared memory is kept before it goes back to the host: segments of the
//! pool no peer maps (`HANDOFF_SHM_POOL_IDLE_SECONDS`) and mappings no view uses
//! (`HANDOFF_SHM_KEEP_SECONDS`), 10 s each by default, and warm receive buffers (10 s), as
//! the Python implementation keeps them. Both drivers run [`IdleTimes::sweep`] from a timer,
//! and [`give_back`] when the process nears a memory limit.

use std::time::{Duration, Instant};

use super::{MappingCache, SegmentPool};
use crate::recv_buffers::RecvPool;

/// The idle times, and the sweep that applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleTimes {
    /// A pool segment idle this long is retired.
    pub pool: Duration,
    /// A mapping no view used for this long is unmapped.
    pub keep: Duration,
    /// A receive buffer idle this long is freed.
    pub recv: Duration,
}

/// The idle times when the environment does not set them.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10);

impl IdleTimes {
    /// From `HANDOFF_SHM_POOL_IDLE_SECONDS` and `HANDOFF_SHM_KEEP_SECONDS` (positive
    /// seconds that a duration can hold; anything else is the default).
    pub fn from_env() -> IdleTimes {
        let seconds = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(DEFAULT_IDLE)
        };
        IdleTimes {
            pool: seconds("HANDOFF_SHM_POOL_IDLE_SECONDS"),
            keep: seconds("HANDOFF_SHM_KEEP_SECONDS"),
            recv: DEFAULT_IDLE,
        }
    }

    /// Gives back, at `now`, what was idle long enough in `pool`, in `mappings` and in
    /// `recv`; how long until the next sweep (half the shortest idle time, so that nothing
    /// stays much past its time; at least 50 ms).
    pub fn sweep(&self, pool: &SegmentPool, mappings: &MappingCache, recv: &RecvPool, now: Instant) -> Duration {
        pool.retire_idle(now, self.pool);
        mappings.forget_idle_for(now, self.keep);
        recv.free_idle(now, self.recv);
        (self.pool.min(self.keep).min(self.recv) / 2).max(Duration::from_millis(50))
    }
}

/// What a process holds only for reuse, in bytes (each with the Python implementation's
/// name in the Dask worker metric `handoff`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldForReuse {
    /// Idle pool segments: in the host's shared memory, in no process's RSS (`pool-idle`).
    pub pool_idle: usize,
    /// Received segments kept mapped with no view using them: in this RSS (`kept-idle`).
    pub kept_idle: usize,
    /// Warm receive buffers: in this RSS (`recv-idle`).
    pub recv_idle: usize,
}

impl HeldForReuse {
    /// What `pool`, `mappings` and `recv` hold for reuse now.
    pub fn of(pool: &SegmentPool, mappings: &MappingCache, recv: &RecvPool) -> HeldForReuse {
        HeldForReuse {
            pool_idle: pool.stats().idle_bytes,
            kept_idle: mappings.idle_bytes(),
            recv_idle: recv.idle_bytes(),
        }
    }
}

/// Gives back now everything `pool`, `mappings` and `recv` hold only for reuse (the process
/// nears a memory limit: Dask would pause or restart it); what it held.
pub fn give_back(pool: &SegmentPool, mappings: &MappingCache, recv: &RecvPool) -> HeldForReuse {
    let held = HeldForReuse::of(pool, mappings, recv);
    let now = Instant::now();
    pool.retire_idle(now, Duration::ZERO);
    mappings.forget_idle();
    recv.free_idle(now, Duration::ZERO);
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_comes_again_at_half_the_shorter_idle_time() {
        let pool = SegmentPool::new(1 << 30);
        let mappings = MappingCache::new(1 << 30);
        let recv = RecvPool::new(1 << 30);
        let times = |pool_s: f64, keep_s: f64| IdleTimes {
            pool: Duration::from_secs_f64(pool_s),
            keep: Duration::from_secs_f64(keep_s),
            recv: DEFAULT_IDLE,
        };
        let now = Instant::now();
        assert_eq!(
            times(1.0, 0.2).sweep(&pool, &mappings, &recv, now),
            Duration::from_millis(100)
        );
        assert_eq!(
            times(0.01, 5.0).sweep(&pool, &mappings, &recv, now),
            Duration::from_millis(50)
        );
        // What it gives back: a segment and a receive buffer idle past their time.
        drop(pool.take(100_000).unwrap());
        drop(recv.take(1 << 20));
        assert_eq!(pool.stats().idle_segments, 1);
        assert_eq!(recv.idle_bytes(), 1 << 20);
        times(1.0, 1.0).sweep(&pool, &mappings, &recv, now + Duration::from_secs(2));
        assert_eq!(pool.stats().idle_segments, 0);
        assert_eq!(recv.idle_bytes(), 1 << 20, "a receive buffer is kept 10 s");
        times(1.0, 1.0).sweep(&pool, &mappings, &recv, now + Duration::from_secs(11));
        assert_eq!(recv.idle_bytes(), 0);
    }

    #[test]
    fn giving_back_frees_everything_idle_at_once_and_says_what_it_held() {
        let pool = SegmentPool::new(1 << 30);
        let mappings = MappingCache::new(1 << 30);
        let recv = RecvPool::new(1 << 30);
        let busy = pool.take(100_000).unwrap();
        drop(pool.take(300_000).unwrap());
        drop(recv.take(1 << 20));
        let held = give_back(&pool, &mappings, &recv);
        assert_eq!(held.pool_idle, 512 << 10);
        assert_eq!(held.recv_idle, 1 << 20);
        assert_eq!(HeldForReuse::of(&pool, &mappings, &recv), HeldForReuse::default());
        assert_eq!(pool.stats().segments, 1, "what is busy stays");
        drop(busy);
    }
}

//! How long idle shared memory is kept before it goes back to the host: segments of the
//! pool no peer maps (`HANDOFF_SHM_POOL_IDLE_SECONDS`) and mappings no view uses
//! (`HANDOFF_SHM_KEEP_SECONDS`), 10 s each by default, as the Python implementation keeps
//! them. Both drivers run [`IdleTimes::sweep`] from a timer.

use std::time::{Duration, Instant};

use super::{MappingCache, SegmentPool};

/// The idle times, and the sweep that applies them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleTimes {
    /// A pool segment idle this long is retired.
    pub pool: Duration,
    /// A mapping no view used for this long is unmapped.
    pub keep: Duration,
}

/// The idle times when the environment does not set them.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(10);

impl IdleTimes {
    /// From `HANDOFF_SHM_POOL_IDLE_SECONDS` and `HANDOFF_SHM_KEEP_SECONDS` (positive
    /// seconds; anything else is the default).
    pub fn from_env() -> IdleTimes {
        let seconds = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map_or(DEFAULT_IDLE, Duration::from_secs_f64)
        };
        IdleTimes {
            pool: seconds("HANDOFF_SHM_POOL_IDLE_SECONDS"),
            keep: seconds("HANDOFF_SHM_KEEP_SECONDS"),
        }
    }

    /// Gives back, at `now`, what was idle long enough in `pool` and in `mappings`; how
    /// long until the next sweep (half the shorter idle time, so that nothing stays much
    /// past its time; at least 50 ms).
    pub fn sweep(&self, pool: &SegmentPool, mappings: &MappingCache, now: Instant) -> Duration {
        pool.retire_idle(now, self.pool);
        mappings.forget_idle_for(now, self.keep);
        (self.pool.min(self.keep) / 2).max(Duration::from_millis(50))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_comes_again_at_half_the_shorter_idle_time() {
        let pool = SegmentPool::new(1 << 30);
        let mappings = MappingCache::new(1 << 30);
        let times = |pool_s: f64, keep_s: f64| IdleTimes {
            pool: Duration::from_secs_f64(pool_s),
            keep: Duration::from_secs_f64(keep_s),
        };
        let now = Instant::now();
        assert_eq!(times(1.0, 0.2).sweep(&pool, &mappings, now), Duration::from_millis(100));
        assert_eq!(times(0.01, 5.0).sweep(&pool, &mappings, now), Duration::from_millis(50));
        // What it gives back: a segment idle past its time.
        drop(pool.take(100_000).unwrap());
        assert_eq!(pool.stats().idle_segments, 1);
        times(1.0, 1.0).sweep(&pool, &mappings, now + Duration::from_secs(2));
        assert_eq!(pool.stats().idle_segments, 0);
    }
}

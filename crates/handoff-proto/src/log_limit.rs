//! [`LogLimiter`]: at most so many warnings per period about one source, so that a peer
//! that sends a flood of bad requests cannot flood the log (or the disk under it) as well.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Allows at most `per_period` log lines per `period`; counts the rest and says how many
/// were suppressed on the first line it allows afterwards. A limiter may have a parent
/// that every line must pass too (a node-wide one above each peer's), so that a peer that
/// opens many connections cannot multiply its share.
#[derive(Debug)]
pub struct LogLimiter {
    per_period: u32,
    period: Duration,
    state: Mutex<State>,
    parent: Option<std::sync::Arc<LogLimiter>>,
}

#[derive(Debug)]
struct State {
    window_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter that lets `per_period` lines through every `period`.
    pub fn new(per_period: u32, period: Duration) -> LogLimiter {
        LogLimiter {
            per_period,
            period,
            state: Mutex::new(State {
                window_start: None,
                logged: 0,
                suppressed: 0,
            }),
            parent: None,
        }
    }

    /// A limiter whose lines must also pass `parent`.
    pub fn under(parent: std::sync::Arc<LogLimiter>, per_period: u32, period: Duration) -> LogLimiter {
        LogLimiter {
            parent: Some(parent),
            ..LogLimiter::new(per_period, period)
        }
    }

    /// Whether to log now: `Some(n)` where `n` lines were suppressed since the last one
    /// logged (mention them), or `None` to stay quiet (the line is counted).
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut st = self.state.lock().expect("log limiter lock");
        let fresh = st.window_start.is_none_or(|s| now.duration_since(s) >= self.period);
        if fresh {
            st.window_start = Some(now);
            st.logged = 0;
        }
        if st.logged < self.per_period {
            let above = match &self.parent {
                Some(parent) => parent.allow(),
                None => Some(0),
            };
            match above {
                Some(n) => {
                    st.logged += 1;
                    Some(std::mem::take(&mut st.suppressed) + n)
                }
                None => {
                    st.suppressed += 1;
                    None
                }
            }
        } else {
            st.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_caps_all_its_children_together() {
        let node = std::sync::Arc::new(LogLimiter::new(5, Duration::from_secs(60)));
        let peers: Vec<_> = (0..10)
            .map(|_| LogLimiter::under(node.clone(), 3, Duration::from_secs(60)))
            .collect();
        let logged: usize = peers
            .iter()
            .map(|p| (0..3).filter(|_| p.allow().is_some()).count())
            .sum();
        assert_eq!(logged, 5, "ten peers of three lines each, five in all");
    }

    #[test]
    fn lets_a_few_through_then_counts() {
        let l = LogLimiter::new(3, Duration::from_millis(50));
        assert_eq!((0..10).filter(|_| l.allow().is_some()).count(), 3);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(l.allow(), Some(7), "the next period reports what it suppressed");
    }
}

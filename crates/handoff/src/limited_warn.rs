//! The `limited_warn!` macro: a warning through a node's or peer's log limiter.

/// Logs a warning through a [`LogLimiter`](crate::LogLimiter), adding how many similar ones were suppressed.
#[macro_export]
macro_rules! limited_warn {
    ($limiter:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limiter.allow() {
            if suppressed > 0 {
                tracing::warn!(suppressed, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

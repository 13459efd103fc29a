//! The one error of the arenas: a system call that failed, and what it was for.

/// Why an arena could not be made or changed: the system call and its error.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ArenaError {
    /// What was being done.
    pub what: &'static str,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

impl ArenaError {
    pub(crate) fn new(what: &'static str, source: impl Into<std::io::Error>) -> ArenaError {
        ArenaError {
            what,
            source: source.into(),
        }
    }
}

//! What the check finds: imports between files and the rings they make.

use std::path::PathBuf;

/// One import from a file to another, with the first place it happens (the witness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The file that uses.
    pub from: PathBuf,
    /// The file that defines what is used.
    pub to: PathBuf,
    /// Line in `from` of the first use found.
    pub line: usize,
    /// The path as written there, e.g. `crate::node::NodeInner`.
    pub path: String,
}

/// What the check found in one crate (one library or binary target).
#[derive(Debug)]
pub struct CrateReport {
    /// The crate's root file (`lib.rs`, `main.rs`, ...).
    pub root: PathBuf,
    /// Every source file of the crate's module tree.
    pub files: Vec<PathBuf>,
    /// Every import between two different files, one witness each.
    pub edges: Vec<Edge>,
    /// Each ring: its files, and one closed loop through them as edges.
    pub rings: Vec<Ring>,
}

/// A set of files that import each other (a strongly connected component of more than
/// one file), with one loop through them to show where to cut.
#[derive(Debug)]
pub struct Ring {
    /// Every file in the ring, sorted.
    pub files: Vec<PathBuf>,
    /// One closed loop: each edge's `to` is the next edge's `from`, and the last returns
    /// to the first.
    pub cycle: Vec<Edge>,
}

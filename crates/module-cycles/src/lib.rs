//! Finds import rings between the source files of a Rust crate.
//!
//! A ring is a set of files that use items from each other, directly (a uses b, b uses a)
//! or round a longer loop. In a ring no file can be read or changed on its own, so the
//! project keeps its crates free of them and `./scripts/test` runs this check.
//!
//! What counts as "file A uses file B": A names an item (by a `use` or by a path in code)
//! whose definition is in B. A re-export (`pub use b::Thing` in `lib.rs`) is followed to the
//! file that defines the item, so a crate root that re-exports everything is not a hub
//! that joins every file into one ring. Declaring a child (`mod b;`) is containment, not
//! use. Test-only code (`#[cfg(test)]`) is left out, as `cargo-modules` does by default.
//!
//! The check is syntactic: it reads the files with `syn` and resolves paths through the
//! module tree, the items each module defines and its `use` declarations (globs too). Names
//! that come from macros or from other crates are not followed. A path inside a macro call
//! (`format!`, `tracing::info!`) is not seen.

pub mod graph;
pub mod modtree;
pub mod report;
pub mod resolve;
pub mod workspace;

use std::path::Path;

pub use report::{CrateReport, Edge, Ring};

/// Reads the crate whose root file is `root` and finds its import rings.
pub fn check_crate(root: &Path) -> anyhow::Result<CrateReport> {
    let tree = modtree::ModuleTree::read(root)?;
    let edges = resolve::file_edges(&tree);
    let rings = graph::rings(&tree.files, &edges);
    Ok(CrateReport {
        root: root.to_path_buf(),
        files: tree.files.clone(),
        edges,
        rings,
    })
}

//! Follows each written path to the module that defines what it names, and turns that into
//! imports between files.

use std::collections::BTreeMap;

use crate::modtree::{ModuleId, ModuleTree, WrittenPath};
use crate::report::Edge;

/// How deep re-exports and globs are followed before giving up (a guard against loops of
/// globs, which Rust allows).
const MAX_DEPTH: usize = 24;

/// What a path names, as far as this check cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A module itself.
    Module(ModuleId),
    /// An item defined in this module (or something inside it: a variant, a method).
    Item(ModuleId),
}

impl Target {
    fn module(self) -> ModuleId {
        match self {
            Target::Module(m) | Target::Item(m) => m,
        }
    }
}

/// Every import between two different files of the tree, each with its first witness.
pub fn file_edges(tree: &ModuleTree) -> Vec<Edge> {
    let mut edges: BTreeMap<(usize, usize), Edge> = BTreeMap::new();
    for reference in &tree.references {
        let Some(target) = resolve(tree, reference, 0) else {
            continue;
        };
        let from = tree.modules[reference.module].file;
        let to = tree.modules[target.module()].file;
        if from == to {
            continue;
        }
        let edge = Edge {
            from: tree.files[from].clone(),
            to: tree.files[to].clone(),
            line: reference.line,
            path: reference.segments.join("::"),
        };
        edges
            .entry((from, to))
            .and_modify(|kept| {
                if edge.line < kept.line {
                    *kept = edge.clone();
                }
            })
            .or_insert(edge);
    }
    edges.into_values().collect()
}

/// The module a written path leads to, or `None` when it leaves the crate (another crate,
/// the prelude, a generic parameter, `Self`).
pub fn resolve(tree: &ModuleTree, path: &WrittenPath, depth: usize) -> Option<Target> {
    if depth > MAX_DEPTH || path.segments.is_empty() {
        return None;
    }
    let segments = &path.segments;
    let mut start = path.module;
    let mut rest = &segments[..];
    match segments[0].as_str() {
        "crate" => {
            start = 0;
            rest = &segments[1..];
        }
        "self" => rest = &segments[1..],
        "super" => {
            while let Some(first) = rest.first() {
                if first != "super" {
                    break;
                }
                start = tree.modules[start].parent?;
                rest = &rest[1..];
            }
        }
        "Self" => return None,
        _ => return lookup(tree, start, rest, true, depth),
    }
    lookup(tree, start, rest, false, depth)
}

/// Walks `segments` from module `at`. `relative` is true for the first segment of a path
/// that did not start with `crate`, `self` or `super`: a name not found in scope then
/// belongs to another crate or the prelude.
fn lookup(tree: &ModuleTree, at: ModuleId, segments: &[String], relative: bool, depth: usize) -> Option<Target> {
    let Some((first, rest)) = segments.split_first() else {
        return Some(Target::Module(at));
    };
    let module = &tree.modules[at];
    if let Some(&child) = module.children.get(first) {
        return lookup(tree, child, rest, false, depth);
    }
    if module.items.contains(first) {
        return Some(Target::Item(at));
    }
    if let Some(import) = module.imports.get(first) {
        return match resolve(tree, import, depth + 1)? {
            Target::Module(m) => lookup(tree, m, rest, false, depth + 1),
            item => Some(item),
        };
    }
    for glob in &module.globs {
        if let Some(Target::Module(m)) = resolve(tree, glob, depth + 1) {
            if let Some(found) = lookup(tree, m, segments, true, depth + 1) {
                return Some(found);
            }
        }
    }
    if relative {
        None
    } else {
        // Named inside a module of this crate but not found (made by a macro, say):
        // count it as the module's own.
        Some(Target::Item(at))
    }
}

//! Relative paths inside a tree: normalized, and refused when they escape it (`..`, absolute paths, symlinks).

use std::path::{Component, Path};

use object_store::path::Path as StorePath;

use crate::error::{Error, Result};

fn refuse(dataset: &str, path: &str, reason: impl Into<String>) -> Error {
    Error::BadPath {
        dataset: dataset.to_string(),
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Normalizes a relative path (`a/./b/../c` → `a/c`); refuses absolute paths and `..` that leaves the tree.
pub(crate) fn normalize(dataset: &str, rel: &str) -> Result<String> {
    if rel.starts_with('/') || rel.starts_with('\\') || Path::new(rel).is_absolute() {
        return Err(refuse(
            dataset,
            rel,
            "absolute paths are not allowed; give a path relative to the tree",
        ));
    }
    if rel.contains('\0') || rel.contains('\\') {
        return Err(refuse(
            dataset,
            rel,
            "NUL and backslash are not allowed in paths; separate parts with '/'",
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(refuse(dataset, rel, "'..' leaves the tree"));
                }
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// Joins a normalized `base` and a relative `rel` within a tree, normalized.
pub(crate) fn join(dataset: &str, base: &str, rel: &str) -> Result<String> {
    if base.is_empty() {
        return normalize(dataset, rel);
    }
    if rel.starts_with('/') || Path::new(rel).is_absolute() {
        return Err(refuse(
            dataset,
            rel,
            "absolute paths are not allowed; give a path relative to the tree",
        ));
    }
    // Normalize the concatenation so that `..` may climb within the dataset's tree but not out of it.
    let combined = format!("{base}/{rel}");
    normalize(dataset, &combined).map_err(|e| match e {
        Error::BadPath { reason, .. } => refuse(dataset, rel, reason),
        other => other,
    })
}

/// For datasets on the local file system (`root` is their folder; `None` for other storage), refuses a path whose
/// existing part resolves (through symlinks) outside the dataset's folder.
pub(crate) fn check_local_symlinks(dataset: &str, root: Option<&Path>, rel: &str) -> Result<()> {
    let Some(root) = root else {
        return Ok(());
    };
    let Ok(root_real) = root.canonicalize() else {
        return Ok(());
    }; // missing root: reads fail later, naming it
       // Resolve the longest existing prefix of root/rel.
    let mut probe = root.to_path_buf();
    for comp in Path::new(rel).components() {
        let Component::Normal(part) = comp else { continue };
        probe.push(part);
        let resolved = match probe.canonicalize() {
            Ok(real) => real,
            Err(_) => break,
        };
        if !resolved.starts_with(&root_real) {
            return Err(refuse(
                dataset,
                rel,
                format!(
                    "it resolves through a symlink to {}, outside the tree {}",
                    resolved.display(),
                    root.display()
                ),
            ));
        }
    }
    Ok(())
}

/// `root/rel` as an object path; `rel` is normalized (no `.`/`..`, no empty parts).
pub(crate) fn join_store_path(root: &StorePath, rel: &str) -> StorePath {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(root.clone(), |acc, part| acc.clone().join(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_and_refuses() {
        assert_eq!(normalize("d", "a/./b/../c").unwrap(), "a/c");
        assert_eq!(normalize("d", "").unwrap(), "");
        assert!(normalize("d", "../x").is_err());
        assert!(normalize("d", "a/../../x").is_err());
        assert!(normalize("d", "/etc/passwd").is_err());
        assert_eq!(join("d", "sub", "../x").unwrap(), "x");
        assert!(join("d", "sub", "../../x").is_err());
    }
}

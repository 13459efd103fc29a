//! Relative paths inside a tree: normalized, and refused when they escape it (`..`, absolute paths, symlinks).

use std::path::{Component, Path};

use object_store::path::{Path as StorePath, PathPart};

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

/// `root/rel` as the cache keys name it (spec/CACHE.md §2.3): each part of `rel` percent-encoded as
/// `object_store`'s `PathPart::from` encodes it; `rel` is normalized (no `.`/`..`, no empty parts).
pub(crate) fn join_store_path(root: &StorePath, rel: &str) -> StorePath {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(root.clone(), |acc, part| acc.join(part))
}

/// `root/rel` as a request to the store names it: each part of `rel` as it is written. An object store's key is the
/// name itself (the file `é.txt` of a tree is the object `…/é.txt`, on S3 as in a folder), as the Python peer names
/// it through obstore; only a part `object_store` cannot hold verbatim (one with an ASCII control character) is
/// percent-encoded, and so names no object.
pub(crate) fn raw_store_path(root: &StorePath, rel: &str) -> StorePath {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(root.clone(), |acc, part| match PathPart::parse(part) {
            Ok(verbatim) => acc.join(verbatim),
            Err(_) => acc.join(part),
        })
}

/// Undoes [`join_store_path`]'s encoding of one part (`%C3%A9.txt` → `é.txt`); a part that is not such an encoding
/// is returned as it is.
pub(crate) fn decode_store_part(part: &str) -> String {
    match percent_encoding::percent_decode_str(part).decode_utf8() {
        Ok(decoded) => decoded.into_owned(),
        Err(_) => part.to_string(),
    }
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

    #[test]
    fn store_paths_name_parts_verbatim_and_keys_encode_them() {
        let root = StorePath::from("tree");
        for name in ["é.txt", "x#y", "50%", "q?", "a%41", "c~d.txt", "a b/ü"] {
            assert_eq!(raw_store_path(&root, name).as_ref(), format!("tree/{name}"), "{name}");
            let key = join_store_path(&root, name);
            let decoded: Vec<String> = key.as_ref().split('/').skip(1).map(decode_store_part).collect();
            assert_eq!(decoded.join("/"), name, "{key}");
        }
        assert_eq!(join_store_path(&root, "é.txt").as_ref(), "tree/%C3%A9.txt");
        // A control character cannot be held verbatim: encoded, it names no object.
        assert_eq!(raw_store_path(&root, "a\tb").as_ref(), "tree/a%09b");
    }
}

//! Relative paths inside a tree: normalized, and refused when they escape it (`..`, absolute paths, symlinks).

use std::path::{Component, Path, PathBuf};

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

/// The file `rel` names in a local dataset whose file or folder is `root`, with the checks of a
/// `FileSystem` dataset: `rel` is empty for a single file and names a file inside a folder, and
/// may not leave the folder (`..`, an absolute path, a symlink that resolves outside it).
pub fn local_file(dataset: &str, root: &Path, rel: &str) -> Result<PathBuf> {
    let meta = std::fs::metadata(root).map_err(|e| Error::io("cannot open the dataset's", root, e))?;
    if rel.is_empty() {
        if meta.is_dir() {
            return Err(refuse(
                dataset,
                rel,
                "the dataset is a folder (BlobTree); the path names no file in it",
            ));
        }
        return Ok(root.to_path_buf());
    }
    if !meta.is_dir() {
        return Err(refuse(
            dataset,
            rel,
            "the dataset is a single file (Blob); it has no paths",
        ));
    }
    let normalized = normalize(dataset, rel)?;
    if normalized.is_empty() {
        return Err(refuse(dataset, rel, "names the tree itself, not a file in it"));
    }
    check_local_symlinks(dataset, Some(root), &normalized)?;
    Ok(root.join(normalized))
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
    fn a_local_file_stays_in_its_folder() {
        let dir = std::env::temp_dir().join(format!("handoff-local-file-{}", std::process::id()));
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("cats")).unwrap();
        std::fs::write(tree.join("cats/1.png"), b"png").unwrap();
        std::fs::write(dir.join("secret"), b"no").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), tree.join("leak")).unwrap();
        std::os::unix::fs::symlink(tree.join("cats/1.png"), tree.join("alias")).unwrap();
        assert_eq!(local_file("d", &tree, "cats/./1.png").unwrap(), tree.join("cats/1.png"));
        assert_eq!(local_file("d", &tree, "alias").unwrap(), tree.join("alias"));
        assert_eq!(local_file("d", &dir.join("secret"), "").unwrap(), dir.join("secret"));
        for bad in [
            "../secret",
            "/etc/passwd",
            "leak",
            "",
            "cats/..",
            "cats/../../secret",
            "a\\b",
        ] {
            let e = local_file("d", &tree, bad).unwrap_err();
            assert!(matches!(e, Error::BadPath { .. }), "{bad}: {e}");
        }
        assert!(matches!(
            local_file("d", &dir.join("secret"), "x"),
            Err(Error::BadPath { .. })
        ));
        assert!(matches!(
            local_file("d", &dir.join("nowhere"), ""),
            Err(Error::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
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

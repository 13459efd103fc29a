//! `BlobTree`: a lazy handle to a directory tree (a local folder or an object-store prefix).

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStore;

use crate::blob::{store_error, Blob};
use crate::cache::{blocking, Cache};
use crate::dataset::DataSet;
use crate::error::{Error, Result};
use crate::relpath;
use crate::source::Backend;

/// One entry of a tree listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TreeEntry {
    /// Path relative to the tree that was listed, `/`-separated.
    pub path: String,
    /// True for a directory (object-store prefix), false for a file (object).
    pub is_dir: bool,
    /// Size in bytes (files only).
    pub size: Option<u64>,
}

impl TreeEntry {
    /// The path as a listing shows it: a folder's with a final `/`.
    pub fn shown(&self) -> String {
        if self.is_dir {
            format!("{}/", self.path)
        } else {
            self.path.clone()
        }
    }
}

/// A lazy handle to a tree of blobs. Paths joined to it are checked: `..` that escapes, absolute paths, and (for
/// local trees) symlinks that lead outside are refused.
#[derive(Clone)]
pub struct BlobTree {
    dataset: Arc<DataSet>,
    rel: String,
    cache: Arc<Cache>,
}

impl std::fmt::Debug for BlobTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobTree")
            .field("dataset", &self.dataset.name())
            .field("path", &self.rel)
            .finish()
    }
}

impl BlobTree {
    pub(crate) fn new(dataset: Arc<DataSet>, rel: String, cache: Arc<Cache>) -> BlobTree {
        BlobTree { dataset, rel, cache }
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<DataSet> {
        &self.dataset
    }

    /// This tree's path within the dataset (empty for the dataset's root).
    pub fn path(&self) -> &str {
        &self.rel
    }

    fn resolve(&self, rel: &str) -> Result<String> {
        let joined = relpath::join(self.dataset.name(), &self.rel, rel)?;
        relpath::check_local_symlinks(self.dataset.name(), self.dataset.source().local_root(), &joined)?;
        Ok(joined)
    }

    /// A subtree (lazy; nothing is read).
    pub fn join(&self, rel: &str) -> Result<BlobTree> {
        Ok(BlobTree::new(
            self.dataset.clone(),
            self.resolve(rel)?,
            self.cache.clone(),
        ))
    }

    /// A blob in this tree (lazy; nothing is read).
    pub fn blob(&self, rel: &str) -> Result<Blob> {
        let joined = self.resolve(rel)?;
        if joined.is_empty() {
            return Err(Error::BadPath {
                dataset: self.dataset.name().to_string(),
                path: rel.to_string(),
                reason: "names the tree itself, not a file in it".into(),
            });
        }
        Ok(Blob::new(self.dataset.clone(), joined, self.cache.clone(), None))
    }

    /// What `rel` names in this tree: a file (`Blob`), a folder (`BlobTree`), or nothing (`None`). Found by
    /// listing its parent folder, so it works alike for local folders, object stores and an offline cache.
    pub async fn kind_of(&self, rel: &str) -> Result<Option<crate::kind::DataKind>> {
        use crate::kind::DataKind;
        let joined = self.resolve(rel)?;
        if joined == self.rel {
            return Ok(Some(DataKind::BlobTree));
        }
        let (parent, leaf) = joined.rsplit_once('/').unwrap_or(("", joined.as_str()));
        let parent = BlobTree::new(self.dataset.clone(), parent.to_string(), self.cache.clone());
        let entries = match parent.list().await {
            Ok(entries) => entries,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(20) => return Ok(None), // ENOTDIR
            Err(e) => return Err(e),
        };
        Ok(entries
            .iter()
            .find(|e| e.path == leaf)
            .map(|e| if e.is_dir { DataKind::BlobTree } else { DataKind::Blob }))
    }

    fn relative(&self, full: &str) -> String {
        let base = self.store_base();
        full.strip_prefix(&base)
            .unwrap_or(full)
            .trim_start_matches('/')
            .to_string()
    }

    fn store_base(&self) -> String {
        self.dataset.source().object_path(&self.rel).to_string()
    }

    /// The entries directly in this tree (files and subdirectories), sorted by path.
    pub async fn list(&self) -> Result<Vec<TreeEntry>> {
        self.entries(false).await
    }

    /// Every file below this tree, recursively, sorted by path.
    pub async fn walk(&self) -> Result<Vec<TreeEntry>> {
        self.entries(true).await
    }

    async fn entries(&self, recursive: bool) -> Result<Vec<TreeEntry>> {
        let source = self.dataset.source();
        let mut out = match &source.backend {
            Backend::Local { .. } => {
                let root = source.local_root().expect("local").to_path_buf();
                let dir = source.local_path(&self.rel).expect("local");
                let ds = self.dataset.clone();
                blocking(move || local_entries(&ds, &root, &dir, recursive)).await?
            }
            Backend::Store { store, .. } => {
                if self.cache.is_offline() {
                    self.offline_entries(recursive)
                } else {
                    self.store_entries(store, recursive).await?
                }
            }
        };
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    async fn store_entries(&self, store: &Arc<dyn ObjectStore>, recursive: bool) -> Result<Vec<TreeEntry>> {
        let prefix = self.dataset.source().object_path(&self.rel);
        let prefix_opt = (!prefix.as_ref().is_empty()).then_some(&prefix);
        let err = |e| store_error(&self.dataset, &prefix, e);
        if recursive {
            let metas: Vec<_> = store.list(prefix_opt).try_collect().await.map_err(err)?;
            Ok(metas
                .into_iter()
                .map(|m| TreeEntry {
                    path: self.relative(m.location.as_ref()),
                    is_dir: false,
                    size: Some(m.size),
                })
                .collect())
        } else {
            let res = store.list_with_delimiter(prefix_opt).await.map_err(err)?;
            let dirs = res.common_prefixes.into_iter().map(|p| TreeEntry {
                path: self.relative(p.as_ref()),
                is_dir: true,
                size: None,
            });
            let files = res.objects.into_iter().map(|m| TreeEntry {
                path: self.relative(m.location.as_ref()),
                is_dir: false,
                size: Some(m.size),
            });
            Ok(dirs.chain(files).collect())
        }
    }

    /// Offline: what the cache holds whole below this tree (its entries spell paths as keys do: decoded here).
    fn offline_entries(&self, recursive: bool) -> Vec<TreeEntry> {
        let identity = self.dataset.source().identity();
        let base = self.dataset.source().key_path(&self.rel).to_string();
        let mut seen = std::collections::BTreeMap::new();
        for (e, present) in self.cache.entries() {
            if !present || e.identity != identity {
                continue;
            }
            let rest = if base.is_empty() {
                e.path.as_str()
            } else {
                match e.path.strip_prefix(&base).and_then(|r| r.strip_prefix('/')) {
                    Some(r) => r,
                    None => continue,
                }
            };
            let rest = rest
                .split('/')
                .map(relpath::decode_store_part)
                .collect::<Vec<_>>()
                .join("/");
            match (recursive, rest.split_once('/')) {
                (false, Some((dir, _))) => {
                    seen.insert(
                        dir.to_string(),
                        TreeEntry {
                            path: dir.to_string(),
                            is_dir: true,
                            size: None,
                        },
                    );
                }
                _ => {
                    seen.insert(
                        rest.clone(),
                        TreeEntry {
                            path: rest.clone(),
                            is_dir: false,
                            size: Some(e.size),
                        },
                    );
                }
            }
        }
        seen.into_values().collect()
    }
}

/// Lists a local folder; symlinks are followed only when they stay inside the tree's root (others are skipped);
/// directory symlinks are not descended into by `walk` (no loops).
fn local_entries(
    ds: &DataSet,
    root: &std::path::Path,
    dir: &std::path::Path,
    recursive: bool,
) -> Result<Vec<TreeEntry>> {
    let root_real = root
        .canonicalize()
        .map_err(|e| Error::io("cannot open dataset folder", root, e))?;
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, prefix)) = stack.pop() {
        let rd = std::fs::read_dir(&path).map_err(|e| Error::io("cannot list dataset folder", &path, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io("cannot list dataset folder", &path, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let p = entry.path();
            let ft = entry.file_type().map_err(|e| Error::io("cannot stat", &p, e))?;
            let is_link = ft.is_symlink();
            if is_link {
                match p.canonicalize() {
                    Ok(real) if real.starts_with(&root_real) => {}
                    _ => {
                        tracing::warn!(dataset = ds.name(), path = %p.display(), "skipping a symlink that leads outside the tree");
                        continue;
                    }
                }
            }
            let meta = std::fs::metadata(&p).map_err(|e| Error::io("cannot stat", &p, e))?;
            if meta.is_dir() {
                if recursive {
                    if !is_link {
                        stack.push((p, rel));
                    }
                } else {
                    out.push(TreeEntry {
                        path: rel,
                        is_dir: true,
                        size: None,
                    });
                }
            } else {
                out.push(TreeEntry {
                    path: rel,
                    is_dir: false,
                    size: Some(meta.len()),
                });
            }
        }
    }
    Ok(out)
}

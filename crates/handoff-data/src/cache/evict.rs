//! The size cap: least recently used entries are evicted first; content pinned by a reader anywhere is skipped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::base::{bump, Cache};
use super::entry::{read_json, IndexEntry};
use super::layout::is_digest;
use super::lock;
use crate::error::{Error, Result};

/// What an eviction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Bytes of content (objects and blocks) before.
    pub before_bytes: u64,
    /// Bytes of content after.
    pub after_bytes: u64,
    /// Objects and blocks removed.
    pub evicted: u64,
    /// Objects that would have been evicted but are in use.
    pub skipped_in_use: u64,
}

enum Candidate {
    Object {
        digest: String,
        size: u64,
        entries: Vec<PathBuf>,
    },
    Block {
        path: PathBuf,
        size: u64,
    },
}

fn mtime(m: &std::fs::Metadata) -> SystemTime {
    m.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

fn files(dir: PathBuf) -> impl Iterator<Item = std::fs::DirEntry> {
    std::fs::read_dir(dir).into_iter().flatten().flatten()
}

impl Cache {
    /// Bytes of content held (objects and blocks).
    pub fn usage(&self) -> u64 {
        let mut total = 0;
        for d in files(self.layout.objects()) {
            for f in files(d.path()) {
                if is_digest(&f.file_name().to_string_lossy()) {
                    total += f.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
        for p in files(self.layout.blocks()) {
            for d in files(p.path()) {
                for f in files(d.path()) {
                    if f.file_name().to_string_lossy().parse::<u64>().is_ok() {
                        total += f.metadata().map(|m| m.len()).unwrap_or(0);
                    }
                }
            }
        }
        total
    }

    /// Applies the size cap, if there is one (skipped when another process is already evicting).
    pub(crate) fn enforce_cap(&self) {
        let Some(cap) = self.max_bytes else { return };
        match lock::try_exclusive_path(&self.layout.evict_lock()) {
            Ok(Some(_guard)) => {
                if let Err(e) = self.evict_locked(cap) {
                    tracing::warn!(error = %e, "cache eviction failed");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot lock the cache for eviction"),
        }
    }

    /// Evicts least recently used content until at most `target` bytes remain (what is in use stays), and removes
    /// temporary files left by crashed writers.
    pub fn evict_to(&self, target: u64) -> Result<GcReport> {
        let path = self.layout.evict_lock();
        let _guard = loop {
            match lock::try_exclusive_path(&path).map_err(|e| Error::io("cannot lock", &path, e))? {
                Some(g) => break g,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let now = SystemTime::now();
        for f in files(self.layout.tmp()) {
            let old = f.metadata().ok().and_then(|m| now.duration_since(mtime(&m)).ok());
            if old.is_some_and(|age| age > Duration::from_secs(3600)) {
                let _ = std::fs::remove_file(f.path());
            }
        }
        self.evict_locked(target)
    }

    fn evict_locked(&self, target: u64) -> Result<GcReport> {
        let now = SystemTime::now();
        // Objects with their size and mtime; entries pointing at them, with their last use.
        let mut objects: HashMap<String, (u64, SystemTime)> = HashMap::new();
        for d in files(self.layout.objects()) {
            for f in files(d.path()) {
                let name = f.file_name().to_string_lossy().into_owned();
                if let (true, Ok(m)) = (is_digest(&name), f.metadata()) {
                    objects.insert(name, (m.len(), mtime(&m)));
                }
            }
        }
        let mut users: HashMap<String, (SystemTime, Vec<PathBuf>)> = HashMap::new();
        for d in files(self.layout.index()) {
            for f in files(d.path()) {
                let (Some(e), Ok(m)) = (read_json::<IndexEntry>(&f.path()), f.metadata()) else {
                    continue;
                };
                let u = users.entry(e.digest).or_insert((SystemTime::UNIX_EPOCH, Vec::new()));
                u.0 = u.0.max(mtime(&m));
                u.1.push(f.path());
            }
        }
        let mut total = 0u64;
        let mut candidates: Vec<(SystemTime, Candidate)> = Vec::new();
        for (digest, (size, made)) in objects {
            total += size;
            let (used, entries) = match users.remove(&digest) {
                Some(u) => u,
                // Unreferenced content goes first, unless it was just written (its entry may be on its way).
                None if now.duration_since(made).unwrap_or_default() > Duration::from_secs(60) => {
                    (SystemTime::UNIX_EPOCH, Vec::new())
                }
                None => (made, Vec::new()),
            };
            candidates.push((used, Candidate::Object { digest, size, entries }));
        }
        for p in files(self.layout.blocks()) {
            for d in files(p.path()) {
                for f in files(d.path()) {
                    if f.file_name().to_string_lossy().parse::<u64>().is_err() {
                        continue;
                    }
                    let Ok(m) = f.metadata() else { continue };
                    total += m.len();
                    candidates.push((
                        mtime(&m),
                        Candidate::Block {
                            path: f.path(),
                            size: m.len(),
                        },
                    ));
                }
            }
        }
        let mut report = GcReport {
            before_bytes: total,
            ..Default::default()
        };
        candidates.sort_by_key(|(t, _)| *t);
        for (_, cand) in candidates {
            if total <= target {
                break;
            }
            match cand {
                Candidate::Block { path, size } => {
                    if std::fs::remove_file(&path).is_ok() {
                        total -= size;
                        report.evicted += 1;
                    }
                }
                Candidate::Object { digest, size, entries } => {
                    let path = self.layout.object(&digest);
                    let Ok(file) = std::fs::File::open(&path) else { continue };
                    match lock::try_exclusive(&file) {
                        Ok(true) => {}
                        _ => {
                            report.skipped_in_use += 1;
                            continue;
                        }
                    }
                    for e in entries {
                        let _ = std::fs::remove_file(e);
                    }
                    let _ = std::fs::remove_file(self.layout.seal(&digest));
                    if std::fs::remove_file(&path).is_ok() {
                        total -= size;
                        report.evicted += 1;
                    }
                    drop(file);
                }
            }
        }
        report.after_bytes = total;
        bump(&self.counters.evictions, report.evicted);
        if report.after_bytes > target {
            tracing::warn!(
                cache = %self.layout.dir.display(),
                bytes = report.after_bytes,
                target,
                in_use = report.skipped_in_use,
                "cache stays above its size target: the rest is in use"
            );
        }
        Ok(report)
    }
}

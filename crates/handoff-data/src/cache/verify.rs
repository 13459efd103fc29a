//! Re-hashing everything in the cache: finds content whose digest no longer matches (bit rot, stray writes).

use std::path::PathBuf;

use super::base::{bump, hash_file, Cache};
use super::layout::is_digest;
use crate::error::{Error, Result};

/// A cached file whose content does not match its digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CorruptFile {
    /// The file.
    pub file: PathBuf,
    /// The digest it should have.
    pub expected: String,
    /// The digest it has.
    pub actual: String,
    /// Whether it was removed (it will be fetched again on next use).
    pub removed: bool,
}

/// The result of [`Cache::verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Files checked (objects and blocks).
    pub checked: u64,
    /// Bytes hashed.
    pub bytes: u64,
    /// Files that failed.
    pub corrupt: Vec<CorruptFile>,
}

impl Cache {
    /// Re-hashes every object and block; corrupt ones are removed when `repair` is set.
    pub fn verify(&self, repair: bool) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let read_dir = |p: PathBuf| std::fs::read_dir(p).into_iter().flatten().flatten();
        for d in read_dir(self.layout.objects()) {
            for f in read_dir(d.path()) {
                let name = f.file_name().to_string_lossy().into_owned();
                if !is_digest(&name) {
                    continue;
                }
                let path = f.path();
                let file = std::fs::File::open(&path).map_err(|e| Error::io("cannot open cache file", &path, e))?;
                let actual = hash_file(&file).map_err(|e| Error::io("cannot read cache file", &path, e))?;
                report.checked += 1;
                report.bytes += file.metadata().map(|m| m.len()).unwrap_or(0);
                if actual != name {
                    let removed = repair && std::fs::remove_file(&path).is_ok();
                    if removed {
                        let _ = std::fs::remove_file(self.layout.seal(&name));
                    }
                    bump(&self.counters.corrupt, 1);
                    report.corrupt.push(CorruptFile {
                        file: path,
                        expected: name,
                        actual,
                        removed,
                    });
                }
            }
        }
        for p in read_dir(self.layout.blocks()) {
            for d in read_dir(p.path()) {
                for f in read_dir(d.path()) {
                    if f.file_name().to_string_lossy().parse::<u64>().is_err() {
                        continue;
                    }
                    let path = f.path();
                    let data = std::fs::read(&path).map_err(|e| Error::io("cannot read cache block", &path, e))?;
                    report.checked += 1;
                    report.bytes += data.len() as u64;
                    let (expected, actual) = if data.len() >= 32 {
                        (hex::encode(&data[..32]), blake3::hash(&data[32..]).to_hex().to_string())
                    } else {
                        ("(a 32-byte digest header)".to_string(), "(file too short)".to_string())
                    };
                    if expected != actual {
                        let removed = repair && std::fs::remove_file(&path).is_ok();
                        bump(&self.counters.corrupt, 1);
                        report.corrupt.push(CorruptFile {
                            file: path,
                            expected,
                            actual,
                            removed,
                        });
                    }
                }
            }
        }
        Ok(report)
    }
}

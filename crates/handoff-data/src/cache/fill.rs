//! Downloading a whole object into the cache: streamed to a temporary file while a blocking thread hashes and
//! writes it, then renamed under its digest, sealed, and indexed.

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::GetOptions;

use super::base::{blocking, bump, Cache, Request};
use super::entry::{IndexEntry, Seal};
use super::layout::write_atomic;
use super::layout::ObjectKey;
use crate::error::{Error, Result};

/// Storage answered with another number of bytes than asked for or announced.
pub(crate) fn wrong_length(req: &Request<'_>, identity: &str, message: String) -> Error {
    storage_error(
        req,
        identity,
        object_store::Error::Generic {
            store: "handoff-data",
            source: message.into(),
        },
    )
}

pub(crate) fn storage_error(req: &Request<'_>, identity: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::NotFound { .. } => Error::NotFound {
            dataset: req.dataset.to_string(),
            path: req.location.to_string(),
            store: identity.to_string(),
        },
        source => Error::Storage {
            dataset: req.dataset.to_string(),
            path: req.location.to_string(),
            store: identity.to_string(),
            source: Box::new(source),
        },
    }
}

impl Cache {
    /// Downloads the object (one GET), returning its digest and, if `collect`, its bytes.
    pub(super) async fn fill(self: &Arc<Self>, req: &Request<'_>, collect: bool) -> Result<(String, Option<Bytes>)> {
        bump(&self.counters.misses, 1);
        bump(&self.counters.gets, 1);
        let opts = GetOptions {
            if_match: req.meta.etag.clone(),
            version: req.meta.version_id.clone(),
            ..Default::default()
        };
        let identity = req.key.identity.as_str();
        let res = req
            .store
            .get_opts(req.location, opts)
            .await
            .map_err(|e| storage_error(req, identity, e))?;
        self.fill_from(res, req, collect).await
    }

    /// Stores the body of a GET response (already counted) under its digest.
    pub(super) async fn fill_from(
        self: &Arc<Self>,
        res: object_store::GetResult,
        req: &Request<'_>,
        collect: bool,
    ) -> Result<(String, Option<Bytes>)> {
        let identity = req.key.identity.as_str();
        let tmp = self.layout.tmp_file("object");
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(32);
        let tmp_w = tmp.clone();
        let expected_size = req.meta.size;
        let writer = tokio::task::spawn_blocking(move || -> io::Result<(blake3::Hash, u64)> {
            let mut file = std::fs::File::create(&tmp_w)?;
            // Reserving the blocks up front makes the writes cheaper (and fails early when the disk is full).
            if expected_size > 0 {
                let _ = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, expected_size);
            }
            let mut hasher = blake3::Hasher::new();
            let mut n = 0u64;
            while let Some(chunk) = rx.blocking_recv() {
                hasher.update(&chunk);
                file.write_all(&chunk)?;
                n += chunk.len() as u64;
            }
            Ok((hasher.finalize(), n))
        });
        let mut collected = collect.then(|| BytesMut::with_capacity(req.meta.size as usize));
        let mut stream = res.into_stream();
        let mut received = 0u64;
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    received += chunk.len() as u64;
                    bump(&self.counters.bytes_fetched, chunk.len() as u64);
                    if let Some(p) = req.progress {
                        p(received);
                    }
                    if let Some(buf) = collected.as_mut() {
                        buf.extend_from_slice(&chunk);
                    }
                    if tx.send(chunk).await.is_err() {
                        break; // the writer failed; its error is reported below
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let written = writer.await.map_err(io::Error::other).and_then(|r| r);
        let cleanup = |tmp: &PathBuf| {
            let _ = std::fs::remove_file(tmp);
        };
        if let Some(e) = failed {
            cleanup(&tmp);
            return Err(storage_error(req, identity, e));
        }
        let (hash, n) = match written {
            Ok(v) => v,
            Err(e) => {
                cleanup(&tmp);
                return Err(Error::io("cannot write cache file", &tmp, e));
            }
        };
        let digest = hash.to_hex().to_string();
        if n != req.meta.size {
            cleanup(&tmp);
            return Err(wrong_length(
                req,
                identity,
                format!(
                    "received {n} bytes but the object has {} (changed while reading?)",
                    req.meta.size
                ),
            ));
        }
        if let Some(expected) = req.expected_digest {
            if expected != digest {
                cleanup(&tmp);
                return Err(Error::DigestMismatch {
                    dataset: req.dataset.to_string(),
                    path: req.location.to_string(),
                    expected: expected.to_string(),
                    actual: digest,
                    context: "storage now holds different content than the sender's tag describes".into(),
                });
            }
        }
        let entry = IndexEntry {
            identity: req.key.identity.clone(),
            path: req.key.path.clone(),
            version: req.key.version.clone(),
            size: n,
            digest: digest.clone(),
        };
        let (me, key, d) = (self.clone(), req.key.clone(), digest.clone());
        blocking(move || me.install(&tmp, &d, &key, &entry)).await?;
        Ok((digest, collected.map(BytesMut::freeze)))
    }

    /// Moves a complete, hashed temporary file under its digest, seals it, writes the index entry and drops other
    /// versions of the same object.
    fn install(&self, tmp: &PathBuf, digest: &str, key: &ObjectKey, entry: &IndexEntry) -> Result<()> {
        let dest = self.layout.object(digest);
        let io_err = |e| Error::io("cannot install cache file", &dest, e);
        if self.open_digest(digest).map_err(io_err)?.is_some() {
            let _ = std::fs::remove_file(tmp); // same content already cached (under another key)
        } else {
            std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o444)).map_err(io_err)?;
            std::fs::create_dir_all(dest.parent().expect("object paths have a parent")).map_err(io_err)?;
            std::fs::rename(tmp, &dest).map_err(io_err)?;
            let seal = Seal::of(&std::fs::metadata(&dest).map_err(io_err)?);
            write_atomic(
                &self.layout,
                &self.layout.seal(digest),
                &serde_json::to_vec(&seal).expect("seal serializes"),
            )
            .map_err(io_err)?;
        }
        let entry_path = self.layout.entry(key);
        write_atomic(
            &self.layout,
            &entry_path,
            &serde_json::to_vec(entry).expect("entry serializes"),
        )
        .map_err(|e| Error::io("cannot write cache index entry", &entry_path, e))?;
        // Other versions of this object are stale now; so are blocks of this version (the whole object is here).
        let mine = entry_path.file_name().map(|n| n.to_os_string());
        for old in std::fs::read_dir(self.layout.entry_dir(key))
            .into_iter()
            .flatten()
            .flatten()
        {
            if Some(old.file_name()) != mine {
                let _ = std::fs::remove_file(old.path());
            }
        }
        let _ = std::fs::remove_dir_all(self.layout.block_parent(key));
        Ok(())
    }
}

//! Range reads: served from the whole object when it is cached, else from fixed-size blocks, fetching only the
//! blocks the range touches (each once, however many readers ask).

use std::io::{self, Read};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::GetOptions;

use super::base::{blocking, bump, Cache, Request};
use super::entry::{read_json, BlockMeta};
use super::fill::{storage_error, wrong_length};
use super::layout::write_atomic;
use super::lock;
use crate::error::{Error, Result};

/// How many blocks of one read are fetched at once.
const PARALLEL_BLOCKS: usize = 4;

impl Cache {
    /// Reads `range` (already checked against the size) of an object.
    pub(crate) async fn read_range(self: &Arc<Self>, req: &Request<'_>, range: Range<u64>) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let (me, key, r) = (self.clone(), req.key.clone(), range.clone());
        let whole = blocking(move || -> io::Result<Option<Vec<u8>>> {
            match me.hit_counted(&key)? {
                Some(f) => Ok(Some(f.read_at(r.start, (r.end - r.start) as usize)?)),
                None => Ok(None),
            }
        })
        .await
        .map_err(|e| Error::io("cannot read cache entry", self.layout.entry(&req.key), e))?;
        if let Some(data) = whole {
            return Ok(Bytes::from(data));
        }
        let bs = self.block_size;
        let first = range.start / bs;
        let last = (range.end - 1) / bs;
        let blocks: Vec<Bytes> = futures::stream::iter(first..=last)
            .map(|i| self.block(req, i))
            .buffered(PARALLEL_BLOCKS)
            .try_collect()
            .await?;
        if blocks.len() == 1 {
            let off = first * bs;
            return Ok(blocks[0].slice((range.start - off) as usize..(range.end - off) as usize));
        }
        let mut out = BytesMut::with_capacity((range.end - range.start) as usize);
        for (i, block) in (first..=last).zip(blocks) {
            let off = i * bs;
            let from = range.start.max(off) - off;
            let to = range.end.min(off + block.len() as u64) - off;
            out.extend_from_slice(&block[from as usize..to as usize]);
        }
        Ok(out.freeze())
    }

    /// One block: cached, or fetched with one ranged GET.
    async fn block(self: &Arc<Self>, req: &Request<'_>, index: u64) -> Result<Bytes> {
        let path = self.layout.block(&req.key, self.block_size, index);
        let io_err = |e| Error::io("cannot read cache block", path.clone(), e);
        let (me, p) = (self.clone(), path.clone());
        if let Some(b) = blocking(move || me.read_block(&p)).await.map_err(io_err)? {
            bump(&self.counters.hits, 1);
            return Ok(b);
        }
        let start = index * self.block_size;
        let end = (start + self.block_size).min(req.meta.size);
        if self.is_offline() {
            return Err(self.offline_error(req.dataset, req.rel, format!("block {index} (bytes {start}..{end})")));
        }
        let lock_path = self.layout.block_lock(&req.key, index);
        let _flight = self.flights.enter(lock_path.display().to_string()).await;
        let _lock = lock::exclusive(lock_path.clone())
            .await
            .map_err(|e| Error::io("cannot lock", &lock_path, e))?;
        let (me, p) = (self.clone(), path.clone());
        if let Some(b) = blocking(move || me.read_block(&p)).await.map_err(io_err)? {
            bump(&self.counters.hits, 1);
            return Ok(b);
        }
        bump(&self.counters.misses, 1);
        bump(&self.counters.gets, 1);
        let identity = req.key.identity.as_str();
        let opts = GetOptions {
            range: Some((start..end).into()),
            if_match: req.meta.etag.clone(),
            version: req.meta.version_id.clone(),
            ..Default::default()
        };
        let res = req
            .store
            .get_opts(req.location, opts)
            .await
            .map_err(|e| storage_error(req, identity, e))?;
        let data = res.bytes().await.map_err(|e| storage_error(req, identity, e))?;
        bump(&self.counters.bytes_fetched, data.len() as u64);
        if data.len() as u64 != end - start {
            return Err(wrong_length(
                req,
                identity,
                format!("asked for bytes {start}..{end}, received {} bytes", data.len()),
            ));
        }
        let meta = BlockMeta {
            identity: req.key.identity.clone(),
            path: req.key.path.clone(),
            version: req.key.version.clone(),
            size: req.meta.size,
            block_size: self.block_size,
        };
        let (me, d) = (self.clone(), data.clone());
        blocking(move || me.write_block(&path, &d, &meta))
            .await
            .map_err(|e| Error::io("cannot write cache block", self.layout.blocks(), e))?;
        let me = self.clone();
        blocking(move || me.enforce_cap()).await;
        Ok(data)
    }

    /// Reads and checks a block file (32-byte BLAKE3 digest, then the data); drops it if corrupt.
    fn read_block(&self, path: &std::path::Path) -> io::Result<Option<Bytes>> {
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut buf = Vec::with_capacity(file.metadata()?.len() as usize);
        file.read_to_end(&mut buf)?;
        if buf.len() >= 32 && blake3::hash(&buf[32..]).as_bytes()[..] == buf[..32] {
            let _ = file.set_modified(std::time::SystemTime::now());
            return Ok(Some(Bytes::from(buf).slice(32..)));
        }
        tracing::warn!(file = %path.display(), "corrupt cache block: dropping it");
        bump(&self.counters.corrupt, 1);
        let _ = std::fs::remove_file(path);
        Ok(None)
    }

    fn write_block(&self, path: &std::path::Path, data: &[u8], meta: &BlockMeta) -> io::Result<()> {
        let dir = path.parent().expect("block paths have a parent");
        std::fs::create_dir_all(dir)?;
        let meta_path = dir.join("meta.json");
        if read_json::<BlockMeta>(&meta_path).is_none() {
            write_atomic(
                &self.layout,
                &meta_path,
                &serde_json::to_vec(meta).expect("block meta serializes"),
            )?;
        }
        let mut content = Vec::with_capacity(32 + data.len());
        content.extend_from_slice(blake3::hash(data).as_bytes());
        content.extend_from_slice(data);
        write_atomic(&self.layout, path, &content)
    }
}

//! Data handles on the wire: a `Blob` travels as a tag the receiver binds to its own
//! catalog and cache, with the sender's bytes as an on-demand ticket to fall back on.
//!
//! The wire form (a msgpack map, `spec/WIRE.md` §8.5):
//!
//! | key | value |
//! |---|---|
//! | `catalog` | resource key (ext 2) `dataset:<uuid>`: the receiver's catalog that holds the dataset |
//! | `tag` | the [`BlobTag`]: dataset uuid and name, path, size, digest and version if known |
//! | `fallback` | optional frame reference: the sender's bytes, sent as a `lazy` ticket |
//!
//! Where the handle goes decides what happens on first use:
//! - **another host**: the receiver's catalog opens the dataset and its cache fetches the
//!   object from storage itself ([`Origin::Storage`]), never from the sender;
//! - **the same host, sharing the cache directory**: the receiver finds the content the
//!   sender cached under the tag's digest ([`Origin::CacheByDigest`]): no second download;
//! - **a receiver that cannot reach the storage** (the dataset is not in its catalog, or its
//!   driver fails): it pulls the bytes from the sender through the ticket
//!   ([`Origin::Sender`], the "RemoteBlob" fallback), and [`BlobHandle::fallback_reason`]
//!   says why.
//!
//! The sender includes a fallback only when it has the bytes locally at send time (a
//! FileSystem dataset, or a cached object whose digest it knows: read or
//! [`fetch`](Blob::fetch) it first) and the receiver takes tickets.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use handoff::tickets::{on_demand, Ticket};
use handoff::wire::resource::{AnyResource, Resolver};
use handoff::wire::ResourceKey;
use handoff::{Buffer, Locality, Resources, Route};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::blob::{Blob, Origin};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::tag::BlobTag;

/// The resource key under which a receiver's catalog answers for a dataset.
pub fn dataset_key(uuid: &str) -> String {
    format!("dataset:{}", uuid.to_ascii_lowercase())
}

/// Answers `dataset:<uuid>` keys with the catalog that holds the dataset.
struct CatalogResolver {
    catalog: Arc<Catalog>,
}

impl Resolver for CatalogResolver {
    fn resolve(&self, key: &str) -> Option<std::result::Result<AnyResource, String>> {
        let uuid = key.strip_prefix("dataset:")?;
        self.catalog
            .datasets()
            .iter()
            .any(|d| d.uuid() == uuid && d.invalid_name().is_none())
            .then(|| Ok(self.catalog.clone() as AnyResource))
    }

    fn keys(&self) -> Vec<String> {
        self.catalog
            .datasets()
            .iter()
            .filter(|d| d.invalid_name().is_none())
            .map(|d| dataset_key(d.uuid()))
            .collect()
    }
}

impl Catalog {
    /// Makes this catalog answer for its datasets in a node's resources, so data handles
    /// the node receives bind to this catalog and its cache (`node.resources()`).
    pub fn serve(self: &Arc<Self>, resources: &Resources) {
        resources.add_resolver(Arc::new(CatalogResolver { catalog: self.clone() }));
    }
}

#[derive(Serialize)]
struct WireOut<'a> {
    catalog: ResourceKey,
    tag: &'a BlobTag,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<Buffer>,
}

#[derive(Deserialize)]
struct WireIn {
    catalog: ResourceKey,
    tag: BlobTag,
    #[serde(default)]
    fallback: Option<Buffer>,
}

impl Blob {
    /// The bytes to offer as a fallback on this route: only when they are local now and the
    /// receiver is another process that takes tickets.
    fn fallback_for(&self, route: Option<&Route>) -> Option<Buffer> {
        let route = route?;
        if route.locality == Locality::SameProcess || !route.to.has_capability("ticket") {
            return None;
        }
        let (bytes, digest) = self.local_bytes_now()?;
        Some(on_demand(Buffer::from(bytes), digest))
    }

    fn wire_key(&self) -> ResourceKey {
        ResourceKey(dataset_key(self.dataset().uuid()))
    }
}

/// A `Blob` travels as its tag (plus the sender's bytes as an on-demand fallback when it
/// has them); see the [module docs](self).
impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let tag = self.tag();
        WireOut {
            catalog: self.wire_key(),
            tag: &tag,
            fallback: self.fallback_for(Route::current().as_deref()),
        }
        .serialize(serializer)
    }
}

/// Receiving a `Blob` binds it to this node's catalog; a node that lacks the dataset fails
/// with an error naming it. Receive a [`BlobHandle`] instead to fall back on the sender.
impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Blob, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        let catalog = Resources::bind::<Catalog>(&wire.catalog.0).map_err(D::Error::custom)?;
        catalog.open_tag(&wire.tag).map_err(D::Error::custom)
    }
}

/// A received data handle: bound to this node's catalog when it has the dataset, with the
/// sender's bytes to fall back on when it does not or its storage fails.
///
/// Send a [`Blob`] (or a `BlobHandle`); receive a `BlobHandle`. Reads go to this node's
/// cache and storage first; [`last_origin`](Self::last_origin) says which path the bytes
/// took.
#[derive(Clone)]
pub struct BlobHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    tag: BlobTag,
    local: Option<Blob>,
    fallback: Mutex<Option<Ticket>>,
    /// Why the bytes came (or will come) from the sender, once they did.
    reason: Mutex<Option<String>>,
    origin: Mutex<Option<Origin>>,
}

impl std::fmt::Debug for BlobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobHandle")
            .field(
                "dataset",
                &self.inner.tag.name.as_deref().unwrap_or(&self.inner.tag.dataset),
            )
            .field("path", &self.inner.tag.path)
            .field("local", &self.inner.local.is_some())
            .field("fallback", &self.has_fallback())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl From<Blob> for BlobHandle {
    fn from(blob: Blob) -> BlobHandle {
        BlobHandle::new(blob.tag(), Some(blob), None, None)
    }
}

impl BlobHandle {
    fn new(tag: BlobTag, local: Option<Blob>, fallback: Option<Ticket>, reason: Option<String>) -> BlobHandle {
        BlobHandle {
            inner: Arc::new(HandleInner {
                tag,
                local,
                fallback: Mutex::new(fallback),
                reason: Mutex::new(reason),
                origin: Mutex::new(None),
            }),
        }
    }

    /// What the sender said about the blob.
    pub fn tag(&self) -> &BlobTag {
        &self.inner.tag
    }

    /// The handle bound to this node's catalog, if this node has the dataset.
    pub fn blob(&self) -> Option<&Blob> {
        self.inner.local.as_ref()
    }

    /// Whether the sender's bytes can still be pulled (a fallback ticket is held).
    pub fn has_fallback(&self) -> bool {
        lock(&self.inner.fallback).is_some()
    }

    /// Why the bytes come from the sender rather than this node's storage, if they do.
    pub fn fallback_reason(&self) -> Option<String> {
        lock(&self.inner.reason).clone()
    }

    /// Where the bytes came from on the last whole read.
    pub fn last_origin(&self) -> Option<Origin> {
        (*lock(&self.inner.origin)).or_else(|| self.blob().and_then(Blob::last_origin))
    }

    fn display(&self) -> String {
        let t = &self.inner.tag;
        let name = t.name.clone().unwrap_or_else(|| t.dataset.clone());
        if t.path.is_empty() {
            name
        } else {
            format!("{name}/{}", t.path)
        }
    }

    /// The fallback ticket, noting `reason` as why it is used; an error naming `cause` if
    /// there is none.
    fn fallback(&self, cause: Option<Error>) -> Result<Ticket> {
        let ticket = lock(&self.inner.fallback).clone();
        match ticket {
            Some(t) => {
                if let Some(cause) = cause {
                    *lock(&self.inner.reason) = Some(format!("this node's storage failed: {cause}"));
                }
                Ok(t)
            }
            None => Err(cause.unwrap_or_else(|| Error::Unbound {
                what: self.display(),
                reason: self.fallback_reason().unwrap_or_default(),
            })),
        }
    }

    /// After a whole read from this node's own storage or cache, the fallback is not needed:
    /// drop it, so the sender can free its lease.
    fn local_read_ok(&self) {
        *lock(&self.inner.origin) = None;
        lock(&self.inner.fallback).take();
    }

    fn mark_pulled_from_sender(&self) {
        *lock(&self.inner.origin) = Some(Origin::Sender);
    }

    /// The object's size in bytes.
    pub async fn size(&self) -> Result<u64> {
        if let Some(blob) = self.blob() {
            match blob.size().await {
                Ok(n) => return Ok(n),
                Err(e) if self.has_fallback() => return Ok(self.fallback(Some(e))?.len()),
                Err(e) => return Err(e),
            }
        }
        Ok(self.fallback(None)?.len())
    }

    /// Reads the whole object: from this node's cache or storage, else from the sender.
    pub async fn read_all(&self) -> Result<Bytes> {
        self.whole(false).await
    }

    /// The whole object as `Bytes` without a copy where possible (a map of the cached file,
    /// or the bytes pulled from the sender).
    pub async fn buffer(&self) -> Result<Bytes> {
        self.whole(true).await
    }

    async fn whole(&self, mapped: bool) -> Result<Bytes> {
        let cause = match self.blob() {
            Some(blob) => {
                let read = if mapped {
                    blob.buffer().await
                } else {
                    blob.read_all().await
                };
                match read {
                    Ok(bytes) => {
                        self.local_read_ok();
                        return Ok(bytes);
                    }
                    Err(e) => Some(e),
                }
            }
            None => None,
        };
        let ticket = self.fallback(cause)?;
        let bytes = ticket.redeem().await.map_err(|e| self.pull_error(e))?;
        self.mark_pulled_from_sender();
        Ok(bytes.into_bytes())
    }

    /// Reads `range`: from this node's cache or storage (only the blocks it touches), else
    /// only that range from the sender.
    pub async fn read_range(&self, range: Range<u64>) -> Result<Bytes> {
        let cause = match self.blob() {
            Some(blob) => match blob.read_range(range.clone()).await {
                Ok(bytes) => return Ok(bytes),
                Err(e @ Error::Range { .. }) => return Err(e),
                Err(e) => Some(e),
            },
            None => None,
        };
        let ticket = self.fallback(cause)?;
        if range.start > range.end || range.end > ticket.len() {
            return Err(Error::Range {
                dataset: self
                    .inner
                    .tag
                    .name
                    .clone()
                    .unwrap_or_else(|| self.inner.tag.dataset.clone()),
                path: self.inner.tag.path.clone(),
                start: range.start,
                end: range.end,
                size: ticket.len(),
            });
        }
        let bytes = ticket.read(range).await.map_err(|e| self.pull_error(e))?;
        *lock(&self.inner.origin) = Some(Origin::Sender);
        Ok(bytes)
    }

    fn pull_error(&self, e: handoff::Error) -> Error {
        Error::Fallback {
            what: self.display(),
            reason: self.fallback_reason().unwrap_or_default(),
            source: Box::new(e),
        }
    }
}

impl Serialize for BlobHandle {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self.blob() {
            Some(blob) => blob.serialize(serializer),
            // Not bound here: pass the tag on; the sender's ticket is forwarded with it.
            None => WireOut {
                catalog: ResourceKey(dataset_key(&self.inner.tag.dataset)),
                tag: &self.inner.tag,
                fallback: lock(&self.inner.fallback).as_ref().map(Ticket::placeholder),
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for BlobHandle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<BlobHandle, D::Error> {
        let wire = WireIn::deserialize(deserializer)?;
        let fallback = wire.fallback.as_ref().and_then(Ticket::of);
        let key = &wire.catalog.0;
        let bound = match Resources::current() {
            Some(resources) => resources
                .get::<Catalog>(key)
                .map_err(|e| e.to_string())
                .and_then(|c| c.open_tag(&wire.tag).map_err(|e| e.to_string())),
            None => Err(format!("no resources to bind {key:?} (decoded outside a node)")),
        };
        match (bound, fallback) {
            (Ok(blob), fallback) => Ok(BlobHandle::new(wire.tag, Some(blob), fallback, None)),
            (Err(why), Some(ticket)) => Ok(BlobHandle::new(
                wire.tag,
                None,
                Some(ticket),
                Some(format!("this node cannot open the dataset: {why}")),
            )),
            (Err(why), None) => {
                // An unbound key with nothing to fall back on is `unknown-resource`, as for a
                // strict `Blob`: binding again records the failure for the codec.
                let _ = Resources::bind::<Catalog>(key);
                Err(D::Error::custom(format!(
                    "{why}; and the sender sent no fallback (it had not fetched the object, or this node takes no tickets)"
                )))
            }
        }
    }
}

//! [`Buffer`]: immutable bytes that travel out of band.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, RangeBounds};
use std::sync::Arc;

use bytes::Bytes;

/// Immutable, cheaply cloned bytes that travel beside a message, never inside its body.
///
/// Inside a value encoded by handoff's codec a `Buffer` becomes a frame of the
/// message and the body holds only a reference to it; on receipt it is a
/// zero-copy view of the received bytes. Outside the codec (plain `serde_json`,
/// say) it serializes as ordinary bytes, so it never panics.
///
/// A buffer may remember its *origin*: the shared-memory segment (or other side
/// channel resource) its bytes live in, so a channel that can pass that resource
/// (the same-host `shm` channel) sends a handle to it instead of the bytes, and a
/// received view can be forwarded on without a copy. Equality, ordering and hashing
/// look at the bytes only.
///
/// A buffer may also carry its BLAKE3 digest, when whoever made it computed that already
/// ([`Buffer::with_digest`]): a node that sends it as a ticket then does not hash it again.
#[derive(Clone, Default)]
pub struct Buffer {
    bytes: Bytes,
    origin: Option<Origin>,
    digest: Option<Arc<[u8; 32]>>,
}

/// Where a buffer's bytes live, for channels that can hand the resource itself on
/// (set by the runtime; opaque here).
pub type Origin = Arc<dyn Any + Send + Sync>;

impl Buffer {
    /// An empty buffer.
    pub const fn new() -> Buffer {
        Buffer {
            bytes: Bytes::new(),
            origin: None,
            digest: None,
        }
    }

    /// A buffer over static bytes (no allocation, no copy).
    pub const fn from_static(bytes: &'static [u8]) -> Buffer {
        Buffer {
            bytes: Bytes::from_static(bytes),
            origin: None,
            digest: None,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_from_slice(data: &[u8]) -> Buffer {
        Buffer::from(Bytes::copy_from_slice(data))
    }

    /// A buffer over `bytes` that lives in `origin` (a shared-memory segment, say).
    pub fn with_origin(bytes: Bytes, origin: Origin) -> Buffer {
        Buffer {
            bytes,
            origin: Some(origin),
            digest: None,
        }
    }

    /// The same buffer, carrying `digest` as the BLAKE3 hash (32-byte output) of its bytes.
    ///
    /// For a producer that hashed the bytes anyway (a content-addressed store, a payload that
    /// carries its own digest): a node that sends the buffer as a ticket puts this digest in
    /// the ticket instead of hashing the bytes again. The caller vouches for it: a wrong digest
    /// makes every redemption of such a ticket fail its check. A [`slice`](Buffer::slice) of
    /// the buffer does not carry it.
    pub fn with_digest(mut self, digest: [u8; 32]) -> Buffer {
        self.digest = Some(Arc::new(digest));
        self
    }

    /// The digest given with [`with_digest`](Buffer::with_digest), if any.
    pub fn known_digest(&self) -> Option<[u8; 32]> {
        self.digest.as_deref().copied()
    }

    /// The resource the bytes live in, if the runtime recorded one.
    pub fn origin(&self) -> Option<&Origin> {
        self.origin.as_ref()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A zero-copy view of part of the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Buffer {
        Buffer {
            bytes: self.bytes.slice(range),
            origin: self.origin.clone(),
            digest: None,
        }
    }

    /// The bytes, as a cheap `Bytes` handle on the same memory.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Converts into `Bytes` without copying.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl From<Bytes> for Buffer {
    fn from(bytes: Bytes) -> Buffer {
        Buffer {
            bytes,
            origin: None,
            digest: None,
        }
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Buffer {
        Buffer::from(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Buffer {
    fn from(s: &'static [u8]) -> Buffer {
        Buffer::from_static(s)
    }
}

impl From<Buffer> for Bytes {
    fn from(b: Buffer) -> Bytes {
        b.bytes
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} bytes)", self.bytes.len())
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Buffer) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Buffer {}

impl PartialOrd for Buffer {
    fn partial_cmp(&self, other: &Buffer) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Buffer {
    fn cmp(&self, other: &Buffer) -> std::cmp::Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

impl Hash for Buffer {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes.hash(state)
    }
}

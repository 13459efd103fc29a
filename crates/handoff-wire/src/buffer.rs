//! [`Buffer`]: immutable bytes that travel out of band.

use std::fmt;
use std::ops::{Deref, RangeBounds};

use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::codec;

/// Immutable, cheaply cloned bytes that travel beside a message, never inside its body.
///
/// Inside a value encoded by handoff's codec a `Buffer` becomes a frame of the
/// message and the body holds only a reference to it; on receipt it is a
/// zero-copy view of the received bytes. Outside the codec (plain `serde_json`,
/// say) it serializes as ordinary bytes, so it never panics.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Buffer(Bytes);

impl Buffer {
    /// An empty buffer.
    pub const fn new() -> Buffer {
        Buffer(Bytes::new())
    }

    /// A buffer over static bytes (no allocation, no copy).
    pub const fn from_static(bytes: &'static [u8]) -> Buffer {
        Buffer(Bytes::from_static(bytes))
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_from_slice(data: &[u8]) -> Buffer {
        Buffer(Bytes::copy_from_slice(data))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A zero-copy view of part of the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Buffer {
        Buffer(self.0.slice(range))
    }

    /// The bytes, as a cheap `Bytes` handle on the same memory.
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }

    /// Converts into `Bytes` without copying.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Bytes> for Buffer {
    fn from(b: Bytes) -> Buffer {
        Buffer(b)
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Buffer {
        Buffer(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Buffer {
    fn from(s: &'static [u8]) -> Buffer {
        Buffer(Bytes::from_static(s))
    }
}

impl From<Buffer> for Bytes {
    fn from(b: Buffer) -> Bytes {
        b.0
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} bytes)", self.0.len())
    }
}

impl Serialize for Buffer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match codec::push_frame(&self.0) {
            Some(index) => codec::serialize_frame_ref(index, serializer),
            None => serializer.serialize_bytes(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Buffer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Buffer, D::Error> {
        deserializer.deserialize_any(BufferVisitor)
    }
}

struct BufferVisitor;

impl<'de> Visitor<'de> for BufferVisitor {
    type Value = Buffer;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes, a sequence of byte values, or a handoff frame reference")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Buffer, E> {
        Ok(Buffer::copy_from_slice(v))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Buffer, E> {
        Ok(Buffer::from(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Buffer, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(byte) = seq.next_element::<u8>()? {
            out.push(byte);
        }
        Ok(Buffer::from(out))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Buffer, D::Error> {
        codec::deserialize_frame_ref(deserializer).map(Buffer)
    }
}

//! How a [`Buffer`] serializes: inside handoff's codec ([`crate::codec::encode`]) as a
//! reference to a frame of the message, outside it as plain bytes; and how one is read back
//! from either. Kept apart from `buffer.rs` so that the buffer type sits below the codec.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::buffer::Buffer;
use crate::codec;

impl Serialize for Buffer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match codec::push_frame(self) {
            Some(index) => codec::serialize_frame_ref(index, serializer),
            None => serializer.serialize_bytes(self),
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
        codec::deserialize_frame_ref(deserializer)
    }
}

//! The message types the CLI's nodes speak (demo and bench); documented in `spec/WIRE.md`
//! so that workers in other languages can take part.

use handoff::{Buffer, Message, NodeBuilder};
use serde::{Deserialize, Serialize};

/// A payload to verify: `digest` is the BLAKE3 hash of `data`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payload {
    /// Transfer id, echoed in the receipt.
    pub id: u64,
    /// BLAKE3 of `data`, 32 bytes.
    pub digest: Buffer,
    /// The bytes.
    pub data: Buffer,
    /// Seconds the sender spent preparing the payload before sending (for timing).
    pub prepare_seconds: f64,
}
impl Message for Payload {
    const TYPE_NAME: &'static str = "handoff.demo.Payload";
}

/// The receiver's answer to a [`Payload`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    /// The payload's id.
    pub id: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Whether the digest matched.
    pub verified: bool,
    /// Seconds the receiver spent verifying (excluded from transfer time).
    pub verify_seconds: f64,
}
impl Message for Receipt {
    const TYPE_NAME: &'static str = "handoff.demo.Receipt";
}

/// Asks a node to send a [`Payload`] of `bytes` bytes back to the asker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendRequest {
    /// Id to put in the payload.
    pub id: u64,
    /// Size of the payload's data.
    pub bytes: u64,
}
impl Message for SendRequest {
    const TYPE_NAME: &'static str = "handoff.demo.SendRequest";
}

/// A small message for round trips; the echo service answers with the same value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ping {
    /// Sequence number.
    pub seq: u64,
    /// A few bytes of payload.
    #[serde(with = "serde_bytes_compat")]
    pub data: Vec<u8>,
}
impl Message for Ping {
    const TYPE_NAME: &'static str = "handoff.bench.Ping";
}

/// A large buffer for throughput runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Blob {
    /// Sequence number.
    pub seq: u64,
    /// The bytes.
    pub data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "handoff.bench.Blob";
}

/// Registers every CLI message type.
pub fn register_all(builder: NodeBuilder) -> NodeBuilder {
    builder
        .register::<Payload>()
        .register::<Receipt>()
        .register::<SendRequest>()
        .register::<Ping>()
        .register::<Blob>()
}

/// Builds a payload of `len` bytes (a cheap deterministic pattern) with its digest.
pub fn make_payload(id: u64, len: usize) -> Payload {
    let started = std::time::Instant::now();
    let mut data = vec![0u8; len];
    let mut x: u64 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    let digest = blake3::hash(&data);
    Payload {
        id,
        digest: Buffer::copy_from_slice(digest.as_bytes()),
        data: Buffer::from(data),
        prepare_seconds: started.elapsed().as_secs_f64(),
    }
}

/// Checks a payload's digest; returns whether it matched and how long it took.
pub fn verify(payload: &Payload) -> (bool, f64) {
    let started = std::time::Instant::now();
    let ok = blake3::hash(&payload.data).as_bytes()[..] == payload.digest[..];
    (ok, started.elapsed().as_secs_f64())
}

/// `Vec<u8>` as msgpack bin (not an array of integers).
mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        handoff::Buffer::deserialize(d).map(|b| b.to_vec())
    }
}

//! The message types the CLI's nodes speak (demo and bench); documented in `spec/WIRE.md`
//! so that workers in other languages can take part.

use handoff::shm::SegmentInfo;
use handoff::{Buffer, Message, NodeBuilder, SharedBufMut};
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

/// Asks a node to keep `data` until told to drop it (to observe leases).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hold {
    /// Id to drop it by later.
    pub id: u64,
    /// The bytes to keep.
    pub data: Buffer,
}
impl Message for Hold {
    const TYPE_NAME: &'static str = "handoff.demo.Hold";
}

/// The answer to [`Hold`], [`Forward`] and [`Release`]: what the holder has.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Held {
    /// The hold's id.
    pub id: u64,
    /// Name of the node that holds (or held) the bytes.
    pub holder: String,
    /// Bytes held (0 once dropped).
    pub bytes: u64,
    /// Where the holder's view lives, if in shared memory.
    pub segment: Option<SegmentInfo>,
}
impl Message for Held {
    const TYPE_NAME: &'static str = "handoff.demo.Held";
}

/// Asks a node to drop what it holds under `id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    /// The hold's id.
    pub id: u64,
}
impl Message for Release {
    const TYPE_NAME: &'static str = "handoff.demo.Release";
}

/// Asks a node to pass `data` on to its peer `to` as a [`Hold`], keep nothing itself,
/// and relay the holder's [`Held`] answer back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Forward {
    /// The hold's id.
    pub id: u64,
    /// Name of the peer to pass it to.
    pub to: String,
    /// The bytes.
    pub data: Buffer,
}
impl Message for Forward {
    const TYPE_NAME: &'static str = "handoff.demo.Forward";
}

/// Registers every CLI message type.
pub fn register_all(builder: NodeBuilder) -> NodeBuilder {
    builder
        .register::<Payload>()
        .register::<Receipt>()
        .register::<SendRequest>()
        .register::<Ping>()
        .register::<Blob>()
        .register::<Hold>()
        .register::<Held>()
        .register::<Release>()
        .register::<Forward>()
}

/// Fills `data` with a cheap deterministic pattern seeded by `seed`.
pub fn fill_pattern(data: &mut [u8], seed: u64) {
    let mut x: u64 = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Builds a payload of `len` bytes with its digest, written in place into shared memory
/// (so a same-host peer gets it with no copy; other channels send it from there).
pub fn make_payload(id: u64, len: usize) -> Payload {
    let started = std::time::Instant::now();
    let data = match SharedBufMut::new(len) {
        Ok(mut shared) if len >= handoff::shm::MIN_SEGMENT => {
            fill_pattern(&mut shared, id);
            shared.freeze()
        }
        _ => {
            let mut heap = vec![0u8; len];
            fill_pattern(&mut heap, id);
            Buffer::from(heap)
        }
    };
    let digest = blake3::hash(&data);
    Payload {
        id,
        digest: Buffer::copy_from_slice(digest.as_bytes()),
        data,
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

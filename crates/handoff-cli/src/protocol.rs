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

/// Chaos: asks an owner to send `bytes` bytes by ticket to its peer `to` as a [`Take`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Issue {
    /// Transfer id.
    pub id: u64,
    /// Size of the buffer.
    pub bytes: u64,
    /// The holder.
    pub to: String,
    /// If set, the holder forwards the ticket to this peer instead of redeeming it.
    pub forward_to: Option<String>,
    /// If set, the final holder leaks its handle (its release is lost).
    pub leak: bool,
}
impl Message for Issue {
    const TYPE_NAME: &'static str = "handoff.chaos.Issue";
}

/// Chaos: a ticketed buffer for a holder to redeem (or forward), with its digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Take {
    /// Transfer id.
    pub id: u64,
    /// BLAKE3 of `data` (bin, in the body: only `data` travels as a ticket).
    #[serde(with = "serde_bytes_compat")]
    pub digest: Vec<u8>,
    /// The bytes (a ticket).
    pub data: Buffer,
    /// Forward to this peer instead of redeeming.
    pub forward_to: Option<String>,
    /// Leak the handle instead of releasing it.
    pub leak: bool,
}
impl Message for Take {
    const TYPE_NAME: &'static str = "handoff.chaos.Take";
}

/// Chaos: what a holder saw, sent to the peer named `chaos`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Transfer id.
    pub id: u64,
    /// The reporting node.
    pub node: String,
    /// `ok`, `forwarded`, `leaked`, `corrupt`, or an error kind (`owner-lost`, `unknown-lease`, …).
    pub outcome: String,
    /// Details of an error.
    pub detail: String,
}
impl Message for Report {
    const TYPE_NAME: &'static str = "handoff.chaos.Report";
}

/// Asks a node for its statistics; it answers with [`Stats`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsRequest {}
impl Message for StatsRequest {
    const TYPE_NAME: &'static str = "handoff.admin.StatsRequest";
}

/// A node's leases and shared memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stats {
    /// The node.
    pub node: String,
    /// Leases it holds as an owner of tickets.
    pub ticket_leases: handoff::tickets::LeaseTableStats,
    /// Shared-memory leases it holds for its peers.
    pub shm_leases: handoff::LeaseStats,
    /// Its process's segment pool.
    pub shm_pool: handoff::shm::PoolStats,
    /// Connected peers (name and channel): at most [`STATS_PEERS`] of them (Appendix A).
    pub peers: Vec<(String, String)>,
    /// How many peers are connected, listed or not (absent from older nodes: then the
    /// length of `peers`).
    #[serde(default)]
    pub peers_total: Option<u64>,
}

/// The most peers a `Stats` answer lists (spec WIRE.md Appendix A): with names of at most
/// 256 bytes, the answer stays far below the 16 MiB header limit of every receiver.
pub const STATS_PEERS: usize = 4096;
impl Message for Stats {
    const TYPE_NAME: &'static str = "handoff.admin.Stats";
}

/// Asks a node to close its connection to `peer`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Disconnect {
    /// The peer's name.
    pub peer: String,
}
impl Message for Disconnect {
    const TYPE_NAME: &'static str = "handoff.chaos.Disconnect";
}

/// Demo: read this data handle and report which path its bytes took.
#[derive(Debug, Serialize, Deserialize)]
pub struct BlobWork {
    /// Transfer id, echoed in the receipt.
    pub id: u64,
    /// The handle: bound to the receiver's catalog, or pulled from the sender.
    pub blob: handoff_data::BlobHandle,
    /// BLAKE3 of the blob's content, 32 bytes, to verify what was read.
    #[serde(with = "serde_bytes_compat")]
    pub digest: Vec<u8>,
}
impl Message for BlobWork {
    const TYPE_NAME: &'static str = "handoff.demo.BlobWork";
}

/// The answer to a [`BlobWork`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlobReceipt {
    /// The work's id.
    pub id: u64,
    /// Bytes read, or 0 if the read failed.
    pub bytes: u64,
    /// Whether the bytes matched the digest.
    pub verified: bool,
    /// Where the bytes came from: `storage`, `cache`, `shared-cache`, `read-in-place` or
    /// `remote-blob` (pulled from the sender); `failed` if the read failed.
    pub path: String,
    /// Why the bytes came from the sender, or why the read failed.
    pub detail: Option<String>,
    /// Seconds the read took at the receiver.
    pub read_seconds: f64,
}
impl Message for BlobReceipt {
    const TYPE_NAME: &'static str = "handoff.demo.BlobReceipt";
}

/// Reads a [`BlobWork`]'s handle and checks the digest.
pub async fn read_blob_work(work: BlobWork) -> BlobReceipt {
    let started = std::time::Instant::now();
    match work.blob.read_all().await {
        Ok(bytes) => BlobReceipt {
            id: work.id,
            bytes: bytes.len() as u64,
            verified: digest(&bytes) == work.digest,
            path: work.blob.last_origin().map_or("unknown", |o| o.as_str()).to_string(),
            detail: work.blob.fallback_reason(),
            read_seconds: started.elapsed().as_secs_f64(),
        },
        Err(e) => BlobReceipt {
            read_seconds: started.elapsed().as_secs_f64(),
            ..BlobReceipt::failed(work.id, e.to_string())
        },
    }
}

impl BlobReceipt {
    /// A receipt for work that could not be read (or not even decoded: id 0).
    pub fn failed(id: u64, why: String) -> BlobReceipt {
        BlobReceipt {
            id,
            bytes: 0,
            verified: false,
            path: "failed".into(),
            detail: Some(why),
            read_seconds: 0.0,
        }
    }
}

/// Bench: connect to `addr` and write `bytes` bytes on a plain TCP stream (no handoff
/// protocol), so the raw baseline runs between the same two processes as the case it
/// measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawSend {
    /// `HOST:PORT` to connect to.
    pub addr: String,
    /// Bytes to write, then close.
    pub bytes: u64,
}
impl Message for RawSend {
    const TYPE_NAME: &'static str = "handoff.bench.RawSend";
}

/// Answers a [`RawSend`]: prepares the bytes first (not part of the stream), then connects and writes them.
pub async fn raw_send(req: RawSend) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut data = try_alloc(req.bytes)?;
    data.fill(0x6b);
    let mut stream = tokio::net::TcpStream::connect(&req.addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(&data).await?;
    stream.shutdown().await
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
        .register::<Issue>()
        .register::<Take>()
        .register::<Report>()
        .register::<StatsRequest>()
        .register::<Stats>()
        .register::<Disconnect>()
        .register::<BlobWork>()
        .register::<BlobReceipt>()
        .register::<RawSend>()
}

/// BLAKE3 of `data`.
pub fn digest(data: &[u8]) -> Vec<u8> {
    blake3::hash(data).as_bytes().to_vec()
}

/// The kind of a runtime error, as chaos counts it.
pub fn error_kind(e: &handoff::Error) -> String {
    match e {
        handoff::Error::OwnerLost { .. } => "owner-lost".into(),
        handoff::Error::TicketRefused { code, .. } => code.clone(),
        handoff::Error::Corrupt { .. } => "corrupt".into(),
        handoff::Error::PeerClosed(_) => "peer-closed".into(),
        handoff::Error::NodeClosed => "node-closed".into(),
        handoff::Error::Timeout(_) => "timeout".into(),
        handoff::Error::LeaseCap { .. } => "lease-cap".into(),
        handoff::Error::Io { .. } => "io".into(),
        _ => "other".into(),
    }
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

/// A zeroed heap buffer of `len` bytes, or an error if the memory cannot be had: a size
/// that came from a peer must never abort the process on allocation.
pub fn try_alloc(len: u64) -> std::io::Result<Vec<u8>> {
    let too_big = || std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("cannot allocate {len} bytes"));
    let len = usize::try_from(len).map_err(|_| too_big())?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| too_big())?;
    v.resize(len, 0);
    Ok(v)
}

/// Builds a payload of `len` bytes with its digest, written in place into shared memory
/// (so a same-host peer gets it with no copy; other channels send it from there).
/// Panics if the memory cannot be had; [`try_make_payload`] reports it instead.
pub fn make_payload(id: u64, len: usize) -> Payload {
    try_make_payload(id, len as u64).expect("memory for the payload")
}

/// [`make_payload`], failing with an error when the memory cannot be had.
pub fn try_make_payload(id: u64, len: u64) -> std::io::Result<Payload> {
    let started = std::time::Instant::now();
    let shared = match usize::try_from(len) {
        Ok(n) if n >= handoff::shm::MIN_SEGMENT => SharedBufMut::new(n).ok(),
        _ => None,
    };
    let data = match shared {
        Some(mut shared) => {
            fill_pattern(&mut shared, id);
            shared.freeze()
        }
        None => {
            let mut heap = try_alloc(len)?;
            fill_pattern(&mut heap, id);
            Buffer::from(heap)
        }
    };
    let digest = blake3::hash(&data);
    Ok(Payload {
        id,
        digest: Buffer::copy_from_slice(digest.as_bytes()),
        // Hashed here already: a ticket for it need not hash it again.
        data: data.with_digest(*digest.as_bytes()),
        prepare_seconds: started.elapsed().as_secs_f64(),
    })
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

//! The msgpack header that starts every message after the preamble, and its frame descriptors.
//!
//! The header is a msgpack map whose `k` field says what kind of message it is
//! (`spec/WIRE.md` §6, §7). The types live here; the work is split by job:
//!
//! - `schema`: the keys a v1 receiver knows, in the header map and in descriptor maps, and
//!   the type of each (§6 rule 3 and the type table);
//! - `scan`: the first pass of decoding, which checks the structure of the whole header
//!   (§6 rules 1–5, the value and nesting limits of §9) and notes where each known key's
//!   value is, building nothing;
//! - `decode`: the second pass, [`Header::decode`], which checks `k` and the kind's fields in
//!   the order of §11.2 and builds only those;
//! - `encode`: [`Header::encode`], the canonical form of §2, keys in the spec's order.
//!
//! Decoders are exactly as strict as the spec: they accept every valid msgpack encoding of
//! the right types (keys in any order, wider formats, nil for an optional key) and ignore
//! keys they do not know, and refuse everything else. Encoders write one form only, so that
//! every implementation produces the same bytes.

mod decode;
mod encode;
mod scan;
mod schema;
#[cfg(test)]
mod tests;

/// Nesting limit of a header (`spec/WIRE.md` §9): each msgpack array, map and ext value is
/// one level, the header map itself level 1, values of ignored keys included. Deeper →
/// `malformed-header`. A valid v1 header uses 3.
pub const MAX_HEADER_DEPTH: u32 = 15;

/// Most msgpack values one header may hold (`spec/WIRE.md` §9), counted as a reader meets
/// them: the header map, each key, each value, each array element and each value nested in
/// those, values of ignored keys included; a str, bin or ext counts one whatever its length.
/// Reading one more → `malformed-header`.
pub const MAX_HEADER_VALUES: u32 = 65_536;

/// Most entries of the header map, and of each descriptor map (`spec/WIRE.md` §6 rule 5).
/// More → `malformed-header`.
pub const MAX_MAP_ENTRIES: u32 = 64;

/// The header kinds of versions 1, 2 and 3, as `k` names them (`spec/WIRE.md` §6): v1 uses
/// `hello`, v2 and v3 `challenge` and `ident` in its place (v3 adds no kind); the decoder
/// knows them all, and which may arrive when is the runtime's check on the connection
/// (§5.1, §5.4, §5.7, §11.2 step 3).
pub const KINDS: &[&str] = &[
    "hello",
    "challenge",
    "ident",
    "auth",
    "ready",
    "msg",
    "error",
    "release",
    "pull",
    "pulled",
    "forward",
    "forwarded",
    "ticket-error",
    "unlease",
    "renew",
];

/// The descriptor kinds any version defines, as a descriptor's `k` names them (`spec/WIRE.md` §7).
pub const DESCRIPTOR_KINDS: &[&str] = &["inline", "shm", "ticket", "tag"];

/// Everything a side says about itself in the handshake of version 1 (Dask's handshake
/// context, made explicit): its [`Ident`] with the version and the nonce, sent before any
/// proof (`spec/WIRE.md` §6.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Random 128-bit node id, lower-case hex.
    pub node_id: String,
    /// Human-readable node name.
    pub name: String,
    /// Host identity: nodes with equal host ids may share memory.
    pub host_id: String,
    /// Operating-system process id.
    pub pid: u32,
    /// Random 128-bit id of the process instance (pids repeat across hosts), lower-case hex.
    pub process_id: String,
    /// Implementation language, e.g. `rust` or `python`.
    pub language: String,
    /// Implementation name and version, e.g. `handoff-rs/0.1.0`.
    pub implementation: String,
    /// The protocol version this side chose after the preambles.
    pub version: u16,
    /// Capabilities: `inline`; `shm` where the node has a Unix socket for same-host peers;
    /// `ticket` where it issues and redeems tickets.
    pub capabilities: Vec<String>,
    /// 32 random bytes: the challenge the peer's proof must cover.
    pub nonce: Vec<u8>,
    /// Address other nodes can connect to, if the node listens.
    pub listen: Option<String>,
    /// Path of the node's Unix socket for same-host peers (the `shm` channel), if any.
    pub unix: Option<String>,
}

impl Hello {
    /// The identity fields of this hello, as a version-2 `ident` carries them.
    pub fn ident(&self) -> Ident {
        Ident {
            node_id: self.node_id.clone(),
            name: self.name.clone(),
            host_id: self.host_id.clone(),
            pid: self.pid,
            process_id: self.process_id.clone(),
            language: self.language.clone(),
            implementation: self.implementation.clone(),
            capabilities: self.capabilities.clone(),
            listen: self.listen.clone(),
            unix: self.unix.clone(),
        }
    }

    /// The version-1 hello of `ident`, for the negotiated `version` with a fresh `nonce`.
    pub fn from_ident(ident: Ident, version: u16, nonce: Vec<u8>) -> Hello {
        Hello {
            node_id: ident.node_id,
            name: ident.name,
            host_id: ident.host_id,
            pid: ident.pid,
            process_id: ident.process_id,
            language: ident.language,
            implementation: ident.implementation,
            version,
            capabilities: ident.capabilities,
            nonce,
            listen: ident.listen,
            unix: ident.unix,
        }
    }
}

/// What a side says about itself in the handshake of version 2, once it has verified the
/// peer's proof (`spec/WIRE.md` §5.4, §6.9): the fields of a v1 [`Hello`] but the version
/// and the nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    /// Random 128-bit node id, lower-case hex.
    pub node_id: String,
    /// Human-readable node name.
    pub name: String,
    /// Host identity: nodes with equal host ids may share memory.
    pub host_id: String,
    /// Operating-system process id.
    pub pid: u32,
    /// Random 128-bit id of the process instance, lower-case hex.
    pub process_id: String,
    /// Implementation language, e.g. `rust` or `python`.
    pub language: String,
    /// Implementation name and version, e.g. `handoff-rs/0.1.0`.
    pub implementation: String,
    /// Capabilities: `inline`; `shm` where the node has a Unix socket for same-host peers;
    /// `ticket` where it issues and redeems tickets.
    pub capabilities: Vec<String>,
    /// Address other nodes can connect to, if the node listens.
    pub listen: Option<String>,
    /// Path of the node's Unix socket for same-host peers (the `shm` channel), if any.
    pub unix: Option<String>,
}

/// How one frame of a message travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descriptor {
    /// `len` bytes that follow the header in the same stream.
    Inline {
        /// Length in bytes.
        len: u64,
    },
    /// A window of a shared-memory segment whose file descriptor travels with the
    /// message (SCM_RIGHTS on a Unix socket), one descriptor per `shm` frame, in order.
    Shm {
        /// Length of the window in bytes.
        len: u64,
        /// Offset of the window in the segment.
        offset: u64,
        /// Size of the whole segment (the receiver checks it against the descriptor's file).
        size: u64,
        /// Lease id: the receiver sends it back in a `release` when its last view is dropped.
        lease: u64,
        /// Whether the segment is sealed against writes, shrinking and growing.
        sealed: bool,
    },
    /// A claim to pull the bytes from their owner, who keeps them under a lease until
    /// every holder has released it.
    Ticket(TicketClaim),
    /// A range of the sender's GPU memory, named by a CUDA IPC handle, that the sender keeps
    /// under a ticket lease (spec §7.10): the receiver maps it, or pulls its bytes.
    Cuda(DeviceClaim),
    /// Reserved (specified for resource tags): a key the receiver resolves locally.
    Tag {
        /// The resource key.
        key: String,
    },
}

/// The digest a ticket carries (spec §7.5): BLAKE3 (`digest`, every node checks it) or XXH3-128
/// (`xxh3`, sent only to a peer that announced the capability `xxh3`). Both catch accidental
/// corruption; neither is what protects against an attacker, which is the channel's job (§7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketDigest {
    /// BLAKE3, 32-byte output (wire key `digest`).
    Blake3([u8; 32]),
    /// XXH3-128 with seed 0, its canonical big-endian 16 bytes (wire key `xxh3`).
    Xxh3([u8; 16]),
}

/// The capability (§5.2) of a node that checks a ticket's `xxh3`.
pub const CAP_XXH3: &str = "xxh3";

impl TicketDigest {
    /// BLAKE3 of `bytes`.
    pub fn blake3_of(bytes: &[u8]) -> TicketDigest {
        TicketDigest::Blake3(*blake3::hash(bytes).as_bytes())
    }

    /// XXH3-128 of `bytes`, in its canonical (big-endian) form.
    pub fn xxh3_of(bytes: &[u8]) -> TicketDigest {
        TicketDigest::Xxh3(xxhash_rust::xxh3::xxh3_128(bytes).to_be_bytes())
    }

    /// The same kind of digest, of `bytes`.
    pub fn same_kind_of(&self, bytes: &[u8]) -> TicketDigest {
        match self {
            TicketDigest::Blake3(_) => TicketDigest::blake3_of(bytes),
            TicketDigest::Xxh3(_) => TicketDigest::xxh3_of(bytes),
        }
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            TicketDigest::Blake3(d) => d,
            TicketDigest::Xxh3(d) => d,
        }
    }

    /// The algorithm, as errors and logs name it.
    pub fn algorithm(&self) -> &'static str {
        match self {
            TicketDigest::Blake3(_) => "BLAKE3",
            TicketDigest::Xxh3(_) => "XXH3-128",
        }
    }

    /// Whether a receiver with these capabilities may be sent this digest (§5.2, §7.5).
    pub fn sendable_to(&self, caps: &[String]) -> bool {
        matches!(self, TicketDigest::Blake3(_)) || caps.iter().any(|c| c == CAP_XXH3)
    }
}

/// The fields of a `ticket` descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketClaim {
    /// Length of the buffer in bytes.
    pub len: u64,
    /// Node id of the owner.
    pub owner: String,
    /// Where the owner listens (`tcp://…`), for holders not connected to it.
    pub addr: Option<String>,
    /// The owner's lease id.
    pub lease: u64,
    /// 32 random bytes, valid only for the node the ticket was issued to.
    pub token: Vec<u8>,
    /// The digest of the whole buffer the holder checks after a full pull (§7.5).
    pub digest: TicketDigest,
    /// Milliseconds the hold lasts unless renewed.
    pub ttl_ms: u64,
    /// The sender asks the receiver to pull only on use, never on receipt: the ticket is a
    /// fallback the receiver may not need (wire key `lazy`, sent only when true).
    pub lazy: bool,
}

/// The capability (§5.2) of a node that opens CUDA IPC handles: it takes `cuda` frames on a
/// Unix socket (§7.10).
pub const CAP_CUDA: &str = "cuda";

/// The fields of a `cuda` descriptor (spec §7.10): `len` bytes at `offset` of the GPU
/// allocation that `ipc` names, on the device whose UUID is `device`. The sender owns them
/// under ticket lease `lease`, held by the receiver with `token` until it releases it
/// (`unlease`) or the connection ends; a receiver that cannot open the handle pulls the
/// bytes with that lease (§7.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceClaim {
    /// Length of the range in bytes.
    pub len: u64,
    /// Where the range starts in the allocation the handle names.
    pub offset: u64,
    /// The owner's lease id (the owner is the sender).
    pub lease: u64,
    /// 32 random bytes, valid only for the receiver.
    pub token: Vec<u8>,
    /// The CUDA IPC memory handle (`CUipcMemHandle`, 64 bytes) of the allocation.
    pub ipc: [u8; 64],
    /// The UUID of the device the allocation lies on (`cuDeviceGetUuid`).
    pub device: [u8; 16],
}

/// Messages of the ticket protocol between a holder and the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketOp {
    /// Holder → owner: send `len` bytes from `offset` of the leased buffer.
    Pull {
        /// Request id, echoed in the answer.
        req: u64,
        /// Lease id.
        lease: u64,
        /// The holder's token.
        token: Vec<u8>,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
    },
    /// Owner → holder: the `len` bytes asked for follow this header.
    Pulled {
        /// Request id.
        req: u64,
        /// Bytes that follow.
        len: u64,
    },
    /// Holder → owner: register node `to` as a holder too (before this holder may release).
    Forward {
        /// Request id, echoed in the answer.
        req: u64,
        /// Lease id.
        lease: u64,
        /// The asking holder's token.
        token: Vec<u8>,
        /// Node id of the new holder.
        to: String,
    },
    /// Owner → holder: the new holder's own token.
    Forwarded {
        /// Request id.
        req: u64,
        /// Token for the new holder.
        token: Vec<u8>,
    },
    /// Owner → holder: a pull or forward refused; the connection stays open.
    Refused {
        /// Request id.
        req: u64,
        /// Stable code: `unknown-lease`, `bad-token`, `expired`, `out-of-range`.
        code: String,
        /// Explanation.
        message: String,
    },
    /// Holder → owner: this holder is done with the lease.
    Unlease {
        /// Lease id.
        lease: u64,
        /// The holder's token.
        token: Vec<u8>,
    },
    /// Holder → owner: extend this holder's deadline by the lease's ttl.
    Renew {
        /// Lease id.
        lease: u64,
        /// The holder's token.
        token: Vec<u8>,
    },
}

impl TicketOp {
    /// The header kind on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            TicketOp::Pull { .. } => "pull",
            TicketOp::Pulled { .. } => "pulled",
            TicketOp::Forward { .. } => "forward",
            TicketOp::Forwarded { .. } => "forwarded",
            TicketOp::Refused { .. } => "ticket-error",
            TicketOp::Unlease { .. } => "unlease",
            TicketOp::Renew { .. } => "renew",
        }
    }
}

impl Descriptor {
    /// The descriptor kind as written on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Descriptor::Inline { .. } => "inline",
            Descriptor::Shm { .. } => "shm",
            Descriptor::Ticket { .. } => "ticket",
            Descriptor::Cuda { .. } => "cuda",
            Descriptor::Tag { .. } => "tag",
        }
    }

    /// Length of the frame in bytes (`0` for a tag).
    pub fn len(&self) -> u64 {
        match self {
            Descriptor::Inline { len } | Descriptor::Shm { len, .. } => *len,
            Descriptor::Ticket(t) => t.len,
            Descriptor::Cuda(c) => c.len,
            Descriptor::Tag { .. } => 0,
        }
    }

    /// Whether the frame is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of this frame that follow the header in the stream.
    pub fn inline_len(&self) -> u64 {
        match self {
            Descriptor::Inline { len } => *len,
            _ => 0,
        }
    }
}

/// A decoded header; `'a` borrows the body from the received bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header<'a> {
    /// First handshake message of version 1: the sender's identity and nonce.
    Hello(Hello),
    /// First handshake message of version 2: the version and a nonce, nothing about the
    /// sender (`spec/WIRE.md` §6.8).
    Challenge {
        /// The protocol version chosen from the preambles.
        version: u16,
        /// 32 random bytes: the challenge the peer's proof must cover.
        nonce: Vec<u8>,
    },
    /// Version 2: the sender's identity, sent once it has verified the peer's proof
    /// (`spec/WIRE.md` §6.9).
    Ident(Ident),
    /// Second handshake message: the proof of the cluster secret.
    Auth {
        /// HMAC-SHA256 proof, 32 bytes.
        mac: Vec<u8>,
    },
    /// Last handshake message: the peer's proof (and, in v2, its ident) checked; messages may flow.
    Ready,
    /// A user message.
    Msg {
        /// The registered type name of the value.
        type_name: &'a str,
        /// The msgpack-encoded value.
        body: &'a [u8],
        /// Its frames, in order.
        frames: Vec<Descriptor>,
    },
    /// The receiver of `shm` frames has dropped its last view of these leases.
    Release {
        /// Lease ids from `shm` descriptors.
        leases: Vec<u64>,
    },
    /// The ticket protocol (pull, forward, release of a ticket's hold, …).
    Ticket(TicketOp),
    /// The sender rejects something and closes the connection.
    Error {
        /// A stable code from the spec, e.g. `auth-failed`.
        code: String,
        /// A human-readable explanation.
        message: String,
    },
}

impl Header<'_> {
    /// The header kind on the wire, the value of `k`.
    pub fn kind(&self) -> &'static str {
        match self {
            Header::Hello(_) => "hello",
            Header::Challenge { .. } => "challenge",
            Header::Ident(_) => "ident",
            Header::Auth { .. } => "auth",
            Header::Ready => "ready",
            Header::Msg { .. } => "msg",
            Header::Release { .. } => "release",
            Header::Ticket(op) => op.kind(),
            Header::Error { .. } => "error",
        }
    }
}

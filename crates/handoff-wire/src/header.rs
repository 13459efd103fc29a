//! The msgpack header that starts every message after the preamble, and its frame descriptors.
//!
//! The header is a msgpack map whose `k` field says what kind of message it is.
//! Decoders accept the keys in any order and ignore keys they do not know (so
//! later versions may add optional keys); encoders write the keys in the order
//! given in `spec/WIRE.md`, so that every implementation produces the same bytes.

use serde::{Deserialize, Serialize};

use crate::{Limits, WireError};

/// Everything a side says about itself in the handshake (Dask's handshake context, made explicit).
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
    /// Reserved (specified for resource tags): a key the receiver resolves locally.
    Tag {
        /// The resource key.
        key: String,
    },
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
    /// BLAKE3 of the whole buffer, 32 bytes.
    pub digest: Vec<u8>,
    /// Milliseconds the hold lasts unless renewed.
    pub ttl_ms: u64,
    /// The sender asks the receiver to pull only on use, never on receipt: the ticket is a
    /// fallback the receiver may not need (wire key `lazy`, sent only when true).
    pub lazy: bool,
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
            Descriptor::Tag { .. } => "tag",
        }
    }

    /// Length of the frame in bytes (`0` for a tag).
    pub fn len(&self) -> u64 {
        match self {
            Descriptor::Inline { len } | Descriptor::Shm { len, .. } => *len,
            Descriptor::Ticket(t) => t.len,
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
    /// First handshake message.
    Hello(Hello),
    /// Second handshake message: the proof of the cluster secret.
    Auth {
        /// HMAC-SHA256 proof, 32 bytes.
        mac: Vec<u8>,
    },
    /// Third handshake message: the peer's proof verified, messages may flow.
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

#[derive(Deserialize)]
struct RawDescriptor<'a> {
    #[serde(borrow)]
    k: Option<&'a str>,
    n: Option<u64>,
    off: Option<u64>,
    size: Option<u64>,
    lease: Option<u64>,
    sealed: Option<bool>,
    key: Option<String>,
    owner: Option<String>,
    addr: Option<String>,
    #[serde(default, with = "serde_bytes")]
    token: Option<Vec<u8>>,
    #[serde(default, with = "serde_bytes")]
    digest: Option<Vec<u8>>,
    ttl: Option<u64>,
    lazy: Option<bool>,
}

#[derive(Serialize)]
struct OutDescriptor<'a> {
    k: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    n: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    off: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sealed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
}

#[derive(Serialize)]
struct OutTicket<'a> {
    k: &'static str,
    n: u64,
    owner: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<&'a str>,
    lease: u64,
    #[serde(with = "serde_bytes")]
    token: &'a [u8],
    #[serde(with = "serde_bytes")]
    digest: &'a [u8],
    ttl: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lazy: bool,
}

#[derive(Deserialize)]
struct RawHeader<'a> {
    #[serde(borrow)]
    k: Option<&'a str>,
    #[serde(borrow)]
    t: Option<&'a str>,
    #[serde(borrow, default, with = "serde_bytes")]
    b: Option<&'a [u8]>,
    #[serde(borrow)]
    f: Option<Vec<RawDescriptor<'a>>>,
    node: Option<String>,
    name: Option<String>,
    host: Option<String>,
    pid: Option<u32>,
    proc: Option<String>,
    lang: Option<String>,
    #[serde(rename = "impl")]
    implementation: Option<String>,
    v: Option<u16>,
    caps: Option<Vec<String>>,
    #[serde(default, with = "serde_bytes")]
    nonce: Option<Vec<u8>>,
    listen: Option<String>,
    unix: Option<String>,
    leases: Option<Vec<u64>>,
    #[serde(default, with = "serde_bytes")]
    mac: Option<Vec<u8>>,
    code: Option<String>,
    msg: Option<String>,
    req: Option<u64>,
    lease: Option<u64>,
    #[serde(default, with = "serde_bytes")]
    token: Option<Vec<u8>>,
    off: Option<u64>,
    n: Option<u64>,
    to: Option<String>,
}

/// Nesting limit of a header: msgpack arrays, maps and ext values deeper than
/// `MAX_HEADER_DEPTH - 1` levels (`spec/WIRE.md`: 15; a valid v1 header uses 3) are
/// `malformed-header`.
const MAX_HEADER_DEPTH: usize = 16;

fn missing(kind: &str, field: &str) -> WireError {
    WireError::MalformedHeader(format!("{kind:?} header lacks field {field:?}"))
}

impl<'a> Header<'a> {
    /// Decodes and validates a header against `limits`.
    pub fn decode(bytes: &'a [u8], limits: &Limits) -> Result<Header<'a>, WireError> {
        // A bounded depth keeps hostile nesting (in ignored keys, say) from overflowing the stack.
        let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
        de.set_max_depth(MAX_HEADER_DEPTH);
        let raw = RawHeader::deserialize(&mut de)
            .map_err(|e| WireError::MalformedHeader(format!("not a msgpack map of the header's shape: {e}")))?;
        let kind = raw
            .k
            .ok_or_else(|| WireError::MalformedHeader("header lacks field \"k\"".into()))?;
        match kind {
            "msg" => {
                let type_name = raw.t.ok_or_else(|| missing("msg", "t"))?;
                let body = raw.b.ok_or_else(|| missing("msg", "b"))?;
                let raw_frames = raw.f.unwrap_or_default();
                if raw_frames.len() as u64 > limits.max_frames as u64 {
                    return Err(WireError::TooManyFrames {
                        count: raw_frames.len() as u64,
                        limit: limits.max_frames as u64,
                    });
                }
                let mut frames = Vec::with_capacity(raw_frames.len());
                let mut total: u64 = 0;
                for (index, d) in raw_frames.into_iter().enumerate() {
                    let desc = decode_descriptor(index, d)?;
                    let len = desc.len();
                    if len > limits.max_frame_bytes {
                        return Err(WireError::FrameTooLarge {
                            index,
                            len,
                            limit: limits.max_frame_bytes,
                        });
                    }
                    total = total.saturating_add(len);
                    if total > limits.max_message_bytes {
                        return Err(WireError::MessageTooLarge {
                            len: total,
                            limit: limits.max_message_bytes,
                        });
                    }
                    frames.push(desc);
                }
                Ok(Header::Msg {
                    type_name,
                    body,
                    frames,
                })
            }
            "hello" => {
                let nonce = raw.nonce.ok_or_else(|| missing("hello", "nonce"))?;
                if nonce.len() != 32 {
                    return Err(WireError::MalformedHeader(format!(
                        "hello nonce must be 32 bytes, got {}",
                        nonce.len()
                    )));
                }
                Ok(Header::Hello(Hello {
                    node_id: raw.node.ok_or_else(|| missing("hello", "node"))?,
                    name: raw.name.ok_or_else(|| missing("hello", "name"))?,
                    host_id: raw.host.ok_or_else(|| missing("hello", "host"))?,
                    pid: raw.pid.ok_or_else(|| missing("hello", "pid"))?,
                    process_id: raw.proc.ok_or_else(|| missing("hello", "proc"))?,
                    language: raw.lang.ok_or_else(|| missing("hello", "lang"))?,
                    implementation: raw.implementation.ok_or_else(|| missing("hello", "impl"))?,
                    version: raw.v.ok_or_else(|| missing("hello", "v"))?,
                    capabilities: raw.caps.ok_or_else(|| missing("hello", "caps"))?,
                    nonce,
                    listen: raw.listen,
                    unix: raw.unix,
                }))
            }
            "auth" => {
                let mac = raw.mac.ok_or_else(|| missing("auth", "mac"))?;
                if mac.len() != 32 {
                    return Err(WireError::MalformedHeader(format!(
                        "auth mac must be 32 bytes, got {}",
                        mac.len()
                    )));
                }
                Ok(Header::Auth { mac })
            }
            "ready" => Ok(Header::Ready),
            "release" => Ok(Header::Release {
                leases: raw.leases.ok_or_else(|| missing("release", "leases"))?,
            }),
            "pull" | "pulled" | "forward" | "forwarded" | "ticket-error" | "unlease" | "renew" => {
                let op = decode_ticket_op(kind, raw)?;
                // The bytes of a `pulled` follow the header like one inline frame: same limits.
                if let TicketOp::Pulled { len, .. } = op {
                    if len > limits.max_frame_bytes {
                        return Err(WireError::FrameTooLarge {
                            index: 0,
                            len,
                            limit: limits.max_frame_bytes,
                        });
                    }
                    if len > limits.max_message_bytes {
                        return Err(WireError::MessageTooLarge {
                            len,
                            limit: limits.max_message_bytes,
                        });
                    }
                }
                Ok(Header::Ticket(op))
            }
            "error" => Ok(Header::Error {
                code: raw.code.ok_or_else(|| missing("error", "code"))?,
                message: raw.msg.ok_or_else(|| missing("error", "msg"))?,
            }),
            other => Err(WireError::UnknownKind(other.to_string())),
        }
    }

    /// Encodes the header as msgpack, keys in the spec's order.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    /// Appends the msgpack encoding of the header to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut ser = rmp_serde::Serializer::new(out).with_struct_map();
        let result = match self {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                #[derive(Serialize)]
                struct Out<'b> {
                    k: &'static str,
                    t: &'b str,
                    #[serde(with = "serde_bytes")]
                    b: &'b [u8],
                    f: Vec<OutAny<'b>>,
                }
                Out {
                    k: "msg",
                    t: type_name,
                    b: body,
                    f: frames.iter().map(out_descriptor).collect(),
                }
                .serialize(&mut ser)
            }
            Header::Hello(h) => {
                #[derive(Serialize)]
                struct Out<'b> {
                    k: &'static str,
                    node: &'b str,
                    name: &'b str,
                    host: &'b str,
                    pid: u32,
                    proc: &'b str,
                    lang: &'b str,
                    #[serde(rename = "impl")]
                    implementation: &'b str,
                    v: u16,
                    caps: &'b [String],
                    #[serde(with = "serde_bytes")]
                    nonce: &'b [u8],
                    #[serde(skip_serializing_if = "Option::is_none")]
                    listen: Option<&'b str>,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    unix: Option<&'b str>,
                }
                Out {
                    k: "hello",
                    node: &h.node_id,
                    name: &h.name,
                    host: &h.host_id,
                    pid: h.pid,
                    proc: &h.process_id,
                    lang: &h.language,
                    implementation: &h.implementation,
                    v: h.version,
                    caps: &h.capabilities,
                    nonce: &h.nonce,
                    listen: h.listen.as_deref(),
                    unix: h.unix.as_deref(),
                }
                .serialize(&mut ser)
            }
            Header::Auth { mac } => {
                #[derive(Serialize)]
                struct Out<'b> {
                    k: &'static str,
                    #[serde(with = "serde_bytes")]
                    mac: &'b [u8],
                }
                Out { k: "auth", mac }.serialize(&mut ser)
            }
            Header::Ready => {
                #[derive(Serialize)]
                struct Out {
                    k: &'static str,
                }
                Out { k: "ready" }.serialize(&mut ser)
            }
            Header::Release { leases } => {
                #[derive(Serialize)]
                struct Out<'b> {
                    k: &'static str,
                    leases: &'b [u64],
                }
                Out { k: "release", leases }.serialize(&mut ser)
            }
            Header::Ticket(op) => encode_ticket_op(op, &mut ser),
            Header::Error { code, message } => {
                #[derive(Serialize)]
                struct Out<'b> {
                    k: &'static str,
                    code: &'b str,
                    msg: &'b str,
                }
                Out {
                    k: "error",
                    code,
                    msg: message,
                }
                .serialize(&mut ser)
            }
        };
        // Serializing these plain structs into a Vec cannot fail.
        result.expect("encoding a header into memory cannot fail");
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutAny<'a> {
    Plain(OutDescriptor<'a>),
    Ticket(OutTicket<'a>),
}

fn decode_ticket_op(kind: &str, raw: RawHeader<'_>) -> Result<TicketOp, WireError> {
    let req = || raw.req.ok_or_else(|| missing(kind, "req"));
    let lease = || raw.lease.ok_or_else(|| missing(kind, "lease"));
    let token = |t: Option<Vec<u8>>| {
        let t = t.ok_or_else(|| missing(kind, "token"))?;
        if t.len() != 32 {
            return Err(WireError::MalformedHeader(format!(
                "{kind:?} token must be 32 bytes, got {}",
                t.len()
            )));
        }
        Ok(t)
    };
    Ok(match kind {
        "pull" => TicketOp::Pull {
            req: req()?,
            lease: lease()?,
            token: token(raw.token)?,
            offset: raw.off.ok_or_else(|| missing(kind, "off"))?,
            len: raw.n.ok_or_else(|| missing(kind, "n"))?,
        },
        "pulled" => TicketOp::Pulled {
            req: req()?,
            len: raw.n.ok_or_else(|| missing(kind, "n"))?,
        },
        "forward" => TicketOp::Forward {
            req: req()?,
            lease: lease()?,
            token: token(raw.token)?,
            to: raw.to.ok_or_else(|| missing(kind, "to"))?,
        },
        "forwarded" => TicketOp::Forwarded {
            req: req()?,
            token: token(raw.token)?,
        },
        "ticket-error" => TicketOp::Refused {
            req: req()?,
            code: raw.code.ok_or_else(|| missing(kind, "code"))?,
            message: raw.msg.ok_or_else(|| missing(kind, "msg"))?,
        },
        "unlease" => TicketOp::Unlease {
            lease: lease()?,
            token: token(raw.token)?,
        },
        _ => TicketOp::Renew {
            lease: lease()?,
            token: token(raw.token)?,
        },
    })
}

fn encode_ticket_op<S: serde::Serializer>(op: &TicketOp, ser: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Out<'b> {
        k: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        req: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        lease: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none", with = "opt_bytes")]
        token: Option<&'b [u8]>,
        #[serde(skip_serializing_if = "Option::is_none")]
        off: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        n: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        to: Option<&'b str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'b str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        msg: Option<&'b str>,
    }
    let none = Out {
        k: op.kind(),
        req: None,
        lease: None,
        token: None,
        off: None,
        n: None,
        to: None,
        code: None,
        msg: None,
    };
    let out = match op {
        TicketOp::Pull {
            req,
            lease,
            token,
            offset,
            len,
        } => Out {
            req: Some(*req),
            lease: Some(*lease),
            token: Some(token),
            off: Some(*offset),
            n: Some(*len),
            ..none
        },
        TicketOp::Pulled { req, len } => Out {
            req: Some(*req),
            n: Some(*len),
            ..none
        },
        TicketOp::Forward { req, lease, token, to } => Out {
            req: Some(*req),
            lease: Some(*lease),
            token: Some(token),
            to: Some(to),
            ..none
        },
        TicketOp::Forwarded { req, token } => Out {
            req: Some(*req),
            token: Some(token),
            ..none
        },
        TicketOp::Refused { req, code, message } => Out {
            req: Some(*req),
            code: Some(code),
            msg: Some(message),
            ..none
        },
        TicketOp::Unlease { lease, token } | TicketOp::Renew { lease, token } => Out {
            lease: Some(*lease),
            token: Some(token),
            ..none
        },
    };
    out.serialize(ser)
}

/// `Option<&[u8]>` as msgpack bin.
mod opt_bytes {
    pub fn serialize<S: serde::Serializer>(v: &Option<&[u8]>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_bytes(b),
            None => s.serialize_none(),
        }
    }
}

fn out_descriptor(d: &Descriptor) -> OutAny<'_> {
    if let Descriptor::Ticket(t) = d {
        return OutAny::Ticket(OutTicket {
            k: "ticket",
            n: t.len,
            owner: &t.owner,
            addr: t.addr.as_deref(),
            lease: t.lease,
            token: &t.token,
            digest: &t.digest,
            ttl: t.ttl_ms,
            lazy: t.lazy,
        });
    }
    let plain = OutDescriptor {
        k: d.kind(),
        n: None,
        off: None,
        size: None,
        lease: None,
        sealed: None,
        key: None,
    };
    OutAny::Plain(match d {
        Descriptor::Inline { len } => OutDescriptor { n: Some(*len), ..plain },
        Descriptor::Ticket(_) => unreachable!("handled above"),
        Descriptor::Shm {
            len,
            offset,
            size,
            lease,
            sealed,
        } => OutDescriptor {
            n: Some(*len),
            off: Some(*offset),
            size: Some(*size),
            lease: Some(*lease),
            sealed: Some(*sealed),
            ..plain
        },
        Descriptor::Tag { key } => OutDescriptor {
            key: Some(key),
            ..plain
        },
    })
}

fn decode_descriptor(index: usize, d: RawDescriptor<'_>) -> Result<Descriptor, WireError> {
    let kind =
        d.k.ok_or_else(|| WireError::MalformedHeader(format!("frame {index}: descriptor lacks field \"k\"")))?;
    let len = || {
        d.n.ok_or_else(|| WireError::MalformedHeader(format!("frame {index}: {kind:?} descriptor lacks field \"n\"")))
    };
    match kind {
        "inline" => Ok(Descriptor::Inline { len: len()? }),
        "shm" => {
            let field = |v: Option<u64>, name: &str| {
                v.ok_or_else(|| {
                    WireError::MalformedHeader(format!("frame {index}: \"shm\" descriptor lacks field {name:?}"))
                })
            };
            let len = len()?;
            let offset = field(d.off, "off")?;
            let size = field(d.size, "size")?;
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(WireError::MalformedHeader(format!(
                    "frame {index}: shm window {offset}+{len} exceeds the segment size {size}"
                )));
            }
            Ok(Descriptor::Shm {
                len,
                offset,
                size,
                lease: field(d.lease, "lease")?,
                sealed: d.sealed.unwrap_or(false),
            })
        }
        "ticket" => {
            let need = |what: &str| {
                WireError::MalformedHeader(format!("frame {index}: \"ticket\" descriptor lacks field {what:?}"))
            };
            let bytes32 = |v: Option<Vec<u8>>, what: &str| {
                let v = v.ok_or_else(|| need(what))?;
                if v.len() != 32 {
                    return Err(WireError::MalformedHeader(format!(
                        "frame {index}: ticket {what} must be 32 bytes, got {}",
                        v.len()
                    )));
                }
                Ok(v)
            };
            Ok(Descriptor::Ticket(TicketClaim {
                len: len()?,
                owner: d.owner.clone().ok_or_else(|| need("owner"))?,
                addr: d.addr.clone(),
                lease: d.lease.ok_or_else(|| need("lease"))?,
                token: bytes32(d.token.clone(), "token")?,
                digest: bytes32(d.digest.clone(), "digest")?,
                ttl_ms: d.ttl.ok_or_else(|| need("ttl"))?,
                lazy: d.lazy.unwrap_or(false),
            }))
        }
        "tag" => Ok(Descriptor::Tag {
            key: d.key.clone().ok_or_else(|| {
                WireError::MalformedHeader(format!("frame {index}: \"tag\" descriptor lacks field \"key\""))
            })?,
        }),
        other => Err(WireError::UnknownDescriptor {
            index,
            kind: other.to_string(),
        }),
    }
}

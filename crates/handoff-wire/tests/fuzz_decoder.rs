//! Property-based fuzzing of the decoder: preamble, framing, header and codec. One property
//! after another for one decoder: long, but one idea, so one file.
//!
//! Every property here holds for *any* input bytes a peer could send: the decoder
//! returns `Ok` or a [`WireError`] with the right code, and never panics, on a TCP
//! connection (`decode_message`: inline frames and tickets) and on a Unix socket
//! (`decode_message_on(.., UNIX_KINDS)`: inline, shm and tickets). Valid messages,
//! the ticket protocol's headers among them, round-trip, their prefixes are
//! `truncated`, and the codec moves [`Buffer`]s out of band and back without copying them.
//! Tickets marked `lazy` round-trip and leave unmarked tickets' bytes as they were; resource
//! keys (msgpack ext type 2) bind to the receiver's registry or fail with `unknown-resource`,
//! and no extension type of any payload makes the codec panic.
//!
//! The case count is modest so the file runs in a few seconds in debug mode; set
//! `PROPTEST_CASES` to fuzz longer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use handoff_wire::framing::{self, decode_message_on, LEN_PREFIX};
use handoff_wire::preamble::{MAGIC, PREAMBLE_LEN};
use handoff_wire::resource::{AnyResource, Resolver};
use handoff_wire::{
    decode_message, Buffer, Descriptor, Header, Hello, Ident, Limits, Preamble, Resource, ResourceError, ResourceKey,
    Resources, TicketClaim, TicketOp, WireError, EXT_FRAME_REF, EXT_RESOURCE_KEY,
};
use proptest::collection::vec;
use proptest::prelude::*;
use serde::{Deserialize, Serialize, Serializer};

/// Every code a decoder may report.
const CODES: &[&str] = &[
    "truncated",
    "bad-magic",
    "unsupported-version",
    "header-too-large",
    "too-many-frames",
    "frame-too-large",
    "message-too-large",
    "malformed-header",
    "unknown-kind",
    "unknown-descriptor",
    "unsupported-descriptor",
    "bad-frame-ref",
    "bad-body",
    "unknown-resource",
    "bad-shm",
    "unknown-type",
    "handshake",
    "auth-failed",
];

/// The descriptor kinds a Unix socket (channel `shm`) carries: inline, shm and ticket.
const SHM: &[&str] = framing::UNIX_KINDS;
/// The descriptor kinds a TCP connection carries: inline and ticket.
const TCP: &[&str] = framing::TCP_KINDS;

/// Limits that accept anything, to look at descriptors whatever their lengths.
const UNLIMITED: Limits = Limits {
    max_header_bytes: u32::MAX,
    max_frames: u32::MAX,
    max_frame_bytes: u64::MAX,
    max_message_bytes: u64::MAX,
    ..Limits::DEFAULT
};

fn config() -> ProptestConfig {
    ProptestConfig {
        // Failures are reported with the minimal input; do not write regression files
        // into the source tree.
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

fn assert_known_code(e: &WireError) {
    assert!(CODES.contains(&e.code()), "unknown error code {:?} for {e}", e.code());
    // Display must not panic either.
    let _ = e.to_string();
}

// ---------------------------------------------------------------------------
// Owned headers and message encoding
// ---------------------------------------------------------------------------

/// An owned header the strategies generate; [`OwnedHeader::header`] borrows it as a [`Header`].
#[derive(Debug, Clone)]
enum OwnedHeader {
    Msg {
        type_name: String,
        body: Vec<u8>,
        frames: Vec<Vec<u8>>,
    },
    Hello(Hello),
    Challenge {
        version: u16,
        nonce: Vec<u8>,
    },
    Ident(Ident),
    Auth(Vec<u8>),
    Ready,
    Release(Vec<u64>),
    Error {
        code: String,
        message: String,
    },
    /// A ticket-protocol header other than `pulled`.
    Ticket(TicketOp),
    /// A `pulled` header and the bytes that follow it.
    Pulled {
        req: u64,
        bytes: Vec<u8>,
    },
}

impl OwnedHeader {
    fn header(&self) -> Header<'_> {
        match self {
            OwnedHeader::Msg {
                type_name,
                body,
                frames,
            } => Header::Msg {
                type_name,
                body,
                frames: frames
                    .iter()
                    .map(|f| Descriptor::Inline { len: f.len() as u64 })
                    .collect(),
            },
            OwnedHeader::Hello(h) => Header::Hello(h.clone()),
            OwnedHeader::Challenge { version, nonce } => Header::Challenge {
                version: *version,
                nonce: nonce.clone(),
            },
            OwnedHeader::Ident(i) => Header::Ident(i.clone()),
            OwnedHeader::Auth(mac) => Header::Auth { mac: mac.clone() },
            OwnedHeader::Ready => Header::Ready,
            OwnedHeader::Release(leases) => Header::Release { leases: leases.clone() },
            OwnedHeader::Error { code, message } => Header::Error {
                code: code.clone(),
                message: message.clone(),
            },
            OwnedHeader::Ticket(op) => Header::Ticket(op.clone()),
            OwnedHeader::Pulled { req, bytes } => Header::Ticket(TicketOp::Pulled {
                req: *req,
                len: bytes.len() as u64,
            }),
        }
    }

    /// The bytes that follow the header: a msg's inline frames, a `pulled`'s bytes.
    fn frames(&self) -> &[Vec<u8>] {
        match self {
            OwnedHeader::Msg { frames, .. } => frames,
            OwnedHeader::Pulled { bytes, .. } => std::slice::from_ref(bytes),
            _ => &[],
        }
    }

    /// `len | header | inline frames`, as a sender writes it.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        framing::encode_header_into(&self.header(), &mut out);
        for f in self.frames() {
            out.extend_from_slice(f);
        }
        out
    }
}

fn text() -> impl Strategy<Value = String> {
    "(?s).{0,24}"
}

/// Text for an identity field: at most 8 characters, so at most 32 bytes of UTF-8, within
/// every field's bound (spec §5.2; the bounds themselves have tests of their own).
fn ident_text() -> impl Strategy<Value = String> {
    "(?s).{0,8}"
}

fn msg_strategy() -> impl Strategy<Value = OwnedHeader> {
    (text(), vec(any::<u8>(), 0..256), vec(vec(any::<u8>(), 0..48), 0..8)).prop_map(|(type_name, body, frames)| {
        OwnedHeader::Msg {
            type_name,
            body,
            frames,
        }
    })
}

fn hello_strategy() -> impl Strategy<Value = Hello> {
    (
        (
            ident_text(),
            ident_text(),
            ident_text(),
            any::<u32>(),
            ident_text(),
            ident_text(),
        ),
        (
            ident_text(),
            any::<u16>(),
            vec(ident_text(), 0..4),
            vec(any::<u8>(), 32..=32),
            proptest::option::of(ident_text()),
            proptest::option::of(ident_text()),
        ),
    )
        .prop_map(
            |(
                (node_id, name, host_id, pid, process_id, language),
                (implementation, version, capabilities, nonce, listen, unix),
            )| {
                Hello {
                    node_id,
                    name,
                    host_id,
                    pid,
                    process_id,
                    language,
                    implementation,
                    version,
                    capabilities,
                    nonce,
                    listen,
                    unix,
                }
            },
        )
}

fn leases_strategy() -> impl Strategy<Value = Vec<u64>> {
    vec(prop_oneof![0u64..1000, any::<u64>()], 0..8)
}

/// An `shm` descriptor whose window lies in its segment (`off + n <= size`): small
/// numbers, any numbers, windows that end exactly at the segment's end.
fn shm_descriptor() -> impl Strategy<Value = Descriptor> {
    (
        prop_oneof![
            (0u64..64, 0u64..64, 0u64..64),
            (any::<u64>(), any::<u64>(), any::<u64>())
        ],
        any::<u64>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|((size, a, b), lease, sealed, fill)| {
            let offset = if size == u64::MAX { a } else { a % (size + 1) };
            let room = size - offset;
            let len = if fill < 48 || room == u64::MAX {
                room
            } else {
                b % (room + 1)
            };
            Descriptor::Shm {
                len,
                offset,
                size,
                lease,
                sealed,
            }
        })
}

/// `(size, off, n)` of a window that ends past its segment (`off + n > size`, also when the
/// sum overflows), among them windows one byte too long.
fn shm_window_outside() -> impl Strategy<Value = (u64, u64, u64)> {
    prop_oneof![
        (0u64..64, 0u64..64, 0u64..64),
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u64>(), any::<u64>(), Just(0u64)).prop_map(|(size, a, _)| {
            let offset = if size == u64::MAX { a } else { a % (size + 1) };
            (size, offset, (size - offset).wrapping_add(1))
        }),
    ]
    .prop_filter("the window must end past the segment", |&(size, off, n)| {
        off as u128 + n as u128 > size as u128
    })
}

/// The frames of a message on a Unix socket: inline bytes (`Ok`) or shm windows (`Err`).
fn shm_parts() -> impl Strategy<Value = Vec<Result<Vec<u8>, Descriptor>>> {
    vec(
        prop_oneof![vec(any::<u8>(), 0..48).prop_map(Ok), shm_descriptor().prop_map(Err)],
        0..8,
    )
}

/// The header and the wire bytes of a message with `parts` as its frames.
fn shm_message<'a>(type_name: &'a str, body: &'a [u8], parts: &[Result<Vec<u8>, Descriptor>]) -> (Header<'a>, Vec<u8>) {
    let frames = parts
        .iter()
        .map(|p| match p {
            Ok(bytes) => Descriptor::Inline {
                len: bytes.len() as u64,
            },
            Err(shm) => shm.clone(),
        })
        .collect();
    let header = Header::Msg {
        type_name,
        body,
        frames,
    };
    let mut wire = Vec::new();
    framing::encode_header_into(&header, &mut wire);
    for bytes in parts.iter().filter_map(|p| p.as_ref().ok()) {
        wire.extend_from_slice(bytes);
    }
    (header, wire)
}

fn token() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 32..=32)
}

/// Small numbers (request and lease ids, offsets) and any numbers.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, any::<u64>()]
}

/// A ticket with arbitrary fields (its token 32 bytes, its digest BLAKE3's 32 or XXH3-128's 16,
/// as they must be), lazy or not.
fn ticket_claim() -> impl Strategy<Value = TicketClaim> {
    let digest = prop_oneof![
        any::<[u8; 32]>().prop_map(handoff_wire::TicketDigest::Blake3),
        any::<[u8; 16]>().prop_map(handoff_wire::TicketDigest::Xxh3),
    ];
    (
        number(),
        text(),
        proptest::option::of(text()),
        number(),
        token(),
        digest,
        number(),
        any::<bool>(),
    )
        .prop_map(|(len, owner, addr, lease, token, digest, ttl_ms, lazy)| TicketClaim {
            len,
            owner,
            addr,
            lease,
            token,
            digest,
            ttl_ms,
            lazy,
        })
}

/// Any ticket-protocol operation; a `pulled` announces any length.
fn ticket_op() -> impl Strategy<Value = TicketOp> {
    prop_oneof![
        (number(), number(), token(), number(), number()).prop_map(|(req, lease, token, offset, len)| TicketOp::Pull {
            req,
            lease,
            token,
            offset,
            len
        }),
        (number(), number()).prop_map(|(req, len)| TicketOp::Pulled { req, len }),
        (number(), number(), token(), text()).prop_map(|(req, lease, token, to)| TicketOp::Forward {
            req,
            lease,
            token,
            to
        }),
        (number(), token()).prop_map(|(req, token)| TicketOp::Forwarded { req, token }),
        (
            number(),
            prop_oneof![
                Just("unknown-lease".to_string()),
                Just("bad-token".to_string()),
                Just("expired".to_string()),
                Just("out-of-range".to_string()),
                text(),
            ],
            text()
        )
            .prop_map(|(req, code, message)| TicketOp::Refused { req, code, message }),
        (number(), token()).prop_map(|(lease, token)| TicketOp::Unlease { lease, token }),
        (number(), token()).prop_map(|(lease, token)| TicketOp::Renew { lease, token }),
    ]
}

/// A ticket-protocol header as a whole message: a `pulled` comes with its bytes.
fn ticket_header() -> impl Strategy<Value = OwnedHeader> {
    prop_oneof![
        3 => ticket_op().prop_filter_map("pulled comes with its bytes", |op| match op {
            TicketOp::Pulled { .. } => None,
            op => Some(OwnedHeader::Ticket(op)),
        }),
        1 => (number(), vec(any::<u8>(), 0..64)).prop_map(|(req, bytes)| OwnedHeader::Pulled { req, bytes }),
    ]
}

fn header_strategy() -> impl Strategy<Value = OwnedHeader> {
    prop_oneof![
        6 => msg_strategy(),
        1 => hello_strategy().prop_map(OwnedHeader::Hello),
        1 => (any::<u16>(), vec(any::<u8>(), 32..=32))
            .prop_map(|(version, nonce)| OwnedHeader::Challenge { version, nonce }),
        1 => hello_strategy().prop_map(|h| OwnedHeader::Ident(h.ident())),
        1 => vec(any::<u8>(), 32..=32).prop_map(OwnedHeader::Auth),
        1 => Just(OwnedHeader::Ready),
        1 => leases_strategy().prop_map(OwnedHeader::Release),
        1 => (text(), text()).prop_map(|(code, message)| OwnedHeader::Error { code, message }),
        2 => ticket_header(),
    ]
}

// ---------------------------------------------------------------------------
// A small msgpack value model, to build structured (not just random) inputs
// ---------------------------------------------------------------------------

/// A msgpack value; serialized with `rmp_serde` (bytes as `bin`, `Ext` as an extension).
#[derive(Debug, Clone)]
enum Mp {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    F64(f64),
    Str(String),
    Bin(Vec<u8>),
    Ext(i8, Vec<u8>),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
}

impl Serialize for Mp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Mp::Nil => s.serialize_unit(),
            Mp::Bool(b) => s.serialize_bool(*b),
            Mp::Int(i) => s.serialize_i64(*i),
            Mp::UInt(u) => s.serialize_u64(*u),
            Mp::F64(f) => s.serialize_f64(*f),
            Mp::Str(t) => s.serialize_str(t),
            Mp::Bin(b) => s.serialize_bytes(b),
            Mp::Ext(tag, data) => s.serialize_newtype_struct(
                rmp_serde::MSGPACK_EXT_STRUCT_NAME,
                &(*tag, serde_bytes::Bytes::new(data)),
            ),
            Mp::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for i in items {
                    seq.serialize_element(i)?;
                }
                seq.end()
            }
            Mp::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

fn mp_to_vec(v: &Mp) -> Vec<u8> {
    rmp_serde::to_vec(v).expect("serializing a msgpack value into memory")
}

/// A frame reference as the codec writes it: `fixext4`, type [`EXT_FRAME_REF`], u32 index.
fn frame_ref(index: u32) -> Mp {
    Mp::Ext(EXT_FRAME_REF, index.to_be_bytes().to_vec())
}

/// The words of tickets, as strings that may turn up anywhere.
const TICKET_WORDS: &str =
    "ticket owner addr token digest ttl pull pulled forward forwarded ticket-error unlease renew req to";

fn mp_leaf() -> impl Strategy<Value = Mp> {
    prop_oneof![
        Just(Mp::Nil),
        any::<bool>().prop_map(Mp::Bool),
        any::<i64>().prop_map(Mp::Int),
        any::<u64>().prop_map(Mp::UInt),
        (0u64..64).prop_map(Mp::UInt),
        any::<f64>().prop_map(Mp::F64),
        text().prop_map(Mp::Str),
        prop_oneof![
            "k", "t", "b", "f", "n", "key", "inline", "msg", "data", "parts", "maybe", "id", "name", "shm", "off",
            "size", "lease", "sealed", "release", "leases", "unix"
        ]
        .prop_map(|s| Mp::Str(s.to_string())),
        prop::sample::select(TICKET_WORDS.split(' ').collect::<Vec<_>>()).prop_map(|s| Mp::Str(s.to_string())),
        vec(any::<u8>(), 0..16).prop_map(Mp::Bin),
        (any::<i8>(), vec(any::<u8>(), 0..6)).prop_map(|(t, d)| Mp::Ext(t, d)),
        (0u32..6).prop_map(frame_ref),
        any::<u32>().prop_map(frame_ref),
        prop_oneof![Just("db"), Just("cache"), Just("dataset:x"), Just("")].prop_map(resource_key),
        text().prop_map(|k| resource_key(&k)),
        vec(any::<u8>(), 0..8).prop_map(|d| Mp::Ext(EXT_RESOURCE_KEY, d)),
    ]
}

/// A resource key as the codec writes it: ext type [`EXT_RESOURCE_KEY`], the key in UTF-8.
fn resource_key(k: &str) -> Mp {
    Mp::Ext(EXT_RESOURCE_KEY, k.as_bytes().to_vec())
}

fn mp_strategy() -> impl Strategy<Value = Mp> {
    mp_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Mp::Arr),
            vec((inner.clone(), inner), 0..6).prop_map(Mp::Map),
        ]
    })
}

fn key(k: &str) -> Mp {
    Mp::Str(k.to_string())
}

/// A value of the right type for one header key.
fn header_field(name: &'static str) -> BoxedStrategy<Mp> {
    match name {
        "b" | "nonce" | "mac" | "token" => prop_oneof![
            vec(any::<u8>(), 0..40).prop_map(Mp::Bin),
            vec(any::<u8>(), 32..=32).prop_map(Mp::Bin),
        ]
        .boxed(),
        "f" => vec(descriptor_mp(), 0..5).prop_map(Mp::Arr).boxed(),
        "pid" | "v" => prop_oneof![
            (0u64..1 << 16).prop_map(Mp::UInt),
            any::<u32>().prop_map(|v| Mp::UInt(v as u64))
        ]
        .boxed(),
        "caps" => vec(ident_text().prop_map(Mp::Str), 0..3).prop_map(Mp::Arr).boxed(),
        "node" | "name" | "host" | "proc" | "lang" | "impl" | "listen" | "unix" => {
            ident_text().prop_map(Mp::Str).boxed()
        }
        "leases" => leases_strategy()
            .prop_map(|l| Mp::Arr(l.into_iter().map(Mp::UInt).collect()))
            .boxed(),
        // Mostly small, so that a `pulled` often finds its bytes in the tail.
        "req" | "lease" | "off" | "n" => prop_oneof![
            4 => (0u64..64).prop_map(Mp::UInt),
            1 => any::<u64>().prop_map(Mp::UInt),
        ]
        .boxed(),
        _ => text().prop_map(Mp::Str).boxed(),
    }
}

fn descriptor_mp() -> impl Strategy<Value = Mp> {
    let kind = prop_oneof![
        6 => Just("inline"), 3 => Just("shm"), 1 => Just("ticket"), 1 => Just("tag"), 1 => Just("x")
    ];
    let small = |max: u64| {
        prop_oneof![
            16 => (0u64..max).prop_map(Mp::UInt),
            1 => any::<u64>().prop_map(Mp::UInt),
            1 => mp_leaf(),
        ]
    };
    let sealed = prop_oneof![12 => any::<bool>().prop_map(Mp::Bool), 1 => mp_leaf()];
    let bytes32 = prop_oneof![
        12 => vec(any::<u8>(), 32..=32).prop_map(Mp::Bin),
        1 => vec(any::<u8>(), 0..40).prop_map(Mp::Bin),
        1 => mp_leaf(),
    ];
    let text_or_not = prop_oneof![12 => text().prop_map(Mp::Str), 1 => mp_leaf()];
    (
        proptest::option::weighted(0.95, kind),
        proptest::option::weighted(0.9, small(16)),
        proptest::option::of(text().prop_map(Mp::Str)),
        // off, size, lease, sealed: mostly present in `shm` descriptors, rarely elsewhere.
        (
            proptest::option::weighted(0.95, small(16)),
            proptest::option::weighted(0.95, small(48)),
            proptest::option::weighted(0.95, small(1000)),
            proptest::option::weighted(0.9, sealed),
        ),
        // owner, addr, token, digest, ttl, lazy: mostly present in `ticket` descriptors.
        (
            proptest::option::weighted(0.95, text_or_not.clone()),
            proptest::option::of(text_or_not),
            proptest::option::weighted(0.95, bytes32.clone()),
            proptest::option::weighted(0.95, bytes32),
            proptest::option::weighted(0.95, small(60_000)),
            proptest::option::of(prop_oneof![12 => any::<bool>().prop_map(Mp::Bool), 1 => mp_leaf()]),
        ),
        any::<u8>(),
    )
        .prop_map(|(k, n, tag_key, (off, size, lease, sealed), ticket, elsewhere)| {
            let (owner, addr, token, digest, ttl, lazy) = ticket;
            let ticket_keys = k == Some("ticket") || elsewhere % 16 == 0;
            let shm_keys = k == Some("shm") || elsewhere < 25;
            let mut entries = Vec::new();
            if let Some(k) = k {
                entries.push((key("k"), key(k)));
            }
            if let Some(n) = n {
                entries.push((key("n"), n));
            }
            if let Some(t) = tag_key {
                entries.push((key("key"), t));
            }
            if shm_keys {
                for (name, value) in [
                    ("off", off),
                    ("size", size),
                    ("lease", lease.clone()),
                    ("sealed", sealed),
                ] {
                    if let Some(v) = value {
                        entries.push((key(name), v));
                    }
                }
            }
            if ticket_keys {
                let lease = if shm_keys { None } else { lease };
                for (name, value) in [
                    ("owner", owner),
                    ("addr", addr),
                    ("lease", lease),
                    ("token", token),
                    ("digest", digest),
                    ("ttl", ttl),
                    ("lazy", lazy),
                ] {
                    if let Some(v) = value {
                        entries.push((key(name), v));
                    }
                }
            }
            Mp::Map(entries)
        })
}

const HEADER_KEYS: &[&str] = &[
    "t", "b", "f", "node", "name", "host", "pid", "proc", "lang", "impl", "v", "caps", "nonce", "listen", "unix",
    "leases", "mac", "code", "msg", "req", "lease", "token", "off", "n", "to", "extra",
];

/// The keys a header of `kind` must (or, for `listen` and `unix`, may) have.
fn required(kind: &str, k: &str) -> bool {
    match kind {
        "msg" => matches!(k, "t" | "b" | "f"),
        "hello" => matches!(
            k,
            "node" | "name" | "host" | "pid" | "proc" | "lang" | "impl" | "v" | "caps" | "nonce" | "listen" | "unix"
        ),
        "challenge" => matches!(k, "v" | "nonce"),
        "ident" => matches!(
            k,
            "node" | "name" | "host" | "pid" | "proc" | "lang" | "impl" | "caps" | "listen" | "unix"
        ),
        "auth" => k == "mac",
        "release" => k == "leases",
        "error" => matches!(k, "code" | "msg"),
        "pull" => matches!(k, "req" | "lease" | "token" | "off" | "n"),
        "pulled" => matches!(k, "req" | "n"),
        "forward" => matches!(k, "req" | "lease" | "token" | "to"),
        "forwarded" => matches!(k, "req" | "token"),
        "ticket-error" => matches!(k, "req" | "code" | "msg"),
        "unlease" | "renew" => matches!(k, "lease" | "token"),
        _ => false,
    }
}

/// A header map of a random kind built from the known keys: the keys its kind needs
/// (mostly), others (sometimes), values mostly of the right type, in random order.
fn structured_header() -> impl Strategy<Value = Mp> {
    let kind = prop_oneof![
        Just("msg"),
        Just("hello"),
        Just("challenge"),
        Just("ident"),
        Just("auth"),
        Just("ready"),
        Just("release"),
        Just("error"),
        Just("pull"),
        Just("pulled"),
        Just("forward"),
        Just("forwarded"),
        Just("ticket-error"),
        Just("unlease"),
        Just("renew"),
        Just("nope")
    ];
    let fields: Vec<BoxedStrategy<(u8, u8, Mp, Mp)>> = HEADER_KEYS
        .iter()
        .map(|&k| (any::<u8>(), any::<u8>(), header_field(k), mp_strategy()).boxed())
        .collect();
    let k_field = (any::<u8>(), any::<u8>(), mp_strategy());
    (kind, k_field, fields, any::<u64>()).prop_map(|(kind, (k_present, k_wrong, k_chaos), fields, seed)| {
        let mut entries = Vec::new();
        if k_present < 250 {
            entries.push((key("k"), if k_wrong < 8 { k_chaos } else { key(kind) }));
        }
        for (&name, (present, wrong, right, chaos)) in HEADER_KEYS.iter().zip(fields) {
            let p = if required(kind, name) { 245 } else { 40 };
            if present < p {
                entries.push((key(name), if wrong < 10 { chaos } else { right }));
            }
        }
        // A cheap deterministic shuffle: decoders must accept keys in any order.
        let n = entries.len();
        let mut s = seed;
        for i in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            entries.swap(i, (s >> 33) as usize % (i + 1));
        }
        Mp::Map(entries)
    })
}

fn with_prefix(header: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(header);
    out
}

/// Checks the invariants of a decode result for any input, on a TCP connection (inline and
/// ticket) and on a Unix socket (inline, shm and ticket), and how the two results relate.
fn check_decoded(input: &[u8], limits: &Limits) {
    let tcp = decode_message(input, limits);
    let unix = decode_message_on(input, limits, SHM);
    check_result(input, limits, &tcp, false);
    check_result(input, limits, &unix, true);
    match (&tcp, &unix) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) if a == b => {}
        // Only a shm descriptor may tell the two apart, and only on TCP.
        (Err(WireError::UnsupportedDescriptor { kind, .. }), _) if kind == "shm" => {}
        (a, b) => panic!("tcp: {a:?}, unix socket: {b:?}"),
    }
}

fn check_result(input: &[u8], limits: &Limits, result: &Result<framing::DecodedMessage<'_>, WireError>, shm: bool) {
    let m = match result {
        Ok(m) => m,
        Err(e) => {
            assert_known_code(e);
            assert_ne!(
                e.code(),
                "bad-shm",
                "bad-shm needs file descriptors, which a byte decoder never sees"
            );
            return;
        }
    };
    assert!(m.consumed <= input.len());
    assert!(m.consumed >= LEN_PREFIX);
    let frame_bytes: usize = m.frames.iter().map(|f| f.len()).sum();
    let header_len = u32::from_be_bytes(input[..4].try_into().unwrap()) as usize;
    assert_eq!(m.consumed, LEN_PREFIX + header_len + frame_bytes);
    match &m.header {
        Header::Msg { frames, .. } => {
            assert!(frames.len() <= limits.max_frames as usize);
            // `frames` holds the inline frames' bytes only, in order.
            let inline: Vec<&Descriptor> = frames
                .iter()
                .filter(|d| matches!(d, Descriptor::Inline { .. }))
                .collect();
            assert_eq!(inline.len(), m.frames.len());
            for (d, f) in inline.iter().zip(&m.frames) {
                assert_eq!(*d, &Descriptor::Inline { len: f.len() as u64 });
            }
            // Every frame, inline or shm, counts toward the limits.
            let mut total: u64 = 0;
            for d in frames {
                match d {
                    Descriptor::Inline { .. } => {}
                    Descriptor::Shm { len, offset, size, .. } => {
                        assert!(shm, "a shm descriptor accepted on TCP: {d:?}");
                        assert!(offset.checked_add(*len).is_some_and(|end| end <= *size), "{d:?}");
                    }
                    // A ticket carries no bytes in the stream, on either channel.
                    Descriptor::Ticket(t) => assert_eq!(t.token.len(), 32),
                    other => panic!("accepted a descriptor no channel carries: {other:?}"),
                }
                assert!(d.len() <= limits.max_frame_bytes);
                total = total.saturating_add(d.len());
            }
            assert!(total <= limits.max_message_bytes);
        }
        // The bytes of a `pulled` follow its header as one frame, within the frame limits.
        Header::Ticket(TicketOp::Pulled { len, .. }) => {
            assert_eq!(m.frames.len(), 1);
            assert_eq!(m.frames[0].len() as u64, *len);
            assert!(*len <= limits.max_frame_bytes && *len <= limits.max_message_bytes);
        }
        other => {
            assert!(m.frames.is_empty(), "{other:?} has no frames");
            match other {
                Header::Hello(h) => assert_eq!(h.nonce.len(), 32),
                Header::Challenge { nonce, .. } => assert_eq!(nonce.len(), 32),
                Header::Auth { mac } => assert_eq!(mac.len(), 32),
                Header::Ticket(
                    TicketOp::Pull { token, .. }
                    | TicketOp::Forward { token, .. }
                    | TicketOp::Forwarded { token, .. }
                    | TicketOp::Unlease { token, .. }
                    | TicketOp::Renew { token, .. },
                ) => assert_eq!(token.len(), 32),
                _ => {}
            }
        }
    }
    // A decoded header re-encodes and decodes to itself.
    let encoded = m.header.encode();
    let again = Header::decode(&encoded, limits).expect("a decoded header re-encodes validly");
    assert_eq!(again, m.header);
}

// ---------------------------------------------------------------------------
// Codec test types
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payload {
    id: u64,
    name: String,
    data: Buffer,
    parts: Vec<Buffer>,
    maybe: Option<Buffer>,
    inner: Inner,
    tags: BTreeMap<String, Buffer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inner {
    count: u64,
    blob: Option<Buffer>,
}

impl Payload {
    /// The buffers in the order the codec serializes them (field order).
    fn buffers(&self) -> Vec<&Buffer> {
        let mut out = vec![&self.data];
        out.extend(&self.parts);
        out.extend(&self.maybe);
        out.extend(&self.inner.blob);
        out.extend(self.tags.values());
        out
    }

    fn buffers_mut(&mut self) -> Vec<&mut Buffer> {
        let mut out = vec![&mut self.data];
        out.extend(&mut self.parts);
        out.extend(&mut self.maybe);
        out.extend(&mut self.inner.blob);
        out.extend(self.tags.values_mut());
        out
    }
}

fn buffer_strategy(max: usize) -> impl Strategy<Value = Buffer> {
    prop_oneof![
        vec(any::<u8>(), 0..32).prop_map(Buffer::from),
        vec(any::<u8>(), 0..max).prop_map(Buffer::from),
        // Large buffers (cheap to generate): a repeated byte.
        (any::<u8>(), 0..8 * max).prop_map(|(b, n)| Buffer::from(vec![b; n])),
    ]
}

fn payload_strategy() -> impl Strategy<Value = Payload> {
    (
        any::<u64>(),
        text(),
        buffer_strategy(4096),
        vec(buffer_strategy(512), 0..5),
        proptest::option::of(buffer_strategy(512)),
        (any::<u64>(), proptest::option::of(buffer_strategy(512))),
        proptest::collection::btree_map(text(), buffer_strategy(64), 0..3),
    )
        .prop_map(|(id, name, data, parts, maybe, (count, blob), tags)| Payload {
            id,
            name,
            data,
            parts,
            maybe,
            inner: Inner { count, blob },
            tags,
        })
}

/// The received frames as buffers (what the runtime hands to the codec).
fn as_buffers(frames: &[Bytes]) -> Vec<Buffer> {
    frames.iter().cloned().map(Buffer::from).collect()
}

/// Sends `value` as a whole wire message and decodes it as the receiver does: the frames
/// are zero-copy slices of one received buffer.
fn send_and_receive(value: &Payload) -> (Payload, Bytes, Vec<Bytes>) {
    let encoded = handoff_wire::encode(value, None).expect("encoding a payload");
    let header = Header::Msg {
        type_name: "t",
        body: &encoded.body,
        frames: encoded
            .frames
            .iter()
            .map(|f| Descriptor::Inline { len: f.len() as u64 })
            .collect(),
    };
    let mut wire = Vec::new();
    framing::encode_header_into(&header, &mut wire);
    for f in &encoded.frames {
        wire.extend_from_slice(f);
    }
    let received = Bytes::from(wire);
    let m = decode_message(&received, &Limits::DEFAULT).expect("a valid message decodes");
    assert_eq!(m.consumed, received.len());
    let Header::Msg { type_name, body, .. } = m.header else {
        panic!("expected a msg header, got {:?}", m.header)
    };
    let frames: Vec<Bytes> = m
        .frames
        .iter()
        .map(|f| {
            if f.is_empty() {
                Bytes::new()
            } else {
                received.slice_ref(f)
            }
        })
        .collect();
    let decoded: Payload =
        handoff_wire::decode(type_name, body, &as_buffers(&frames), None).expect("decoding the body");
    (decoded, received, frames)
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// `decode_message` on arbitrary bytes returns Ok or a known error, never panics.
    #[test]
    fn decode_message_arbitrary_bytes(bytes in vec(any::<u8>(), 0..512)) {
        check_decoded(&bytes, &Limits::DEFAULT);
    }

    /// Arbitrary bytes behind a length prefix that fits them: the header decoder sees them.
    #[test]
    fn decode_message_arbitrary_header(header in vec(any::<u8>(), 0..256), tail in vec(any::<u8>(), 0..64)) {
        let mut input = with_prefix(&header);
        input.extend_from_slice(&tail);
        check_decoded(&input, &Limits::DEFAULT);
    }

    /// Random msgpack maps built from the header's keys, in any order, with right or wrong types.
    #[test]
    fn decode_message_structured_header(header in structured_header(), tail in vec(any::<u8>(), 0..64)) {
        let mut input = with_prefix(&mp_to_vec(&header));
        input.extend_from_slice(&tail);
        check_decoded(&input, &Limits::DEFAULT);
        let small = Limits { max_header_bytes: 64, max_frames: 2, max_frame_bytes: 8, max_message_bytes: 12, ..Limits::DEFAULT };
        check_decoded(&input, &small);
    }

    /// Arbitrary msgpack values (not only maps) as headers.
    #[test]
    fn decode_message_any_msgpack(value in mp_strategy()) {
        let input = with_prefix(&mp_to_vec(&value));
        check_decoded(&input, &Limits::DEFAULT);
    }

    /// `Preamble::decode` on arbitrary bytes never panics; Ok only for a well-formed preamble.
    #[test]
    fn preamble_arbitrary_bytes(bytes in vec(any::<u8>(), 0..40), magic in any::<bool>()) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(&MAGIC);
        }
        match Preamble::decode(&bytes) {
            Ok(p) => {
                prop_assert!(bytes.len() >= PREAMBLE_LEN);
                prop_assert!(p.min_version >= 1 && p.min_version <= p.max_version);
                prop_assert_eq!(&p.encode()[..], &bytes[..PREAMBLE_LEN]);
                for ours in [Preamble::OURS, Preamble::ACCEPTING_V1, Preamble::V1_ONLY] {
                    let _ = ours.negotiate(&p);
                    let _ = p.negotiate(&ours);
                }
            }
            Err(e) => {
                assert_known_code(&e);
                let expected = if bytes.len() < PREAMBLE_LEN {
                    "truncated"
                } else if bytes[..8] != MAGIC {
                    "bad-magic"
                } else {
                    "handshake"
                };
                prop_assert_eq!(e.code(), expected);
            }
        }
    }

    /// Any version range negotiates to a version both speak, or `unsupported-version`.
    #[test]
    fn preamble_round_trip_and_negotiate(a in (1u16..8, 0u16..8, any::<u32>()), b in (1u16..8, 0u16..8)) {
        let ours = Preamble { min_version: a.0, max_version: a.0 + a.1, flags: a.2 };
        let peer = Preamble { min_version: b.0, max_version: b.0 + b.1, flags: 0 };
        prop_assert_eq!(Preamble::decode(&ours.encode()).unwrap(), ours);
        match ours.negotiate(&peer) {
            Ok(v) => {
                prop_assert!(v >= ours.min_version && v <= ours.max_version);
                prop_assert!(v >= peer.min_version && v <= peer.max_version);
                prop_assert_eq!(peer.negotiate(&ours).unwrap(), v);
            }
            Err(e) => {
                prop_assert_eq!(e.code(), "unsupported-version");
                prop_assert!(ours.max_version < peer.min_version || peer.max_version < ours.min_version);
            }
        }
    }

    /// Encoded headers (any kind) and their frames decode back to the same header and frames.
    #[test]
    fn round_trip(owned in header_strategy(), trailing in vec(any::<u8>(), 0..16)) {
        let wire = owned.encode();
        let m = decode_message(&wire, &Limits::DEFAULT).unwrap();
        prop_assert_eq!(&m.header, &owned.header());
        let frames: Vec<&[u8]> = owned.frames().iter().map(|f| &f[..]).collect();
        prop_assert_eq!(&m.frames, &frames);
        prop_assert_eq!(m.consumed, wire.len());

        // Bytes after the message (the next message) are not consumed.
        let mut longer = wire.clone();
        longer.extend_from_slice(&trailing);
        let m2 = decode_message(&longer, &Limits::DEFAULT).unwrap();
        prop_assert_eq!(m2.consumed, wire.len());
        prop_assert_eq!(m2.header, owned.header());

        // Header::encode and encode_header_into agree.
        prop_assert_eq!(&wire[LEN_PREFIX..LEN_PREFIX + owned.header().encode().len()], &owned.header().encode()[..]);
    }

    /// Descriptors of every kind round-trip through `Header`; TCP (`decode_message`) carries
    /// inline frames and tickets and rejects the first shm or tag as `unsupported-descriptor`;
    /// a Unix socket carries inline, shm and ticket and rejects tags.
    #[test]
    fn descriptors_round_trip(
        type_name in text(),
        descs in vec(prop_oneof![
            (0u64..1 << 40).prop_map(|len| Descriptor::Inline { len }),
            shm_descriptor(),
            ticket_claim().prop_map(Descriptor::Ticket),
            text().prop_map(|key| Descriptor::Tag { key }),
        ], 0..6),
    ) {
        let header = Header::Msg { type_name: &type_name, body: b"", frames: descs.clone() };
        let encoded = header.encode();
        prop_assert_eq!(Header::decode(&encoded, &UNLIMITED).unwrap(), header.clone());

        let mut wire = Vec::new();
        framing::encode_header_into(&header, &mut wire);
        for supported in [TCP, SHM] {
            let first_other = descs.iter().position(|d| !supported.contains(&d.kind()));
            match (decode_message_on(&wire, &UNLIMITED, supported), first_other) {
                (Err(e), Some(index)) => prop_assert_eq!(e, WireError::UnsupportedDescriptor {
                    index, kind: descs[index].kind().to_string(),
                }),
                (Err(e), None) => {
                    // Only carried kinds: the (absent) inline frame bytes are missing.
                    prop_assert_eq!(e.code(), "truncated");
                    prop_assert!(descs.iter().any(|d| d.inline_len() > 0));
                }
                (Ok(m), None) => {
                    prop_assert!(descs.iter().all(|d| d.inline_len() == 0));
                    let inline = descs.iter().filter(|d| matches!(d, Descriptor::Inline { .. })).count();
                    prop_assert_eq!(m.frames.len(), inline);
                    prop_assert_eq!(&m.header, &header);
                }
                (Ok(m), Some(_)) => {
                    prop_assert!(false, "accepted a descriptor {:?} does not carry: {:?}", supported, m)
                }
            }
        }
        // No connection carries tags; TCP carries no shm; both carry tickets.
        if descs.iter().any(|d| d.kind() == "tag") {
            prop_assert_eq!(decode_message_on(&wire, &UNLIMITED, SHM).unwrap_err().code(), "unsupported-descriptor");
        }
        if descs.iter().any(|d| matches!(d.kind(), "tag" | "shm")) {
            prop_assert_eq!(decode_message(&wire, &UNLIMITED).unwrap_err().code(), "unsupported-descriptor");
        }
        prop_assert_eq!(decode_message(&wire, &UNLIMITED), decode_message_on(&wire, &UNLIMITED, TCP));
    }

    /// Tickets beside inline frames: only the inline frames' bytes follow the header, on TCP
    /// and on a Unix socket alike; a ticket's `n` counts toward the frame and message limits.
    #[test]
    fn ticket_messages(
        parts in vec(prop_oneof![vec(any::<u8>(), 0..32).prop_map(Ok), ticket_claim().prop_map(Err)], 0..6),
        trailing in vec(any::<u8>(), 0..8),
    ) {
        let descs: Vec<Descriptor> = parts
            .iter()
            .map(|p| match p {
                Ok(bytes) => Descriptor::Inline { len: bytes.len() as u64 },
                Err(claim) => Descriptor::Ticket(claim.clone()),
            })
            .collect();
        let header = Header::Msg { type_name: "demo.Sample", body: &[0x80], frames: descs.clone() };
        let mut wire = Vec::new();
        framing::encode_header_into(&header, &mut wire);
        let inline: Vec<&[u8]> = parts.iter().filter_map(|p| p.as_ref().ok()).map(|b| &b[..]).collect();
        for bytes in &inline {
            wire.extend_from_slice(bytes);
        }
        let mut longer = wire.clone();
        longer.extend_from_slice(&trailing);
        for supported in [TCP, SHM] {
            let m = decode_message_on(&longer, &UNLIMITED, supported).unwrap();
            prop_assert_eq!(&m.header, &header);
            prop_assert_eq!(&m.frames, &inline);
            prop_assert_eq!(m.consumed, wire.len());
        }
        // A receiver that takes no tickets (it did not announce `ticket`) refuses them by its
        // own list of kinds.
        if let Some(index) = descs.iter().position(|d| d.kind() == "ticket") {
            prop_assert_eq!(
                decode_message_on(&wire, &UNLIMITED, &["inline"]).unwrap_err(),
                WireError::UnsupportedDescriptor { index, kind: "ticket".into() }
            );
        }
        let biggest = descs.iter().map(Descriptor::len).max().unwrap_or(0);
        if biggest > 0 {
            let limits = Limits { max_frame_bytes: biggest - 1, ..UNLIMITED };
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "frame-too-large");
        }
        if let Some(total) = descs.iter().try_fold(0u64, |t, d| t.checked_add(d.len())) {
            if total > biggest {
                let limits = Limits { max_frame_bytes: biggest, max_message_bytes: total - 1, ..UNLIMITED };
                prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "message-too-large");
            }
        } else {
            let limits = Limits { max_message_bytes: u64::MAX - 1, ..UNLIMITED };
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "message-too-large");
        }
    }

    /// Every ticket-protocol header round-trips through `Header::encode` and `Header::decode`,
    /// and is canonical: encoding what was decoded gives the same bytes.
    #[test]
    fn ticket_ops_round_trip(op in ticket_op()) {
        let header = Header::Ticket(op.clone());
        let encoded = header.encode();
        let decoded = Header::decode(&encoded, &UNLIMITED).unwrap();
        prop_assert_eq!(&decoded, &header);
        prop_assert_eq!(decoded.encode(), encoded);
        prop_assert_eq!(op.kind(), match op {
            TicketOp::Pull { .. } => "pull",
            TicketOp::Pulled { .. } => "pulled",
            TicketOp::Forward { .. } => "forward",
            TicketOp::Forwarded { .. } => "forwarded",
            TicketOp::Refused { .. } => "ticket-error",
            TicketOp::Unlease { .. } => "unlease",
            TicketOp::Renew { .. } => "renew",
        });
        // Every header but `pulled` is the whole message, on any connection.
        if !matches!(op, TicketOp::Pulled { .. }) {
            let mut wire = Vec::new();
            framing::encode_header_into(&header, &mut wire);
            for supported in [TCP, SHM] {
                let m = decode_message_on(&wire, &Limits::DEFAULT, supported).unwrap();
                prop_assert_eq!(&m.header, &header);
                prop_assert!(m.frames.is_empty());
                prop_assert_eq!(m.consumed, wire.len());
            }
        }
    }

    /// `pulled` and its `n` bytes: `decode_message` returns them as the only frame; every strict
    /// prefix is `truncated`; `n` is held to the frame and message limits from the header alone.
    #[test]
    fn pulled_message(req in number(), bytes in vec(any::<u8>(), 0..96), trailing in vec(any::<u8>(), 0..8)) {
        let owned = OwnedHeader::Pulled { req, bytes: bytes.clone() };
        let wire = owned.encode();
        let mut longer = wire.clone();
        longer.extend_from_slice(&trailing);
        for supported in [TCP, SHM] {
            let m = decode_message_on(&longer, &Limits::DEFAULT, supported).unwrap();
            prop_assert_eq!(&m.header, &Header::Ticket(TicketOp::Pulled { req, len: bytes.len() as u64 }));
            prop_assert_eq!(&m.frames, &vec![&bytes[..]]);
            prop_assert_eq!(m.consumed, wire.len());
        }
        for len in 0..wire.len() {
            let e = decode_message(&wire[..len], &Limits::DEFAULT).unwrap_err();
            prop_assert_eq!(e.code(), "truncated", "prefix of {} of {} bytes: {}", len, wire.len(), e);
        }
        let n = bytes.len() as u64;
        if n > 0 {
            // Rejected from the header: even with none of the bytes present.
            let header_only = &wire[..wire.len() - bytes.len()];
            let limits = Limits { max_frame_bytes: n - 1, ..Limits::DEFAULT };
            prop_assert_eq!(decode_message(header_only, &limits).unwrap_err().code(), "frame-too-large");
            let limits = Limits { max_message_bytes: n - 1, ..Limits::DEFAULT };
            prop_assert_eq!(decode_message(header_only, &limits).unwrap_err().code(), "message-too-large");
        }
        let exact = Limits { max_frame_bytes: n, max_message_bytes: n, ..Limits::DEFAULT };
        prop_assert!(decode_message(&wire, &exact).is_ok());
    }

    /// A shm window that ends past its segment is `malformed-header` on any connection,
    /// before the descriptor kinds are checked against it.
    #[test]
    fn shm_window_outside_segment(
        (size, offset, len) in shm_window_outside(),
        lease in any::<u64>(),
        sealed in any::<bool>(),
        before in vec((0u64..8).prop_map(|len| Descriptor::Inline { len }), 0..3),
    ) {
        let mut frames = before.clone();
        frames.push(Descriptor::Shm { len, offset, size, lease, sealed });
        let header = Header::Msg { type_name: "x", body: b"", frames };
        let mut wire = Vec::new();
        framing::encode_header_into(&header, &mut wire);
        let e = Header::decode(&wire[LEN_PREFIX..], &UNLIMITED).unwrap_err();
        prop_assert_eq!(e.code(), "malformed-header", "{}", e);
        for limits in [UNLIMITED, Limits::DEFAULT] {
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "malformed-header");
            prop_assert_eq!(decode_message_on(&wire, &limits, SHM).unwrap_err().code(), "malformed-header");
        }
    }

    /// Messages mixing inline frames and shm windows, as a Unix socket carries them: only the
    /// inline frames' bytes follow the header, and `frames` holds exactly those; TCP refuses
    /// the first shm descriptor; shm lengths count toward the frame and message limits.
    #[test]
    fn shm_messages(
        type_name in text(),
        body in vec(any::<u8>(), 0..32),
        parts in shm_parts(),
        trailing in vec(any::<u8>(), 0..8),
    ) {
        let (header, wire) = shm_message(&type_name, &body, &parts);
        let Header::Msg { frames: descs, .. } = &header else { unreachable!() };
        let inline: Vec<&[u8]> = parts.iter().filter_map(|p| p.as_ref().ok()).map(|b| &b[..]).collect();

        let m = decode_message_on(&wire, &UNLIMITED, SHM).unwrap();
        prop_assert_eq!(&m.header, &header);
        prop_assert_eq!(&m.frames, &inline);
        prop_assert_eq!(m.consumed, wire.len());
        let mut longer = wire.clone();
        longer.extend_from_slice(&trailing);
        prop_assert_eq!(&decode_message_on(&longer, &UNLIMITED, SHM).unwrap(), &m);

        match descs.iter().position(|d| d.kind() == "shm") {
            Some(index) => prop_assert_eq!(
                decode_message(&wire, &UNLIMITED).unwrap_err(),
                WireError::UnsupportedDescriptor { index, kind: "shm".into() }
            ),
            None => prop_assert_eq!(decode_message(&wire, &UNLIMITED).unwrap(), m),
        }

        // Every strict prefix is `truncated` on a Unix socket too.
        for len in 0..wire.len() {
            let e = decode_message_on(&wire[..len], &UNLIMITED, SHM).unwrap_err();
            prop_assert_eq!(e.code(), "truncated", "prefix of {} of {} bytes: {}", len, wire.len(), e);
        }

        // The limits see every frame's `n`, shm or inline.
        let count = descs.len() as u32;
        let biggest = descs.iter().map(Descriptor::len).max().unwrap_or(0);
        if count > 0 {
            let limits = Limits { max_frames: count - 1, ..UNLIMITED };
            prop_assert_eq!(decode_message_on(&wire, &limits, SHM).unwrap_err().code(), "too-many-frames");
        }
        if biggest > 0 {
            let limits = Limits { max_frame_bytes: biggest - 1, ..UNLIMITED };
            prop_assert_eq!(decode_message_on(&wire, &limits, SHM).unwrap_err().code(), "frame-too-large");
        }
        if let Some(total) = descs.iter().try_fold(0u64, |t, d| t.checked_add(d.len())) {
            if total > biggest {
                let limits = Limits { max_frame_bytes: biggest, max_message_bytes: total - 1, ..UNLIMITED };
                prop_assert_eq!(decode_message_on(&wire, &limits, SHM).unwrap_err().code(), "message-too-large");
            }
            let exact = Limits { max_frames: count, max_frame_bytes: biggest, max_message_bytes: total, ..UNLIMITED };
            prop_assert!(decode_message_on(&wire, &exact, SHM).is_ok());
        }
    }

    /// Overwriting or flipping bytes of a message with shm frames never panics.
    #[test]
    fn shm_mutation(
        parts in shm_parts(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (_, mut wire) = shm_message("demo.Sample", &[0x80], &parts);
        for (at, byte, flip) in edits {
            let i = at.index(wire.len());
            if flip {
                wire[i] ^= 1 << (byte % 8);
            } else {
                wire[i] = byte;
            }
        }
        if let Some(cut) = cut {
            wire.truncate(cut.index(wire.len() + 1));
        }
        check_decoded(&wire, &Limits::DEFAULT);
        let small = Limits { max_header_bytes: 256, max_frames: 3, max_frame_bytes: 32, max_message_bytes: 64, ..Limits::DEFAULT };
        check_decoded(&wire, &small);
    }

    /// `release` headers round-trip, whatever the lease ids.
    #[test]
    fn release_round_trip(leases in leases_strategy(), trailing in vec(any::<u8>(), 0..8)) {
        let owned = OwnedHeader::Release(leases.clone());
        let mut wire = owned.encode();
        let len = wire.len();
        wire.extend_from_slice(&trailing);
        let tcp = decode_message(&wire, &Limits::DEFAULT).unwrap();
        for m in [tcp, decode_message_on(&wire, &Limits::DEFAULT, SHM).unwrap()] {
            prop_assert_eq!(&m.header, &Header::Release { leases: leases.clone() });
            prop_assert!(m.frames.is_empty());
            prop_assert_eq!(m.consumed, len);
        }
        // Canonical: exactly `{"k": "release", "leases": [...]}`, keys in that order.
        let expected = Mp::Map(vec![
            (key("k"), key("release")),
            (key("leases"), Mp::Arr(leases.iter().copied().map(Mp::UInt).collect())),
        ]);
        prop_assert_eq!(&wire[LEN_PREFIX..len], &mp_to_vec(&expected)[..]);
    }

    /// Every strict prefix of a valid message is `truncated`.
    #[test]
    fn truncation(owned in header_strategy(), cut in any::<prop::sample::Index>()) {
        let wire = owned.encode();
        let len = cut.index(wire.len());
        let e = decode_message(&wire[..len], &Limits::DEFAULT).unwrap_err();
        prop_assert_eq!(e.code(), "truncated", "prefix of {} of {} bytes: {}", len, wire.len(), e);
    }

    /// Every strict prefix, exhaustively, for a few messages.
    #[test]
    fn truncation_every_prefix(owned in msg_strategy()) {
        let wire = owned.encode();
        for len in 0..wire.len() {
            let e = decode_message(&wire[..len], &Limits::DEFAULT).unwrap_err();
            prop_assert_eq!(e.code(), "truncated", "prefix of {} of {} bytes: {}", len, wire.len(), e);
        }
    }

    /// Overwriting or flipping bytes of a valid message never panics.
    #[test]
    fn mutation(
        owned in header_strategy(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut wire = owned.encode();
        for (at, byte, flip) in edits {
            let i = at.index(wire.len());
            if flip {
                wire[i] ^= 1 << (byte % 8);
            } else {
                wire[i] = byte;
            }
        }
        if let Some(cut) = cut {
            wire.truncate(cut.index(wire.len() + 1));
        }
        check_decoded(&wire, &Limits::DEFAULT);
        let small = Limits { max_header_bytes: 128, max_frames: 3, max_frame_bytes: 32, max_message_bytes: 64, ..Limits::DEFAULT };
        check_decoded(&wire, &small);
    }

    /// Mutations that keep the length prefix: the header decoder gets the damage.
    #[test]
    fn mutation_inside_header(owned in msg_strategy(), edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let mut wire = owned.encode();
        let header_len = u32::from_be_bytes(wire[..4].try_into().unwrap()) as usize;
        for (at, byte) in edits {
            wire[LEN_PREFIX + at.index(header_len)] = byte;
        }
        check_decoded(&wire, &Limits::DEFAULT);
    }

    /// A length prefix above `max_header_bytes` is `header-too-large`, whatever follows.
    #[test]
    fn header_too_large(max in any::<u32>(), excess in any::<u32>(), tail in vec(any::<u8>(), 0..64)) {
        prop_assume!(max < u32::MAX);
        let len = max.saturating_add(1).saturating_add(excess % (u32::MAX - max));
        prop_assert!(len > max);
        let limits = Limits { max_header_bytes: max, ..Limits::DEFAULT };
        let mut input = len.to_be_bytes().to_vec();
        input.extend_from_slice(&tail);
        let e = decode_message(&input, &limits).unwrap_err();
        prop_assert_eq!(&e, &WireError::HeaderTooLarge { len: len as u64, limit: max as u64 });
        prop_assert_eq!(framing::header_len(len.to_be_bytes(), &limits).unwrap_err(), e);
    }

    /// The same with the default limits, and a valid message behind the oversized prefix.
    #[test]
    fn header_too_large_default(len in (Limits::DEFAULT.max_header_bytes + 1).., owned in header_strategy()) {
        let mut input = owned.encode();
        input[..4].copy_from_slice(&len.to_be_bytes());
        prop_assert_eq!(decode_message(&input, &Limits::DEFAULT).unwrap_err().code(), "header-too-large");
    }

    /// Valid messages over the frame limits get the matching error.
    #[test]
    fn frame_limits(owned in msg_strategy()) {
        let OwnedHeader::Msg { frames, .. } = &owned else { unreachable!() };
        let wire = owned.encode();
        let count = frames.len() as u32;
        let biggest = frames.iter().map(|f| f.len() as u64).max().unwrap_or(0);
        let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
        if count > 0 {
            let limits = Limits { max_frames: count - 1, ..Limits::DEFAULT };
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "too-many-frames");
        }
        if biggest > 0 {
            let limits = Limits { max_frame_bytes: biggest - 1, ..Limits::DEFAULT };
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "frame-too-large");
        }
        if total > biggest {
            let limits = Limits { max_frame_bytes: biggest, max_message_bytes: total - 1, ..Limits::DEFAULT };
            prop_assert_eq!(decode_message(&wire, &limits).unwrap_err().code(), "message-too-large");
        }
        let exact = Limits {
            max_header_bytes: (wire.len() - LEN_PREFIX - total as usize) as u32,
            max_frames: count,
            max_frame_bytes: biggest,
            max_message_bytes: total,
            ..Limits::DEFAULT
        };
        prop_assert!(decode_message(&wire, &exact).is_ok());
        if exact.max_header_bytes > 0 {
            let tight = Limits { max_header_bytes: exact.max_header_bytes - 1, ..exact };
            prop_assert_eq!(decode_message(&wire, &tight).unwrap_err().code(), "header-too-large");
        }
    }

    /// The codec moves buffers out of band and back, zero copy, through a whole wire message.
    #[test]
    fn codec_round_trip(value in payload_strategy()) {
        let encoded = handoff_wire::encode(&value, None).unwrap();
        let buffers = value.buffers();
        let total: usize = buffers.iter().map(|b| b.len()).sum();

        // Each buffer is one frame, in serialization order, sharing the buffer's memory.
        prop_assert_eq!(encoded.frames.len(), buffers.len());
        for (f, b) in encoded.frames.iter().zip(&buffers) {
            prop_assert_eq!(&f[..], &b[..]);
            if !b.is_empty() {
                prop_assert_eq!(f.as_ptr(), b.as_ptr(), "encode copied a buffer");
            }
        }
        // The body does not hold the buffer bytes: it does not change when their contents
        // and lengths change.
        let mut other = value.clone();
        for b in other.buffers_mut() {
            *b = Buffer::from(vec![0xA5; b.len() * 2 + 1]);
        }
        let other_encoded = handoff_wire::encode(&other, None).unwrap();
        prop_assert_eq!(&other_encoded.body, &encoded.body);
        if total > 4096 {
            prop_assert!(encoded.body.len() < total, "body of {} bytes for {} buffer bytes", encoded.body.len(), total);
        }

        // Direct decode against the sender's frames.
        let direct: Payload = handoff_wire::decode("t", &encoded.body, &encoded.frames, None).unwrap();
        prop_assert_eq!(&direct, &value);

        // Over the wire: decoded buffers are views of the received frames.
        let (decoded, received, frames) = send_and_receive(&value);
        prop_assert_eq!(&decoded, &value);
        let range = received.as_ptr() as usize..received.as_ptr() as usize + received.len();
        for (i, (b, f)) in decoded.buffers().into_iter().zip(&frames).enumerate() {
            prop_assert_eq!(b.len(), f.len());
            if !b.is_empty() {
                prop_assert_eq!(b.as_ptr(), f.as_ptr(), "buffer {} was copied", i);
                prop_assert!(range.contains(&(b.as_ptr() as usize)));
            }
        }
    }

    /// `decode` of arbitrary body bytes with arbitrary frames never panics.
    #[test]
    fn codec_decode_arbitrary_bytes(body in vec(any::<u8>(), 0..256), frames in vec(vec(any::<u8>(), 0..16), 0..4)) {
        let frames: Vec<Bytes> = frames.into_iter().map(Bytes::from).collect();
        check_body(&body, &frames);
    }

    /// The codec's depth scan rejects nothing shallow that msgpack itself accepts: for bodies
    /// too short to nest 128 levels, `decode` succeeds exactly when plain rmp-serde does.
    #[test]
    fn codec_depth_scan_agrees(body in vec(any::<u8>(), 0..127), value in mp_strategy()) {
        for body in [body, mp_to_vec(&value)] {
            let ours = handoff_wire::decode::<serde::de::IgnoredAny>("t", &body, &[], None);
            let plain = rmp_serde::from_slice::<serde::de::IgnoredAny>(&body);
            prop_assert_eq!(ours.is_ok(), plain.is_ok(), "{:?} vs {:?} for {}", ours, plain, hex::encode(&body));
        }
    }

    /// `decode` of structured msgpack bodies (maps with the payload's keys, frame references
    /// in and out of range, foreign extensions) never panics.
    #[test]
    fn codec_decode_structured(value in mp_strategy(), frames in vec(vec(any::<u8>(), 0..16), 0..6)) {
        let frames: Vec<Bytes> = frames.into_iter().map(Bytes::from).collect();
        check_body(&mp_to_vec(&value), &frames);
    }

    /// Frame references resolve exactly when their index is in range; otherwise `bad-frame-ref`.
    #[test]
    fn codec_frame_refs(indices in vec(0u32..8, 0..8), n in 0usize..6) {
        let frames: Vec<Bytes> = (0..n).map(|i| Bytes::from(vec![i as u8; i + 1])).collect();
        let body = mp_to_vec(&Mp::Arr(indices.iter().map(|&i| frame_ref(i)).collect()));
        let result = handoff_wire::decode::<Vec<Buffer>>("t", &body, &as_buffers(&frames), None);
        match indices.iter().find(|&&i| i as usize >= n) {
            None => {
                let bufs = result.unwrap();
                prop_assert_eq!(bufs.len(), indices.len());
                for (b, &i) in bufs.iter().zip(&indices) {
                    prop_assert_eq!(b.as_ptr(), frames[i as usize].as_ptr());
                }
            }
            Some(&bad) => prop_assert_eq!(result.unwrap_err(), WireError::BadFrameRef { index: bad as u64, count: n }),
        }
    }

    /// Outside the codec a `Buffer` is plain bytes: serde_json and rmp_serde round-trip it.
    #[test]
    fn buffer_outside_codec(value in payload_strategy()) {
        let json = serde_json::to_vec(&value).unwrap();
        let back: Payload = serde_json::from_slice(&json).unwrap();
        prop_assert_eq!(&back, &value);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let data: Vec<u8> = serde_json::from_value(v["data"].clone()).unwrap();
        prop_assert_eq!(&data[..], &value.data[..]);

        let mp = rmp_serde::to_vec_named(&value).unwrap();
        let back: Payload = rmp_serde::from_slice(&mp).unwrap();
        prop_assert_eq!(&back, &value);
    }
}

/// Decodes `body` as several types; each returns Ok or a codec error.
fn check_body(body: &[u8], frames: &[Bytes]) {
    fn check<T: serde::de::DeserializeOwned>(body: &[u8], frames: &[Bytes]) -> Option<T> {
        match handoff_wire::decode::<T>("t", body, &as_buffers(frames), None) {
            Ok(v) => Some(v),
            Err(e) => {
                assert!(
                    matches!(e.code(), "bad-body" | "bad-frame-ref" | "unknown-resource"),
                    "unexpected error {e}"
                );
                let _ = e.to_string();
                None
            }
        }
    }
    if let Some(p) = check::<Payload>(body, frames) {
        for b in p.buffers() {
            let _ = &b[..];
        }
    }
    check::<Vec<Buffer>>(body, frames);
    check::<Option<Buffer>>(body, frames);
    check::<Buffer>(body, frames);
    check::<BTreeMap<String, Buffer>>(body, frames);
    check::<(u64, String, Buffer)>(body, frames);
    check::<serde_json::Value>(body, frames);
    check::<Vec<serde_json::Value>>(body, frames);
    // Resource keys, without a registry and with one that holds some keys.
    check::<ResourceKey>(body, frames);
    check::<Vec<ResourceKey>>(body, frames);
    check::<Resource<Thing>>(body, frames);
    check::<BTreeMap<String, Resource<Thing>>>(body, frames);
    let registry = Arc::new(Resources::new("fuzz"));
    registry.insert("db", Arc::new(Thing(1)));
    registry.insert("", Arc::new(Thing(2)));
    registry.insert("dataset:x", Arc::new(String::from("not a thing")));
    Resources::with(&registry, || {
        check::<Resource<Thing>>(body, frames);
        check::<Vec<Resource<Thing>>>(body, frames);
        check::<(Resource<Thing>, Buffer)>(body, frames);
        check::<Option<Resource<Thing>>>(body, frames);
        check::<BTreeMap<String, Resource<Thing>>>(body, frames);
    });
}

/// A resource the tests register: it cannot travel, only its key does.
#[derive(Debug, PartialEq, Eq)]
struct Thing(u64);

// ---------------------------------------------------------------------------
// Fixed regression cases
// ---------------------------------------------------------------------------

/// Nesting depth as `spec/WIRE.md` counts it: every array, map and ext value is one level.
fn mp_depth(v: &Mp) -> usize {
    match v {
        Mp::Arr(items) => 1 + items.iter().map(mp_depth).max().unwrap_or(0),
        Mp::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| mp_depth(k).max(mp_depth(v)))
                .max()
                .unwrap_or(0)
        }
        Mp::Ext(..) => 1,
        _ => 0,
    }
}

fn wrap_in_arrays(v: Mp, levels: usize) -> Mp {
    (0..levels).fold(v, |v, _| Mp::Arr(vec![v]))
}

/// `levels` one-element arrays around the msgpack value `leaf`, built without recursion
/// (a deep `Mp` would overflow the stack in its own `Serialize` and `Drop`).
fn arrays_around(levels: usize, leaf: &[u8]) -> Vec<u8> {
    let mut out = vec![0x91; levels];
    out.extend_from_slice(leaf);
    out
}

/// A whole message with a header of kind `ready` holding the msgpack `value` under an ignored key.
fn ready_header_with(value: &[u8]) -> Vec<u8> {
    let mut header = mp_to_vec(&Mp::Map(vec![(key("k"), key("ready")), (key("x"), Mp::Nil)]));
    header.pop(); // the nil
    header.extend_from_slice(value);
    with_prefix(&header)
}

proptest! {
    #![proptest_config(config())]

    /// Headers nest at most 15 levels (the outermost map included), bodies 127.
    #[test]
    fn nesting_limits(value in mp_strategy(), target in 10usize..20, body_target in 120usize..135) {
        let depth = mp_depth(&value);
        prop_assume!(depth < target);
        let input = ready_header_with(&mp_to_vec(&wrap_in_arrays(value.clone(), target - 1 - depth)));
        let result = decode_message(&input, &Limits::DEFAULT);
        if target <= 15 {
            prop_assert_eq!(result.unwrap().header, Header::Ready);
        } else {
            prop_assert_eq!(result.unwrap_err().code(), "malformed-header");
        }

        let body = mp_to_vec(&wrap_in_arrays(value, body_target - depth));
        let result = handoff_wire::decode::<serde::de::IgnoredAny>("t", &body, &[], None);
        if body_target <= 127 {
            prop_assert!(result.is_ok(), "{:?}", result);
        } else {
            prop_assert_eq!(result.unwrap_err().code(), "bad-body");
        }
    }
}

/// Deeply nested msgpack in an ignored header key must not overflow the stack (it did:
/// ~1000 levels aborted the process in debug builds).
#[test]
fn deeply_nested_header_is_rejected_not_a_crash() {
    for levels in [14, 15, 16, 100, 1_000, 100_000] {
        // The outermost map is one level.
        for leaf in [Mp::Nil, frame_ref(0)] {
            let arrays = levels - 1 - mp_depth(&leaf);
            let input = ready_header_with(&arrays_around(arrays, &mp_to_vec(&leaf)));
            match decode_message(&input, &Limits::DEFAULT) {
                Ok(m) => assert!(levels <= 15 && m.header == Header::Ready, "{levels} levels"),
                Err(e) => assert!(levels > 15 && e.code() == "malformed-header", "{levels} levels: {e}"),
            }
        }
    }
}

/// The same for bodies: a deep body is `bad-body`, not a crash.
#[test]
fn deeply_nested_body_is_rejected_not_a_crash() {
    for levels in [126, 127, 128, 1_000, 100_000] {
        let body = arrays_around(levels, &[0xc0]);
        let value = handoff_wire::decode::<serde_json::Value>("t", &body, &[], None);
        let buffers = handoff_wire::decode::<Vec<Buffer>>("t", &body, &[], None);
        if levels <= 127 {
            assert!(value.is_ok(), "{levels} levels: {value:?}");
        } else {
            assert_eq!(value.unwrap_err().code(), "bad-body", "{levels} levels");
        }
        assert_eq!(buffers.unwrap_err().code(), "bad-body");

        // A frame reference is a level too.
        let body = arrays_around(levels - 1, &mp_to_vec(&frame_ref(0)));
        let frames = [Bytes::from_static(b"x")];
        let result = handoff_wire::decode::<serde::de::IgnoredAny>("t", &body, &as_buffers(&frames), None);
        assert_eq!(result.is_ok(), levels <= 127, "{levels} levels: {result:?}");
    }
}

/// A recursive enum: rmp-serde does not count the one-entry map of an enum variant
/// towards its depth limit, so without the codec's own scan this overflowed the stack.
#[test]
fn deeply_nested_enum_is_rejected_not_a_crash() {
    #[derive(Debug, Deserialize, PartialEq)]
    enum Expr {
        Neg(Box<Expr>),
        Leaf(Buffer),
    }
    let frames = [Bytes::from_static(b"leaf")];
    for levels in [126, 127, 128, 1_000, 100_000] {
        // `levels - 1` maps `{"Neg": …}` around `{"Leaf": <frame ref>}`.
        let mut body = Vec::new();
        for _ in 0..levels - 2 {
            body.extend_from_slice(&[0x81, 0xa3, b'N', b'e', b'g']);
        }
        body.extend(mp_to_vec(&Mp::Map(vec![(key("Leaf"), frame_ref(0))])));
        let result = handoff_wire::decode::<Expr>("t", &body, &as_buffers(&frames), None);
        // Levels: `levels - 1` maps, then the frame reference.
        if levels <= 127 {
            let mut e = result.unwrap();
            let mut depth = 1;
            while let Expr::Neg(inner) = e {
                e = *inner;
                depth += 1;
            }
            assert_eq!(depth, levels - 1);
            assert_eq!(e, Expr::Leaf(Buffer::from_static(b"leaf")));
        } else {
            assert_eq!(result.unwrap_err().code(), "bad-body", "{levels} levels");
        }
    }
}

/// A frame reference outside the codec is an error, not a panic.
#[test]
fn frame_ref_outside_codec() {
    let body = mp_to_vec(&frame_ref(0));
    assert!(rmp_serde::from_slice::<Buffer>(&body).is_err());
    let body = mp_to_vec(&Mp::Bin(vec![1, 2, 3]));
    assert_eq!(&rmp_serde::from_slice::<Buffer>(&body).unwrap()[..], &[1, 2, 3]);
}

/// Lengths below the prefix are `truncated`; a zero length prefix is `malformed-header`.
#[test]
fn tiny_inputs() {
    for len in 0..LEN_PREFIX {
        assert_eq!(
            decode_message(&[0xff; 3][..len], &Limits::DEFAULT).unwrap_err().code(),
            "truncated"
        );
    }
    assert_eq!(
        decode_message(&[0, 0, 0, 0], &Limits::DEFAULT).unwrap_err().code(),
        "malformed-header"
    );
    assert_eq!(
        decode_message(&[0, 0, 0, 1], &Limits::DEFAULT).unwrap_err().code(),
        "truncated"
    );
}

// ---------------------------------------------------------------------------
// Shared memory: the shm descriptor and the release header
// ---------------------------------------------------------------------------

/// A whole `msg` message (no frame bytes) whose `f` holds the descriptor maps `descs`.
fn msg_with_descriptors(descs: Vec<Mp>) -> Vec<u8> {
    with_prefix(&mp_to_vec(&Mp::Map(vec![
        (key("k"), key("msg")),
        (key("t"), key("x")),
        (key("b"), Mp::Bin(vec![0x80])),
        (key("f"), Mp::Arr(descs)),
    ])))
}

fn shm_map(fields: &[(&str, Mp)]) -> Mp {
    let mut entries = vec![(key("k"), key("shm"))];
    entries.extend(fields.iter().map(|(k, v)| (key(k), v.clone())));
    Mp::Map(entries)
}

/// The decode result of one message on a Unix socket, as an error code or the descriptors.
fn decode_shm_descriptors(input: &[u8]) -> Result<Vec<Descriptor>, &'static str> {
    match decode_message_on(input, &Limits::DEFAULT, SHM) {
        Ok(m) => match m.header {
            Header::Msg { frames, .. } => Ok(frames),
            other => panic!("expected a msg, got {other:?}"),
        },
        Err(e) => Err(e.code()),
    }
}

/// An encoder writes every field of a shm descriptor, `sealed` included, in the order
/// k, n, off, size, lease, sealed.
#[test]
fn shm_descriptor_is_canonical() {
    for sealed in [false, true] {
        let d = Descriptor::Shm {
            len: 1 << 20,
            offset: 4096,
            size: 4 << 20,
            lease: 7,
            sealed,
        };
        let header = Header::Msg {
            type_name: "x",
            body: &[0x80],
            frames: vec![d.clone()],
        };
        let expected = Mp::Map(vec![
            (key("k"), key("msg")),
            (key("t"), key("x")),
            (key("b"), Mp::Bin(vec![0x80])),
            (
                key("f"),
                Mp::Arr(vec![shm_map(&[
                    ("n", Mp::UInt(1 << 20)),
                    ("off", Mp::UInt(4096)),
                    ("size", Mp::UInt(4 << 20)),
                    ("lease", Mp::UInt(7)),
                    ("sealed", Mp::Bool(sealed)),
                ])]),
            ),
        ]);
        assert_eq!(header.encode(), mp_to_vec(&expected));
        assert_eq!(decode_shm_descriptors(&with_prefix(&header.encode())), Ok(vec![d]));
    }
}

/// Windows at the very end of the segment are fine; one byte further is `malformed-header`.
#[test]
fn shm_window_bounds() {
    let shm = |n: u64, off: u64, size: u64| {
        shm_map(&[
            ("n", Mp::UInt(n)),
            ("off", Mp::UInt(off)),
            ("size", Mp::UInt(size)),
            ("lease", Mp::UInt(1)),
            ("sealed", Mp::Bool(false)),
        ])
    };
    let window = |len, offset, size| Descriptor::Shm {
        len,
        offset,
        size,
        lease: 1,
        sealed: false,
    };
    for (n, off, size) in [
        (0, 0, 0),
        (8192, 0, 8192),
        (4096, 4096, 8192),
        (0, 8192, 8192),
        (1, u64::MAX - 1, u64::MAX),
    ] {
        let d = decode_shm_descriptors(&msg_with_descriptors(vec![shm(n, off, size)]));
        assert_eq!(d, Ok(vec![window(n, off, size)]), "n {n}, off {off}, size {size}");
    }
    for (n, off, size) in [
        (1, 0, 0),
        (8193, 0, 8192),
        (4096, 8192, 8192),
        (1, 8192, 8192),
        (2, u64::MAX - 1, u64::MAX),
        (u64::MAX, u64::MAX, u64::MAX),
    ] {
        let input = msg_with_descriptors(vec![shm(n, off, size)]);
        assert_eq!(
            decode_shm_descriptors(&input),
            Err("malformed-header"),
            "n {n}, off {off}, size {size}"
        );
        assert_eq!(
            decode_message(&input, &Limits::DEFAULT).unwrap_err().code(),
            "malformed-header"
        );
    }
}

/// A shm descriptor needs `n`, `off`, `size` and `lease`; an absent `sealed` reads as false;
/// every known descriptor key is type-checked, whatever the descriptor's kind.
#[test]
fn shm_descriptor_fields() {
    let all = [
        ("n", Mp::UInt(16)),
        ("off", Mp::UInt(0)),
        ("size", Mp::UInt(64)),
        ("lease", Mp::UInt(3)),
        ("sealed", Mp::Bool(true)),
    ];
    let full = Descriptor::Shm {
        len: 16,
        offset: 0,
        size: 64,
        lease: 3,
        sealed: true,
    };
    assert_eq!(
        decode_shm_descriptors(&msg_with_descriptors(vec![shm_map(&all)])),
        Ok(vec![full])
    );
    for missing in ["n", "off", "size", "lease"] {
        let fields: Vec<_> = all.iter().filter(|(k, _)| *k != missing).cloned().collect();
        let input = msg_with_descriptors(vec![shm_map(&fields)]);
        assert_eq!(
            decode_shm_descriptors(&input),
            Err("malformed-header"),
            "without {missing}"
        );
        // nil counts as absent.
        let nil: Vec<_> = all
            .iter()
            .map(|(k, v)| (*k, if *k == missing { Mp::Nil } else { v.clone() }))
            .collect();
        let input = msg_with_descriptors(vec![shm_map(&nil)]);
        assert_eq!(
            decode_shm_descriptors(&input),
            Err("malformed-header"),
            "{missing}: nil"
        );
    }
    let unsealed: Vec<_> = all.iter().filter(|(k, _)| *k != "sealed").cloned().collect();
    assert_eq!(
        decode_shm_descriptors(&msg_with_descriptors(vec![shm_map(&unsealed)])),
        Ok(vec![Descriptor::Shm {
            len: 16,
            offset: 0,
            size: 64,
            lease: 3,
            sealed: false
        }])
    );
    // Wrong types, in shm descriptors and in others.
    for (name, bad) in [
        ("off", Mp::Str("0".into())),
        ("size", Mp::Int(-1)),
        ("lease", Mp::F64(3.0)),
        ("sealed", Mp::UInt(1)),
        ("sealed", Mp::Str("yes".into())),
    ] {
        let fields: Vec<_> = all
            .iter()
            .map(|(k, v)| (*k, if *k == name { bad.clone() } else { v.clone() }))
            .collect();
        let input = msg_with_descriptors(vec![shm_map(&fields)]);
        assert_eq!(
            decode_shm_descriptors(&input),
            Err("malformed-header"),
            "{name}: {bad:?}"
        );
        let inline = Mp::Map(vec![
            (key("k"), key("inline")),
            (key("n"), Mp::UInt(0)),
            (key(name), bad.clone()),
        ]);
        let input = msg_with_descriptors(vec![inline]);
        assert_eq!(
            decode_shm_descriptors(&input),
            Err("malformed-header"),
            "inline with {name}: {bad:?}"
        );
    }
    // Unknown keys inside a descriptor are ignored.
    let mut extra = all.to_vec();
    extra.push(("x-segment-name", Mp::Str("pool-3".into())));
    assert!(decode_shm_descriptors(&msg_with_descriptors(vec![shm_map(&extra)])).is_ok());
}

/// The vector `msg-shm-frame`: frame references index all descriptors, `frames` only the
/// inline ones; on TCP the same bytes are `unsupported-descriptor`.
#[test]
fn shm_frame_and_inline_frame() {
    let shm = Descriptor::Shm {
        len: 1 << 20,
        offset: 4096,
        size: 4 << 20,
        lease: 7,
        sealed: false,
    };
    let body = mp_to_vec(&Mp::Map(vec![(key("data"), frame_ref(0)), (key("meta"), frame_ref(1))]));
    let header = Header::Msg {
        type_name: "demo.Sample",
        body: &body,
        frames: vec![shm.clone(), Descriptor::Inline { len: 3 }],
    };
    let mut wire = Vec::new();
    framing::encode_header_into(&header, &mut wire);
    wire.extend_from_slice(b"abc");
    let m = decode_message_on(&wire, &Limits::DEFAULT, SHM).unwrap();
    assert_eq!(m.header, header);
    assert_eq!(m.frames, vec![&b"abc"[..]]);
    assert_eq!(m.consumed, wire.len());
    assert_eq!(
        decode_message(&wire, &Limits::DEFAULT).unwrap_err(),
        WireError::UnsupportedDescriptor {
            index: 0,
            kind: "shm".into()
        }
    );
    // The receiver puts the mapped window where the shm descriptor is.
    let mapped = Bytes::from(vec![0x5a; 1 << 20]);
    let frames = [mapped.clone(), Bytes::from_static(b"abc")];
    #[derive(Deserialize)]
    struct Sample {
        data: Buffer,
        meta: Buffer,
    }
    let s: Sample = handoff_wire::decode("demo.Sample", &body, &as_buffers(&frames), None).unwrap();
    assert_eq!(s.data.as_ptr(), mapped.as_ptr());
    assert_eq!(&s.meta[..], b"abc");
}

/// `release` needs `leases`, an array of unsigned integers; the keys of shared memory are
/// type-checked in every header, whatever its kind.
#[test]
fn release_and_new_header_keys() {
    let header = |entries: Vec<(&str, Mp)>| {
        with_prefix(&mp_to_vec(&Mp::Map(
            entries.into_iter().map(|(k, v)| (key(k), v)).collect(),
        )))
    };
    fn code(input: &[u8]) -> Result<Header<'_>, WireError> {
        decode_message_on(input, &Limits::DEFAULT, SHM).map(|m| m.header)
    }

    // The bytes of the vector `release`.
    let release = Header::Release {
        leases: vec![7, 300, 70000],
    };
    let mut wire = Vec::new();
    framing::encode_header_into(&release, &mut wire);
    assert_eq!(
        hex::encode(&wire),
        "0000001c82a16ba772656c65617365a66c65617365739307cd012cce00011170"
    );
    assert_eq!(code(&wire), Ok(release));
    assert_eq!(
        code(&header(vec![("k", key("release")), ("leases", Mp::Arr(vec![]))])),
        Ok(Header::Release { leases: vec![] })
    );

    for bad in [
        vec![("k", key("release"))],
        vec![("k", key("release")), ("leases", Mp::Nil)],
        vec![("k", key("release")), ("leases", Mp::UInt(7))],
        vec![("k", key("release")), ("leases", Mp::Arr(vec![Mp::Int(-1)]))],
        vec![("k", key("release")), ("leases", Mp::Arr(vec![Mp::Str("7".into())]))],
        vec![("k", key("ready")), ("leases", Mp::Str("x".into()))],
        vec![("k", key("ready")), ("unix", Mp::UInt(5))],
        vec![
            ("k", key("error")),
            ("code", key("x")),
            ("msg", key("y")),
            ("unix", Mp::Arr(vec![])),
        ],
    ] {
        let input = header(bad.clone());
        assert_eq!(code(&input).unwrap_err().code(), "malformed-header", "{bad:?}");
    }
    // Keys of other kinds do not belong to a release, and are ignored when well typed.
    assert_eq!(
        code(&header(vec![
            ("k", key("release")),
            ("unix", key("unix:///tmp/x.sock")),
            ("leases", Mp::Arr(vec![Mp::UInt(1)])),
        ])),
        Ok(Header::Release { leases: vec![1] })
    );
}

/// `unix` is optional and written after `listen`.
#[test]
fn hello_unix_key() {
    let hello = Hello {
        node_id: "n".into(),
        name: "alpha".into(),
        host_id: "h".into(),
        pid: 1,
        process_id: "p".into(),
        language: "rust".into(),
        implementation: "handoff-rs/0.1.0".into(),
        version: 1,
        capabilities: vec!["inline".into(), "shm".into()],
        nonce: vec![0; 32],
        listen: Some("tcp://127.0.0.1:7070".into()),
        unix: Some("unix:///run/user/1000/handoff/alpha-0123456789ab.sock".into()),
    };
    for (listen, unix) in [(true, true), (false, true), (true, false), (false, false)] {
        let h = Hello {
            listen: hello.listen.clone().filter(|_| listen),
            unix: hello.unix.clone().filter(|_| unix),
            ..hello.clone()
        };
        let mut entries = vec![
            (key("k"), key("hello")),
            (key("node"), key("n")),
            (key("name"), key("alpha")),
            (key("host"), key("h")),
            (key("pid"), Mp::UInt(1)),
            (key("proc"), key("p")),
            (key("lang"), key("rust")),
            (key("impl"), key("handoff-rs/0.1.0")),
            (key("v"), Mp::UInt(1)),
            (key("caps"), Mp::Arr(vec![key("inline"), key("shm")])),
            (key("nonce"), Mp::Bin(vec![0; 32])),
        ];
        if let Some(l) = &h.listen {
            entries.push((key("listen"), Mp::Str(l.clone())));
        }
        if let Some(u) = &h.unix {
            entries.push((key("unix"), Mp::Str(u.clone())));
        }
        let header = Header::Hello(h);
        assert_eq!(header.encode(), mp_to_vec(&Mp::Map(entries)));
        assert_eq!(Header::decode(&header.encode(), &Limits::DEFAULT).unwrap(), header);
    }
}

// ---------------------------------------------------------------------------
// Tickets: the ticket descriptor and the ticket protocol's headers
// ---------------------------------------------------------------------------

fn claim_fixture() -> TicketClaim {
    TicketClaim {
        len: 1 << 20,
        owner: "0123456789abcdef0123456789abcdef".into(),
        addr: Some("tcp://127.0.0.1:7000".into()),
        lease: 9,
        token: vec![0xab; 32],
        digest: handoff_wire::TicketDigest::Blake3([0xcd; 32]),
        lazy: false,
        ttl_ms: 30_000,
    }
}

/// The map of a ticket descriptor with `fields` after its `k`.
fn ticket_map(fields: &[(&str, Mp)]) -> Mp {
    let mut entries = vec![(key("k"), key("ticket"))];
    entries.extend(fields.iter().map(|(k, v)| (key(k), v.clone())));
    Mp::Map(entries)
}

/// Every field of the fixture ticket, in canonical order.
fn claim_fields() -> Vec<(&'static str, Mp)> {
    vec![
        ("n", Mp::UInt(1 << 20)),
        ("owner", key("0123456789abcdef0123456789abcdef")),
        ("addr", key("tcp://127.0.0.1:7000")),
        ("lease", Mp::UInt(9)),
        ("token", Mp::Bin(vec![0xab; 32])),
        ("digest", Mp::Bin(vec![0xcd; 32])),
        ("ttl", Mp::UInt(30_000)),
    ]
}

/// An encoder writes a ticket's keys in the order k, n, owner, addr, lease, token, digest,
/// ttl, and omits `addr` when there is none.
#[test]
fn ticket_descriptor_is_canonical() {
    for with_addr in [true, false] {
        let claim = TicketClaim {
            addr: claim_fixture().addr.filter(|_| with_addr),
            ..claim_fixture()
        };
        let header = Header::Msg {
            type_name: "x",
            body: &[0x80],
            frames: vec![Descriptor::Ticket(claim.clone()), Descriptor::Inline { len: 2 }],
        };
        let fields: Vec<_> = claim_fields()
            .into_iter()
            .filter(|(k, _)| with_addr || *k != "addr")
            .collect();
        let expected = Mp::Map(vec![
            (key("k"), key("msg")),
            (key("t"), key("x")),
            (key("b"), Mp::Bin(vec![0x80])),
            (
                key("f"),
                Mp::Arr(vec![
                    ticket_map(&fields),
                    Mp::Map(vec![(key("k"), key("inline")), (key("n"), Mp::UInt(2))]),
                ]),
            ),
        ]);
        assert_eq!(header.encode(), mp_to_vec(&expected));
        let mut wire = with_prefix(&header.encode());
        wire.extend_from_slice(b"ok");
        for supported in [TCP, SHM] {
            let m = decode_message_on(&wire, &Limits::DEFAULT, supported).unwrap();
            assert_eq!(m.header, header);
            assert_eq!(m.frames, vec![&b"ok"[..]]);
            assert_eq!(m.consumed, wire.len());
        }
    }
}

/// A ticket needs `n`, `owner`, `lease`, `token`, `digest` and `ttl` (nil counts as absent);
/// `token` and `digest` are exactly 32 bytes; the ticket's keys are type-checked in every
/// descriptor, whatever its kind.
#[test]
fn ticket_descriptor_fields() {
    let decode = |d: Mp| -> Result<Vec<Descriptor>, &'static str> {
        let input = msg_with_descriptors(vec![d]);
        let tcp = decode_message(&input, &Limits::DEFAULT).map(|m| m.header);
        let unix = decode_message_on(&input, &Limits::DEFAULT, SHM).map(|m| m.header);
        assert_eq!(tcp, unix);
        match tcp {
            Ok(Header::Msg { frames, .. }) => Ok(frames),
            Ok(other) => panic!("expected a msg, got {other:?}"),
            Err(e) => Err(e.code()),
        }
    };
    let all = claim_fields();
    assert_eq!(decode(ticket_map(&all)), Ok(vec![Descriptor::Ticket(claim_fixture())]));
    let without_addr: Vec<_> = all.iter().filter(|(k, _)| *k != "addr").cloned().collect();
    assert_eq!(
        decode(ticket_map(&without_addr)),
        Ok(vec![Descriptor::Ticket(TicketClaim {
            addr: None,
            ..claim_fixture()
        })])
    );
    // Keys in any order.
    let mut reversed = all.clone();
    reversed.reverse();
    assert_eq!(
        decode(ticket_map(&reversed)),
        Ok(vec![Descriptor::Ticket(claim_fixture())])
    );
    for missing in ["n", "owner", "lease", "token", "digest", "ttl"] {
        let fields: Vec<_> = all.iter().filter(|(k, _)| *k != missing).cloned().collect();
        assert_eq!(
            decode(ticket_map(&fields)),
            Err("malformed-header"),
            "without {missing}"
        );
        let nil: Vec<_> = all
            .iter()
            .map(|(k, v)| (*k, if *k == missing { Mp::Nil } else { v.clone() }))
            .collect();
        assert_eq!(decode(ticket_map(&nil)), Err("malformed-header"), "{missing}: nil");
    }
    for name in ["token", "digest"] {
        for len in [0, 16, 31, 33, 64] {
            let fields: Vec<_> = all
                .iter()
                .map(|(k, v)| (*k, if *k == name { Mp::Bin(vec![7; len]) } else { v.clone() }))
                .collect();
            assert_eq!(
                decode(ticket_map(&fields)),
                Err("malformed-header"),
                "{name} of {len} bytes"
            );
        }
    }
    for (name, bad) in [
        ("owner", Mp::UInt(1)),
        ("addr", Mp::UInt(7000)),
        ("lease", Mp::Int(-1)),
        ("token", Mp::UInt(5)),
        ("digest", Mp::Bool(true)),
        ("ttl", Mp::Str("30s".into())),
        ("ttl", Mp::F64(1.5)),
    ] {
        let fields: Vec<_> = all
            .iter()
            .map(|(k, v)| (*k, if *k == name { bad.clone() } else { v.clone() }))
            .collect();
        assert_eq!(decode(ticket_map(&fields)), Err("malformed-header"), "{name}: {bad:?}");
        let inline = Mp::Map(vec![
            (key("k"), key("inline")),
            (key("n"), Mp::UInt(0)),
            (key(name), bad.clone()),
        ]);
        assert_eq!(decode(inline), Err("malformed-header"), "inline with {name}: {bad:?}");
    }
    // Unknown keys inside a ticket are ignored.
    let mut extra = all.clone();
    extra.push(("x-region", key("eu")));
    assert_eq!(
        decode(ticket_map(&extra)),
        Ok(vec![Descriptor::Ticket(claim_fixture())])
    );
    // A ticket's `n` is held to the limits like any frame's.
    let huge: Vec<_> = all
        .iter()
        .map(|(k, v)| (*k, if *k == "n" { Mp::UInt(5 << 30) } else { v.clone() }))
        .collect();
    assert_eq!(decode(ticket_map(&huge)), Err("frame-too-large"));
    // A tag is defined but carried by no connection.
    let tag = Mp::Map(vec![(key("k"), key("tag")), (key("key"), key("model/llama"))]);
    assert_eq!(decode(tag), Err("unsupported-descriptor"));
}

/// Each ticket-protocol header is written with exactly its keys, in the spec's order.
#[test]
fn ticket_ops_are_canonical() {
    let token = || Mp::Bin(vec![0x11; 32]);
    let cases: Vec<(TicketOp, Vec<(&str, Mp)>)> = vec![
        (
            TicketOp::Pull {
                req: 1,
                lease: 9,
                token: vec![0x11; 32],
                offset: 4096,
                len: 65536,
            },
            vec![
                ("k", key("pull")),
                ("req", Mp::UInt(1)),
                ("lease", Mp::UInt(9)),
                ("token", token()),
                ("off", Mp::UInt(4096)),
                ("n", Mp::UInt(65536)),
            ],
        ),
        (
            TicketOp::Pulled { req: 1, len: 5 },
            vec![("k", key("pulled")), ("req", Mp::UInt(1)), ("n", Mp::UInt(5))],
        ),
        (
            TicketOp::Forward {
                req: 2,
                lease: 9,
                token: vec![0x11; 32],
                to: "c0ffee".into(),
            },
            vec![
                ("k", key("forward")),
                ("req", Mp::UInt(2)),
                ("lease", Mp::UInt(9)),
                ("token", token()),
                ("to", key("c0ffee")),
            ],
        ),
        (
            TicketOp::Forwarded {
                req: 2,
                token: vec![0x11; 32],
            },
            vec![("k", key("forwarded")), ("req", Mp::UInt(2)), ("token", token())],
        ),
        (
            TicketOp::Refused {
                req: 3,
                code: "expired".into(),
                message: "too late".into(),
            },
            vec![
                ("k", key("ticket-error")),
                ("req", Mp::UInt(3)),
                ("code", key("expired")),
                ("msg", key("too late")),
            ],
        ),
        (
            TicketOp::Unlease {
                lease: 9,
                token: vec![0x11; 32],
            },
            vec![("k", key("unlease")), ("lease", Mp::UInt(9)), ("token", token())],
        ),
        (
            TicketOp::Renew {
                lease: 9,
                token: vec![0x11; 32],
            },
            vec![("k", key("renew")), ("lease", Mp::UInt(9)), ("token", token())],
        ),
    ];
    for (op, fields) in cases {
        let header = Header::Ticket(op.clone());
        let expected = mp_to_vec(&Mp::Map(fields.iter().map(|(k, v)| (key(k), v.clone())).collect()));
        assert_eq!(header.encode(), expected, "{}", op.kind());
        assert_eq!(Header::decode(&expected, &Limits::DEFAULT).unwrap(), header);

        // Every field is required (nil counts as absent); tokens are exactly 32 bytes.
        for (name, _) in fields.iter().skip(1) {
            let without: Vec<_> = fields.iter().filter(|(k, _)| k != name).cloned().collect();
            let input = mp_to_vec(&Mp::Map(without.into_iter().map(|(k, v)| (key(k), v)).collect()));
            let e = Header::decode(&input, &Limits::DEFAULT).unwrap_err();
            assert_eq!(e.code(), "malformed-header", "{} without {name}", op.kind());
            let nil: Vec<_> = fields
                .iter()
                .map(|(k, v)| (key(k), if k == name { Mp::Nil } else { v.clone() }))
                .collect();
            let e = Header::decode(&mp_to_vec(&Mp::Map(nil)), &Limits::DEFAULT).unwrap_err();
            assert_eq!(e.code(), "malformed-header", "{} with {name} nil", op.kind());
        }
        if fields.iter().any(|(k, _)| *k == "token") {
            for len in [0, 31, 33] {
                let short: Vec<_> = fields
                    .iter()
                    .map(|(k, v)| {
                        (
                            key(k),
                            if *k == "token" {
                                Mp::Bin(vec![1; len])
                            } else {
                                v.clone()
                            },
                        )
                    })
                    .collect();
                let e = Header::decode(&mp_to_vec(&Mp::Map(short)), &Limits::DEFAULT).unwrap_err();
                assert_eq!(e.code(), "malformed-header", "{} with a {len}-byte token", op.kind());
            }
        }
    }
}

/// The ticket protocol's keys are type-checked in every header, whatever its kind; keys of
/// other kinds are ignored when well typed.
#[test]
fn ticket_header_keys() {
    let decode = |entries: Vec<(&str, Mp)>| {
        let input = mp_to_vec(&Mp::Map(entries.into_iter().map(|(k, v)| (key(k), v)).collect()));
        match Header::decode(&input, &Limits::DEFAULT) {
            Ok(Header::Ready) => Ok(Header::Ready),
            Ok(Header::Ticket(op)) => Ok(Header::Ticket(op)),
            Ok(other) => panic!("unexpected header {other:?}"),
            Err(e) => Err(e),
        }
    };
    for (name, bad) in [
        ("req", Mp::Str("1".into())),
        ("req", Mp::Int(-1)),
        ("lease", Mp::F64(1.0)),
        ("token", Mp::UInt(1)),
        ("off", Mp::Bool(false)),
        ("n", Mp::Arr(vec![])),
        ("to", Mp::UInt(3)),
    ] {
        let e = decode(vec![("k", key("ready")), (name, bad.clone())]).unwrap_err();
        assert_eq!(e.code(), "malformed-header", "ready with {name}: {bad:?}");
    }
    assert_eq!(
        decode(vec![("k", key("ready")), ("req", Mp::UInt(1)), ("to", key("x"))]),
        Ok(Header::Ready)
    );
    assert_eq!(
        decode(vec![
            ("k", key("renew")),
            ("token", Mp::Bin(vec![0; 32])),
            ("lease", Mp::UInt(4)),
            ("req", Mp::UInt(99)),
            ("x-later", key("ignored")),
        ]),
        Ok(Header::Ticket(TicketOp::Renew {
            lease: 4,
            token: vec![0; 32]
        }))
    );
    // A `ticket-error` with any code decodes: the codes are the runtime's business.
    assert_eq!(
        decode(vec![
            ("k", key("ticket-error")),
            ("req", Mp::UInt(1)),
            ("code", key("some-later-code")),
            ("msg", key("")),
        ]),
        Ok(Header::Ticket(TicketOp::Refused {
            req: 1,
            code: "some-later-code".into(),
            message: String::new()
        }))
    );
}

/// `pulled` announcing more bytes than follow is `truncated`; one above the frame limit is
/// `frame-too-large` before any byte is read.
#[test]
fn pulled_limits() {
    let mut wire = Vec::new();
    framing::encode_header_into(&Header::Ticket(TicketOp::Pulled { req: 1, len: 8 }), &mut wire);
    wire.extend_from_slice(b"abc");
    let e = decode_message(&wire, &Limits::DEFAULT).unwrap_err();
    assert_eq!(
        e,
        WireError::Truncated {
            what: "pulled bytes",
            needed: 8,
            available: 3
        }
    );
    let mut big = Vec::new();
    let len = Limits::DEFAULT.max_frame_bytes + 1;
    framing::encode_header_into(&Header::Ticket(TicketOp::Pulled { req: 1, len }), &mut big);
    assert_eq!(
        decode_message(&big, &Limits::DEFAULT).unwrap_err().code(),
        "frame-too-large"
    );
    assert_eq!(
        decode_message_on(&big, &Limits::DEFAULT, SHM).unwrap_err().code(),
        "frame-too-large"
    );
    let mut max = Vec::new();
    framing::encode_header_into(
        &Header::Ticket(TicketOp::Pulled {
            req: 1,
            len: Limits::DEFAULT.max_frame_bytes,
        }),
        &mut max,
    );
    assert_eq!(decode_message(&max, &Limits::DEFAULT).unwrap_err().code(), "truncated");
}

// ---------------------------------------------------------------------------
// Lazy tickets and resource keys
// ---------------------------------------------------------------------------

/// The map an encoder writes for `claim`: the keys of WIRE.md §7 in order, `addr` only when
/// there is one, `lazy` only when true, last.
fn claim_map(claim: &TicketClaim) -> Mp {
    let mut fields = vec![("n", Mp::UInt(claim.len)), ("owner", key(&claim.owner))];
    if let Some(addr) = &claim.addr {
        fields.push(("addr", key(addr)));
    }
    fields.extend([
        ("lease", Mp::UInt(claim.lease)),
        ("token", Mp::Bin(claim.token.clone())),
        (
            match claim.digest {
                handoff_wire::TicketDigest::Blake3(_) => "digest",
                handoff_wire::TicketDigest::Xxh3(_) => "xxh3",
            },
            Mp::Bin(claim.digest.as_bytes().to_vec()),
        ),
        ("ttl", Mp::UInt(claim.ttl_ms)),
    ]);
    if claim.lazy {
        fields.push(("lazy", Mp::Bool(true)));
    }
    ticket_map(&fields)
}

/// The `msg` header holding `descs` as the codec's encoder writes it.
fn msg_header_mp(descs: Vec<Mp>) -> Vec<u8> {
    mp_to_vec(&Mp::Map(vec![
        (key("k"), key("msg")),
        (key("t"), key("x")),
        (key("b"), Mp::Bin(vec![0x80])),
        (key("f"), Mp::Arr(descs)),
    ]))
}

/// A value holding resources of the tests' type, as a user's message would.
#[derive(Debug, Serialize, Deserialize)]
struct Uses {
    name: String,
    first: Resource<Thing>,
    more: Vec<Resource<Thing>>,
    data: Buffer,
}

/// Keys the registry strategies use: short ones (fixext sizes among them) and any text.
fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z]{1,2}",
        "[a-z]{4}",
        "[a-z]{8}",
        "[a-z]{16}",
        "[a-z:/._-]{0,40}",
        text(),
        "\\PC{0,300}",
    ]
}

/// Opens `pool:NAME` keys on demand; `pool:broken` fails.
struct Pools;

impl Resolver for Pools {
    fn resolve(&self, key: &str) -> Option<Result<AnyResource, String>> {
        let name = key.strip_prefix("pool:")?;
        if name == "broken" {
            return Some(Err("the pool refused".into()));
        }
        Some(Ok(Arc::new(Thing(name.len() as u64))))
    }
    fn keys(&self) -> Vec<String> {
        vec!["pool:*".into()]
    }
}

proptest! {
    #![proptest_config(config())]

    /// A ticket round-trips with its `lazy` flag; its encoding is the map of WIRE.md §7 with
    /// `lazy: true` last, or with no `lazy` key at all: a ticket that is not lazy encodes
    /// byte for byte as before the key existed.
    #[test]
    fn lazy_ticket_round_trips(claim in ticket_claim(), inline in vec(any::<u8>(), 0..8)) {
        let header = Header::Msg {
            type_name: "x",
            body: &[0x80],
            frames: vec![Descriptor::Ticket(claim.clone()), Descriptor::Inline { len: inline.len() as u64 }],
        };
        let encoded = header.encode();
        let inline_mp = Mp::Map(vec![(key("k"), key("inline")), (key("n"), Mp::UInt(inline.len() as u64))]);
        prop_assert_eq!(&encoded, &msg_header_mp(vec![claim_map(&claim), inline_mp.clone()]));
        let decoded = Header::decode(&encoded, &UNLIMITED).unwrap();
        prop_assert_eq!(&decoded, &header);
        prop_assert_eq!(decoded.encode(), encoded.clone());

        // Not lazy: exactly the bytes of the same ticket without the flag, which has no `lazy`.
        let plain = TicketClaim { lazy: false, ..claim.clone() };
        let plain_header = Header::Msg {
            type_name: "x",
            body: &[0x80],
            frames: vec![Descriptor::Ticket(plain.clone()), Descriptor::Inline { len: inline.len() as u64 }],
        };
        let plain_bytes = plain_header.encode();
        prop_assert!(!plain_bytes.windows(5).any(|w| w == b"\xa4lazy"));
        if !claim.lazy {
            prop_assert_eq!(&plain_bytes, &encoded);
        } else {
            // The lazy encoding is the plain one with `a4 "lazy" c3` appended to the ticket map
            // (whose entry count grows by one).
            prop_assert_eq!(encoded.len(), plain_bytes.len() + 6);
        }
        // An explicit `lazy: false`, or nil, decodes as not lazy and re-encodes without the key.
        for explicit in [Mp::Bool(false), Mp::Nil] {
            let Mp::Map(mut entries) = claim_map(&plain) else { unreachable!() };
            entries.push((key("lazy"), explicit));
            let bytes = msg_header_mp(vec![Mp::Map(entries), inline_mp.clone()]);
            let got = Header::decode(&bytes, &UNLIMITED).unwrap();
            prop_assert_eq!(&got, &plain_header);
            prop_assert_eq!(got.encode(), plain_bytes.clone());
        }
        // The whole message, on TCP and on a Unix socket.
        let mut wire = Vec::new();
        framing::encode_header_into(&header, &mut wire);
        wire.extend_from_slice(&inline);
        for supported in [TCP, SHM] {
            let m = decode_message_on(&wire, &UNLIMITED, supported).unwrap();
            prop_assert_eq!(&m.header, &header);
            prop_assert_eq!(m.frames, vec![&inline[..]]);
        }
    }

    /// `lazy` is type-checked in every descriptor, whatever its kind: anything but a bool
    /// (or nil) is `malformed-header`.
    #[test]
    fn lazy_must_be_a_bool(value in mp_leaf(), kind in prop_oneof![Just("ticket"), Just("inline")]) {
        let mut d = match kind {
            "ticket" => claim_map(&claim_fixture()),
            _ => Mp::Map(vec![(key("k"), key("inline")), (key("n"), Mp::UInt(0))]),
        };
        if let Mp::Map(entries) = &mut d {
            entries.push((key("lazy"), value.clone()));
        }
        let input = msg_with_descriptors(vec![d]);
        let result = decode_message(&input, &Limits::DEFAULT);
        match value {
            Mp::Bool(b) => {
                let m = result.unwrap();
                let Header::Msg { frames, .. } = m.header else { panic!("a msg") };
                if let Descriptor::Ticket(c) = &frames[0] {
                    prop_assert_eq!(c.lazy, b);
                }
            }
            Mp::Nil => prop_assert!(result.is_ok()),
            _ => prop_assert_eq!(result.unwrap_err().code(), "malformed-header"),
        }
    }

    /// A resource key round-trips through the codec as msgpack ext type 2 (the smallest ext
    /// encoding of its UTF-8 bytes) and binds, on receipt, to the receiver's own object.
    #[test]
    fn resource_key_round_trips(
        keys in proptest::collection::btree_set(key_strategy(), 1..5),
        picks in vec(any::<prop::sample::Index>(), 0..4),
        name in text(),
        data in vec(any::<u8>(), 0..16),
    ) {
        let keys: Vec<String> = keys.into_iter().collect();
        let pick = |i: &prop::sample::Index| keys[i.index(keys.len())].clone();
        let sender_side = Arc::new(Thing(u64::MAX));
        let value = Uses {
            name: name.clone(),
            first: Resource::new(keys[0].clone(), sender_side.clone()),
            more: picks.iter().map(|i| Resource::new(pick(i), sender_side.clone())).collect(),
            data: Buffer::from(data.clone()),
        };
        let encoded = handoff_wire::encode(&value, None).unwrap();
        prop_assert_eq!(encoded.frames.len(), 1);
        // The body is what a generic msgpack writer makes of ext type 2 with the key's bytes.
        let expected = Mp::Map(vec![
            (key("name"), key(&name)),
            (key("first"), resource_key(&keys[0])),
            (key("more"), Mp::Arr(picks.iter().map(|i| resource_key(&pick(i))).collect())),
            (key("data"), frame_ref(0)),
        ]);
        prop_assert_eq!(&encoded.body, &mp_to_vec(&expected));

        // Bound to the receiver's objects, never to a copy of the sender's.
        let receiver = Arc::new(Resources::new("receiver"));
        let theirs: Vec<Arc<Thing>> = (0..keys.len()).map(|i| Arc::new(Thing(i as u64))).collect();
        for (k, t) in keys.iter().zip(&theirs) {
            receiver.insert(k.clone(), t.clone());
        }
        let got: Uses = Resources::with(&receiver, || handoff_wire::decode("t", &encoded.body, &encoded.frames, None)).unwrap();
        prop_assert_eq!(&got.name, &name);
        prop_assert_eq!(got.first.key(), keys[0].as_str());
        prop_assert!(Arc::ptr_eq(got.first.value(), &theirs[0]));
        prop_assert_eq!(got.more.len(), picks.len());
        for (r, i) in got.more.iter().zip(&picks) {
            let at = i.index(keys.len());
            prop_assert_eq!(r.key(), keys[at].as_str());
            prop_assert!(Arc::ptr_eq(r.value(), &theirs[at]));
        }
        prop_assert_eq!(&got.data[..], &data[..]);

        // Unbound, a key is just its name.
        let bare: Vec<ResourceKey> = handoff_wire::decode(
            "t",
            &mp_to_vec(&Mp::Arr(keys.iter().map(|k| resource_key(k)).collect())),
            &[],
            None,
        ).unwrap();
        prop_assert_eq!(bare, keys.iter().map(|k| ResourceKey(k.clone())).collect::<Vec<_>>());
        // And the registry is no longer current once the decode is over.
        prop_assert!(Resources::current().is_none());
    }

    /// A key the receiver does not have is `unknown-resource`, naming the key, the node and
    /// every key the node has (registered or announced by a resolver), sorted.
    #[test]
    fn unknown_keys_name_the_key_and_the_keys_the_node_has(
        have in proptest::collection::btree_set(key_strategy(), 0..5),
        wanted in key_strategy(),
        node in "[a-z]{1,8}",
    ) {
        prop_assume!(!have.contains(&wanted) && !wanted.starts_with("pool:"));
        let registry = Arc::new(Resources::new(node.clone()));
        for k in &have {
            registry.insert(k.clone(), Arc::new(Thing(0)));
        }
        registry.add_resolver(Arc::new(Pools));
        let body = mp_to_vec(&Mp::Arr(vec![resource_key(&wanted)]));
        let err = Resources::with(&registry, || {
            handoff_wire::decode::<Vec<Resource<Thing>>>("t", &body, &[], None)
        }).unwrap_err();
        prop_assert_eq!(err.code(), "unknown-resource");
        let mut available: BTreeSet<String> = have.clone();
        available.insert("pool:*".into());
        let expected = ResourceError::Unknown {
            key: wanted.clone(),
            node: node.clone(),
            available: available.into_iter().collect(),
        };
        prop_assert_eq!(&err, &WireError::UnknownResource(expected));
        let text = err.to_string();
        prop_assert!(text.contains(&format!("{wanted:?}")) && text.contains(&format!("{node:?}")), "{}", text);
        prop_assert!(text.contains("pool:*"), "{}", text);

        // Outside any node there is no registry: the same error, saying so.
        let err = handoff_wire::decode::<Vec<Resource<Thing>>>("t", &body, &[], None).unwrap_err();
        let outside = matches!(&err, WireError::UnknownResource(ResourceError::Unknown { key, .. }) if key == &wanted);
        prop_assert!(outside, "{:?}", err);
    }

    /// A resource key whose payload is not UTF-8 is `bad-body` saying so, wherever a resource
    /// or a key is expected; a UTF-8 payload binds or is unknown.
    #[test]
    fn resource_key_payload_must_be_utf8(payload in vec(any::<u8>(), 0..24)) {
        let body = mp_to_vec(&Mp::Map(vec![(key("k"), Mp::Ext(EXT_RESOURCE_KEY, payload.clone()))]));
        let registry = Arc::new(Resources::new("beta"));
        registry.insert("db", Arc::new(Thing(1)));
        let as_resource = Resources::with(&registry, || {
            handoff_wire::decode::<BTreeMap<String, Resource<Thing>>>("t", &body, &[], None)
        });
        let as_key = handoff_wire::decode::<BTreeMap<String, ResourceKey>>("t", &body, &[], None);
        match std::str::from_utf8(&payload) {
            Err(_) => {
                for err in [as_resource.unwrap_err(), as_key.unwrap_err()] {
                    prop_assert_eq!(err.code(), "bad-body");
                    prop_assert!(err.to_string().contains("not UTF-8"), "{}", err);
                }
            }
            Ok(k) => {
                prop_assert_eq!(&as_key.unwrap()["k"], &ResourceKey(k.to_string()));
                match as_resource {
                    Ok(m) => prop_assert_eq!(k, "db", "bound {:?}", m),
                    Err(e) => {
                        prop_assert_ne!(k, "db");
                        prop_assert_eq!(e.code(), "unknown-resource");
                    }
                }
            }
        }
    }

    /// No extension type, with any payload, anywhere, makes the codec panic: where a
    /// resource is expected, only type 2 is one (others are `bad-body`); where a buffer is
    /// expected, only type 1 is one.
    #[test]
    fn arbitrary_ext_types_never_panic(
        tag in any::<i8>(),
        payload in vec(any::<u8>(), 0..40),
        value in mp_strategy(),
        frames in vec(vec(any::<u8>(), 0..8), 0..3),
    ) {
        let frames: Vec<Bytes> = frames.into_iter().map(Bytes::from).collect();
        let ext = Mp::Ext(tag, payload.clone());
        for body in [
            mp_to_vec(&ext),
            mp_to_vec(&Mp::Arr(vec![ext.clone(), value.clone()])),
            mp_to_vec(&Mp::Map(vec![(key("first"), ext.clone()), (key("data"), ext.clone())])),
            mp_to_vec(&Mp::Map(vec![(ext.clone(), value.clone())])),
        ] {
            check_body(&body, &frames);
        }
        let registry = Arc::new(Resources::new("beta"));
        registry.insert(String::from_utf8_lossy(&payload).into_owned(), Arc::new(Thing(7)));
        let as_resource = Resources::with(&registry, || {
            handoff_wire::decode::<Resource<Thing>>("t", &mp_to_vec(&ext), &[], None)
        });
        let as_key = handoff_wire::decode::<ResourceKey>("t", &mp_to_vec(&ext), &[], None);
        let as_buffer = handoff_wire::decode::<Buffer>("t", &mp_to_vec(&ext), &as_buffers(&frames), None);
        if tag != EXT_RESOURCE_KEY {
            prop_assert_eq!(as_resource.unwrap_err().code(), "bad-body");
            prop_assert_eq!(as_key.unwrap_err().code(), "bad-body");
        } else if std::str::from_utf8(&payload).is_ok() {
            prop_assert!(Arc::ptr_eq(as_resource.unwrap().value(), &registry.get::<Thing>(&String::from_utf8_lossy(&payload)).unwrap()));
            let k = as_key.unwrap();
            prop_assert_eq!(k.0.as_bytes(), &payload[..]);
        }
        if tag != EXT_FRAME_REF {
            prop_assert_eq!(as_buffer.unwrap_err().code(), "bad-body");
        }
    }
}

/// A key of another type, a resolver that opens keys on demand, and one that fails: each as
/// the reference reports it.
#[test]
fn resource_binding_cases() {
    let registry = Arc::new(Resources::new("beta"));
    registry.insert("db", Arc::new(String::from("not a thing")));
    registry.add_resolver(Arc::new(Pools));
    let decode = |k: &str| {
        Resources::with(&registry, || {
            handoff_wire::decode::<Resource<Thing>>("t", &mp_to_vec(&resource_key(k)), &[], None)
        })
    };
    let got = decode("pool:reports").unwrap();
    assert_eq!(got.value().as_ref(), &Thing(7));
    assert!(matches!(
        decode("db").unwrap_err(),
        WireError::UnknownResource(ResourceError::WrongType { ref key, ref node, .. }) if key == "db" && node == "beta"
    ));
    let err = decode("pool:broken").unwrap_err();
    assert_eq!(err.code(), "unknown-resource");
    assert_eq!(
        err.to_string(),
        "resource \"pool:broken\" on node \"beta\" could not be opened: the pool refused"
    );
    let err = decode("nope").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no resource \"nope\" on node \"beta\" (it has: db, pool:*)"
    );
    // A bad frame reference next to an unknown key is reported as what it is, in document order.
    let body = mp_to_vec(&Mp::Arr(vec![frame_ref(5), resource_key("nope")]));
    let err = Resources::with(&registry, || {
        handoff_wire::decode::<(Buffer, Resource<Thing>)>("t", &body, &[], None)
    })
    .unwrap_err();
    assert_eq!(err.code(), "bad-frame-ref");
    let body = mp_to_vec(&Mp::Arr(vec![resource_key("nope"), frame_ref(5)]));
    let err = Resources::with(&registry, || {
        handoff_wire::decode::<(Resource<Thing>, Buffer)>("t", &body, &[], None)
    })
    .unwrap_err();
    assert_eq!(err.code(), "unknown-resource");
    // A failure is not carried over to the next decode on the thread.
    let ok: ResourceKey = handoff_wire::decode("t", &mp_to_vec(&resource_key("db")), &[], None).unwrap();
    assert_eq!(ok, ResourceKey("db".into()));
    let plain = handoff_wire::decode::<Buffer>("t", &mp_to_vec(&Mp::Bin(vec![1])), &[], None);
    assert_eq!(&plain.unwrap()[..], &[1]);
}

/// The canonical ext encodings of resource keys: fixext for 1, 2, 4, 8 and 16 bytes, else
/// ext8 (an empty key too), ext16, ext32.
#[test]
fn resource_keys_are_canonical() {
    let encode = |k: &str| handoff_wire::encode(&ResourceKey(k.into()), None).unwrap().body;
    assert_eq!(encode("db"), [0xd5, 0x02, b'd', b'b']);
    assert_eq!(encode("x"), [0xd4, 0x02, b'x']);
    assert_eq!(encode("abcd")[..2], [0xd6, 0x02]);
    assert_eq!(encode("abcdefgh")[..2], [0xd7, 0x02]);
    assert_eq!(encode(&"k".repeat(16))[..2], [0xd8, 0x02]);
    assert_eq!(encode(""), [0xc7, 0x00, 0x02]);
    assert_eq!(encode("abc"), [0xc7, 0x03, 0x02, b'a', b'b', b'c']);
    assert_eq!(encode("cache:reports")[..3], [0xc7, 0x0d, 0x02]);
    assert_eq!(encode(&"k".repeat(256))[..4], [0xc8, 0x01, 0x00, 0x02]);
    assert_eq!(encode(&"k".repeat(70_000))[..6], [0xc9, 0x00, 0x01, 0x11, 0x70, 0x02]);
    // A Resource writes exactly its key.
    let r = Resource::new("db", Arc::new(Thing(1)));
    assert_eq!(handoff_wire::encode(&r, None).unwrap().body, encode("db"));
}

// ---------------------------------------------------------------------------
// Strict decoding: non-canonical encodings, trailing bytes (spec/WIRE.md §6)
// ---------------------------------------------------------------------------

/// A small deterministic generator for the choices of [`write_noncanonical`].
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        // xorshift64*; the seed is made odd so it never sticks at zero.
        self.0 |= 1;
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Heads or tails.
    fn coin(&mut self) -> bool {
        self.next() & 1 == 0
    }

    /// One of `options`.
    fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[(self.next() % options.len() as u64) as usize]
    }
}

/// Parses one msgpack value, as a canonical encoder writes it (for headers to re-encode).
fn parse_mp(input: &mut &[u8]) -> Mp {
    fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
        let (head, rest) = input.split_at(n);
        *input = rest;
        head
    }
    fn be(input: &mut &[u8], n: usize) -> u64 {
        take(input, n).iter().fold(0, |acc, &b| (acc << 8) | b as u64)
    }
    let m = take(input, 1)[0];
    let items = |input: &mut &[u8], n: u64| (0..n).map(|_| parse_mp(input)).collect::<Vec<_>>();
    let text = |input: &mut &[u8], n: u64| Mp::Str(String::from_utf8(take(input, n as usize).to_vec()).unwrap());
    match m {
        0x00..=0x7f => Mp::UInt(m as u64),
        0xe0..=0xff => Mp::Int(m as i8 as i64),
        0x80..=0x8f | 0xde | 0xdf => {
            let n = match m {
                0xde => be(input, 2),
                0xdf => be(input, 4),
                _ => (m & 0x0f) as u64,
            };
            Mp::Map((0..n).map(|_| (parse_mp(input), parse_mp(input))).collect())
        }
        0x90..=0x9f => Mp::Arr(items(input, (m & 0x0f) as u64)),
        0xdc => {
            let n = be(input, 2);
            Mp::Arr(items(input, n))
        }
        0xdd => {
            let n = be(input, 4);
            Mp::Arr(items(input, n))
        }
        0xa0..=0xbf => text(input, (m & 0x1f) as u64),
        0xd9..=0xdb => {
            let n = be(input, 1 << (m - 0xd9));
            text(input, n)
        }
        0xc4..=0xc6 => {
            let n = be(input, 1 << (m - 0xc4)) as usize;
            Mp::Bin(take(input, n).to_vec())
        }
        0xc0 => Mp::Nil,
        0xc2 => Mp::Bool(false),
        0xc3 => Mp::Bool(true),
        0xcc..=0xcf => Mp::UInt(be(input, 1 << (m - 0xcc))),
        0xd0..=0xd3 => {
            let n = 1 << (m - 0xd0);
            let v = be(input, n);
            let shift = 64 - 8 * n as u32;
            Mp::Int(((v << shift) as i64) >> shift)
        }
        0xcb => Mp::F64(f64::from_bits(be(input, 8))),
        0xd4..=0xd8 => {
            let t = take(input, 1)[0] as i8;
            Mp::Ext(t, take(input, 1 << (m - 0xd4)).to_vec())
        }
        0xc7..=0xc9 => {
            let n = be(input, 1 << (m - 0xc7)) as usize;
            let t = take(input, 1)[0] as i8;
            Mp::Ext(t, take(input, n).to_vec())
        }
        other => panic!("the canonical encoder never writes {other:#04x}"),
    }
}

/// Writes `v` in valid msgpack chosen at random among the encodings of the same value: any
/// integer format wide enough (signed formats for non-negative values too), any str, bin,
/// ext, array or map format wide enough, and map entries in another order.
fn write_noncanonical(v: &Mp, c: &mut Choices, out: &mut Vec<u8>) {
    fn sized(out: &mut Vec<u8>, markers: [u8; 3], len: usize, c: &mut Choices) {
        let widths: Vec<usize> = [1usize, 2, 4]
            .into_iter()
            .filter(|w| *w == 4 || len < 1 << (8 * w))
            .collect();
        let w = c.pick(&widths);
        out.push(markers[w.trailing_zeros() as usize]);
        out.extend_from_slice(&(len as u64).to_be_bytes()[8 - w..]);
    }
    match v {
        Mp::Nil => out.push(0xc0),
        Mp::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mp::UInt(u) => {
            let u = *u;
            let mut options = vec![(0xcf, 8)];
            for (marker, width) in [(0xcc, 1), (0xcd, 2), (0xce, 4)] {
                if u < 1 << (8 * width) {
                    options.push((marker, width));
                }
            }
            for (marker, width) in [(0xd0, 1), (0xd1, 2), (0xd2, 4), (0xd3, 8)] {
                if u < 1 << (8 * width - 1) {
                    options.push((marker, width));
                }
            }
            if u < 0x80 {
                options.push((0, 0));
            }
            match c.pick(&options) {
                (_, 0) => out.push(u as u8),
                (marker, width) => {
                    out.push(marker);
                    out.extend_from_slice(&u.to_be_bytes()[8 - width..]);
                }
            }
        }
        Mp::Int(i) if *i >= 0 => write_noncanonical(&Mp::UInt(*i as u64), c, out),
        Mp::Int(i) => {
            let i = *i;
            let mut options = vec![(0xd3, 8)];
            for (marker, width) in [(0xd0, 1), (0xd1, 2), (0xd2, 4)] {
                if i >= -(1 << (8 * width - 1)) {
                    options.push((marker, width));
                }
            }
            if i >= -32 {
                options.push((0, 0));
            }
            match c.pick(&options) {
                (_, 0) => out.push(i as u8),
                (marker, width) => {
                    out.push(marker);
                    out.extend_from_slice(&i.to_be_bytes()[8 - width..]);
                }
            }
        }
        Mp::F64(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Mp::Str(s) => {
            if s.len() < 32 && c.coin() {
                out.push(0xa0 | s.len() as u8);
            } else {
                sized(out, [0xd9, 0xda, 0xdb], s.len(), c);
            }
            out.extend_from_slice(s.as_bytes());
        }
        Mp::Bin(b) => {
            sized(out, [0xc4, 0xc5, 0xc6], b.len(), c);
            out.extend_from_slice(b);
        }
        Mp::Ext(t, data) => {
            let fixed = [1, 2, 4, 8, 16].iter().position(|n| *n == data.len());
            match fixed {
                Some(k) if c.coin() => out.push(0xd4 + k as u8),
                _ => sized(out, [0xc7, 0xc8, 0xc9], data.len(), c),
            }
            out.push(*t as u8);
            out.extend_from_slice(data);
        }
        Mp::Arr(items) => {
            if items.len() < 16 && c.coin() {
                out.push(0x90 | items.len() as u8);
            } else {
                let w = if items.len() < 1 << 16 { c.pick(&[2, 4]) } else { 4 };
                out.push(if w == 2 { 0xdc } else { 0xdd });
                out.extend_from_slice(&(items.len() as u32).to_be_bytes()[4 - w..]);
            }
            for i in items {
                write_noncanonical(i, c, out);
            }
        }
        Mp::Map(entries) => {
            if entries.len() < 16 && c.coin() {
                out.push(0x80 | entries.len() as u8);
            } else {
                let w = if entries.len() < 1 << 16 { c.pick(&[2, 4]) } else { 4 };
                out.push(if w == 2 { 0xde } else { 0xdf });
                out.extend_from_slice(&(entries.len() as u32).to_be_bytes()[4 - w..]);
            }
            // Keys in another order: a random permutation.
            let mut order: Vec<usize> = (0..entries.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (c.next() % (i as u64 + 1)) as usize);
            }
            for i in order {
                write_noncanonical(&entries[i].0, c, out);
                write_noncanonical(&entries[i].1, c, out);
            }
        }
    }
}

fn noncanonical(v: &Mp, seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    write_noncanonical(v, &mut Choices(seed), &mut out);
    out
}

/// What a decode tells a peer: the header, or only the error's code.
fn outcome<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Header<'a>, &'static str> {
    Header::decode(bytes, limits).map_err(|e| e.code())
}

/// A `msg` with descriptors of every kind, and the headers of every other kind.
fn any_header() -> impl Strategy<Value = (String, Vec<u8>, Vec<Descriptor>, OwnedHeader)> {
    (
        text(),
        vec(any::<u8>(), 0..24),
        vec(
            prop_oneof![
                (0u64..1 << 40).prop_map(|len| Descriptor::Inline { len }),
                shm_descriptor(),
                ticket_claim().prop_map(Descriptor::Ticket),
                text().prop_map(|key| Descriptor::Tag { key }),
            ],
            0..5,
        ),
        header_strategy(),
    )
}

proptest! {
    #![proptest_config(config())]

    /// The parser of these tests reads back what the canonical encoder wrote, and the
    /// canonical choice of `write_noncanonical`'s formats is one of its choices.
    #[test]
    fn parse_mp_reads_canonical_headers((type_name, body, descs, owned) in any_header()) {
        let msg = Header::Msg { type_name: &type_name, body: &body, frames: descs };
        for header in [msg, owned.header()] {
            let bytes = header.encode();
            let mut input = &bytes[..];
            let value = parse_mp(&mut input);
            prop_assert!(input.is_empty());
            prop_assert_eq!(mp_to_vec(&value), bytes);
        }
    }

    /// A header decodes to the same header whether it is written canonically or in other
    /// valid encodings of the same values (wider formats, signed integers, keys in another
    /// order): decoders accept every valid encoding (§6), and the result re-encodes to the
    /// canonical bytes.
    #[test]
    fn non_canonical_encodings_decode_alike((type_name, body, descs, owned) in any_header(), seed in any::<u64>()) {
        let msg = Header::Msg { type_name: &type_name, body: &body, frames: descs };
        for header in [msg, owned.header()] {
            let canonical = header.encode();
            let value = parse_mp(&mut &canonical[..]);
            let other = noncanonical(&value, seed);
            let decoded = Header::decode(&other, &UNLIMITED);
            prop_assert_eq!(decoded.as_ref(), Ok(&header), "{:02x?}", other);
            prop_assert_eq!(decoded.unwrap().encode(), canonical);
        }
    }

    /// Any structured header, valid or not, gets the same outcome however it is encoded: the
    /// same header, or an error with the same code (§6 rules are about values, not formats,
    /// and §11.2's order is that of the spec's tables, not of the bytes).
    #[test]
    fn encodings_do_not_change_the_outcome(header in structured_header(), seed in any::<u64>()) {
        let canonical = mp_to_vec(&header);
        let other = noncanonical(&header, seed);
        let small = Limits { max_header_bytes: u32::MAX, max_frames: 2, max_frame_bytes: 8, max_message_bytes: 12, ..Limits::DEFAULT };
        for limits in [Limits::DEFAULT, small] {
            prop_assert_eq!(outcome(&canonical, &limits), outcome(&other, &limits), "{:02x?}", other);
        }
    }

    /// Bytes after the header map, within the header length, make any header malformed, also
    /// a valid one (§6 rule 1).
    #[test]
    fn bytes_after_the_map_are_malformed(owned in header_strategy(), extra in vec(any::<u8>(), 1..4)) {
        let mut header = owned.header().encode();
        header.extend_from_slice(&extra);
        prop_assert_eq!(outcome(&header, &Limits::DEFAULT), Err("malformed-header"));
        let e = decode_message(&with_prefix(&header), &Limits::DEFAULT).unwrap_err();
        prop_assert_eq!(e.code(), "malformed-header");
    }

    /// The header's value budget counts every value, ignored or not: a `ready` whose ignored
    /// key holds `n` values in nested arrays and maps is valid exactly when it has at most
    /// 65 536 values in all.
    #[test]
    fn the_value_budget_is_exact(n in 65_400u32..65_600, split in 0u32..100) {
        // {"k": "ready", "x": [[nil × split], nil × (n - split - 1)]}: 5 + n values.
        let inner = split.min(n.saturating_sub(1));
        let mut header = mp_to_vec(&Mp::Map(vec![(key("k"), key("ready")), (key("x"), Mp::Nil)]));
        header.pop();
        header.push(0xdd);
        header.extend_from_slice(&(n - inner).to_be_bytes());
        header.push(0xdd);
        header.extend_from_slice(&inner.to_be_bytes());
        header.resize(header.len() + (n - 1) as usize, 0xc0);
        let result = outcome(&header, &Limits::DEFAULT);
        if 5 + n <= 65_536 {
            prop_assert_eq!(result, Ok(Header::Ready));
        } else {
            prop_assert_eq!(result, Err("malformed-header"));
        }
    }
}

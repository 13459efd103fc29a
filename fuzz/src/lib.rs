//! What the fuzz targets share: the limits they decode under, the error codes each decoder
//! may report (spec/WIRE.md §11.2), the invariants a decoded header or body keeps, and the
//! receiver's side of a body (its frames, its resource registry, the typed values it asks for).
//!
//! A target fails (a *finding*) when a decoder panics, aborts, overflows the stack, runs out of
//! memory or time, reports a code its step of §11.2 cannot produce, or breaks an invariant.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use handoff_wire::resource::{AnyResource, Resolver};
use handoff_wire::{Buffer, Header, Limits, Resource, ResourceKey, Resources, WireError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Limits of an established connection (the spec's defaults).
pub const DEFAULT_LIMITS: Limits = Limits::DEFAULT;

/// Limits while the handshake runs: a header of at most 64 KiB and 1024 values (spec/WIRE.md
/// §9), the rest as by default (`Limits::during_handshake`, spelled out as a constant).
pub const HANDSHAKE_LIMITS: Limits = Limits {
    max_header_bytes: handoff_wire::HANDSHAKE_HEADER_BYTES,
    max_header_values: handoff_wire::HANDSHAKE_HEADER_VALUES,
    ..Limits::DEFAULT
};

/// Both sets of limits, each input is decoded under.
pub const LIMITS: [Limits; 2] = [DEFAULT_LIMITS, HANDSHAKE_LIMITS];

/// Codes a header decoder may report (§11.2 steps 2–3).
pub const HEADER_CODES: &[&str] = &[
    "malformed-header",
    "unknown-kind",
    "too-many-frames",
    "unknown-descriptor",
    "frame-too-large",
    "message-too-large",
    "header-too-large",
    "handshake",
];

/// Codes decoding a whole message from bytes may report (§11.2 steps 1–3, 5 and 6 without
/// file descriptors).
pub const MESSAGE_CODES: &[&str] = &[
    "truncated",
    "header-too-large",
    "malformed-header",
    "unknown-kind",
    "too-many-frames",
    "unknown-descriptor",
    "frame-too-large",
    "message-too-large",
    "unsupported-descriptor",
    "handshake",
];

/// Codes a body decoder may report (§11.2 step 7).
pub const BODY_CODES: &[&str] = &["bad-body", "bad-frame-ref", "unknown-resource"];

/// Codes decoding a preamble and negotiating a version may report (§3).
pub const PREAMBLE_CODES: &[&str] = &["truncated", "bad-magic", "handshake", "unsupported-version"];

/// Asserts that `error` is one of `allowed`, and that it formats (its message is built from
/// the peer's bytes).
pub fn expect_code(error: &WireError, allowed: &[&str], what: &str) {
    let text = error.to_string();
    assert!(
        allowed.contains(&error.code()),
        "{what}: unexpected error code {:?} ({text})",
        error.code()
    );
}

/// A decoded header re-encodes to bytes that decode, under the same limits, to the same
/// header, and re-encode to the same bytes (the encoding is canonical).
pub fn check_header(header: &Header<'_>, limits: &Limits) {
    let encoded = header.encode();
    let again = Header::decode(&encoded, limits)
        .unwrap_or_else(|e| panic!("a decoded header re-encodes to bytes that do not decode: {e}\n{header:?}"));
    assert_eq!(&again, header, "a decoded header re-encodes to a different header");
    assert_eq!(again.encode(), encoded, "the header encoding is not canonical");
}

/// Decodes `body` as a `T` with the receiver's frames and registry current; any error must be
/// a body error, and a value that decodes must survive encode → decode → encode unchanged.
pub fn check_body<T: Serialize + DeserializeOwned>(type_name: &str, body: &[u8], frames: &[Buffer]) {
    Resources::with(registry(), || {
        match handoff_wire::decode::<T>(type_name, body, frames, None) {
            Ok(value) => round_trip(type_name, &value),
            Err(e) => expect_code(&e, BODY_CODES, type_name),
        }
    })
}

fn round_trip<T: Serialize + DeserializeOwned>(type_name: &str, value: &T) {
    let first = handoff_wire::encode(value, None)
        .unwrap_or_else(|e| panic!("{type_name}: a decoded value does not encode: {e}"));
    let again: T = handoff_wire::decode(type_name, &first.body, &first.frames, None)
        .unwrap_or_else(|e| panic!("{type_name}: an encoded value does not decode: {e}"));
    let second =
        handoff_wire::encode(&again, None).unwrap_or_else(|e| panic!("{type_name}: does not encode again: {e}"));
    assert_eq!(
        first, second,
        "{type_name}: encode → decode → encode changed the body or frames"
    );
}

/// The frames a received body may refer to: an empty one, a short one and a 4 KiB one.
pub fn frames() -> &'static [Buffer] {
    static FRAMES: OnceLock<Vec<Buffer>> = OnceLock::new();
    FRAMES.get_or_init(|| {
        vec![
            Buffer::new(),
            Buffer::from_static(b"frame one"),
            Buffer::from(vec![0x5a; 4096]),
        ]
    })
}

/// A pool a value refers to by key.
#[derive(Debug)]
pub struct Pool {
    /// Its size.
    pub size: usize,
}

/// A cache a value refers to by key.
#[derive(Debug)]
pub struct Cache;

/// Opens `open:*` keys on demand (as a `Pool`) and fails to open `broken:*` ones.
struct Opener;

impl Resolver for Opener {
    fn resolve(&self, key: &str) -> Option<Result<AnyResource, String>> {
        if key.starts_with("open:") {
            Some(Ok(Arc::new(Pool { size: key.len() }) as Arc<dyn Any + Send + Sync>))
        } else if key.starts_with("broken:") {
            Some(Err("the fuzzer's resolver refuses it".into()))
        } else {
            None
        }
    }

    fn keys(&self) -> Vec<String> {
        vec!["open:…".into(), "broken:…".into()]
    }
}

/// The receiving node's registry: `db` (a `Pool`), `cache:reports` (a `Cache`), `text` (a
/// `String`, the wrong type for both), and a resolver.
pub fn registry() -> &'static Arc<Resources> {
    static REGISTRY: OnceLock<Arc<Resources>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Resources::new("fuzz");
        r.insert("db", Arc::new(Pool { size: 4 }));
        r.insert("cache:reports", Arc::new(Cache));
        r.insert("text", Arc::new(String::from("not a pool")));
        r.add_resolver(Arc::new(Opener));
        Arc::new(r)
    })
}

/// A typed value with every kind of field a body carries: integers, floats, strings, bytes,
/// buffers (plain, optional, in a vector, in a map), resource keys and bound resources, and
/// nested enums.
#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    /// An unsigned integer.
    pub id: u64,
    /// A string.
    pub name: String,
    /// A small signed integer (out-of-range values are `bad-body`).
    pub small: i8,
    /// A signed integer.
    pub delta: i64,
    /// A float.
    pub ratio: f64,
    /// A bool.
    pub flag: bool,
    /// A buffer.
    pub data: Buffer,
    /// An optional buffer.
    pub maybe: Option<Buffer>,
    /// Buffers in a vector.
    pub parts: Vec<Buffer>,
    /// Buffers by name.
    pub tags: BTreeMap<String, Buffer>,
    /// A resource key, unbound.
    pub key: ResourceKey,
    /// A resource bound to the receiver's registry.
    pub pool: Resource<Pool>,
    /// An optional bound resource.
    pub cache: Option<Resource<Cache>>,
    /// Nested enums.
    pub shape: Shape,
    /// A recursive enum.
    pub steps: Vec<Step>,
    /// Small integers.
    pub counts: Vec<u16>,
    /// A tuple.
    pub pair: (u32, Option<String>),
}

/// An enum with every kind of variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum Shape {
    /// A unit variant.
    Empty,
    /// A newtype variant.
    One(Buffer),
    /// A tuple variant.
    Pair(u32, Option<Buffer>),
    /// A struct variant that nests the enum.
    Named {
        /// A string.
        name: String,
        /// The nested shape.
        inner: Option<Box<Shape>>,
    },
}

/// A recursive enum whose variants hold resources and buffers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Step {
    /// A key and a range.
    Read {
        /// The key.
        key: ResourceKey,
        /// The range.
        range: (u64, u64),
    },
    /// A buffer.
    Write(Buffer),
    /// A bound resource.
    Use(Resource<Pool>),
    /// Nested steps.
    Nested(Vec<Step>),
}

fn job(id: u64) -> Job {
    let frame = |n: usize| Buffer::from(vec![id as u8; n]);
    Job {
        id,
        name: format!("job {id}"),
        small: -3,
        delta: -(id as i64) * 1_000_000_007,
        ratio: 0.5 + id as f64,
        flag: id.is_multiple_of(2),
        data: frame(16),
        maybe: (id % 2 == 1).then(|| frame(3)),
        parts: (0..id as usize).map(frame).collect(),
        tags: BTreeMap::from([("a".to_string(), frame(1)), ("b".to_string(), frame(2))]),
        key: ResourceKey("cache:reports".into()),
        pool: Resource::new(if id == 0 { "db" } else { "open:pool" }, Arc::new(Pool { size: 1 })),
        cache: (id != 1).then(|| Resource::new("cache:reports", Arc::new(Cache))),
        shape: Shape::Named {
            name: "outer".into(),
            inner: Some(Box::new(if id == 0 {
                Shape::Pair(7, Some(frame(5)))
            } else {
                Shape::One(frame(4))
            })),
        },
        steps: vec![
            Step::Read {
                key: ResourceKey("db".into()),
                range: (0, id),
            },
            Step::Nested(vec![
                Step::Write(frame(8)),
                Step::Use(Resource::new("db", Arc::new(Pool { size: 2 }))),
            ]),
        ],
        counts: vec![1, 300, 65535],
        pair: (id as u32, Some("x".into())),
    }
}

/// Seed inputs for the body target, made by the real encoder: `(name, bytes)` where the bytes
/// are `[3][body]` (all three of the target's frames; the bodies' frame references are
/// renumbered into them). Each seed decodes as the type it was made from, or this panics (so a
/// change to the codec that breaks them fails the target's first run, not silently its seeds).
pub fn body_seeds() -> Vec<(String, Vec<u8>)> {
    fn renumber(encoded: handoff_wire::EncodedBody) -> Vec<u8> {
        let mut body = encoded.body;
        let marker = [0xd6u8, handoff_wire::EXT_FRAME_REF as u8];
        let mut i = 0;
        while i + 6 <= body.len() {
            if body[i..i + 2] == marker {
                let index = u32::from_be_bytes([body[i + 2], body[i + 3], body[i + 4], body[i + 5]]);
                body[i + 2..i + 6].copy_from_slice(&(index % 3).to_be_bytes());
                i += 6;
            } else {
                i += 1;
            }
        }
        body
    }
    fn seed<T: Serialize + DeserializeOwned>(name: String, value: &T) -> (String, Vec<u8>) {
        let body = renumber(handoff_wire::encode(value, None).expect("a seed encodes"));
        Resources::with(registry(), || handoff_wire::decode::<T>(&name, &body, frames(), None))
            .unwrap_or_else(|e| panic!("body seed {name} does not decode: {e}"));
        let mut input = vec![3u8];
        input.extend_from_slice(&body);
        (name, input)
    }
    let mut seeds: Vec<(String, Vec<u8>)> = (0..3).map(|id| seed(format!("job-{id}"), &job(id))).collect();
    seeds.push(seed("steps".into(), &job(2).steps));
    seeds.push(seed(
        "value".into(),
        &rmpv::Value::Map(vec![
            (rmpv::Value::from("n"), rmpv::Value::from(-1)),
            (
                rmpv::Value::from(1),
                rmpv::Value::Ext(handoff_wire::EXT_FRAME_REF, vec![0, 0, 0, 2]),
            ),
            (
                rmpv::Value::from("k"),
                rmpv::Value::Ext(handoff_wire::EXT_RESOURCE_KEY, b"db".to_vec()),
            ),
            (rmpv::Value::from("f"), rmpv::Value::F32(1.5)),
            (
                rmpv::Value::Nil,
                rmpv::Value::Array(vec![rmpv::Value::Boolean(true), rmpv::Value::Binary(vec![1, 2])]),
            ),
        ]),
    ));
    seeds
}

/// Writes [`body_seeds`] into `dir` (once; existing files are kept).
pub fn write_body_seeds(dir: &std::path::Path) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    for (name, bytes) in body_seeds() {
        let path = dir.join(format!("typed-{name}"));
        if !path.exists() {
            let _ = std::fs::write(path, bytes);
        }
    }
}

/// Formats any debug value (to make sure `Debug` of decoded values cannot panic either).
pub fn touch<T: Debug>(value: &T) -> usize {
    format!("{value:?}").len()
}

//! The pieces every vector table builds from: the [`Vector`] type, the fixtures (hellos,
//! tickets, tokens) and the helpers that write messages and their JSON descriptions.

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Header, Hello, Preamble, TicketClaim, TicketOp};
use serde_json::{json, Value as Json};

/// One test vector.
#[derive(Debug, Clone)]
pub struct Vector {
    /// File stem.
    pub name: &'static str,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The JSON description (without the `file` key, which the writer adds).
    pub description: Json,
}

pub(crate) fn hello_fixture() -> Hello {
    Hello {
        node_id: "0123456789abcdef0123456789abcdef".into(),
        name: "alpha".into(),
        host_id: "host-a".into(),
        pid: 4242,
        process_id: "fedcba9876543210fedcba9876543210".into(),
        language: "rust".into(),
        implementation: "handoff-rs/0.1.0".into(),
        version: 1,
        capabilities: vec!["inline".into()],
        nonce: (0u8..32).collect(),
        listen: Some("tcp://127.0.0.1:7070".into()),
        unix: None,
    }
}

pub(crate) fn hello_fixture_b() -> Hello {
    Hello {
        node_id: "00000000000000000000000000000001".into(),
        name: "beta".into(),
        host_id: "host-b".into(),
        pid: 7,
        process_id: "00000000000000000000000000000002".into(),
        language: "python".into(),
        implementation: "handoff-py/0.1.0".into(),
        version: 1,
        capabilities: vec!["inline".into()],
        nonce: (100u8..132).collect(),
        listen: None,
        unix: None,
    }
}

pub(crate) fn hello_json(h: &Hello) -> Json {
    let mut j = json!({
        "k": "hello", "node": h.node_id, "name": h.name, "host": h.host_id, "pid": h.pid,
        "proc": h.process_id, "lang": h.language, "impl": h.implementation, "v": h.version,
        "caps": h.capabilities, "nonce": {"$bin": hex::encode(&h.nonce)},
    });
    if let Some(l) = &h.listen {
        j["listen"] = json!(l);
    }
    if let Some(u) = &h.unix {
        j["unix"] = json!(u);
    }
    j
}

pub(crate) fn message(header: &Header<'_>, frames: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(header, &mut out);
    for f in frames {
        out.extend_from_slice(f);
    }
    out
}

/// Encodes a header from raw msgpack bytes (for vectors the encoder refuses to write).
pub(crate) fn raw_message(header_msgpack: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut out = (header_msgpack.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(header_msgpack);
    out.extend_from_slice(tail);
    out
}

pub(crate) fn msgpack(value: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("writing msgpack to memory");
    out
}

pub(crate) fn s(v: &str) -> rmpv::Value {
    rmpv::Value::from(v)
}

pub(crate) fn map(pairs: Vec<(&str, rmpv::Value)>) -> rmpv::Value {
    rmpv::Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

pub(crate) fn invalid(name: &'static str, kind: &str, bytes: Vec<u8>, error: &str, what: &str) -> Vector {
    Vector {
        name,
        bytes,
        description: json!({"kind": kind, "valid": false, "error": error, "description": what}),
    }
}

/// A preamble vector: `bytes` negotiated against a side that sent `against`.
pub(crate) fn preamble_vector(name: &'static str, bytes: Preamble, against: Preamble, what: &str) -> Vector {
    let range = |p: Preamble| json!({"min_version": p.min_version, "max_version": p.max_version});
    let mut description = json!({
        "kind": "preamble", "description": what, "against": range(against),
        "decoded": {"min_version": bytes.min_version, "max_version": bytes.max_version, "flags": bytes.flags},
    });
    match against.negotiate(&bytes) {
        Ok(v) => {
            description["valid"] = json!(true);
            description["negotiated"] = json!(v);
        }
        Err(e) => {
            description["valid"] = json!(false);
            description["error"] = json!(e.code());
            description.as_object_mut().expect("an object").remove("decoded");
        }
    }
    Vector {
        name,
        bytes: bytes.encode().to_vec(),
        description,
    }
}

/// The buffer the ticket vectors are about: 1 MiB, byte `i` = `i % 251`.
pub(crate) fn ticket_buffer() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i % 251) as u8).collect()
}

/// BLAKE3 of [`ticket_buffer`] (`b3sum` of those bytes), the ticket's `digest`.
pub(crate) const TICKET_DIGEST: &str = "74cb441fd087764ca9c3694da742ebe30cbeb3060a17009ca81825c7a8d10343";

/// Beta's token for lease 42: bytes 64..=95.
pub(crate) fn beta_token() -> Vec<u8> {
    (64u8..96).collect()
}

/// The token alpha issues to carol when beta forwards the ticket: bytes 96..=127.
pub(crate) fn carol_token() -> Vec<u8> {
    (96u8..128).collect()
}

/// Carol, the third node of the forwarding vectors.
pub(crate) const CAROL: &str = "00000000000000000000000000000003";

/// The ticket alpha (the owner) gives beta for [`ticket_buffer`].
pub(crate) fn ticket_fixture() -> TicketClaim {
    TicketClaim {
        len: 1 << 20,
        owner: hello_fixture().node_id,
        addr: hello_fixture().listen,
        lease: 42,
        token: beta_token(),
        digest: handoff_wire::TicketDigest::Blake3(
            hex::decode(TICKET_DIGEST).expect("hex").try_into().expect("32 bytes"),
        ),
        ttl_ms: 30_000,
        lazy: false,
    }
}

/// The body of the `demo.Sample` vectors with a ticket or an shm frame:
/// `{"data": frame 0, "meta": frame 1}`.
pub(crate) const TWO_FRAME_REFS: &[u8] = &[
    0x82, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 0, 0xa4, b'm', b'e', b't', b'a', 0xd6, 0x01, 0, 0, 0, 1,
];

pub(crate) fn bin_json(bytes: &[u8]) -> Json {
    json!({"$bin": hex::encode(bytes)})
}

/// A valid ticket-protocol message on TCP: the header, then `follow` (the bytes of a `pulled`).
pub(crate) fn ticket_vector(name: &'static str, op: TicketOp, follow: &[u8], header: Json, what: &str) -> Vector {
    let frames: Vec<Json> = if matches!(op, TicketOp::Pulled { .. }) {
        vec![bin_json(follow)]
    } else {
        vec![]
    };
    Vector {
        name,
        bytes: message(&Header::Ticket(op), &[follow]),
        description: json!({
            "kind": "message", "valid": true, "description": what, "header": header, "frames": frames,
        }),
    }
}

//! The version-1 vector table: every vector of the format's first version, in a stable
//! order. One idea, one long list, so it stays in one file.

use handoff_wire::{
    auth, Buffer, Descriptor, Header, Hello, Preamble, ResourceKey, TicketClaim, TicketOp, EXT_RESOURCE_KEY,
};
use serde::Serialize;
use serde_json::json;

use crate::fixtures::*;

/// A struct with two buffers, the body of the `msg-two-frames` vector.
#[derive(Serialize)]
struct Sample {
    name: String,
    seq: u32,
    data: Buffer,
    meta: Buffer,
}

/// The body of the `msg-resource-key` vector: a query that names two of the receiver's
/// resources by key (as `Resource<T>` fields serialize).
#[derive(Serialize)]
struct Query {
    sql: String,
    pool: ResourceKey,
    cache: ResourceKey,
}

/// The dataset of the data-handle vectors (a `Blob` dataset holding [`ticket_buffer`]).
pub const BLOB_DATASET: &str = "4a0d2e7c-5b1f-4c3e-9d8a-6f2b1c0e9a71";

/// The dataset of the data-handle vector without a fallback (a `BlobTree` dataset).
pub const TREE_DATASET: &str = "b7e3c1d2-8a4f-4e6b-a1c9-3d5f7e9b0c24";

/// A data handle's tag as `handoff-data`'s `BlobTag` writes it (WIRE.md §8.5): optional keys
/// omitted when unknown, `path` always written.
#[derive(Serialize)]
struct Tag {
    dataset: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'static str>,
    path: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
}

/// A data handle as `handoff-data`'s `Blob` and `BlobHandle` write it (WIRE.md §8.5).
#[derive(Serialize)]
struct Handle {
    catalog: ResourceKey,
    tag: Tag,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<Buffer>,
}

/// The body of the data-handle vectors: a work item whose input is a data handle.
#[derive(Serialize)]
struct Work {
    input: Handle,
}

/// Beta's token for lease 43, the data handle's fallback: bytes 128..=159.
fn fallback_token() -> Vec<u8> {
    (128u8..160).collect()
}

/// The vectors of version 1 of the format, valid and invalid, in a stable order.
pub(crate) fn vectors() -> Vec<Vector> {
    let mut v = Vec::new();
    // The preambles of version 1, each negotiated against a version-1 implementation.
    let v1 = Preamble::V1_ONLY;
    let range = |min_version, max_version| Preamble {
        min_version,
        max_version,
        flags: 0,
    };
    v.push(preamble_vector(
        "preamble-v1",
        v1,
        v1,
        "The preamble of a version-1 implementation.",
    ));
    v.push(preamble_vector(
        "preamble-newer-peer",
        range(1, 3),
        v1,
        "A newer peer that still speaks version 1: both use version 1.",
    ));
    v.push(preamble_vector(
        "preamble-no-common-version",
        range(2, 3),
        v1,
        "A peer that speaks only versions 2 and 3: negotiation with a version-1 implementation fails.",
    ));
    for (name, bytes, what) in [
        (
            "preamble-bad-magic",
            &b"GET / HTTP/1.1\r\n"[..],
            "An HTTP client connected to a handoff port.",
        ),
        ("preamble-truncated", b"HANDOFF", "The connection closed after 7 bytes."),
    ] {
        let mut bad = invalid(
            name,
            "preamble",
            bytes.to_vec(),
            if bytes.len() < 16 { "truncated" } else { "bad-magic" },
            what,
        );
        bad.description["against"] = json!({"min_version": 1, "max_version": 1});
        v.push(bad);
    }

    let hello = hello_fixture();
    v.push(Vector {
        name: "hello",
        bytes: message(&Header::Hello(hello.clone()), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A hello: the first message after the preambles.",
            "header": hello_json(&hello), "frames": [],
        }),
    });

    let same_host = Hello {
        capabilities: vec!["inline".into(), "shm".into()],
        unix: Some("unix:///run/user/1000/handoff/alpha-0123456789ab.sock".into()),
        ..hello.clone()
    };
    v.push(Vector {
        name: "hello-same-host",
        bytes: message(&Header::Hello(same_host.clone()), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A hello from a node that offers shared memory: capability shm and its Unix socket.",
            "header": hello_json(&same_host), "frames": [],
        }),
    });

    // The authentication proof between the two fixture hellos.
    let secret = b"correct horse battery staple";
    let hello_a = hello.clone();
    let hello_b = hello_fixture_b();
    let bytes_a = Header::Hello(hello_a.clone()).encode();
    let bytes_b = Header::Hello(hello_b.clone()).encode();
    let proof_a = auth::proof(secret, &bytes_a, &bytes_b);
    v.push(Vector {
        name: "auth",
        bytes: message(&Header::Auth { mac: proof_a.to_vec() }, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The auth message alpha sends to beta. Its mac is HMAC-SHA256(secret, \"handoff-v1-auth\\0\" | u32 len | alpha's hello header | u32 len | beta's hello header).",
            "header": {"k": "auth", "mac": {"$bin": hex::encode(proof_a)}},
            "frames": [],
            "auth": {
                "secret": {"$bin": hex::encode(secret)},
                "prover_hello": {"$bin": hex::encode(&bytes_a)},
                "verifier_hello": {"$bin": hex::encode(&bytes_b)},
                "verifier_proof": {"$bin": hex::encode(auth::proof(secret, &bytes_b, &bytes_a))},
            },
        }),
    });
    v.push(Vector {
        name: "ready",
        bytes: message(&Header::Ready, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "Ready: the peer's proof verified.",
            "header": {"k": "ready"}, "frames": [],
        }),
    });
    v.push(Vector {
        name: "error",
        bytes: message(
            &Header::Error {
                code: "auth-failed".into(),
                message: "wrong cluster secret".into(),
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "An error the sender reports before it closes the connection.",
            "header": {"k": "error", "code": "auth-failed", "msg": "wrong cluster secret"}, "frames": [],
        }),
    });
    let tls_msg = "this node requires TLS: connect with TLS on (a certificate, its key and the cluster's CA)";
    v.push(Vector {
        name: "error-tls-required",
        bytes: message(
            &Header::Error {
                code: "tls-required".into(),
                message: tls_msg.into(),
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "What a node that requires TLS (WIRE.md §3.1) sends, in plain text and before any preamble, to a peer that connected without TLS; then it closes.",
            "header": {"k": "error", "code": "tls-required", "msg": tls_msg}, "frames": [],
        }),
    });

    let ping = handoff_wire::encode(&json!({"seq": 7}), None).expect("encode");
    v.push(Vector {
        name: "msg-no-frames",
        bytes: message(
            &Header::Msg {
                type_name: "handoff.Ping",
                body: &ping.body,
                frames: vec![],
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A message with a small body and no frames.",
            "header": {"k": "msg", "t": "handoff.Ping", "b": {"$bin": hex::encode(&ping.body)}, "f": []},
            "frames": [], "body": {"seq": 7},
        }),
    });

    let sample = Sample {
        name: "blob".into(),
        seq: 300,
        data: Buffer::from_static(b"hello world"),
        meta: Buffer::from_static(&[0, 1, 2, 3]),
    };
    let enc = handoff_wire::encode(&sample, None).expect("encode");
    let descs: Vec<Descriptor> = enc
        .frames
        .iter()
        .map(|f| Descriptor::Inline { len: f.len() as u64 })
        .collect();
    let frames: Vec<&[u8]> = enc.frames.iter().map(|f| f.as_ref()).collect();
    v.push(Vector {
        name: "msg-two-frames",
        bytes: message(&Header::Msg { type_name: "demo.Sample", body: &enc.body, frames: descs }, &frames),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A struct with two buffers: the body refers to them as frames 0 and 1 (msgpack ext type 1, u32 big-endian index); their bytes follow the header.",
            "header": {"k": "msg", "t": "demo.Sample", "b": {"$bin": hex::encode(&enc.body)},
                       "f": [{"k": "inline", "n": 11}, {"k": "inline", "n": 4}]},
            "frames": [{"$bin": hex::encode(b"hello world")}, {"$bin": "00010203"}],
            "body": {"name": "blob", "seq": 300, "data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    });

    let shm_msg = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![
            Descriptor::Shm {
                len: 1 << 20,
                offset: 4096,
                size: 4 << 20,
                lease: 7,
                sealed: false,
            },
            Descriptor::Inline { len: 3 },
        ],
    };
    v.push(Vector {
        name: "msg-shm-frame",
        bytes: message(&shm_msg, &[b"abc"]),
        description: json!({
            "kind": "message", "channel": "shm", "valid": true,
            "description": "On a Unix socket: frame 0 is a 1 MiB window at offset 4096 of a 4 MiB shared segment whose file descriptor travels with the header (SCM_RIGHTS), under lease 7; frame 1 is 3 inline bytes.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "shm", "n": 1048576, "off": 4096, "size": 4194304, "lease": 7, "sealed": false},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    });
    let arena_msg = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![
            Descriptor::Shm {
                len: 3 << 20,
                offset: (64 << 20) + 128,
                size: 1 << 30,
                lease: 9,
                sealed: false,
            },
            Descriptor::Inline { len: 3 },
        ],
    };
    v.push(Vector {
        name: "msg-shm-arena-window",
        bytes: message(&arena_msg, &[b"abc"]),
        description: json!({
            "kind": "message", "channel": "shm", "valid": true,
            "description": "On a Unix socket: frame 0 is a 3 MiB window at offset 64 MiB + 128 (not on a page boundary) of an unsealed 1 GiB segment (an arena of the sender's application, spec §7.4), under lease 9; frame 1 is 3 inline bytes.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "shm", "n": 3145728, "off": 67108992, "size": 1073741824, "lease": 9, "sealed": false},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    });
    v.push(Vector {
        name: "release",
        bytes: message(&Header::Release { leases: vec![7, 300, 70000] }, &[]),
        description: json!({
            "kind": "message", "channel": "shm", "valid": true,
            "description": "The receiver of shm frames dropped its last views of leases 7, 300 and 70000: the sender may reuse those segments.",
            "header": {"k": "release", "leases": [7, 300, 70000]}, "frames": [],
        }),
    });

    // Tickets: alpha owns a 1 MiB buffer and gives beta a ticket for it under lease 42.
    let ticket = ticket_fixture();
    let ticket_msg = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![Descriptor::Ticket(ticket.clone()), Descriptor::Inline { len: 3 }],
    };
    v.push(Vector {
        name: "msg-ticket",
        bytes: message(&ticket_msg, &[b"abc"]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "Frame 0 is a ticket: 1 MiB that beta pulls from its owner alpha (node 0123…cdef, listening at tcp://127.0.0.1:7070) under lease 42 with its own token, checked against the BLAKE3 digest, held for 30 s unless renewed; no byte of it follows in the stream. Frame 1 is 3 inline bytes.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "ticket", "n": 1048576, "owner": ticket.owner, "addr": ticket.addr,
                              "lease": 42, "token": bin_json(&ticket.token), "digest": {"$bin": TICKET_DIGEST},
                              "ttl": 30000},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    });
    let lazy = TicketClaim {
        lazy: true,
        ..ticket.clone()
    };
    let lazy_msg = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![Descriptor::Ticket(lazy.clone()), Descriptor::Inline { len: 3 }],
    };
    v.push(Vector {
        name: "msg-ticket-lazy",
        bytes: message(&lazy_msg, &[b"abc"]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The ticket of msg-ticket marked lazy: the sender asks beta to pull the bytes only when they are used, never on receipt, even if beta redeems other tickets eagerly (a fallback it may never need). `lazy` is written only when true, after `ttl`.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "ticket", "n": 1048576, "owner": lazy.owner, "addr": lazy.addr,
                              "lease": 42, "token": bin_json(&lazy.token), "digest": {"$bin": TICKET_DIGEST},
                              "ttl": 30000, "lazy": true},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    });

    // The same ticket with an XXH3-128 digest (§7.5), for a receiver that announced `xxh3`.
    let buffer = ticket_buffer();
    let xxh3 = TicketClaim {
        digest: handoff_wire::TicketDigest::xxh3_of(&buffer),
        ..ticket.clone()
    };
    let xxh3_msg = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![Descriptor::Ticket(xxh3.clone()), Descriptor::Inline { len: 3 }],
    };
    let hex_of = |d: handoff_wire::TicketDigest| hex::encode(d.as_bytes());
    v.push(Vector {
        name: "msg-ticket-xxh3",
        bytes: message(&xxh3_msg, &[b"abc"]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "The ticket of msg-ticket with an XXH3-128 digest (`xxh3`, 16 bytes, canonical big-endian) in place of its BLAKE3 `digest`: sent only to a receiver that announced the capability `xxh3`, which checks the pulled bytes against it (§7.5). `digests` gives both hashes of the fixture buffer and of `abc`.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "ticket", "n": 1048576, "owner": xxh3.owner, "addr": xxh3.addr,
                              "lease": 42, "token": bin_json(&xxh3.token), "xxh3": {"$bin": hex_of(xxh3.digest)},
                              "ttl": 30000},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
            "digests": {
                "buffer": "1048576 bytes, byte i is i % 251",
                "blake3": TICKET_DIGEST,
                "xxh3_128": hex_of(xxh3.digest),
                "abc": {"blake3": hex_of(handoff_wire::TicketDigest::blake3_of(b"abc")),
                        "xxh3_128": hex_of(handoff_wire::TicketDigest::xxh3_of(b"abc"))},
            },
        }),
    });

    // Resource keys: values that refer to the receiver's own objects (msgpack ext type 2).
    let query = Query {
        sql: "select 1".into(),
        pool: ResourceKey("db".into()),
        cache: ResourceKey("cache:reports".into()),
    };
    let enc = handoff_wire::encode(&query, None).expect("encode");
    assert!(enc.frames.is_empty());
    v.push(Vector {
        name: "msg-resource-key",
        bytes: message(
            &Header::Msg {
                type_name: "demo.Query",
                body: &enc.body,
                frames: vec![],
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A body that refers to two of the receiver's local resources by key: msgpack ext type 2 whose payload is the key in UTF-8 (`db`, 2 bytes, as fixext 2; `cache:reports`, 13 bytes, as ext 8). The receiver binds each key in its own registry; one it cannot bind is `unknown-resource`, which needs the receiver's registry and so is not a vector.",
            "header": {"k": "msg", "t": "demo.Query", "b": {"$bin": hex::encode(&enc.body)}, "f": []},
            "frames": [],
            "body": {"sql": "select 1", "pool": {"$resource": "db"}, "cache": {"$resource": "cache:reports"}},
        }),
    });

    // Data handles (WIRE.md §8.5): a Blob travels as its dataset key, its tag and, when the
    // sender has the bytes, a lazy ticket for them.
    let catalog_key = format!("dataset:{BLOB_DATASET}");
    let handle = Work {
        input: Handle {
            catalog: ResourceKey(catalog_key.clone()),
            tag: Tag {
                dataset: BLOB_DATASET,
                name: Some("big"),
                path: "",
                size: Some(1 << 20),
                digest: Some(TICKET_DIGEST),
                version: Some("etag-5d41402a"),
            },
            fallback: Some(Buffer::from(ticket_buffer())),
        },
    };
    let enc = handoff_wire::encode(&handle, None).expect("encode");
    assert_eq!(enc.frames.len(), 1);
    let fallback = TicketClaim {
        lease: 43,
        token: fallback_token(),
        lazy: true,
        ..ticket.clone()
    };
    v.push(Vector {
        name: "msg-blob-handle",
        bytes: message(
            &Header::Msg {
                type_name: "demo.Work",
                body: &enc.body,
                frames: vec![Descriptor::Ticket(fallback.clone())],
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A data handle (WIRE.md §8.5): alpha sends beta a work item whose input is the Blob dataset `big`. `catalog` is the resource key dataset:<uuid>, which beta binds to its own catalog to read the object from its storage or cache; `tag` says which object (uuid, name, path '' for a Blob dataset, size, BLAKE3 digest in hex, storage version); `fallback` is frame 0, alpha's copy of the bytes as a lazy ticket (lease 43) that beta pulls only if it cannot read the object itself.",
            "header": {"k": "msg", "t": "demo.Work", "b": {"$bin": hex::encode(&enc.body)},
                       "f": [{"k": "ticket", "n": 1048576, "owner": fallback.owner, "addr": fallback.addr,
                              "lease": 43, "token": bin_json(&fallback.token), "digest": {"$bin": TICKET_DIGEST},
                              "ttl": 30000, "lazy": true}]},
            "frames": [],
            "body": {"input": {
                "catalog": {"$resource": catalog_key},
                "tag": {"dataset": BLOB_DATASET, "name": "big", "path": "", "size": 1048576,
                        "digest": TICKET_DIGEST, "version": "etag-5d41402a"},
                "fallback": {"$frame": 0},
            }},
        }),
    });
    let tree_key = format!("dataset:{TREE_DATASET}");
    let bare = Work {
        input: Handle {
            catalog: ResourceKey(tree_key.clone()),
            tag: Tag {
                dataset: TREE_DATASET,
                name: Some("images"),
                path: "cats/1.png",
                size: None,
                digest: None,
                version: None,
            },
            fallback: None,
        },
    };
    let enc = handoff_wire::encode(&bare, None).expect("encode");
    assert!(enc.frames.is_empty());
    v.push(Vector {
        name: "msg-blob-handle-no-fallback",
        bytes: message(
            &Header::Msg {
                type_name: "demo.Work",
                body: &enc.body,
                frames: vec![],
            },
            &[],
        ),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A data handle for the file cats/1.png of the BlobTree dataset `images`, from a sender that had not read it (no size, digest or version known, and no bytes to offer): the receiver must read it from its own storage, or fail naming the dataset.",
            "header": {"k": "msg", "t": "demo.Work", "b": {"$bin": hex::encode(&enc.body)}, "f": []},
            "frames": [],
            "body": {"input": {
                "catalog": {"$resource": tree_key},
                "tag": {"dataset": TREE_DATASET, "name": "images", "path": "cats/1.png"},
            }},
        }),
    });

    v.push(ticket_vector(
        "ticket-pull",
        TicketOp::Pull {
            req: 1,
            lease: 42,
            token: beta_token(),
            offset: 4096,
            len: 16,
        },
        &[],
        json!({"k": "pull", "req": 1, "lease": 42, "token": bin_json(&beta_token()), "off": 4096, "n": 16}),
        "Beta (holder) asks alpha (owner) for bytes 4096..4112 of lease 42, request 1.",
    ));
    let pulled = &ticket_buffer()[4096..4112];
    v.push(ticket_vector(
        "ticket-pulled",
        TicketOp::Pulled { req: 1, len: 16 },
        pulled,
        json!({"k": "pulled", "req": 1, "n": 16}),
        "Alpha's answer to request 1: the 16 bytes asked for follow the header, like an inline frame.",
    ));
    v.push(ticket_vector(
        "ticket-forward",
        TicketOp::Forward {
            req: 2,
            lease: 42,
            token: beta_token(),
            to: CAROL.into(),
        },
        &[],
        json!({"k": "forward", "req": 2, "lease": 42, "token": bin_json(&beta_token()), "to": CAROL}),
        "Beta asks alpha to make carol (node 0000…0003) a holder of lease 42 too, before it passes the ticket on.",
    ));
    v.push(ticket_vector(
        "ticket-forwarded",
        TicketOp::Forwarded {
            req: 2,
            token: carol_token(),
        },
        &[],
        json!({"k": "forwarded", "req": 2, "token": bin_json(&carol_token())}),
        "Alpha's answer to request 2: carol's own token, valid only on a connection authenticated as carol.",
    ));
    let refusal = format!("the hold of node {} on lease 42 expired", hello_fixture_b().node_id);
    v.push(ticket_vector(
        "ticket-error",
        TicketOp::Refused {
            req: 3,
            code: "expired".into(),
            message: refusal.clone(),
        },
        &[],
        json!({"k": "ticket-error", "req": 3, "code": "expired", "msg": refusal}),
        "Alpha refuses request 3: beta's hold ended by its deadline. The connection stays open.",
    ));
    v.push(ticket_vector(
        "ticket-unlease",
        TicketOp::Unlease {
            lease: 42,
            token: beta_token(),
        },
        &[],
        json!({"k": "unlease", "lease": 42, "token": bin_json(&beta_token())}),
        "Beta is done with lease 42: its hold ends (the lease ends with its last hold).",
    ));
    v.push(ticket_vector(
        "ticket-renew",
        TicketOp::Renew {
            lease: 42,
            token: beta_token(),
        },
        &[],
        json!({"k": "renew", "lease": 42, "token": bin_json(&beta_token())}),
        "Beta extends its hold on lease 42: its deadline becomes now + ttl. No answer.",
    ));

    let extra_keys = msgpack(&map(vec![
        ("k", s("msg")),
        ("t", s("handoff.Ping")),
        ("b", rmpv::Value::Binary(vec![0x80])),
        ("f", rmpv::Value::Array(vec![])),
        ("x-future", s("ignored")),
    ]));
    v.push(Vector {
        name: "msg-unknown-key-ignored",
        bytes: raw_message(&extra_keys, &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "Receivers ignore header keys they do not know (later versions add optional keys).",
            "header": {"k": "msg", "t": "handoff.Ping", "b": {"$bin": "80"}, "f": []},
            "frames": [], "body": {},
        }),
    });

    // Invalid messages.
    let ok_header = msgpack(&map(vec![
        ("k", s("msg")),
        ("t", s("x")),
        ("b", rmpv::Value::Binary(vec![0x80])),
        (
            "f",
            rmpv::Value::Array(vec![map(vec![("k", s("inline")), ("n", 10.into())])]),
        ),
    ]));
    v.push(invalid(
        "msg-truncated-header",
        "message",
        raw_message(&ok_header, &[])[..12].to_vec(),
        "truncated",
        "The stream ends inside the header.",
    ));
    v.push(invalid(
        "msg-truncated-frame",
        "message",
        raw_message(&ok_header, b"abc"),
        "truncated",
        "The descriptor announces 10 bytes, only 3 follow.",
    ));
    v.push(invalid(
        "msg-header-too-large",
        "message",
        vec![0x7f, 0xff, 0xff, 0xff, 0x80],
        "header-too-large",
        "The length prefix announces a 2 GiB header (the default limit is 16 MiB); the receiver rejects it before reading or allocating.",
    ));
    v.push(invalid(
        "msg-header-zero-length",
        "message",
        vec![0, 0, 0, 0],
        "malformed-header",
        "A zero-length header.",
    ));
    v.push(invalid(
        "msg-header-not-a-map",
        "message",
        raw_message(&[0xc1, 0xc1, 0xc1], &[]),
        "malformed-header",
        "The header is not msgpack (0xc1 is never used).",
    ));
    v.push(invalid(
        "msg-missing-type",
        "message",
        raw_message(
            &msgpack(&map(vec![("k", s("msg")), ("b", rmpv::Value::Binary(vec![0x80]))])),
            &[],
        ),
        "malformed-header",
        "A msg header without its type name `t`.",
    ));
    v.push(invalid(
        "msg-unknown-kind",
        "message",
        raw_message(&msgpack(&map(vec![("k", s("launch-missiles"))])), &[]),
        "unknown-kind",
        "A header kind this version does not know.",
    ));
    let many: Vec<rmpv::Value> = (0..1025)
        .map(|_| map(vec![("k", s("inline")), ("n", 0.into())]))
        .collect();
    v.push(invalid(
        "msg-too-many-frames",
        "message",
        raw_message(
            &msgpack(&map(vec![
                ("k", s("msg")),
                ("t", s("x")),
                ("b", rmpv::Value::Binary(vec![0x80])),
                ("f", rmpv::Value::Array(many)),
            ])),
            &[],
        ),
        "too-many-frames",
        "1025 descriptors; the default limit is 1024.",
    ));
    let desc = |k: &str, n: u64| map(vec![("k", s(k)), ("n", n.into())]);
    let msg_with = |descs: Vec<rmpv::Value>| {
        msgpack(&map(vec![
            ("k", s("msg")),
            ("t", s("x")),
            ("b", rmpv::Value::Binary(vec![0x80])),
            ("f", rmpv::Value::Array(descs)),
        ]))
    };
    v.push(invalid(
        "msg-frame-too-large",
        "message",
        raw_message(&msg_with(vec![desc("inline", 5 << 30)]), &[]),
        "frame-too-large",
        "One frame of 5 GiB; the default limit is 4 GiB per frame. Rejected before any frame byte is read.",
    ));
    v.push(invalid(
        "msg-message-too-large",
        "message",
        raw_message(&msg_with((0..5).map(|_| desc("inline", 4 << 30)).collect()), &[]),
        "message-too-large",
        "Five frames of 4 GiB; the default limit is 16 GiB per message.",
    ));
    v.push(invalid(
        "msg-unknown-descriptor",
        "message",
        raw_message(&msg_with(vec![desc("carrier-pigeon", 1)]), b"x"),
        "unknown-descriptor",
        "A descriptor kind that no version defines.",
    ));
    let shm_desc = |n: u64, off: u64, size: u64| {
        map(vec![
            ("k", s("shm")),
            ("n", n.into()),
            ("off", off.into()),
            ("size", size.into()),
            ("lease", 1.into()),
            ("sealed", rmpv::Value::Boolean(false)),
        ])
    };
    v.push(invalid(
        "msg-shm-descriptor-on-stream",
        "message",
        raw_message(&msg_with(vec![shm_desc(4096, 0, 4096)]), &[]),
        "unsupported-descriptor",
        "A shm descriptor on a TCP connection, which cannot pass file descriptors.",
    ));
    let mut outside = invalid(
        "msg-shm-window-outside-segment",
        "message",
        raw_message(&msg_with(vec![shm_desc(4096, 8192, 8192)]), &[]),
        "malformed-header",
        "A shm window (offset 8192, 4096 bytes) that ends past its 8192-byte segment.",
    );
    outside.description["channel"] = json!("shm");
    v.push(outside);
    let mut no_lease = invalid(
        "msg-shm-missing-lease",
        "message",
        raw_message(
            &msg_with(vec![map(vec![
                ("k", s("shm")),
                ("n", 4096.into()),
                ("off", 0.into()),
                ("size", 4096.into()),
                ("sealed", rmpv::Value::Boolean(false)),
            ])]),
            &[],
        ),
        "malformed-header",
        "A shm descriptor without its lease.",
    );
    no_lease.description["channel"] = json!("shm");
    v.push(no_lease);
    let ticket_desc = |drop: &str, token_len: usize| {
        let t = ticket_fixture();
        let mut fields = vec![
            ("k", s("ticket")),
            ("n", t.len.into()),
            ("owner", s(&t.owner)),
            ("addr", s(t.addr.as_deref().unwrap_or_default())),
            ("lease", t.lease.into()),
            ("token", rmpv::Value::Binary(t.token[..token_len].to_vec())),
            ("digest", rmpv::Value::Binary(t.digest.as_bytes().to_vec())),
            ("ttl", t.ttl_ms.into()),
        ];
        // "+xxh3" adds an XXH3 digest beside the BLAKE3 one; "short-xxh3" puts a 15-byte one in its place.
        if drop == "+xxh3" || drop == "short-xxh3" {
            let n = if drop == "+xxh3" { 16 } else { 15 };
            fields.push(("xxh3", rmpv::Value::Binary(vec![7; n])));
        }
        let drop = if drop == "short-xxh3" { "digest" } else { drop };
        map(fields.into_iter().filter(|(k, _)| *k != drop).collect())
    };
    v.push(invalid(
        "msg-ticket-short-token",
        "message",
        raw_message(&msg_with(vec![ticket_desc("", 31)]), &[]),
        "malformed-header",
        "A ticket whose token is 31 bytes; tokens and digests are exactly 32.",
    ));
    v.push(invalid(
        "msg-ticket-no-digest",
        "message",
        raw_message(&msg_with(vec![ticket_desc("digest", 32)]), &[]),
        "malformed-header",
        "A ticket with neither `digest` nor `xxh3`: a ticket carries exactly one of them.",
    ));
    v.push(invalid(
        "msg-ticket-both-digests",
        "message",
        raw_message(&msg_with(vec![ticket_desc("+xxh3", 32)]), &[]),
        "malformed-header",
        "A ticket with both `digest` and `xxh3`: a ticket carries exactly one of them.",
    ));
    v.push(invalid(
        "msg-ticket-short-xxh3",
        "message",
        raw_message(&msg_with(vec![ticket_desc("short-xxh3", 32)]), &[]),
        "malformed-header",
        "A ticket whose `xxh3` is 15 bytes; it is exactly 16.",
    ));
    v.push(invalid(
        "msg-ticket-missing-owner",
        "message",
        raw_message(&msg_with(vec![ticket_desc("owner", 32)]), &[]),
        "malformed-header",
        "A ticket without its owner's node id.",
    ));
    v.push(invalid(
        "ticket-pull-missing-token",
        "message",
        raw_message(
            &msgpack(&map(vec![
                ("k", s("pull")),
                ("req", 1.into()),
                ("lease", 42.into()),
                ("off", 0.into()),
                ("n", 16.into()),
            ])),
            &[],
        ),
        "malformed-header",
        "A pull without the holder's token.",
    ));
    v.push(invalid(
        "ticket-pulled-truncated",
        "message",
        raw_message(
            &msgpack(&map(vec![("k", s("pulled")), ("req", 1.into()), ("n", 16.into())])),
            &ticket_buffer()[4096..4106],
        ),
        "truncated",
        "A pulled announcing 16 bytes; the stream ends after 10.",
    ));
    let bad_ref_body = msgpack(&map(vec![("data", rmpv::Value::Ext(1, vec![0, 0, 0, 3]))]));
    v.push(invalid(
        "msg-bad-frame-ref",
        "message",
        raw_message(
            &msgpack(&map(vec![
                ("k", s("msg")),
                ("t", s("x")),
                ("b", rmpv::Value::Binary(bad_ref_body)),
                ("f", rmpv::Value::Array(vec![desc("inline", 2)])),
            ])),
            b"ok",
        ),
        "bad-frame-ref",
        "The body refers to frame 3 of a message with one frame.",
    ));
    let bad_ext_body = msgpack(&map(vec![("data", rmpv::Value::Ext(1, vec![0, 0]))]));
    v.push(invalid(
        "msg-bad-frame-ref-payload",
        "message",
        raw_message(
            &msgpack(&map(vec![
                ("k", s("msg")),
                ("t", s("x")),
                ("b", rmpv::Value::Binary(bad_ext_body)),
                ("f", rmpv::Value::Array(vec![])),
            ])),
            &[],
        ),
        "bad-body",
        "A frame reference whose payload is 2 bytes instead of 4.",
    ));
    let bad_key_body = msgpack(&map(vec![(
        "pool",
        rmpv::Value::Ext(EXT_RESOURCE_KEY, vec![0x64, 0xff, 0x62]),
    )]));
    v.push(invalid(
        "msg-resource-key-not-utf8",
        "message",
        raw_message(
            &msgpack(&map(vec![
                ("k", s("msg")),
                ("t", s("x")),
                ("b", rmpv::Value::Binary(bad_key_body)),
                ("f", rmpv::Value::Array(vec![])),
            ])),
            &[],
        ),
        "bad-body",
        "A resource key (ext type 2) whose payload is not UTF-8.",
    ));
    let lazy_not_bool = {
        let mut d = ticket_desc("", 32);
        if let rmpv::Value::Map(entries) = &mut d {
            entries.push((s("lazy"), 1.into()));
        }
        d
    };
    v.push(invalid(
        "msg-ticket-lazy-not-bool",
        "message",
        raw_message(&msg_with(vec![lazy_not_bool]), &[]),
        "malformed-header",
        "A ticket whose `lazy` is the integer 1: `lazy` is a bool, type-checked like every known descriptor key.",
    ));
    v
}

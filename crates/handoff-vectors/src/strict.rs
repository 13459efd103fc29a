//! The vectors of the strict decoding rules (`spec/WIRE.md` §6 rules 1–5, the type table,
//! fixed lengths), of the header limits (§9) and of the non-canonical encodings decoders
//! must accept.
//!
//! Their bytes are written by hand ([`Raw`]): most are encodings the reference encoder never
//! produces. Each `strict-…` vector breaks exactly one rule of a header that is otherwise
//! valid, most of them in a way a lenient decoder (the serde one before it, for one) would
//! have accepted; the `…-at-limit` ones sit exactly on a limit and are valid.
//!
//! One table of vectors and the byte writer they share: long, but one idea, so one file.

use handoff_wire::{Limits, HANDSHAKE_HEADER_BYTES};
use serde_json::json;

use crate::fixtures::{
    beta_token, bin_json, hello_fixture, hello_json, invalid, raw_message, ticket_fixture, Vector, TICKET_DIGEST,
    TWO_FRAME_REFS,
};

/// msgpack written byte by byte, in whichever encoding a vector needs.
#[derive(Debug, Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn new() -> Self {
        Raw::default()
    }

    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }

    fn byte(self, b: u8) -> Self {
        self.bytes(&[b])
    }

    /// A fixstr (shorter than 32 bytes): how keys are written.
    fn key(self, text: &str) -> Self {
        assert!(text.len() < 32);
        self.byte(0xa0 | text.len() as u8).bytes(text.as_bytes())
    }

    fn str8(self, text: &str) -> Self {
        self.byte(0xd9).byte(text.len() as u8).bytes(text.as_bytes())
    }

    fn str16(self, text: &str) -> Self {
        self.byte(0xda)
            .bytes(&(text.len() as u16).to_be_bytes())
            .bytes(text.as_bytes())
    }

    fn str32(self, text: &str) -> Self {
        self.byte(0xdb)
            .bytes(&(text.len() as u32).to_be_bytes())
            .bytes(text.as_bytes())
    }

    fn bin8(self, b: &[u8]) -> Self {
        self.byte(0xc4).byte(b.len() as u8).bytes(b)
    }

    fn bin16(self, b: &[u8]) -> Self {
        self.byte(0xc5).bytes(&(b.len() as u16).to_be_bytes()).bytes(b)
    }

    fn bin32(self, b: &[u8]) -> Self {
        self.byte(0xc6).bytes(&(b.len() as u32).to_be_bytes()).bytes(b)
    }

    fn fixmap(self, entries: u8) -> Self {
        assert!(entries < 16);
        self.byte(0x80 | entries)
    }

    fn map16(self, entries: u16) -> Self {
        self.byte(0xde).bytes(&entries.to_be_bytes())
    }

    fn map32(self, entries: u32) -> Self {
        self.byte(0xdf).bytes(&entries.to_be_bytes())
    }

    fn fixarray(self, items: u8) -> Self {
        assert!(items < 16);
        self.byte(0x90 | items)
    }

    fn array16(self, items: u16) -> Self {
        self.byte(0xdc).bytes(&items.to_be_bytes())
    }

    fn array32(self, items: u32) -> Self {
        self.byte(0xdd).bytes(&items.to_be_bytes())
    }

    /// A positive fixint.
    fn fixint(self, v: u8) -> Self {
        assert!(v < 0x80);
        self.byte(v)
    }

    fn uint8(self, v: u8) -> Self {
        self.byte(0xcc).byte(v)
    }

    fn uint16(self, v: u16) -> Self {
        self.byte(0xcd).bytes(&v.to_be_bytes())
    }

    fn uint32(self, v: u32) -> Self {
        self.byte(0xce).bytes(&v.to_be_bytes())
    }

    fn uint64(self, v: u64) -> Self {
        self.byte(0xcf).bytes(&v.to_be_bytes())
    }

    fn int8(self, v: i8) -> Self {
        self.byte(0xd0).bytes(&v.to_be_bytes())
    }

    fn int16(self, v: i16) -> Self {
        self.byte(0xd1).bytes(&v.to_be_bytes())
    }

    fn int64(self, v: i64) -> Self {
        self.byte(0xd3).bytes(&v.to_be_bytes())
    }

    fn float64(self, v: f64) -> Self {
        self.byte(0xcb).bytes(&v.to_be_bytes())
    }

    fn nil(self) -> Self {
        self.byte(0xc0)
    }

    fn done(self) -> Vec<u8> {
        self.0
    }
}

/// `{"k": "ready"` and `more` entries: the start of a `ready` header of `1 + more` entries.
fn ready_and(more: u16) -> Raw {
    let raw = if more < 15 {
        Raw::new().fixmap(1 + more as u8)
    } else {
        Raw::new().map16(1 + more)
    };
    raw.key("k").key("ready")
}

/// `{"k": "msg", "t": "x", "b": bin 80, "f": [` with `descriptors` to follow.
fn msg_and(descriptors: u8) -> Raw {
    Raw::new()
        .fixmap(4)
        .key("k")
        .key("msg")
        .key("t")
        .key("x")
        .key("b")
        .bin8(&[0x80])
        .key("f")
        .fixarray(descriptors)
}

/// The fields of the `hello` vector, without `listen`, `nonce` last and as given.
fn hello_and(nonce: &[u8]) -> Vec<u8> {
    let h = hello_fixture();
    Raw::new()
        .fixmap(11)
        .key("k")
        .key("hello")
        .key("node")
        .str8(&h.node_id)
        .key("name")
        .key(&h.name)
        .key("host")
        .key(&h.host_id)
        .key("pid")
        .uint16(h.pid as u16)
        .key("proc")
        .str8(&h.process_id)
        .key("lang")
        .key(&h.language)
        .key("impl")
        .key(&h.implementation)
        .key("v")
        .fixint(1)
        .key("caps")
        .fixarray(1)
        .key("inline")
        .key("nonce")
        .bin8(nonce)
        .done()
}

fn vector(description: serde_json::Value, name: &'static str, bytes: Vec<u8>) -> Vector {
    Vector {
        name,
        bytes,
        description,
    }
}

/// Every strict and non-canonical vector, in a stable order.
pub(crate) fn vectors() -> Vec<Vector> {
    let mut v = Vec::new();
    let bad = |name, bytes, what| invalid(name, "message", bytes, "malformed-header", what);

    // Rule 1: one map, filling the header exactly.
    v.push(bad(
        "strict-trailing-bytes",
        raw_message(&ready_and(0).nil().done(), &[]),
        "A ready header followed, within the header length, by one more byte (c0, nil): the map must fill the header exactly.",
    ));
    // As many elements as a header has known keys (26), k, t, b, f first, as a decoder that
    // reads structs by position would expect them.
    let mut positional = Raw::new().array16(26).key("msg").key("x").bin8(&[0x80]).fixarray(0);
    positional.0.resize(positional.0.len() + 22, 0xc0);
    v.push(bad(
        "strict-array-header",
        raw_message(&positional.done(), &[]),
        "A 26-element array [\"msg\", \"x\", bin 80, [], then 22 nils] where the header map belongs: one element per key a v1 header may hold, k, t, b and f first, so that a decoder reading structs by position takes it for a msg. A header is a map, whatever its length.",
    ));
    v.push(bad(
        "strict-never-used-marker",
        raw_message(&ready_and(1).key("x-later").byte(0xc1).done(), &[]),
        "The never-used marker c1 as the value of an ignored key: ignored values must still be valid msgpack.",
    ));
    v.push(bad(
        "strict-value-cut-short",
        raw_message(&ready_and(1).key("x-later").bytes(&[0xd9, 10, b'a', b'b']).done(), &[]),
        "An ignored str8 announcing 10 bytes of which the header holds 2: a value cut short by the header length (the stream itself is complete).",
    ));

    // Rule 2: keys are strs holding UTF-8.
    v.push(bad(
        "strict-integer-key",
        raw_message(
            &Raw::new()
                .fixmap(4)
                .fixint(0)
                .key("msg")
                .fixint(1)
                .key("x")
                .fixint(2)
                .bin8(&[0x80])
                .fixint(3)
                .fixarray(0)
                .done(),
            &[],
        ),
        "The map {0: \"msg\", 1: \"x\", 2: bin 80, 3: []}: keys must be strs; no decoder reads integer keys as field positions.",
    ));
    v.push(bad(
        "strict-descriptor-integer-key",
        raw_message(
            &msg_and(1).fixmap(2).fixint(0).key("inline").fixint(1).fixint(3).done(),
            b"abc",
        ),
        "A msg whose descriptor is {0: \"inline\", 1: 3}, followed by 3 bytes: keys of descriptors must be strs too.",
    ));
    v.push(bad(
        "strict-key-not-utf8",
        raw_message(&ready_and(1).bytes(&[0xa2, 0xff, 0xfe]).nil().done(), &[]),
        "A ready header with a key whose bytes ff fe are not UTF-8 (its value nil): every key must be valid UTF-8, even one the receiver would ignore.",
    ));

    // Rule 3: known keys are typed whatever the kind.
    v.push(bad(
        "strict-known-key-wrong-type",
        raw_message(&ready_and(1).key("pid").key("x").done(), &[]),
        "A ready header with \"pid\": \"x\". pid is a known key (a u32 in hello), type-checked whatever the kind.",
    ));
    v.push(bad(
        "strict-descriptor-not-a-map",
        raw_message(&msg_and(1).key("inline").done(), &[]),
        "A msg whose f is [\"inline\"]: every element of f must be a descriptor map.",
    ));

    // The types.
    v.push(bad(
        "strict-bin-for-str",
        raw_message(
            &Raw::new()
                .fixmap(4)
                .key("k")
                .key("msg")
                .key("t")
                .bin8(b"demo.Sample")
                .key("b")
                .bin8(&[0x80])
                .key("f")
                .fixarray(0)
                .done(),
            &[],
        ),
        "A msg whose type name t is a bin holding \"demo.Sample\": a str is due.",
    ));
    v.push(bad(
        "strict-str-not-utf8",
        raw_message(
            &Raw::new()
                .fixmap(4)
                .key("k")
                .key("msg")
                .key("t")
                .bytes(&[0xa3, b'x', 0xff, b'y'])
                .key("b")
                .bin8(&[0x80])
                .key("f")
                .fixarray(0)
                .done(),
            &[],
        ),
        "A msg whose type name is a str holding 78 ff 79, which is not UTF-8.",
    ));
    v.push(bad(
        "strict-str-for-bin",
        raw_message(
            &Raw::new()
                .fixmap(2)
                .key("k")
                .key("auth")
                .key("mac")
                .str8("0123456789abcdef0123456789abcdef")
                .done(),
            &[],
        ),
        "An auth whose mac is a str of 32 ASCII characters: a bin is due.",
    ));
    let token_as_array = (0x40u8..0x60).fold(Raw::new().array16(32), |r, b| r.uint8(b));
    v.push(bad(
        "strict-token-as-array",
        raw_message(
            &Raw::new()
                .fixmap(6)
                .key("k")
                .key("pull")
                .key("req")
                .fixint(1)
                .key("lease")
                .fixint(42)
                .key("token")
                .bytes(&token_as_array.done())
                .key("off")
                .uint16(4096)
                .key("n")
                .fixint(16)
                .done(),
            &[],
        ),
        "The pull of ticket-pull whose token is an array of 32 integers (64..95) instead of a bin.",
    ));
    v.push(bad(
        "strict-negative-integer",
        raw_message(
            &Raw::new()
                .fixmap(3)
                .key("k")
                .key("pulled")
                .key("req")
                .fixint(1)
                .key("n")
                .byte(0xf0)
                .done(),
            &[],
        ),
        "A pulled whose n is -16 (negative fixint f0): a u64 is due.",
    ));
    v.push(bad(
        "strict-float-for-integer",
        raw_message(
            &msg_and(1).fixmap(2).key("k").key("inline").key("n").float64(3.0).done(),
            b"abc",
        ),
        "A msg whose inline descriptor has n = 3.0 (float64), followed by 3 bytes: an integer is due.",
    ));
    v.push(bad(
        "strict-integer-too-large",
        raw_message(&ready_and(1).key("v").uint32(65_536).done(), &[]),
        "A ready header with \"v\": 65536. v is a u16 (in hello), so 2^16 is out of its range, whatever the kind.",
    ));

    v.push(bad(
        "strict-nil-in-array",
        raw_message(&ready_and(1).key("leases").fixarray(2).fixint(7).nil().done(), &[]),
        "A ready header with \"leases\": [7, nil]: nil counts as absent for a key, but as an element of an array it is a value of the wrong type (leases is a [u64]).",
    ));
    v.push(Vector {
        name: "strict-ignored-str-not-utf8",
        bytes: raw_message(&ready_and(1).key("x-later").bytes(&[0xa2, 0xff, 0xfe]).done(), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A ready header whose ignored key x-later holds a str of the bytes ff fe, which are not UTF-8: the values of ignored keys are checked only for being valid msgpack, not their UTF-8.",
            "header": {"k": "ready"}, "frames": [],
        }),
    });

    // Rule 4: no key twice.
    v.push(bad(
        "strict-duplicate-key",
        raw_message(
            &Raw::new()
                .fixmap(5)
                .key("k")
                .key("msg")
                .key("t")
                .key("x")
                .key("t")
                .key("y")
                .key("b")
                .bin8(&[0x80])
                .key("f")
                .fixarray(0)
                .done(),
            &[],
        ),
        "A msg with the key t twice (\"x\", then \"y\").",
    ));
    v.push(bad(
        "strict-duplicate-key-other-encoding",
        raw_message(&ready_and(1).str8("k").key("ready").done(), &[]),
        "A ready header with the key k twice, as a fixstr and as a str8: keys compare by their bytes, not their encoding.",
    ));
    v.push(bad(
        "strict-duplicate-unknown-key",
        raw_message(
            &ready_and(2).key("x-later").fixint(1).key("x-later").fixint(2).done(),
            &[],
        ),
        "A ready header with the ignored key x-later twice: no key may appear twice, known or not.",
    ));
    v.push(bad(
        "strict-descriptor-duplicate-key",
        raw_message(
            &msg_and(1)
                .fixmap(3)
                .key("k")
                .key("inline")
                .key("n")
                .fixint(3)
                .key("n")
                .fixint(3)
                .done(),
            b"abc",
        ),
        "A msg whose inline descriptor has the key n twice, followed by 3 bytes.",
    ));

    // Fixed lengths.
    v.push(bad(
        "strict-short-nonce",
        raw_message(&hello_and(&(0u8..31).collect::<Vec<_>>()), &[]),
        "The hello of the hello vector (without listen) whose nonce is 31 bytes: exactly 32 are due.",
    ));
    v.push(bad(
        "strict-length-other-kind",
        raw_message(&ready_and(1).key("token").bin8(&[0x40; 31]).done(), &[]),
        "A ready header with a 31-byte token: a length is part of a key's type, checked whatever the kind, though a ready has no token of its own.",
    ));
    v.push(bad(
        "strict-long-mac",
        raw_message(
            &Raw::new()
                .fixmap(2)
                .key("k")
                .key("auth")
                .key("mac")
                .bin8(&[0x5a; 33])
                .done(),
            &[],
        ),
        "An auth whose mac is 33 bytes: exactly 32 are due.",
    ));

    // Rule 5 and §9: entries, values, nesting.
    let padded = |more: u16| (0..more).fold(ready_and(more), |r, i| r.key(&format!("x-{i:02}")).nil());
    v.push(bad(
        "strict-too-many-entries",
        raw_message(&padded(64).done(), &[]),
        "A ready header of 65 entries (k and 64 distinct ignored keys x-00..x-63, each nil): a map has at most 64.",
    ));
    v.push(Vector {
        name: "strict-entries-at-limit",
        bytes: raw_message(&padded(63).done(), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A ready header of exactly 64 entries (k and 63 ignored keys x-00..x-62, each nil): the most a map may have.",
            "header": {"k": "ready"}, "frames": [],
        }),
    });
    let descriptor_padded = (0..63).fold(
        msg_and(1).map16(65).key("k").key("inline").key("n").fixint(0),
        |r, i| r.key(&format!("x-{i:02}")).nil(),
    );
    v.push(bad(
        "strict-descriptor-too-many-entries",
        raw_message(&descriptor_padded.done(), &[]),
        "A msg whose inline descriptor has 65 entries (k, n and 63 ignored keys): a descriptor map has at most 64.",
    ));
    // {"k": "ready", "x-pad": [nil × n]} holds 5 + n values: the map, two keys, two values and
    // the n elements.
    let nils = |n: u32| {
        let mut raw = ready_and(1).key("x-pad").array32(n);
        raw.0.resize(raw.0.len() + n as usize, 0xc0);
        raw.done()
    };
    v.push(bad(
        "strict-too-many-values",
        raw_message(&nils(65_532), &[]),
        "A ready header whose ignored key x-pad holds an array of 65 532 nils: with the map, its two keys and two values, 65 537 msgpack values, one more than a header may hold.",
    ));
    v.push(Vector {
        name: "strict-values-at-limit",
        bytes: raw_message(&nils(65_531), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A ready header whose ignored key x-pad holds an array of 65 531 nils: 65 536 msgpack values in all (the map, its two keys and two values, the elements), exactly as many as a header may hold.",
            "header": {"k": "ready"}, "frames": [],
        }),
    });
    let nested = |arrays: usize| {
        let mut raw = ready_and(1).key("x-deep");
        raw.0.resize(raw.0.len() + arrays, 0x91);
        raw.nil().done()
    };
    v.push(bad(
        "strict-too-deep",
        raw_message(&nested(15), &[]),
        "A ready header whose ignored key x-deep holds 15 nested one-element arrays around nil: with the header map, 16 levels; a header nests at most 15.",
    ));
    v.push(Vector {
        name: "strict-depth-at-limit",
        bytes: raw_message(&nested(14), &[]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "A ready header whose ignored key x-deep holds 14 nested one-element arrays around nil: with the header map, 15 levels, the most a header may nest.",
            "header": {"k": "ready"}, "frames": [],
        }),
    });

    // The handshake header limit: decoded as before the handshake completes.
    let handshake = Limits::DEFAULT.during_handshake().max_header_bytes;
    assert_eq!(handshake, HANDSHAKE_HEADER_BYTES);
    let mut too_large = invalid(
        "strict-handshake-header-too-large",
        "message",
        [&(handshake + 1).to_be_bytes()[..], &[0x8c]].concat(),
        "header-too-large",
        "Before the handshake completes, a length prefix of 65 537: above the handshake header limit of 64 KiB (the general limit is 16 MiB). Refused before the header is read.",
    );
    too_large.description["stage"] = json!("handshake");
    v.push(too_large);
    // The hello of the hello vector (without listen), padded with an ignored bin to 64 KiB.
    let hello = hello_fixture();
    let unpadded = Raw::new()
        .bytes(&hello_and(&hello.nonce))
        .key("x-pad")
        .bin16(&[])
        .done();
    let mut at_limit = hello_and(&hello.nonce);
    at_limit[0] = 0x8c; // 12 entries
    let at_limit = Raw::new()
        .bytes(&at_limit)
        .key("x-pad")
        .bin16(&vec![0; handshake as usize - unpadded.len()])
        .done();
    assert_eq!(at_limit.len(), handshake as usize);
    v.push(Vector {
        name: "strict-handshake-header-at-limit",
        bytes: raw_message(&at_limit, &[]),
        description: json!({
            "kind": "message", "stage": "handshake", "valid": true,
            "description": "Before the handshake completes, a hello whose header is exactly 65 536 bytes, the handshake header limit (the hello of the hello vector without listen, padded with an ignored bin x-pad).",
            "header": hello_json(&handoff_wire::Hello { listen: None, ..hello }), "frames": [],
        }),
    });

    // The handshake value limit: 1024 values before the handshake completes. The hello of the
    // hello vector (without listen) holds 24 (the map, 11 keys and values, one capability);
    // an ignored key x-nils with an array adds 2, and each nil in it one.
    let hello_with_nils = |nils: u16| {
        let mut h = hello_and(&hello_fixture().nonce);
        h[0] = 0x8c; // 12 entries
        Raw::new()
            .bytes(&h)
            .key("x-nils")
            .array16(nils)
            .bytes(&vec![0xc0; nils as usize])
            .done()
    };
    let mut too_many = invalid(
        "strict-handshake-too-many-values",
        "message",
        raw_message(&hello_with_nils(999), &[]),
        "malformed-header",
        "Before the handshake completes, a hello of 1025 msgpack values (an ignored key x-nils holding 999 nils): a header holds at most 1024 values until the connection is established (65 536 afterwards).",
    );
    too_many.description["stage"] = json!("handshake");
    v.push(too_many);
    v.push(Vector {
        name: "strict-handshake-values-at-limit",
        bytes: raw_message(&hello_with_nils(998), &[]),
        description: json!({
            "kind": "message", "stage": "handshake", "valid": true,
            "description": "Before the handshake completes, a hello of exactly 1024 msgpack values, the handshake value limit (an ignored key x-nils holding 998 nils).",
            "header": hello_json(&handoff_wire::Hello { listen: None, ..hello_fixture() }), "frames": [],
        }),
    });

    // Non-canonical encodings that decoders must accept: the same values as canonical vectors.
    let t = ticket_fixture();
    let ticket = Raw::new()
        .map32(9)
        .key("ttl")
        .uint64(t.ttl_ms)
        .key("lazy")
        .nil()
        .key("digest")
        .bin16(t.digest.as_bytes())
        .key("token")
        .bin32(&t.token)
        .key("lease")
        .int8(t.lease as i8)
        .key("addr")
        .str16(t.addr.as_deref().expect("the fixture ticket has an address"))
        .key("owner")
        .str32(&t.owner)
        .key("n")
        .uint64(t.len)
        .key("k")
        .str8("ticket");
    let header = Raw::new()
        .map16(5)
        .key("f")
        .array16(2)
        .bytes(&ticket.done())
        .fixmap(2)
        .key("n")
        .uint16(3)
        .key("k")
        .str8("inline")
        .key("listen")
        .nil()
        .key("b")
        .bin16(TWO_FRAME_REFS)
        .key("t")
        .str8("demo.Sample")
        .key("k")
        .str8("msg")
        .done();
    v.push(vector(
        json!({
            "kind": "message", "valid": true,
            "description": "The message of msg-ticket written in other valid encodings, which decoders must accept: keys in another order, map16 and map32, str8, str16 and str32, bin16 and bin32, array16, uint16, int8 and uint64 for small integers, and nil for the optional keys lazy (in the ticket) and listen (a known key of another kind). It decodes to the same header as msg-ticket.",
            "header": {"k": "msg", "t": "demo.Sample", "b": bin_json(TWO_FRAME_REFS),
                       "f": [{"k": "ticket", "n": 1048576, "owner": t.owner, "addr": t.addr,
                              "lease": 42, "token": bin_json(&t.token), "digest": {"$bin": TICKET_DIGEST},
                              "ttl": 30000},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
        "noncanonical-msg",
        raw_message(&header, b"abc"),
    ));
    let pull = Raw::new()
        .map16(6)
        .key("n")
        .int64(16)
        .key("off")
        .uint64(4096)
        .key("token")
        .bin16(&beta_token())
        .key("lease")
        .uint64(42)
        .key("req")
        .uint64(1)
        .key("k")
        .str8("pull")
        .done();
    v.push(vector(
        json!({
            "kind": "message", "valid": true,
            "description": "The pull of ticket-pull written in other valid encodings: keys in another order, map16, str8 for k, bin16 for the token, uint64 and int64 for small integers. It decodes to the same header as ticket-pull.",
            "header": {"k": "pull", "req": 1, "lease": 42, "token": bin_json(&beta_token()), "off": 4096, "n": 16},
            "frames": [],
        }),
        "noncanonical-ticket-pull",
        raw_message(&pull, &[]),
    ));
    let h = hello_fixture();
    let hello_bytes = Raw::new()
        .map32(12)
        .key("listen")
        .nil()
        .key("nonce")
        .bin32(&h.nonce)
        .key("caps")
        .array32(1)
        .str8("inline")
        .key("v")
        .int16(1)
        .key("impl")
        .str16(&h.implementation)
        .key("lang")
        .str8(&h.language)
        .key("proc")
        .str16(&h.process_id)
        .key("pid")
        .uint32(h.pid)
        .key("host")
        .str8(&h.host_id)
        .key("name")
        .str32(&h.name)
        .key("node")
        .str16(&h.node_id)
        .key("k")
        .str8("hello")
        .done();
    v.push(vector(
        json!({
            "kind": "message", "valid": true,
            "description": "The hello of the hello vector, without an address to listen on, written in other valid encodings: keys in reverse order, map32, str8, str16 and str32 strings, array32 for caps, bin32 for the nonce, uint32 for pid, int16 for v, and nil for listen.",
            "header": hello_json(&handoff_wire::Hello { listen: None, ..h }),
            "frames": [],
        }),
        "noncanonical-hello",
        raw_message(&hello_bytes, &[]),
    ));
    v
}

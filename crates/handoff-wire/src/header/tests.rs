//! One test per decoding rule of `spec/WIRE.md` §6, per header limit of §9 and per step of
//! the order of checks of §11.2, on hand-written msgpack (canonical or not).
//!
//! Long, but one idea (the rule-by-rule table of the header decoder's tests), so one file.

use super::*;
use crate::msgpack::{write_array_len, write_bin, write_map_len, write_str, write_uint};
use crate::{Limits, WireError, HANDSHAKE_HEADER_BYTES};

// ---------------------------------------------------------------------------
// Writing msgpack by hand: each helper returns the bytes of one value.
// ---------------------------------------------------------------------------

fn s(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    write_str(&mut out, text);
    out
}

fn u(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    write_uint(&mut out, v);
    out
}

fn b(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_bin(&mut out, bytes);
    out
}

const NIL: &[u8] = &[0xc0];

/// An array of `items`, each already encoded.
fn arr(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    write_array_len(&mut out, items.len());
    items.iter().for_each(|i| out.extend_from_slice(i));
    out
}

/// A map of `entries` whose keys are strs.
fn map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    raw_map(&entries.iter().map(|(k, v)| (s(k), v.clone())).collect::<Vec<_>>())
}

/// A map of `entries`, keys and values already encoded.
fn raw_map(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    write_map_len(&mut out, entries.len());
    for (k, v) in entries {
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out
}

fn decode(bytes: &[u8]) -> Result<Header<'_>, WireError> {
    Header::decode(bytes, &Limits::DEFAULT)
}

fn code(bytes: &[u8]) -> &'static str {
    match decode(bytes) {
        Ok(h) => panic!("decoded {h:?}, expected an error"),
        Err(e) => {
            // Every error explains itself.
            assert!(!e.to_string().is_empty());
            e.code()
        }
    }
}

fn ready_with(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut all = vec![("k", s("ready"))];
    all.extend(entries.iter().cloned());
    map(&all)
}

fn msg_with(descriptors: &[Vec<u8>]) -> Vec<u8> {
    map(&[
        ("k", s("msg")),
        ("t", s("x")),
        ("b", b(&[0x80])),
        ("f", arr(descriptors)),
    ])
}

fn inline(n: u64) -> Vec<u8> {
    map(&[("k", s("inline")), ("n", u(n))])
}

fn ticket_fields() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("k", s("ticket")),
        ("n", u(1 << 20)),
        ("owner", s("0123456789abcdef0123456789abcdef")),
        ("lease", u(42)),
        ("token", b(&[7; 32])),
        ("digest", b(&[9; 32])),
        ("ttl", u(30_000)),
    ]
}

fn hello_fields() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("k", s("hello")),
        ("node", s("n")),
        ("name", s("alpha")),
        ("host", s("h")),
        ("pid", u(4242)),
        ("proc", s("p")),
        ("lang", s("rust")),
        ("impl", s("handoff-rs/0.1.0")),
        ("v", u(1)),
        ("caps", arr(&[s("inline")])),
        ("nonce", b(&[1; 32])),
    ]
}

/// `fields` with `key`'s value replaced (or added) by `value`.
fn with(fields: &[(&'static str, Vec<u8>)], key: &'static str, value: Vec<u8>) -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<_> = fields.iter().filter(|(k, _)| *k != key).cloned().collect();
    out.push((key, value));
    out
}

// ---------------------------------------------------------------------------
// Rule 1: one msgpack map that fills the header exactly.
// ---------------------------------------------------------------------------

#[test]
fn rule_1_bytes_after_the_map_are_malformed() {
    let ready = map(&[("k", s("ready"))]);
    assert_eq!(decode(&ready), Ok(Header::Ready));
    for tail in [&[0xc0][..], &[0x00], &[0x80], &ready[..]] {
        let mut bytes = ready.clone();
        bytes.extend_from_slice(tail);
        assert_eq!(code(&bytes), "malformed-header", "tail {tail:02x?}");
    }
    // Even when the kind is unknown: the structure comes first (§11.2 step 2).
    let mut bytes = map(&[("k", s("launch-missiles"))]);
    assert_eq!(code(&bytes), "unknown-kind");
    bytes.push(0xc0);
    assert_eq!(code(&bytes), "malformed-header");
}

#[test]
fn rule_1_only_a_map_is_a_header() {
    // The array a positional decoder would read as {k, t, b, f}.
    let positional = arr(&[s("msg"), s("x"), b(&[0x80]), arr(&[])]);
    assert_eq!(code(&positional), "malformed-header");
    for other in [
        NIL.to_vec(),
        u(1),
        s("ready"),
        b(b"ready"),
        vec![0xd4, 1, 0],
        vec![0xca, 0, 0, 0, 0],
    ] {
        assert_eq!(code(&other), "malformed-header", "{other:02x?}");
    }
    assert_eq!(code(&[]), "malformed-header");
}

#[test]
fn rule_1_invalid_msgpack_anywhere_is_malformed() {
    assert_eq!(code(&[0xc1]), "malformed-header");
    assert_eq!(code(&ready_with(&[("x-a", vec![0xc1])])), "malformed-header");
    assert_eq!(
        code(&ready_with(&[("x-a", arr(&[u(1), vec![0xc1]]))])),
        "malformed-header"
    );
    // A value cut short by the header length: a str, a bin, an array, an ext.
    let ready = ready_with(&[("x-a", s("hello"))]);
    for cut in 1..ready.len() {
        assert_eq!(code(&ready[..cut]), "malformed-header", "cut at {cut}");
    }
    for short in [
        vec![0xc5, 0, 9, 1],
        vec![0x93, 1, 2],
        vec![0xd6, 1, 0, 0],
        vec![0xcd, 1],
    ] {
        assert_eq!(
            code(&ready_with(&[("x-a", short.clone())])),
            "malformed-header",
            "{short:02x?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Rule 2: every key of the header map and of each descriptor map is a str in UTF-8.
// ---------------------------------------------------------------------------

#[test]
fn rule_2_keys_are_strs() {
    // {0: "ready"}: no decoder reads integer keys as field positions.
    assert_eq!(code(&raw_map(&[(u(0), s("ready"))])), "malformed-header");
    for key in [u(7), b(b"x-a"), NIL.to_vec(), arr(&[]), vec![0xc3], vec![0xe0]] {
        let bytes = raw_map(&[(s("k"), s("ready")), (key.clone(), u(1))]);
        assert_eq!(code(&bytes), "malformed-header", "key {key:02x?}");
    }
    // Inside a descriptor too.
    let positional = raw_map(&[(u(0), s("inline")), (u(1), u(3))]);
    assert_eq!(code(&msg_with(&[positional])), "malformed-header");
    let bin_key = raw_map(&[(s("k"), s("inline")), (s("n"), u(3)), (b(b"x"), u(1))]);
    assert_eq!(code(&msg_with(&[bin_key])), "malformed-header");
}

#[test]
fn rule_2_keys_are_utf8() {
    for key in [&[0xff][..], &[0xc3, 0x28], &[b'x', 0x80]] {
        let mut k = vec![0xa0 | key.len() as u8];
        k.extend_from_slice(key);
        let bytes = raw_map(&[(s("k"), s("ready")), (k, u(1))]);
        assert_eq!(code(&bytes), "malformed-header", "key {key:02x?}");
    }
    // A UTF-8 key that is not ASCII is just unknown.
    assert_eq!(decode(&ready_with(&[("x-é", u(1))])), Ok(Header::Ready));
}

// ---------------------------------------------------------------------------
// Rule 3: unknown keys ignored, known keys typed whatever the kind, nil is absent.
// ---------------------------------------------------------------------------

#[test]
fn rule_3_unknown_keys_are_ignored_whatever_their_values() {
    let anything = [
        NIL.to_vec(),
        u(u64::MAX),
        vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0xcb, 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18],
        s("text"),
        vec![0xa2, 0xff, 0xfe], // not UTF-8: only the header's own keys and known strs are checked
        b(&[0; 100]),
        vec![0xd6, 0x01, 0, 0, 0, 9],
        arr(&[u(1), s("two"), arr(&[])]),
        raw_map(&[(u(0), u(1)), (u(0), u(2)), (b(b"k"), NIL.to_vec())]), // any keys, twice too
    ];
    for value in anything {
        assert_eq!(
            decode(&ready_with(&[("x-later", value.clone())])),
            Ok(Header::Ready),
            "{value:02x?}"
        );
        let mut d = ticket_fields();
        d.push(("x-later", value.clone()));
        assert!(decode(&msg_with(&[map(&d)])).is_ok(), "descriptor with {value:02x?}");
    }
}

#[test]
fn rule_3_known_keys_are_typed_whatever_the_kind() {
    for (key, bad) in [
        ("pid", s("x")),
        ("v", u(1 << 16)),
        ("caps", s("inline")),
        ("caps", arr(&[u(1)])),
        ("nonce", s(&"n".repeat(32))),
        ("listen", u(7070)),
        ("t", b(b"x")),
        ("b", s("x")),
        ("f", arr(&[u(1)])),
        ("f", map(&[])),
        ("leases", arr(&[vec![0xff]])),
        ("mac", arr(&vec![u(1); 32])),
        ("req", vec![0xc3]),
        ("off", vec![0xca, 0, 0, 0, 0]),
        ("to", u(3)),
    ] {
        assert_eq!(
            code(&ready_with(&[(key, bad.clone())])),
            "malformed-header",
            "ready with {key}"
        );
    }
    // In a descriptor of another kind, and in one of no kind at all.
    for (key, bad) in [
        ("sealed", u(1)),
        ("owner", u(1)),
        ("lazy", u(1)),
        ("key", b(b"k")),
        ("size", s("1")),
    ] {
        let d = map(&[("k", s("inline")), ("n", u(0)), (key, bad.clone())]);
        assert_eq!(code(&msg_with(&[d])), "malformed-header", "inline with {key}");
        let d = map(&[("k", s("carrier-pigeon")), (key, bad.clone())]);
        assert_eq!(code(&msg_with(&[d])), "malformed-header", "carrier-pigeon with {key}");
    }
    // Well typed, keys of other kinds are ignored (and not built).
    let hello_keys = hello_fields().into_iter().skip(1).collect::<Vec<_>>();
    assert_eq!(decode(&ready_with(&hello_keys)), Ok(Header::Ready));
    assert_eq!(
        decode(&ready_with(&[("f", arr(&[map(&[("k", s("x"))])]))])),
        Ok(Header::Ready)
    );
}

#[test]
fn rule_3_known_keys_are_known_per_map() {
    // A descriptor key in the header map, a header key in a descriptor: unknown there.
    assert_eq!(
        decode(&ready_with(&[("sealed", s("yes")), ("digest", u(1))])),
        Ok(Header::Ready)
    );
    let d = map(&[("k", s("inline")), ("n", u(0)), ("pid", s("x")), ("caps", u(1))]);
    assert!(decode(&msg_with(&[d])).is_ok());
    // Nil in an array is a wrong type, not an absent element.
    assert_eq!(code(&ready_with(&[("caps", arr(&[NIL.to_vec()]))])), "malformed-header");
    assert_eq!(
        code(&ready_with(&[("leases", arr(&[u(7), NIL.to_vec()]))])),
        "malformed-header"
    );
    assert_eq!(code(&msg_with(&[NIL.to_vec()])), "malformed-header");
}

#[test]
fn rule_3_nil_is_absent() {
    assert_eq!(
        decode(&ready_with(&[("pid", NIL.to_vec()), ("f", NIL.to_vec())])),
        Ok(Header::Ready)
    );
    // An optional key: absent.
    let hello = with(&hello_fields(), "listen", NIL.to_vec());
    let Ok(Header::Hello(h)) = decode(&map(&hello)) else {
        panic!("a hello")
    };
    assert_eq!(h.listen, None);
    let msg = map(&[("k", s("msg")), ("t", s("x")), ("b", b(&[])), ("f", NIL.to_vec())]);
    assert!(matches!(decode(&msg), Ok(Header::Msg { frames, .. }) if frames.is_empty()));
    let lazy = map(&with(&ticket_fields(), "lazy", NIL.to_vec()));
    assert!(matches!(
        decode(&msg_with(&[lazy])),
        Ok(Header::Msg { frames, .. }) if matches!(&frames[0], Descriptor::Ticket(t) if !t.lazy)
    ));
    // A required key: missing.
    assert_eq!(
        code(&map(&with(&hello_fields(), "node", NIL.to_vec()))),
        "malformed-header"
    );
    assert_eq!(code(&map(&[("k", NIL.to_vec())])), "malformed-header");
}

// ---------------------------------------------------------------------------
// Rule 4: no key twice in one map, keys compared byte for byte.
// ---------------------------------------------------------------------------

#[test]
fn rule_4_a_key_twice_is_malformed() {
    assert_eq!(
        code(&raw_map(&[(s("k"), s("ready")), (s("k"), s("ready"))])),
        "malformed-header"
    );
    assert_eq!(
        code(&ready_with(&[("pid", u(1)), ("pid", NIL.to_vec())])),
        "malformed-header"
    );
    assert_eq!(
        code(&ready_with(&[("x-a", u(1)), ("x-b", u(1)), ("x-a", u(2))])),
        "malformed-header"
    );
    // The same key written as fixstr and as str8 is the same key.
    let str8_k = vec![0xd9, 1, b'k'];
    assert_eq!(
        code(&raw_map(&[(s("k"), s("ready")), (str8_k, s("ready"))])),
        "malformed-header"
    );
    // In a descriptor.
    let d = raw_map(&[(s("k"), s("inline")), (s("n"), u(1)), (s("n"), u(1))]);
    assert_eq!(code(&msg_with(&[d])), "malformed-header");
    // The same key in two maps is fine.
    assert!(decode(&msg_with(&[inline(0), inline(0)])).is_ok());
}

// ---------------------------------------------------------------------------
// Rule 5: at most 64 entries in the header map and in each descriptor map.
// ---------------------------------------------------------------------------

#[test]
fn rule_5_at_most_64_entries_per_map() {
    let names: Vec<String> = (0..64).map(|i| format!("x-{i:02}")).collect();
    let pad = |n: usize| {
        names[..n]
            .iter()
            .map(|k| (k.as_str(), NIL.to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(decode(&ready_with(&pad(63))), Ok(Header::Ready), "64 entries");
    assert_eq!(code(&ready_with(&pad(64))), "malformed-header");
    let mut d = vec![("k", s("inline")), ("n", u(0))];
    d.extend(pad(62));
    assert!(decode(&msg_with(&[map(&d)])).is_ok());
    d.push(("x-last", NIL.to_vec()));
    assert_eq!(code(&msg_with(&[map(&d)])), "malformed-header");
    // Announced, not present: refused from the count alone.
    assert_eq!(code(&[0xdf, 0xff, 0xff, 0xff, 0xff]), "malformed-header");
}

// ---------------------------------------------------------------------------
// Rules 6 and 7: `k`, then the kind's fields.
// ---------------------------------------------------------------------------

#[test]
fn rule_6_k_is_a_known_kind() {
    assert_eq!(code(&map(&[])), "malformed-header");
    assert_eq!(code(&map(&[("t", s("x"))])), "malformed-header");
    assert_eq!(code(&map(&[("k", s("launch-missiles"))])), "unknown-kind");
    assert_eq!(code(&map(&[("k", s(""))])), "unknown-kind");
    assert_eq!(code(&map(&[("k", b(b"ready"))])), "malformed-header");
    for kind in KINDS {
        let bytes = map(&[("k", s(kind))]);
        assert!(!matches!(decode(&bytes), Err(WireError::UnknownKind(_))), "{kind}");
    }
}

#[test]
fn rule_7_required_fields() {
    for (key, _) in hello_fields().iter().skip(1) {
        let without: Vec<_> = hello_fields().into_iter().filter(|(k, _)| k != key).collect();
        assert_eq!(code(&map(&without)), "malformed-header", "hello without {key}");
    }
    assert_eq!(code(&map(&[("k", s("msg")), ("b", b(&[]))])), "malformed-header");
    assert_eq!(code(&map(&[("k", s("msg")), ("t", s("x"))])), "malformed-header");
    assert!(
        decode(&map(&[("k", s("msg")), ("t", s("x")), ("b", b(&[]))])).is_ok(),
        "f absent = []"
    );
    for missing in ["k", "n", "owner", "lease", "token", "digest", "ttl"] {
        let d: Vec<_> = ticket_fields().into_iter().filter(|(k, _)| *k != missing).collect();
        assert_eq!(
            code(&msg_with(&[map(&d)])),
            "malformed-header",
            "ticket without {missing}"
        );
    }
    assert_eq!(code(&msg_with(&[map(&[("k", s("tag"))])])), "malformed-header");
}

// ---------------------------------------------------------------------------
// The types.
// ---------------------------------------------------------------------------

#[test]
fn unsigned_integers_in_any_encoding() {
    let encodings = |v: u8| {
        vec![
            vec![v],
            vec![0xcc, v],
            vec![0xcd, 0, v],
            vec![0xce, 0, 0, 0, v],
            vec![0xcf, 0, 0, 0, 0, 0, 0, 0, v],
            vec![0xd0, v],
            vec![0xd1, 0, v],
            vec![0xd2, 0, 0, 0, v],
            vec![0xd3, 0, 0, 0, 0, 0, 0, 0, v],
        ]
    };
    for n in encodings(3) {
        let bytes = map(&[("k", s("pulled")), ("req", n.clone()), ("n", n.clone())]);
        assert_eq!(
            decode(&bytes),
            Ok(Header::Ticket(TicketOp::Pulled { req: 3, len: 3 })),
            "{n:02x?}"
        );
    }
    for bad in [
        vec![0xff],
        vec![0xd0, 0xfd],
        vec![0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfd],
        vec![0xca, 0x40, 0x40, 0, 0],
        vec![0xcb, 0x40, 0x08, 0, 0, 0, 0, 0, 0],
        vec![0xc3],
        s("3"),
        b(&[3]),
    ] {
        let bytes = map(&[("k", s("pulled")), ("req", bad.clone()), ("n", u(3))]);
        assert_eq!(code(&bytes), "malformed-header", "{bad:02x?}");
    }
    // u16 and u32: values of 2^N and more are malformed.
    let hello = |key, v: Vec<u8>| map(&with(&hello_fields(), key, v));
    assert!(decode(&hello("v", vec![0xcd, 0xff, 0xff])).is_ok());
    assert_eq!(code(&hello("v", vec![0xce, 0, 1, 0, 0])), "malformed-header");
    assert!(decode(&hello("pid", vec![0xce, 0xff, 0xff, 0xff, 0xff])).is_ok());
    assert!(decode(&hello("pid", vec![0xd3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])).is_ok());
    assert_eq!(
        code(&hello("pid", vec![0xcf, 0, 0, 0, 1, 0, 0, 0, 0])),
        "malformed-header"
    );
}

#[test]
fn bools_are_c2_and_c3() {
    for (value, lazy) in [(vec![0xc2], false), (vec![0xc3], true)] {
        let d = map(&with(&ticket_fields(), "lazy", value));
        let Ok(Header::Msg { frames, .. }) = decode(&msg_with(&[d])) else {
            panic!("a msg")
        };
        assert!(matches!(&frames[0], Descriptor::Ticket(t) if t.lazy == lazy));
    }
    for bad in [u(1), u(0), s("true")] {
        let d = map(&with(&ticket_fields(), "lazy", bad.clone()));
        assert_eq!(code(&msg_with(&[d])), "malformed-header", "{bad:02x?}");
    }
}

#[test]
fn str_and_bin_are_not_interchangeable() {
    // bin for str.
    assert_eq!(
        code(&map(&[("k", s("msg")), ("t", b(b"x")), ("b", b(&[]))])),
        "malformed-header"
    );
    // str not UTF-8.
    let bytes = map(&[("k", s("error")), ("code", s("x")), ("msg", vec![0xa2, 0xc3, 0x28])]);
    assert_eq!(code(&bytes), "malformed-header");
    // str for bin; an array of integers for bin.
    assert_eq!(
        code(&map(&[("k", s("auth")), ("mac", s(&"m".repeat(32)))])),
        "malformed-header"
    );
    let token_as_array = arr(&(0..32).map(u).collect::<Vec<_>>());
    let bytes = map(&[("k", s("unlease")), ("lease", u(1)), ("token", token_as_array)]);
    assert_eq!(code(&bytes), "malformed-header");
    // ext is neither.
    assert_eq!(code(&map(&[("k", vec![0xd5, 0, b'o', b'k'])])), "malformed-header");
}

#[test]
fn fixed_lengths_are_part_of_the_type() {
    for len in [0, 31, 33, 64] {
        let hello = map(&with(&hello_fields(), "nonce", b(&vec![0; len])));
        assert_eq!(code(&hello), "malformed-header", "nonce of {len}");
        assert_eq!(
            code(&map(&[("k", s("auth")), ("mac", b(&vec![0; len]))])),
            "malformed-header"
        );
        // Wherever the key appears: in a header of another kind, in a descriptor of another kind.
        assert_eq!(code(&ready_with(&[("token", b(&vec![0; len]))])), "malformed-header");
        let d = map(&[("k", s("inline")), ("n", u(0)), ("digest", b(&vec![0; len]))]);
        assert_eq!(code(&msg_with(&[d])), "malformed-header");
    }
    assert_eq!(
        decode(&ready_with(&[("token", b(&[0; 32])), ("mac", b(&[0; 32]))])),
        Ok(Header::Ready)
    );
}

// ---------------------------------------------------------------------------
// §9: the value budget and the nesting limit.
// ---------------------------------------------------------------------------

/// `{"k": "ready", "x": [nil × n]}`: 5 + n values (the map, two keys, two values, n elements).
fn ready_with_nils(n: usize) -> Vec<u8> {
    ready_with(&[("x", arr(&vec![NIL.to_vec(); n]))])
}

#[test]
fn at_most_65536_values() {
    assert_eq!(MAX_HEADER_VALUES, 65_536);
    assert_eq!(decode(&ready_with_nils(65_531)), Ok(Header::Ready));
    assert_eq!(code(&ready_with_nils(65_532)), "malformed-header");
    // A str, bin or ext counts one, whatever its length.
    // Here: the map, "k", "ready", "x", its array, three elements, "y", its array: 10 + n.
    let long = |n: usize| {
        let x = arr(&[b(&[0; 70_000]), s(&"s".repeat(70_000)), vec![0xc7, 0, 5]]);
        ready_with(&[("x", x), ("y", arr(&vec![NIL.to_vec(); n]))])
    };
    assert_eq!(decode(&long(65_526)), Ok(Header::Ready));
    assert_eq!(code(&long(65_527)), "malformed-header");
    // The values of descriptors count: {"k": "msg", "f": [{} × n]} is 5 + n values. (Such a
    // msg lacks `t` and `b`, so only the budget tells the two counts apart.)
    let empties = |n: usize| map(&[("k", s("hello")), ("f", arr(&vec![map(&[]); n]))]);
    assert_eq!(code(&empties(65_531)), "malformed-header");
    assert!(decode(&empties(65_531))
        .unwrap_err()
        .to_string()
        .contains("lacks field"));
    assert!(decode(&empties(65_532)).unwrap_err().to_string().contains("values"));
    // Keys and values of every map count, entries of ignored maps too.
    // Here: the map, "k", "ready", "x", {nil: nil} (3), "y", its array: 9 + n.
    let nested = |n: usize| {
        let x = raw_map(&[(NIL.to_vec(), NIL.to_vec())]);
        ready_with(&[("x", x), ("y", arr(&vec![NIL.to_vec(); n]))])
    };
    assert_eq!(decode(&nested(65_527)), Ok(Header::Ready));
    assert_eq!(code(&nested(65_528)), "malformed-header");
}

/// A ready header whose ignored key holds `arrays` nested one-element arrays around `leaf`.
fn ready_nested(arrays: usize, leaf: &[u8]) -> Vec<u8> {
    let mut value = vec![0x91; arrays];
    value.extend_from_slice(leaf);
    ready_with(&[("x", value)])
}

#[test]
fn at_most_15_levels() {
    assert_eq!(MAX_HEADER_DEPTH, 15);
    // The header map is level 1: 14 arrays inside it make 15 levels.
    assert_eq!(decode(&ready_nested(14, NIL)), Ok(Header::Ready));
    assert_eq!(code(&ready_nested(15, NIL)), "malformed-header");
    // An empty array, a map or an ext at the deepest level is a level too.
    for leaf in [&[0x90][..], &[0x80], &[0xd4, 1, 0]] {
        assert_eq!(decode(&ready_nested(13, leaf)), Ok(Header::Ready), "{leaf:02x?}");
        assert_eq!(code(&ready_nested(14, leaf)), "malformed-header", "{leaf:02x?}");
    }
    // Inside a descriptor (level 3).
    let deep = |arrays: usize| {
        let mut value = vec![0x91; arrays];
        value.push(0xc0);
        map(&[("k", s("inline")), ("n", u(0)), ("x", value)])
    };
    assert!(decode(&msg_with(&[deep(12)])).is_ok());
    assert_eq!(code(&msg_with(&[deep(13)])), "malformed-header");
    // Very deep input is refused, not a stack overflow.
    assert_eq!(code(&ready_nested(1_000_000, NIL)), "malformed-header");
}

// ---------------------------------------------------------------------------
// §11.2: the order of checks.
// ---------------------------------------------------------------------------

#[test]
fn structure_comes_before_every_other_check() {
    let bad = map(&[("k", s("inline")), ("n", u(0)), ("sealed", u(1))]);
    // Before the frame count.
    let mut many = vec![inline(0); 1025];
    assert_eq!(code(&msg_with(&many)), "too-many-frames");
    many.push(bad.clone());
    assert_eq!(code(&msg_with(&many)), "malformed-header");
    // Before an unknown descriptor, a frame or message too large, before earlier descriptors.
    let pigeon = map(&[("k", s("carrier-pigeon"))]);
    assert_eq!(code(&msg_with(std::slice::from_ref(&pigeon))), "unknown-descriptor");
    assert_eq!(code(&msg_with(&[pigeon, bad.clone()])), "malformed-header");
    assert_eq!(code(&msg_with(&[inline(5 << 30)])), "frame-too-large");
    assert_eq!(code(&msg_with(&[inline(5 << 30), bad.clone()])), "malformed-header");
    // A short token of a later ticket: its length is part of its type.
    let short = map(&with(&ticket_fields(), "token", b(&[0; 31])));
    assert_eq!(code(&msg_with(&[inline(5 << 30), short])), "malformed-header");
    // Before the kind.
    let unknown = map(&[("k", s("launch")), ("pid", s("x"))]);
    assert_eq!(code(&unknown), "malformed-header");
}

#[test]
fn then_the_kinds_fields_in_order() {
    // t, b, then the frame count, then each descriptor in order.
    let no_t = map(&[("k", s("msg")), ("b", b(&[])), ("f", arr(&vec![inline(0); 1025]))]);
    assert_eq!(code(&no_t), "malformed-header");
    let limits = Limits {
        max_frames: 2,
        max_frame_bytes: 10,
        max_message_bytes: 15,
        ..Limits::DEFAULT
    };
    let code_with = |descs: &[Vec<u8>]| Header::decode(&msg_with(descs), &limits).unwrap_err().code();
    let pigeon = map(&[("k", s("carrier-pigeon"))]);
    let no_k = map(&[("n", u(1))]);
    assert_eq!(code_with(&[inline(0), inline(0), pigeon.clone()]), "too-many-frames");
    assert_eq!(code_with(&[no_k.clone(), pigeon.clone()]), "malformed-header");
    assert_eq!(code_with(&[pigeon.clone(), no_k]), "unknown-descriptor");
    assert_eq!(code_with(&[inline(11), pigeon.clone()]), "frame-too-large");
    assert_eq!(code_with(&[pigeon.clone(), inline(11)]), "unknown-descriptor");
    assert_eq!(code_with(&[inline(10), inline(10)]), "message-too-large");
    assert_eq!(code_with(&[inline(10), inline(11)]), "frame-too-large");
    assert!(Header::decode(&msg_with(&[inline(10), inline(5)]), &limits).is_ok());
    // shm: n, off, size, the window, lease.
    let shm = |fields: &[(&str, Vec<u8>)]| {
        let mut all = vec![("k", s("shm"))];
        all.extend(fields.iter().cloned());
        map(&all)
    };
    let d = shm(&[("n", u(9)), ("off", u(8)), ("size", u(16))]);
    assert!(decode(&msg_with(&[d])).unwrap_err().to_string().contains("window"));
    let d = shm(&[("n", u(8)), ("off", u(8)), ("size", u(16))]);
    assert!(decode(&msg_with(&[d])).unwrap_err().to_string().contains("lease"));
    // A tag needs its key, and has no length.
    let tag = map(&[("k", s("tag")), ("key", s("model"))]);
    let Ok(Header::Msg { frames, .. }) = decode(&msg_with(&[tag])) else {
        panic!("a msg")
    };
    assert_eq!(frames, vec![Descriptor::Tag { key: "model".into() }]);
    // A pulled's n: against the frame limit, then the message limit.
    let pulled = |n| map(&[("k", s("pulled")), ("req", u(1)), ("n", u(n))]);
    assert_eq!(
        Header::decode(&pulled(11), &limits).unwrap_err().code(),
        "frame-too-large"
    );
    let limits = Limits {
        max_message_bytes: 5,
        ..limits
    };
    assert_eq!(
        Header::decode(&pulled(6), &limits).unwrap_err().code(),
        "message-too-large"
    );
}

#[test]
fn only_the_kinds_fields_are_built() {
    // A hello whose `f` holds descriptors of no known kind, with no `n`: typed, never built.
    let f = arr(&vec![map(&[("k", s("carrier-pigeon"))]); 2000]);
    let hello = map(&with(&hello_fields(), "f", f));
    assert!(matches!(decode(&hello), Ok(Header::Hello(_))));
    // A ready whose `caps` and `leases` are typed, not built.
    assert_eq!(
        decode(&ready_with(&[("caps", arr(&[s("a")])), ("leases", arr(&[u(1)]))])),
        Ok(Header::Ready)
    );
}

// ---------------------------------------------------------------------------
// Non-canonical encodings of the same values decode to the same header.
// ---------------------------------------------------------------------------

#[test]
fn non_canonical_encodings_are_accepted() {
    let canonical = Header::Msg {
        type_name: "demo.Sample",
        body: &[0x80],
        frames: vec![
            Descriptor::Ticket(TicketClaim {
                len: 1 << 20,
                owner: "o".into(),
                addr: None,
                lease: 42,
                token: vec![7; 32],
                digest: crate::TicketDigest::Blake3([9; 32]),
                ttl_ms: 30_000,
                lazy: false,
            }),
            Descriptor::Inline { len: 3 },
        ],
    };
    let ticket = raw_map(&[
        (vec![0xd9, 5, b'o', b'w', b'n', b'e', b'r'], vec![0xda, 0, 1, b'o']),
        (s("ttl"), vec![0xd3, 0, 0, 0, 0, 0, 0, 0x75, 0x30]),
        (s("token"), [&[0xc6, 0, 0, 0, 32][..], &[7; 32]].concat()),
        (s("digest"), [&[0xc5, 0, 32][..], &[9; 32]].concat()),
        (s("lease"), vec![0xd0, 42]),
        (s("lazy"), NIL.to_vec()),
        (s("addr"), NIL.to_vec()),
        (s("n"), vec![0xcf, 0, 0, 0, 0, 0, 0x10, 0, 0]),
        (s("k"), vec![0xdb, 0, 0, 0, 6, b't', b'i', b'c', b'k', b'e', b't']),
    ]);
    let inline = [&[0xde, 0, 2][..], &s("n"), &[0xd1, 0, 3], &s("k"), &s("inline")].concat();
    let header = [
        &[0xdf, 0, 0, 0, 5][..],
        &s("f"),
        &[0xdd, 0, 0, 0, 2],
        &ticket,
        &inline,
        &s("b"),
        &[0xc6, 0, 0, 0, 1, 0x80],
        &s("listen"),
        NIL,
        &s("t"),
        &[0xd9, 11],
        b"demo.Sample",
        &s("k"),
        &[0xd9, 3],
        b"msg",
    ]
    .concat();
    assert_eq!(decode(&header), Ok(canonical.clone()));
    assert_ne!(header, canonical.encode());
}

#[test]
fn the_handshake_header_limit() {
    assert_eq!(HANDSHAKE_HEADER_BYTES, 65_536);
    assert_eq!(Limits::DEFAULT.during_handshake().max_header_bytes, 65_536);
    assert_eq!(Limits::DEFAULT.during_handshake().max_header_values, 1024);
    let small = Limits {
        max_header_bytes: 1000,
        max_header_values: 100,
        ..Limits::DEFAULT
    };
    assert_eq!(small.during_handshake(), small);
    let during = Limits::DEFAULT.during_handshake();
    assert_eq!(
        Limits {
            max_header_bytes: Limits::DEFAULT.max_header_bytes,
            max_header_values: Limits::DEFAULT.max_header_values,
            ..during
        },
        Limits::DEFAULT
    );
    // A hello of 1025 values is refused during the handshake, accepted afterwards.
    let mut hello = crate::Header::Hello(crate::Hello {
        node_id: "n".into(),
        name: "x".into(),
        host_id: "h".into(),
        pid: 1,
        process_id: "p".into(),
        language: "rust".into(),
        implementation: "t".into(),
        version: 1,
        capabilities: vec!["inline".into()],
        nonce: vec![0; 32],
        listen: None,
        unix: None,
    })
    .encode();
    let values_now = 1 + 2 * 11 + 1; // the map, 11 keys and values, the caps element
    hello[0] += 1; // one more entry: an ignored key holding an array of nils
    hello.extend_from_slice(&[0xa1, b'x', 0xdc]);
    let nils = 1024 - values_now - 2 + 1;
    hello.extend_from_slice(&(nils as u16).to_be_bytes());
    hello.extend(std::iter::repeat_n(0xc0, nils));
    assert_eq!(
        crate::Header::decode(&hello, &during).unwrap_err().code(),
        "malformed-header",
        "1025 values during the handshake"
    );
    assert!(crate::Header::decode(&hello, &Limits::DEFAULT).is_ok());
    // One nil fewer: exactly 1024 values, accepted.
    let n = hello.len();
    let count = u16::from_be_bytes([hello[n - nils - 2], hello[n - nils - 1]]) - 1;
    hello[n - nils - 2..n - nils].copy_from_slice(&count.to_be_bytes());
    hello.pop();
    assert!(
        crate::Header::decode(&hello, &during).is_ok(),
        "1024 values during the handshake"
    );
    let prefix = 65_537u32.to_be_bytes();
    assert_eq!(
        crate::framing::header_len(prefix, &during).unwrap_err().code(),
        "header-too-large"
    );
    assert_eq!(crate::framing::header_len(65_536u32.to_be_bytes(), &during), Ok(65_536));
}

// ---------------------------------------------------------------------------
// Version 2: `challenge` and `ident` (§6.8, §6.9).
// ---------------------------------------------------------------------------

fn challenge_fields() -> Vec<(&'static str, Vec<u8>)> {
    vec![("k", s("challenge")), ("v", u(2)), ("nonce", b(&[1; 32]))]
}

/// The fields of a hello but `v` and `nonce`, under the kind `ident`.
fn ident_fields() -> Vec<(&'static str, Vec<u8>)> {
    let mut fields: Vec<_> = hello_fields()
        .into_iter()
        .filter(|(k, _)| !matches!(*k, "v" | "nonce"))
        .collect();
    fields[0] = ("k", s("ident"));
    fields
}

fn ident_fixture() -> Ident {
    Ident {
        node_id: "n".into(),
        name: "alpha".into(),
        host_id: "h".into(),
        pid: 4242,
        process_id: "p".into(),
        language: "rust".into(),
        implementation: "handoff-rs/0.1.0".into(),
        capabilities: vec!["inline".into()],
        listen: None,
        unix: None,
    }
}

#[test]
fn v2_challenge_and_ident_decode_and_encode_canonically() {
    let challenge = map(&challenge_fields());
    let decoded = decode(&challenge).unwrap();
    assert_eq!(
        decoded,
        Header::Challenge {
            version: 2,
            nonce: vec![1; 32]
        }
    );
    assert_eq!(decoded.kind(), "challenge");
    assert_eq!(decoded.encode(), challenge, "keys in the order of §6.8");
    let ident = map(&ident_fields());
    let decoded = decode(&ident).unwrap();
    assert_eq!(decoded, Header::Ident(ident_fixture()));
    assert_eq!(decoded.kind(), "ident");
    assert_eq!(decoded.encode(), ident, "keys in the order of §6.9");
    // The optional keys, in their place after `caps`.
    let full = Ident {
        listen: Some("tcp://127.0.0.1:1".into()),
        unix: Some("unix:///tmp/x.sock".into()),
        ..ident_fixture()
    };
    let mut fields = ident_fields();
    fields.push(("listen", s("tcp://127.0.0.1:1")));
    fields.push(("unix", s("unix:///tmp/x.sock")));
    assert_eq!(Header::Ident(full.clone()).encode(), map(&fields));
    assert_eq!(decode(&map(&fields)), Ok(Header::Ident(full)));
}

#[test]
fn v2_fields_are_required_and_typed_as_in_the_hello() {
    for (key, _) in challenge_fields().iter().skip(1) {
        let without: Vec<_> = challenge_fields().into_iter().filter(|(k, _)| k != key).collect();
        assert_eq!(code(&map(&without)), "malformed-header", "challenge without {key}");
    }
    for (key, _) in ident_fields().iter().skip(1) {
        let without: Vec<_> = ident_fields().into_iter().filter(|(k, _)| k != key).collect();
        assert_eq!(code(&map(&without)), "malformed-header", "ident without {key}");
    }
    // Fixed lengths and integer widths are the keys' types, whatever the kind.
    assert_eq!(
        code(&map(&with(&challenge_fields(), "nonce", b(&[1; 31])))),
        "malformed-header"
    );
    assert_eq!(
        code(&map(&with(&challenge_fields(), "v", u(65_536)))),
        "malformed-header"
    );
    assert_eq!(
        code(&map(&with(&ident_fields(), "pid", u(1 << 32)))),
        "malformed-header"
    );
    assert_eq!(
        code(&map(&with(&ident_fields(), "caps", arr(&[s("inline"), NIL.to_vec()])))),
        "malformed-header"
    );
    // Keys of the other kinds are typed too, and ignored when well typed: an ident with a
    // nonce and a version is an ident.
    let extra = with(&with(&ident_fields(), "nonce", b(&[1; 32])), "v", u(2));
    assert_eq!(decode(&map(&extra)), Ok(Header::Ident(ident_fixture())));
    assert_eq!(
        code(&map(&with(&ident_fields(), "nonce", b(&[1; 3])))),
        "malformed-header"
    );
}

#[test]
fn hello_and_ident_convert() {
    let ident = ident_fixture();
    let hello = Hello::from_ident(ident.clone(), 1, vec![5; 32]);
    assert_eq!(hello.version, 1);
    assert_eq!(hello.ident(), ident);
    // The same fields, the same bytes but for the kind, `v` and `nonce`.
    let Ok(Header::Hello(back)) = decode(&Header::Hello(hello.clone()).encode()) else {
        panic!("a hello")
    };
    assert_eq!(back, hello);
}

/// A ticket's XXH3 digest goes only to a receiver that announced `xxh3` (§7.5); BLAKE3 to anyone.
#[test]
fn an_xxh3_digest_is_sendable_only_to_a_peer_that_announced_it() {
    use crate::{TicketDigest, CAP_XXH3};
    let caps = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let x = TicketDigest::xxh3_of(b"abc");
    let b = TicketDigest::blake3_of(b"abc");
    assert!(x.sendable_to(&caps(&["inline", "ticket", CAP_XXH3])));
    assert!(!x.sendable_to(&caps(&["inline", "ticket"])));
    assert!(b.sendable_to(&caps(&["inline", "ticket"])));
    assert_eq!((x.as_bytes().len(), b.as_bytes().len()), (16, 32));
    assert_ne!(x, x.same_kind_of(b"abd"));
}

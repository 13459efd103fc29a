//! Tests of the msgpack reader and writer: each typed read against every encoding of its
//! family and the wrong ones, the budgets and limits, and the canonical writer.

use super::*;

fn reader(bytes: &[u8]) -> Reader<'_> {
    Reader::new(bytes, u32::MAX, 15)
}

#[test]
fn unsigned_integers_in_every_encoding() {
    let cases: &[(&[u8], u64)] = &[
        (&[0x00], 0),
        (&[0x7f], 127),
        (&[0xcc, 0x05], 5),
        (&[0xcd, 0x00, 0x05], 5),
        (&[0xce, 0, 0, 0, 5], 5),
        (&[0xcf, 0, 0, 0, 0, 0, 0, 0, 5], 5),
        (&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], u64::MAX),
        (&[0xd0, 0x05], 5),
        (&[0xd0, 0x7f], 127),
        (&[0xd1, 0x01, 0x00], 256),
        (&[0xd2, 0, 1, 0, 0], 65536),
        (&[0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], i64::MAX as u64),
    ];
    for (bytes, v) in cases {
        let mut r = reader(bytes);
        assert_eq!(r.read_uint(64), Ok(*v), "{bytes:02x?}");
        assert!(r.at_end());
        assert_eq!(r.values(), 1);
    }
}

#[test]
fn unsigned_integers_refuse_negatives_floats_bools_and_large_values() {
    let problem = |bytes: &[u8], bits: u8| reader(bytes).read_uint(bits).unwrap_err().problem;
    for negative in [
        &[0xff][..],
        &[0xe0],
        &[0xd0, 0xff],
        &[0xd1, 0x80, 0],
        &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
    ] {
        assert_eq!(problem(negative, 64), Problem::Negative, "{negative:02x?}");
    }
    assert_eq!(problem(&[0xcd, 0x01, 0x00], 8), Problem::TooLarge { bits: 8 });
    assert_eq!(problem(&[0xce, 0, 1, 0, 0], 16), Problem::TooLarge { bits: 16 });
    assert_eq!(reader(&[0xcd, 0xff, 0xff]).read_uint(16), Ok(65535));
    assert_eq!(
        reader(&[0xce, 0xff, 0xff, 0xff, 0xff]).read_uint(32),
        Ok(u32::MAX as u64)
    );
    assert_eq!(
        problem(&[0xcf, 0, 0, 0, 1, 0, 0, 0, 0], 32),
        Problem::TooLarge { bits: 32 }
    );
    for bytes in [
        &[0xca, 0, 0, 0, 0][..],
        &[0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xc3],
        &[0xc0],
        &[0xa1, b'1'],
    ] {
        assert_eq!(
            problem(bytes, 64),
            Problem::WrongType {
                expected: Family::UnsignedInteger,
                found: bytes[0]
            }
        );
    }
    let e = reader(&[0xca, 0, 0, 0, 0]).read_uint(64).unwrap_err();
    assert_eq!(e.to_string(), "expected an unsigned integer, found a float at byte 0");
}

#[test]
fn str_and_bin_are_distinct_families() {
    assert_eq!(reader(&[0xa2, b'h', b'i']).read_str(), Ok("hi"));
    assert_eq!(reader(&[0xd9, 2, b'h', b'i']).read_str(), Ok("hi"));
    assert_eq!(reader(&[0xda, 0, 2, b'h', b'i']).read_str(), Ok("hi"));
    assert_eq!(reader(&[0xdb, 0, 0, 0, 2, b'h', b'i']).read_str(), Ok("hi"));
    assert_eq!(reader(&[0xc4, 2, 1, 2]).read_bin(), Ok(&[1u8, 2][..]));
    assert_eq!(reader(&[0xc5, 0, 2, 1, 2]).read_bin(), Ok(&[1u8, 2][..]));
    assert_eq!(reader(&[0xc6, 0, 0, 0, 2, 1, 2]).read_bin(), Ok(&[1u8, 2][..]));
    let wrong = |e: ReadError| e.problem;
    assert!(matches!(
        wrong(reader(&[0xc4, 1, b'x']).read_str().unwrap_err()),
        Problem::WrongType { found: 0xc4, .. }
    ));
    assert!(matches!(
        wrong(reader(&[0xa1, b'x']).read_bin().unwrap_err()),
        Problem::WrongType { found: 0xa1, .. }
    ));
    assert!(matches!(
        wrong(reader(&[0x92, 1, 2]).read_bin().unwrap_err()),
        Problem::WrongType { found: 0x92, .. }
    ));
    assert_eq!(
        wrong(reader(&[0xa2, 0xff, 0xfe]).read_str().unwrap_err()),
        Problem::NotUtf8
    );
    assert_eq!(
        wrong(reader(&[0xa2, 0xff, 0xfe]).read_text().unwrap_err()),
        Problem::NotUtf8
    );
    assert_eq!(
        wrong(reader(&[0xa2, 0xc3, 0x28]).read_text().unwrap_err()),
        Problem::NotUtf8
    );
    assert_eq!(reader(&[0xa2, 0xc3, 0xa9]).read_text(), Ok("é".as_bytes()));
    assert_eq!(reader(&[0xa2, 0xc3, 0xa9]).read_str(), Ok("é"));
    assert_eq!(wrong(reader(&[0xa3, b'a']).read_str().unwrap_err()), Problem::Truncated);
    assert_eq!(
        wrong(reader(&[0xc6, 0xff, 0xff, 0xff, 0xff]).read_bin().unwrap_err()),
        Problem::Truncated
    );
}

#[test]
fn bools_are_c2_and_c3_only() {
    assert_eq!(reader(&[0xc2]).read_bool(), Ok(false));
    assert_eq!(reader(&[0xc3]).read_bool(), Ok(true));
    for bytes in [&[0x01][..], &[0x00], &[0xc0]] {
        assert!(reader(bytes).read_bool().is_err(), "{bytes:02x?}");
    }
}

#[test]
fn skip_passes_over_every_type() {
    let values: &[&[u8]] = &[
        &[0x05],
        &[0xe0],
        &[0xc0],
        &[0xc2],
        &[0xcc, 1],
        &[0xd1, 1, 2],
        &[0xca, 1, 2, 3, 4],
        &[0xcb, 1, 2, 3, 4, 5, 6, 7, 8],
        &[0xa2, 0xff, 0xfe], // not UTF-8: skipped values are only msgpack
        &[0xd9, 1, b'x'],
        &[0xc5, 0, 1, 9],
        &[0x92, 0x01, 0x80],
        &[0xdc, 0, 1, 0xc0],
        &[0x81, 0x01, 0x02], // an integer key: fine inside a skipped value
        &[0xde, 0, 1, 0xc4, 0, 0x90],
        &[0xd4, 1, 0],
        &[0xd8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[0xc7, 2, 5, 0, 0],
        &[0xc9, 0, 0, 0, 0, 5],
    ];
    for bytes in values {
        let mut r = reader(bytes);
        r.skip(2).unwrap_or_else(|e| panic!("{bytes:02x?}: {e}"));
        assert!(r.at_end(), "{bytes:02x?}");
    }
    assert_eq!(reader(&[0xc1]).skip(2).unwrap_err().problem, Problem::NeverUsed);
    assert_eq!(reader(&[0x91, 0xc1]).skip(2).unwrap_err().problem, Problem::NeverUsed);
    assert_eq!(reader(&[0x92, 0x01]).skip(2).unwrap_err().problem, Problem::Truncated);
    assert_eq!(reader(&[0xd6, 1, 0]).skip(2).unwrap_err().problem, Problem::Truncated);
}

#[test]
fn every_value_counts_once() {
    // [nil, {1: "a", "b": [2]}, bin]: the array, nil, the map, 1, "a", "b", [2], 2, bin.
    let bytes = [0x93, 0xc0, 0x82, 0x01, 0xa1, b'a', 0xa1, b'b', 0x91, 0x02, 0xc4, 0x00];
    let mut r = reader(&bytes);
    r.skip(1).unwrap();
    assert_eq!(r.values(), 9);
    let mut r = Reader::new(&bytes, 9, 15);
    assert!(r.skip(1).is_ok());
    let mut r = Reader::new(&bytes, 8, 15);
    let e = r.skip(1).unwrap_err();
    assert_eq!(e.problem, Problem::TooManyValues { max: 8 });
    assert_eq!(e.offset, 10, "the ninth value, the bin");
    // A huge array fails at its budget, not at its announced length.
    let huge = [0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0, 0xc0, 0xc0];
    let mut r = Reader::new(&huge, 3, 15);
    assert_eq!(r.skip(1).unwrap_err().problem, Problem::TooManyValues { max: 3 });
}

#[test]
fn nesting_counts_arrays_maps_and_exts() {
    // `levels` one-element arrays around `leaf`, read as if the first array were at level 1.
    let nested = |levels: usize, leaf: &[u8]| {
        let mut v = vec![0x91; levels];
        v.extend_from_slice(leaf);
        v
    };
    for leaf in [&[0xc0][..], &[0x90], &[0x80], &[0xd4, 1, 0]] {
        let containers = if leaf == [0xc0] { 0 } else { 1 };
        for levels in 10..20 {
            let bytes = nested(levels, leaf);
            let result = reader(&bytes).skip(1);
            if levels + containers <= 15 {
                assert!(result.is_ok(), "{levels} + {leaf:02x?}");
            } else {
                assert_eq!(result.unwrap_err().problem, Problem::TooDeep { max: 15 });
            }
        }
    }
    assert!(reader(&[0x90]).read_array_len(15).is_ok());
    assert_eq!(
        reader(&[0x80]).read_map_len(16).unwrap_err().problem,
        Problem::TooDeep { max: 15 }
    );
}

#[test]
fn the_writer_is_canonical() {
    let uint = |v| {
        let mut out = Vec::new();
        write_uint(&mut out, v);
        out
    };
    assert_eq!(uint(0), [0x00]);
    assert_eq!(uint(127), [0x7f]);
    assert_eq!(uint(128), [0xcc, 0x80]);
    assert_eq!(uint(256), [0xcd, 1, 0]);
    assert_eq!(uint(65536), [0xce, 0, 1, 0, 0]);
    assert_eq!(uint(1 << 32), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
    let str_head = |n: usize| {
        let mut out = Vec::new();
        write_str(&mut out, &"x".repeat(n));
        out.truncate(out.len() - n);
        out
    };
    assert_eq!(str_head(31), [0xbf]);
    assert_eq!(str_head(32), [0xd9, 32]);
    assert_eq!(str_head(256), [0xda, 1, 0]);
    assert_eq!(str_head(65536), [0xdb, 0, 1, 0, 0]);
    let mut out = Vec::new();
    write_bin(&mut out, &[]);
    write_bin(&mut out, &[0; 256]);
    assert_eq!(out[..5], [0xc4, 0, 0xc5, 1, 0]);
    let mut out = Vec::new();
    write_array_len(&mut out, 15);
    write_array_len(&mut out, 16);
    write_map_len(&mut out, 15);
    write_map_len(&mut out, 70_000);
    assert_eq!(out, [0x9f, 0xdc, 0, 16, 0x8f, 0xdf, 0, 1, 0x11, 0x70]);
}

#[test]
fn read_any_gives_each_family_its_head_in_any_encoding() {
    let bytes = [
        0x05, 0xff, 0xc0, 0xc3, 0xcd, 0x01, 0x00, 0xd0, 0x80, 0xca, 0x3f, 0x80, 0, 0, 0xa2, b'h', b'i', 0xc4, 1, 9,
        0x92, 0xde, 0, 1, 0xd6, 0x01, 0, 0, 0, 7,
    ];
    let mut r = Reader::new(&bytes, u32::MAX, 8);
    let got: Vec<Any<'_>> = std::iter::from_fn(|| (!r.at_end()).then(|| r.read_any(1).unwrap())).collect();
    assert_eq!(
        got,
        vec![
            Any::Uint(5),
            Any::Int(-1),
            Any::Nil,
            Any::Bool(true),
            Any::Uint(256),
            Any::Int(-128),
            Any::Float(1.0),
            Any::Str(b"hi"),
            Any::Bin(&[9]),
            Any::Array(2),
            Any::Map(1),
            Any::Ext(1, &[0, 0, 0, 7]),
        ]
    );
}

#[test]
fn read_any_keeps_the_budget_the_nesting_limit_and_refuses_c1() {
    assert!(Reader::new(&[0x91, 0x90], u32::MAX, 1).read_any(2).is_err());
    let mut r = Reader::new(&[1, 2], 1, 8);
    r.read_any(1).unwrap();
    assert!(r.read_any(1).unwrap_err().to_string().contains("more than 1"));
    assert!(Reader::new(&[0xc1], 9, 9).read_any(1).is_err());
    assert!(Reader::new(&[0xd9, 5, b'a'], 9, 9)
        .read_any(1)
        .unwrap_err()
        .to_string()
        .contains("cut short"));
}

//! Feeds arbitrary bytes to every decoder a peer's bytes reach: the preamble, the
//! message framing and header (default limits), and the codec for the body of a
//! `msg` (as a generic value and as a struct holding `Buffer`s).
//!
//! Any panic, abort or stack overflow is a bug; errors are expected.

#![no_main]

use std::collections::BTreeMap;

use bytes::Bytes;
use handoff_wire::{decode_message, Buffer, Header, Limits, Preamble};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

#[allow(dead_code)]
#[derive(Debug, Deserialize)]
struct Payload {
    id: u64,
    name: String,
    data: Buffer,
    parts: Vec<Buffer>,
    maybe: Option<Buffer>,
    tags: BTreeMap<String, Buffer>,
}

/// A recursive enum: its variants nest as one-entry maps.
#[allow(dead_code)]
#[derive(Debug, Deserialize)]
enum Expr {
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Leaf(Buffer),
    Num(i64),
}

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Preamble::decode(data) {
        // The default (v2 only) and the preamble of a node that accepts v1 peers.
        let _ = Preamble::OURS.negotiate(&p);
        let _ = Preamble::ACCEPTING_V1.negotiate(&p);
    }

    let message = match decode_message(data, &Limits::DEFAULT) {
        Ok(m) => m,
        Err(e) => {
            let _ = (e.code(), e.to_string());
            return;
        }
    };
    assert!(message.consumed <= data.len());

    // A decoded header re-encodes to one that decodes to the same header.
    let encoded = message.header.encode();
    let again = Header::decode(&encoded, &Limits::DEFAULT).expect("re-encoded header decodes");
    assert_eq!(again, message.header);

    if let Header::Msg {
        type_name, body, ..
    } = message.header
    {
        // The receiver's frames: zero-copy views of one received buffer.
        let received = Bytes::copy_from_slice(data);
        let frames: Vec<Buffer> = message
            .frames
            .iter()
            .map(|f| {
                let start = f.as_ptr() as usize - data.as_ptr() as usize;
                Buffer::from(received.slice(start..start + f.len()))
            })
            .collect();
        for result in [
            handoff_wire::decode::<serde_json::Value>(type_name, body, &frames, None).map(drop),
            handoff_wire::decode::<Payload>(type_name, body, &frames, None).map(drop),
            handoff_wire::decode::<Vec<Buffer>>(type_name, body, &frames, None).map(drop),
            handoff_wire::decode::<Expr>(type_name, body, &frames, None).map(drop),
        ] {
            if let Err(e) = result {
                assert!(
                    matches!(e.code(), "bad-body" | "bad-frame-ref"),
                    "unexpected error {e}"
                );
            }
        }
    }
});

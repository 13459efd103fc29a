//! `Preamble::decode` of arbitrary bytes: an error of §3 or a preamble that encodes back to
//! the bytes it was read from (flags included) and negotiates, against both our preambles, without panicking.

#![no_main]

use handoff_fuzz::{expect_code, PREAMBLE_CODES};
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::Preamble;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Preamble::decode(data) {
        Ok(p) => {
            assert_eq!(
                &p.encode()[..],
                &data[..PREAMBLE_LEN],
                "a preamble re-encodes to other bytes"
            );
            assert!(p.min_version >= 1 && p.min_version <= p.max_version);
            // The default (version 2 only) and the preamble of a node that accepts v1 peers.
            for ours in [Preamble::OURS, Preamble::ACCEPTING_V1] {
                match ours.negotiate(&p) {
                    Ok(v) => assert!(
                        v >= p.min_version && v <= p.max_version && v >= ours.min_version && v <= ours.max_version,
                        "negotiated {v} outside {p:?} and {ours:?}"
                    ),
                    Err(e) => expect_code(&e, PREAMBLE_CODES, "negotiate"),
                }
            }
        }
        Err(e) => expect_code(&e, PREAMBLE_CODES, "Preamble::decode"),
    }
});

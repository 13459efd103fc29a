//! `Preamble::decode` of arbitrary bytes: an error of §3 or a preamble that encodes back to
//! the bytes it was read from (flags included) and negotiates without panicking.

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
            match Preamble::OURS.negotiate(&p) {
                Ok(v) => assert!(v >= p.min_version && v <= p.max_version, "negotiated {v} outside {p:?}"),
                Err(e) => expect_code(&e, PREAMBLE_CODES, "negotiate"),
            }
        }
        Err(e) => expect_code(&e, PREAMBLE_CODES, "Preamble::decode"),
    }
});

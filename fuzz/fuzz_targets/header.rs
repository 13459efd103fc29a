//! `Header::decode` of arbitrary bytes (the bytes after the length prefix), under the default
//! limits and under the handshake's (a 64 KiB header): an error of §11.2 steps 2–3, or a
//! header that re-encodes canonically to itself.

#![no_main]

use handoff_fuzz::{check_header, expect_code, touch, HEADER_CODES, LIMITS};
use handoff_wire::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for limits in &LIMITS {
        match Header::decode(data, limits) {
            Ok(header) => {
                touch(&header);
                check_header(&header, limits);
            }
            Err(e) => expect_code(&e, HEADER_CODES, "Header::decode"),
        }
    }
});

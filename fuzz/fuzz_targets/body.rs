//! `handoff_wire::codec::decode` of arbitrary bodies, with the receiving node's resource
//! registry current: as a generic msgpack value (`rmpv::Value`), as buffers, as a recursive
//! enum and as a typed struct with buffers, optional buffers, resource keys, bound resources,
//! strings, integers, vectors and nested enums.
//!
//! Input: `[n][body…]`: the message has the first `n % 4` of three frames (so references to
//! frames 0–2 resolve or are `bad-frame-ref`). Any error must be a body error (§11.2 step 7),
//! and a value that decodes survives encode → decode → encode unchanged.
//!
//! With `HANDOFF_FUZZ_BODY_SEEDS=DIR` in the environment the target first writes seeds made by
//! the real encoder (typed values, see `handoff_fuzz::body_seeds`) into DIR.

#![no_main]

use handoff_fuzz::{check_body, frames, write_body_seeds, Job, Step};
use handoff_wire::Buffer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        if let Some(dir) = std::env::var_os("HANDOFF_FUZZ_BODY_SEEDS") {
            write_body_seeds(std::path::Path::new(&dir));
        }
    },
    |data: &[u8]| {
        let Some((&n, body)) = data.split_first() else {
            return;
        };
        let frames = &frames()[..(n % 4) as usize];
        check_body::<rmpv::Value>("fuzz.Value", body, frames);
        check_body::<Vec<Buffer>>("fuzz.Buffers", body, frames);
        check_body::<Vec<Step>>("fuzz.Steps", body, frames);
        check_body::<Job>("fuzz.Job", body, frames);
    }
);

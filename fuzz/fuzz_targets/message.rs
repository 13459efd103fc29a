//! `framing::decode_message_on` of arbitrary bytes, as a TCP stream (`TCP_KINDS`) and as a
//! Unix socket (`UNIX_KINDS`) receives them, under the default and the handshake limits.
//!
//! A message that decodes uses no more bytes than it was given, its frames are the inline
//! descriptors' bytes in order right after the header, every descriptor is one the channel
//! carries, its header re-encodes canonically, and the message written again from its parts
//! decodes to the same message.

#![no_main]

use handoff_fuzz::{check_header, expect_code, touch, LIMITS, MESSAGE_CODES};
use handoff_wire::framing::{decode_message_on, encode_header_into, TCP_KINDS, UNIX_KINDS};
use handoff_wire::{Descriptor, Header, TicketOp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kinds in [TCP_KINDS, UNIX_KINDS] {
        for limits in &LIMITS {
            let message = match decode_message_on(data, limits, kinds) {
                Ok(m) => m,
                Err(e) => {
                    expect_code(&e, MESSAGE_CODES, "decode_message_on");
                    continue;
                }
            };
            touch(&message);
            assert!(message.consumed <= data.len(), "consumed more than the input");
            let header_len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
            assert!(header_len as u64 <= limits.max_header_bytes as u64);
            let mut at = 4 + header_len;
            for frame in &message.frames {
                let start = frame.as_ptr() as usize - data.as_ptr() as usize;
                assert_eq!(start, at, "frames are not contiguous after the header");
                at += frame.len();
            }
            assert_eq!(at, message.consumed, "frames do not end where the message does");
            let expected: Vec<u64> = match &message.header {
                Header::Msg { frames, .. } => {
                    for d in frames {
                        assert!(
                            kinds.contains(&d.kind()),
                            "a {} descriptor on a channel without it",
                            d.kind()
                        );
                    }
                    frames
                        .iter()
                        .filter_map(|d| match d {
                            Descriptor::Inline { len } => Some(*len),
                            _ => None,
                        })
                        .collect()
                }
                Header::Ticket(TicketOp::Pulled { len, .. }) => vec![*len],
                _ => Vec::new(),
            };
            let got: Vec<u64> = message.frames.iter().map(|f| f.len() as u64).collect();
            assert_eq!(got, expected, "frame lengths differ from the descriptors");
            check_header(&message.header, limits);

            // The same message written from its parts decodes to the same message.
            let mut again = Vec::new();
            encode_header_into(&message.header, &mut again);
            for frame in &message.frames {
                again.extend_from_slice(frame);
            }
            let decoded = decode_message_on(&again, limits, kinds)
                .unwrap_or_else(|e| panic!("a decoded message written again does not decode: {e}"));
            assert_eq!(decoded.header, message.header);
            assert_eq!(decoded.frames, message.frames);
            assert_eq!(decoded.consumed, again.len());
        }
    }
});

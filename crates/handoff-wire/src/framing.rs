//! Message framing: `u32 header length | msgpack header | inline frame bytes…`.
//!
//! These functions hold the protocol logic; the runtime does the reading and
//! writing around them (the reader reads the 4-byte prefix, asks
//! [`header_len`], reads the header, asks [`Header::decode`] and
//! [`inline_frame_lengths`], then reads each inline frame straight into its
//! destination buffer).

use crate::{Descriptor, Header, Limits, WireError};

/// Bytes of the length prefix in front of every header.
pub const LEN_PREFIX: usize = 4;

/// Validates a header's length prefix against the limits.
pub fn header_len(prefix: [u8; LEN_PREFIX], limits: &Limits) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(prefix);
    if len > limits.max_header_bytes {
        return Err(WireError::HeaderTooLarge {
            len: len as u64,
            limit: limits.max_header_bytes as u64,
        });
    }
    if len == 0 {
        return Err(WireError::MalformedHeader("header length is zero".into()));
    }
    Ok(len as usize)
}

/// Appends `len(header) | header` to `out`, ready to be followed by the inline frames.
pub fn encode_header_into(header: &Header<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; LEN_PREFIX]);
    header.encode_into(out);
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
}

/// The lengths of the frames that follow the header in the stream, checking that every
/// descriptor kind is one `supported` (a channel passes the kinds it can carry).
pub fn inline_frame_lengths(frames: &[Descriptor], supported: &[&str]) -> Result<Vec<u64>, WireError> {
    frames
        .iter()
        .enumerate()
        .map(|(index, d)| {
            if !supported.contains(&d.kind()) {
                return Err(WireError::UnsupportedDescriptor {
                    index,
                    kind: d.kind().to_string(),
                });
            }
            Ok(d.inline_len())
        })
        .collect()
}

/// A whole message decoded from one contiguous buffer (the test vectors, the fuzzer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage<'a> {
    /// The header.
    pub header: Header<'a>,
    /// The inline frames, in order (for a `pulled` header: its bytes, as one frame).
    pub frames: Vec<&'a [u8]>,
    /// How many bytes of the input the message used.
    pub consumed: usize,
}

/// The descriptor kinds a TCP stream carries.
pub const TCP_KINDS: &[&str] = &["inline", "ticket"];
/// The descriptor kinds a Unix socket carries.
pub const UNIX_KINDS: &[&str] = &["inline", "shm", "ticket"];
/// The descriptor kinds a Unix socket carries to a node that announced `cuda` (§7.10).
pub const UNIX_KINDS_WITH_CUDA: &[&str] = &["inline", "shm", "ticket", "cuda"];

/// Decodes one message from the front of `bytes` as a TCP stream carries it: `inline`
/// frames and `ticket`s (a plain byte stream cannot pass shared memory).
pub fn decode_message<'a>(bytes: &'a [u8], limits: &Limits) -> Result<DecodedMessage<'a>, WireError> {
    decode_message_on(bytes, limits, TCP_KINDS)
}

/// Decodes one message from the front of `bytes` on a connection that carries the
/// descriptor kinds in `supported` (a Unix socket: [`UNIX_KINDS`]); `frames` holds the
/// inline frames' bytes, or for a `pulled` header the bytes that follow it.
pub fn decode_message_on<'a>(
    bytes: &'a [u8],
    limits: &Limits,
    supported: &[&str],
) -> Result<DecodedMessage<'a>, WireError> {
    if bytes.len() < LEN_PREFIX {
        return Err(WireError::Truncated {
            what: "header length",
            needed: LEN_PREFIX as u64,
            available: bytes.len() as u64,
        });
    }
    let len = header_len([bytes[0], bytes[1], bytes[2], bytes[3]], limits)?;
    let rest = &bytes[LEN_PREFIX..];
    if rest.len() < len {
        return Err(WireError::Truncated {
            what: "header",
            needed: len as u64,
            available: rest.len() as u64,
        });
    }
    let header = Header::decode(&rest[..len], limits)?;
    let mut offset = LEN_PREFIX + len;
    let mut frames = Vec::new();
    if let Header::Ticket(crate::TicketOp::Pulled { len, .. }) = &header {
        let available = (bytes.len() - offset) as u64;
        if available < *len {
            return Err(WireError::Truncated {
                what: "pulled bytes",
                needed: *len,
                available,
            });
        }
        let end = offset + *len as usize;
        frames.push(&bytes[offset..end]);
        offset = end;
    }
    if let Header::Msg { frames: descs, .. } = &header {
        for (desc, frame_len) in descs.iter().zip(inline_frame_lengths(descs, supported)?) {
            if !matches!(desc, Descriptor::Inline { .. }) {
                continue;
            }
            let available = (bytes.len() - offset) as u64;
            if available < frame_len {
                return Err(WireError::Truncated {
                    what: "frame",
                    needed: frame_len,
                    available,
                });
            }
            let end = offset + frame_len as usize;
            frames.push(&bytes[offset..end]);
            offset = end;
        }
    }
    Ok(DecodedMessage {
        header,
        frames,
        consumed: offset,
    })
}

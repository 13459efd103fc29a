//! [`Header::decode`]: the first pass (`scan`) checks the structure of the whole header; the
//! second, here, checks `k` and then the fields of that kind only, in the order of
//! `spec/WIRE.md` §11.2 step 3, and builds them (§6 rules 6 and 7, §7, §9).
//!
//! Fields of other kinds were type-checked by the first pass and are not built: a `hello`
//! never builds an `f`. A `msg`'s frame count is held to the limit before any descriptor is
//! built, and each descriptor is read again from the header's bytes as it is built.

use super::scan::{self, DescriptorFields, HeaderFields};
use super::schema::{descriptor as d, header as h};
use super::{Descriptor, DeviceClaim, Header, Hello, Ident, TicketClaim, TicketOp, MAX_HEADER_DEPTH};
use crate::header::TicketDigest;
use crate::msgpack::Reader;
use crate::{Limits, WireError};

impl<'a> Header<'a> {
    /// Decodes and validates one header against `limits`: `bytes` are exactly the header's
    /// bytes, after the length prefix (bytes left over after the map are malformed).
    ///
    /// The checks and their order are those of `spec/WIRE.md` §11.2 steps 2 and 3; the
    /// result borrows the type name and the body from `bytes`.
    pub fn decode(bytes: &'a [u8], limits: &Limits) -> Result<Header<'a>, WireError> {
        let mut fields = HeaderFields::new();
        scan::header(bytes, &mut fields, limits.max_header_values)?;
        let kind = fields
            .text(h::K)
            .ok_or_else(|| WireError::MalformedHeader("header lacks field \"k\"".into()))?;
        // Compared as bytes; the first pass checked that they are UTF-8.
        match kind {
            b"msg" => msg(bytes, &fields, limits),
            b"hello" => hello(bytes, &fields),
            b"challenge" => Ok(Header::Challenge {
                version: need(fields.uint(h::V), "challenge", "v")? as u16,
                // 32 bytes: the first pass checked the length, which is part of the type.
                nonce: need(fields.bin(h::NONCE), "challenge", "nonce")?.to_vec(),
            }),
            b"ident" => ident(bytes, &fields).map(Header::Ident),
            b"auth" => Ok(Header::Auth {
                mac: need(fields.bin(h::MAC), "auth", "mac")?.to_vec(),
            }),
            b"ready" => Ok(Header::Ready),
            b"release" => Ok(Header::Release {
                leases: leases(bytes, need(fields.array(h::LEASES), "release", "leases")?)?,
            }),
            b"error" => Ok(Header::Error {
                code: need(fields.str(h::CODE), "error", "code")?.to_string(),
                message: need(fields.str(h::MSG), "error", "msg")?.to_string(),
            }),
            b"pull" | b"pulled" | b"forward" | b"forwarded" | b"ticket-error" | b"unlease" | b"renew" => {
                let op = ticket_op(&String::from_utf8_lossy(kind), &fields)?;
                // The bytes of a `pulled` follow the header like one inline frame: same limits.
                if let TicketOp::Pulled { len, .. } = op {
                    check_frame(0, len, 0, limits)?;
                }
                Ok(Header::Ticket(op))
            }
            other => Err(WireError::UnknownKind(String::from_utf8_lossy(other).into_owned())),
        }
    }
}

/// A required field: present (not nil), or `malformed-header` naming it.
fn need<T>(value: Option<T>, kind: &str, field: &str) -> Result<T, WireError> {
    value.ok_or_else(|| WireError::MalformedHeader(format!("{kind:?} header lacks field {field:?}")))
}

/// A reader positioned at an array the first pass found valid, to read it again.
fn reread(bytes: &[u8], at: usize) -> Reader<'_> {
    // The first pass counted these values already; reading them again costs no more budget.
    let mut r = Reader::new(bytes, u32::MAX, MAX_HEADER_DEPTH);
    r.seek(at);
    r
}

/// Holds one frame of `len` bytes to the per-frame limit and the running total to the
/// per-message limit; returns the new total.
fn check_frame(index: usize, len: u64, total: u64, limits: &Limits) -> Result<u64, WireError> {
    if len > limits.max_frame_bytes {
        return Err(WireError::FrameTooLarge {
            index,
            len,
            limit: limits.max_frame_bytes,
        });
    }
    let total = total.saturating_add(len);
    if total > limits.max_message_bytes {
        return Err(WireError::MessageTooLarge {
            len: total,
            limit: limits.max_message_bytes,
        });
    }
    Ok(total)
}

fn malformed(e: crate::msgpack::ReadError) -> WireError {
    WireError::MalformedHeader(format!("reading a field again: {e}"))
}

fn msg<'a>(bytes: &'a [u8], fields: &HeaderFields<'a>, limits: &Limits) -> Result<Header<'a>, WireError> {
    let type_name = need(fields.str(h::T), "msg", "t")?;
    let body = need(fields.bin(h::B), "msg", "b")?;
    let Some((at, count)) = fields.array(h::F) else {
        return Ok(Header::Msg {
            type_name,
            body,
            frames: Vec::new(),
        });
    };
    if count as u64 > limits.max_frames as u64 {
        return Err(WireError::TooManyFrames {
            count: count as u64,
            limit: limits.max_frames as u64,
        });
    }
    let mut r = reread(bytes, at);
    r.read_array_len(2).map_err(malformed)?;
    let mut frames = Vec::with_capacity(count as usize);
    let mut total = 0u64;
    let mut fields = DescriptorFields::new();
    for index in 0..count {
        scan::descriptor(&mut r, index, &mut fields)?;
        let desc = descriptor(index as usize, &fields)?;
        total = check_frame(index as usize, desc.len(), total, limits)?;
        frames.push(desc);
    }
    Ok(Header::Msg {
        type_name,
        body,
        frames,
    })
}

/// Builds descriptor `index` from its known keys, in the order of §7 and §11.2.
fn descriptor(index: usize, f: &DescriptorFields<'_>) -> Result<Descriptor, WireError> {
    let lacks = |kind: &str, field: &str| {
        WireError::MalformedHeader(format!("frame {index}: {kind:?} descriptor lacks field {field:?}"))
    };
    let kind = f
        .text(d::K)
        .ok_or_else(|| WireError::MalformedHeader(format!("frame {index}: descriptor lacks field \"k\"")))?;
    let len = |kind| f.uint(d::N).ok_or_else(|| lacks(kind, "n"));
    match kind {
        b"inline" => Ok(Descriptor::Inline { len: len("inline")? }),
        b"shm" => {
            let kind = "shm";
            let len = len(kind)?;
            let offset = f.uint(d::OFF).ok_or_else(|| lacks(kind, "off"))?;
            let size = f.uint(d::SIZE).ok_or_else(|| lacks(kind, "size"))?;
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(WireError::MalformedHeader(format!(
                    "frame {index}: shm window {offset}+{len} exceeds the segment size {size}"
                )));
            }
            Ok(Descriptor::Shm {
                len,
                offset,
                size,
                lease: f.uint(d::LEASE).ok_or_else(|| lacks(kind, "lease"))?,
                sealed: f.bool(d::SEALED).unwrap_or(false),
            })
        }
        b"ticket" => {
            let kind = "ticket";
            Ok(Descriptor::Ticket(TicketClaim {
                len: len(kind)?,
                owner: f.str(d::OWNER).ok_or_else(|| lacks(kind, "owner"))?.to_string(),
                addr: f.str(d::ADDR).map(str::to_string),
                lease: f.uint(d::LEASE).ok_or_else(|| lacks(kind, "lease"))?,
                // 32 bytes each: the first pass checked their lengths, which are part of their type.
                token: f.bin(d::TOKEN).ok_or_else(|| lacks(kind, "token"))?.to_vec(),
                digest: match (f.bin(d::DIGEST), f.bin(d::XXH3)) {
                    (Some(b), None) => TicketDigest::Blake3(b.try_into().expect("32 bytes by type")),
                    (None, Some(x)) => TicketDigest::Xxh3(x.try_into().expect("16 bytes by type")),
                    (None, None) => return Err(lacks(kind, "digest")),
                    (Some(_), Some(_)) => {
                        return Err(WireError::MalformedHeader(format!(
                        "frame {index}: \"ticket\" descriptor has both \"digest\" and \"xxh3\"; a ticket carries one"
                    )))
                    }
                },
                ttl_ms: f.uint(d::TTL).ok_or_else(|| lacks(kind, "ttl"))?,
                lazy: f.bool(d::LAZY).unwrap_or(false),
            }))
        }
        b"cuda" => {
            let kind = "cuda";
            let len = len(kind)?;
            let offset = f.uint(d::OFF).ok_or_else(|| lacks(kind, "off"))?;
            let lease = f.uint(d::LEASE).ok_or_else(|| lacks(kind, "lease"))?;
            let token = f.bin(d::TOKEN).ok_or_else(|| lacks(kind, "token"))?.to_vec();
            // Fixed lengths, checked with their types by the first pass.
            let ipc = f.bin(d::IPC).ok_or_else(|| lacks(kind, "ipc"))?;
            let device = f.bin(d::DEVICE).ok_or_else(|| lacks(kind, "device"))?;
            if offset.checked_add(len).is_none() {
                return Err(WireError::MalformedHeader(format!(
                    "frame {index}: cuda range {offset}+{len} overflows"
                )));
            }
            Ok(Descriptor::Cuda(DeviceClaim {
                len,
                offset,
                lease,
                token,
                ipc: ipc.try_into().expect("64 bytes by type"),
                device: device.try_into().expect("16 bytes by type"),
            }))
        }
        b"tag" => Ok(Descriptor::Tag {
            key: f.str(d::KEY).ok_or_else(|| lacks("tag", "key"))?.to_string(),
        }),
        other => Err(WireError::UnknownDescriptor {
            index,
            kind: String::from_utf8_lossy(other).into_owned(),
        }),
    }
}

fn hello(bytes: &[u8], f: &HeaderFields<'_>) -> Result<Header<'static>, WireError> {
    const KIND: &str = "hello";
    // The nonce first (§11.2): its length was checked with its type.
    let nonce = need(f.bin(h::NONCE), KIND, "nonce")?.to_vec();
    let text = |slot: usize, field: &str| need(f.str(slot), KIND, field).map(str::to_string);
    let node_id = text(h::NODE, "node")?;
    let name = text(h::NAME, "name")?;
    let host_id = text(h::HOST, "host")?;
    let pid = need(f.uint(h::PID), KIND, "pid")? as u32;
    let process_id = text(h::PROC, "proc")?;
    let language = text(h::LANG, "lang")?;
    let implementation = text(h::IMPL, "impl")?;
    let version = need(f.uint(h::V), KIND, "v")? as u16;
    let capabilities = caps(bytes, need(f.array(h::CAPS), KIND, "caps")?)?;
    Ok(Header::Hello(Hello {
        node_id,
        name,
        host_id,
        pid,
        process_id,
        language,
        implementation,
        version,
        capabilities,
        nonce,
        listen: f.str(h::LISTEN).map(str::to_string),
        unix: f.str(h::UNIX).map(str::to_string),
    }))
}

/// Builds an `ident`: its fields in the order of §6.9's table.
fn ident(bytes: &[u8], f: &HeaderFields<'_>) -> Result<Ident, WireError> {
    const KIND: &str = "ident";
    let text = |slot: usize, field: &str| need(f.str(slot), KIND, field).map(str::to_string);
    Ok(Ident {
        node_id: text(h::NODE, "node")?,
        name: text(h::NAME, "name")?,
        host_id: text(h::HOST, "host")?,
        pid: need(f.uint(h::PID), KIND, "pid")? as u32,
        process_id: text(h::PROC, "proc")?,
        language: text(h::LANG, "lang")?,
        implementation: text(h::IMPL, "impl")?,
        capabilities: caps(bytes, need(f.array(h::CAPS), KIND, "caps")?)?,
        listen: f.str(h::LISTEN).map(str::to_string),
        unix: f.str(h::UNIX).map(str::to_string),
    })
}

/// The strings of `caps`, which the first pass found to be an array of str.
fn caps(bytes: &[u8], (at, count): (usize, u32)) -> Result<Vec<String>, WireError> {
    let mut r = reread(bytes, at);
    r.read_array_len(2).map_err(malformed)?;
    (0..count)
        .map(|_| r.read_str().map(str::to_string).map_err(malformed))
        .collect()
}

fn leases(bytes: &[u8], (at, count): (usize, u32)) -> Result<Vec<u64>, WireError> {
    let mut r = reread(bytes, at);
    r.read_array_len(2).map_err(malformed)?;
    (0..count).map(|_| r.read_uint(64).map_err(malformed)).collect()
}

/// Builds a ticket-protocol header: its fields in the order of §6.7's table.
fn ticket_op(kind: &str, f: &HeaderFields<'_>) -> Result<TicketOp, WireError> {
    let req = || need(f.uint(h::REQ), kind, "req");
    let lease = || need(f.uint(h::LEASE), kind, "lease");
    // 32 bytes: the first pass checked the length, which is part of the type.
    let token = || need(f.bin(h::TOKEN), kind, "token").map(<[u8]>::to_vec);
    let text = |slot: usize, field: &str| need(f.str(slot), kind, field).map(str::to_string);
    Ok(match kind {
        "pull" => TicketOp::Pull {
            req: req()?,
            lease: lease()?,
            token: token()?,
            offset: need(f.uint(h::OFF), kind, "off")?,
            len: need(f.uint(h::N), kind, "n")?,
        },
        "pulled" => TicketOp::Pulled {
            req: req()?,
            len: need(f.uint(h::N), kind, "n")?,
        },
        "forward" => TicketOp::Forward {
            req: req()?,
            lease: lease()?,
            token: token()?,
            to: text(h::TO, "to")?,
        },
        "forwarded" => TicketOp::Forwarded {
            req: req()?,
            token: token()?,
        },
        "ticket-error" => TicketOp::Refused {
            req: req()?,
            code: text(h::CODE, "code")?,
            message: text(h::MSG, "msg")?,
        },
        "unlease" => TicketOp::Unlease {
            lease: lease()?,
            token: token()?,
        },
        _ => TicketOp::Renew {
            lease: lease()?,
            token: token()?,
        },
    })
}

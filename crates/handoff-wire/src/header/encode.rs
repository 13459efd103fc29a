//! [`Header::encode`]: the canonical form of `spec/WIRE.md` §2, with exactly the keys of §6
//! and §7 in their listed order, optional keys omitted when absent (never written as nil).
//! Every implementation writes the same bytes for the same header; the vectors check it.

use super::{Descriptor, Header, TicketOp};
use crate::header::TicketDigest;
use crate::msgpack::{write_array_len, write_bin, write_bool, write_map_len, write_str, write_uint};

impl Header<'_> {
    /// Encodes the header as msgpack, keys in the spec's order.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }

    /// Appends the msgpack encoding of the header to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let mut w = Writer { out };
        match self {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                w.map(4, "msg");
                w.str("t", type_name);
                w.bin("b", body);
                w.key("f");
                write_array_len(w.out, frames.len());
                for d in frames {
                    descriptor(&mut w, d);
                }
            }
            Header::Hello(h) => {
                w.map(11 + h.listen.is_some() as usize + h.unix.is_some() as usize, "hello");
                w.str("node", &h.node_id);
                w.str("name", &h.name);
                w.str("host", &h.host_id);
                w.uint("pid", h.pid as u64);
                w.str("proc", &h.process_id);
                w.str("lang", &h.language);
                w.str("impl", &h.implementation);
                w.uint("v", h.version as u64);
                w.key("caps");
                write_array_len(w.out, h.capabilities.len());
                for c in &h.capabilities {
                    write_str(w.out, c);
                }
                w.bin("nonce", &h.nonce);
                if let Some(listen) = &h.listen {
                    w.str("listen", listen);
                }
                if let Some(unix) = &h.unix {
                    w.str("unix", unix);
                }
            }
            Header::Challenge { version, nonce } => {
                w.map(3, "challenge");
                w.uint("v", *version as u64);
                w.bin("nonce", nonce);
            }
            Header::Ident(i) => {
                w.map(9 + i.listen.is_some() as usize + i.unix.is_some() as usize, "ident");
                w.str("node", &i.node_id);
                w.str("name", &i.name);
                w.str("host", &i.host_id);
                w.uint("pid", i.pid as u64);
                w.str("proc", &i.process_id);
                w.str("lang", &i.language);
                w.str("impl", &i.implementation);
                w.key("caps");
                write_array_len(w.out, i.capabilities.len());
                for c in &i.capabilities {
                    write_str(w.out, c);
                }
                if let Some(listen) = &i.listen {
                    w.str("listen", listen);
                }
                if let Some(unix) = &i.unix {
                    w.str("unix", unix);
                }
            }
            Header::Auth { mac } => {
                w.map(2, "auth");
                w.bin("mac", mac);
            }
            Header::Ready => w.map(1, "ready"),
            Header::Release { leases } => {
                w.map(2, "release");
                w.key("leases");
                write_array_len(w.out, leases.len());
                for &lease in leases {
                    write_uint(w.out, lease);
                }
            }
            Header::Ticket(op) => ticket_op(&mut w, op),
            Header::Error { code, message } => {
                w.map(3, "error");
                w.str("code", code);
                w.str("msg", message);
            }
        }
    }
}

/// Writes map entries: a key, then its value.
struct Writer<'o> {
    out: &'o mut Vec<u8>,
}

impl Writer<'_> {
    /// The header of a map of `entries` entries, and its first entry, `k`.
    fn map(&mut self, entries: usize, kind: &str) {
        write_map_len(self.out, entries);
        self.str("k", kind);
    }

    fn key(&mut self, key: &str) {
        write_str(self.out, key);
    }

    fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        write_str(self.out, value);
    }

    fn bin(&mut self, key: &str, value: &[u8]) {
        self.key(key);
        write_bin(self.out, value);
    }

    fn uint(&mut self, key: &str, value: u64) {
        self.key(key);
        write_uint(self.out, value);
    }

    fn bool(&mut self, key: &str, value: bool) {
        self.key(key);
        write_bool(self.out, value);
    }
}

/// A descriptor map: the keys of its kind in the order of §7.
fn descriptor(w: &mut Writer<'_>, d: &Descriptor) {
    match d {
        Descriptor::Inline { len } => {
            w.map(2, "inline");
            w.uint("n", *len);
        }
        Descriptor::Shm {
            len,
            offset,
            size,
            lease,
            sealed,
        } => {
            // `sealed` is always written, false included.
            w.map(6, "shm");
            w.uint("n", *len);
            w.uint("off", *offset);
            w.uint("size", *size);
            w.uint("lease", *lease);
            w.bool("sealed", *sealed);
        }
        Descriptor::Ticket(t) => {
            // `addr` only when there is one; `lazy` only when true, last.
            w.map(7 + t.addr.is_some() as usize + t.lazy as usize, "ticket");
            w.uint("n", t.len);
            w.str("owner", &t.owner);
            if let Some(addr) = &t.addr {
                w.str("addr", addr);
            }
            w.uint("lease", t.lease);
            w.bin("token", &t.token);
            match &t.digest {
                TicketDigest::Blake3(d) => w.bin("digest", d),
                TicketDigest::Xxh3(x) => w.bin("xxh3", x),
            }
            w.uint("ttl", t.ttl_ms);
            if t.lazy {
                w.bool("lazy", true);
            }
        }
        Descriptor::Cuda(c) => {
            w.map(7, "cuda");
            w.uint("n", c.len);
            w.uint("off", c.offset);
            w.uint("lease", c.lease);
            w.bin("token", &c.token);
            w.bin("ipc", &c.ipc);
            w.bin("device", &c.device);
        }
        Descriptor::Tag { key } => {
            w.map(2, "tag");
            w.str("key", key);
        }
    }
}

/// A ticket-protocol header: the keys of its kind in the order of §6.7.
fn ticket_op(w: &mut Writer<'_>, op: &TicketOp) {
    match op {
        TicketOp::Pull {
            req,
            lease,
            token,
            offset,
            len,
        } => {
            w.map(6, op.kind());
            w.uint("req", *req);
            w.uint("lease", *lease);
            w.bin("token", token);
            w.uint("off", *offset);
            w.uint("n", *len);
        }
        TicketOp::Pulled { req, len } => {
            w.map(3, op.kind());
            w.uint("req", *req);
            w.uint("n", *len);
        }
        TicketOp::Forward { req, lease, token, to } => {
            w.map(5, op.kind());
            w.uint("req", *req);
            w.uint("lease", *lease);
            w.bin("token", token);
            w.str("to", to);
        }
        TicketOp::Forwarded { req, token } => {
            w.map(3, op.kind());
            w.uint("req", *req);
            w.bin("token", token);
        }
        TicketOp::Refused { req, code, message } => {
            w.map(4, op.kind());
            w.uint("req", *req);
            w.str("code", code);
            w.str("msg", message);
        }
        TicketOp::Unlease { lease, token } | TicketOp::Renew { lease, token } => {
            w.map(3, op.kind());
            w.uint("lease", *lease);
            w.bin("token", token);
        }
    }
}

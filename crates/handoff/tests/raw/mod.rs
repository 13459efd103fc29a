//! A peer that speaks the handshake by hand (spec §5.1, §5.4), step by step, for the tests
//! that then misbehave on purpose. It does no I/O: each step returns the bytes to write,
//! given what the node sent; the tests read and write (blocking or async) around it.
//!
//! Version 3, the default, as the dialer (the raw peer always connects): preamble,
//! `challenge`, `auth` (the dialer proves first, §5.7), then the node's `auth`, `ident`,
//! `ready`. Version 2, for nodes that accept v2 peers, in the same order. Version 1, for
//! the tests of nodes that accept v1 peers: preamble, `hello`, `auth`, `ready`.

#![allow(dead_code)]

use handoff::wire::framing::encode_header_into;
use handoff::wire::{auth, Header, Hello, Ident, Preamble};

/// Frames a header: its length prefix, then its bytes.
pub fn framed(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

/// An identity for a raw peer.
pub fn ident(node_id: &str, name: &str, process_id: &str, caps: &[&str]) -> Ident {
    Ident {
        node_id: node_id.into(),
        name: name.into(),
        host_id: "raw-host".into(),
        pid: std::process::id(),
        process_id: process_id.into(),
        language: "test".into(),
        implementation: "raw/0".into(),
        capabilities: caps.iter().map(|c| c.to_string()).collect(),
        listen: None,
        unix: None,
    }
}

/// Our side of one hand-driven handshake.
pub struct RawSide {
    secret: Vec<u8>,
    ident: Ident,
    version: u16,
    nonce: [u8; 32],
    /// Our first handshake header as sent (hello or challenge), without its prefix.
    first: Vec<u8>,
}

impl RawSide {
    /// A peer that speaks version 3 only, the default of every node.
    pub fn v3(secret: &str, ident: Ident) -> RawSide {
        RawSide::new(secret, ident, 3)
    }

    /// A peer that speaks version 2 only, as a default v2 implementation does.
    pub fn v2(secret: &str, ident: Ident) -> RawSide {
        RawSide::new(secret, ident, 2)
    }

    /// A peer that speaks version 1 only, as an older implementation does.
    pub fn v1(secret: &str, ident: Ident) -> RawSide {
        RawSide::new(secret, ident, 1)
    }

    fn new(secret: &str, ident: Ident, version: u16) -> RawSide {
        RawSide {
            secret: secret.as_bytes().to_vec(),
            ident,
            version,
            nonce: rand::random(),
            first: Vec::new(),
        }
    }

    /// The preamble to write first: `3..=3`, `2..=2` or `1..=1`.
    pub fn preamble(&self) -> [u8; 16] {
        Preamble::range(self.version, self.version).encode()
    }

    /// After the preambles: our `challenge` (v2, v3) or `hello` (v1), framed.
    pub fn first(&mut self) -> Vec<u8> {
        let header = if self.version == 1 {
            Header::Hello(Hello::from_ident(self.ident.clone(), 1, self.nonce.to_vec()))
        } else {
            Header::Challenge {
                version: self.version,
                nonce: self.nonce.to_vec(),
            }
        };
        let bytes = framed(&header);
        self.first = bytes[4..].to_vec();
        bytes
    }

    /// Given the node's preamble and its first handshake header (without prefix): our `auth`.
    pub fn auth(&self, peer_preamble: &[u8], peer_first: &[u8]) -> Vec<u8> {
        let own = self.preamble();
        let peer: [u8; 16] = peer_preamble.try_into().expect("16 bytes");
        let ours = auth::Sent {
            preamble: &own,
            challenge: &self.first,
        };
        let theirs = auth::Sent {
            preamble: &peer,
            challenge: peer_first,
        };
        let mac = match self.version {
            1 => auth::proof(&self.secret, &self.first, peer_first),
            2 => auth::proof_v2(&self.secret, ours, theirs),
            _ => auth::dialer_proof(&self.secret, &auth::Transcript::of(auth::Role::Dialer, ours, theirs)),
        };
        framed(&Header::Auth { mac: mac.to_vec() })
    }

    /// After the node's `auth` (v2, v3): our `ident`, framed.
    pub fn ident(&self) -> Vec<u8> {
        framed(&Header::Ident(self.ident.clone()))
    }

    /// The last step: `ready`, framed.
    pub fn ready(&self) -> Vec<u8> {
        framed(&Header::Ready)
    }
}

/// An owner that completes the handshake as the acceptor (driven by the engine's own
/// handshake, blocking, on a thread of its own), then reads nothing and answers nothing:
/// a stalled ticket owner. Returns its address and node id; it keeps its connections open
/// until the process ends.
pub fn silent_acceptor(secret: &str, node_id: &str) -> (String, String) {
    use handoff::proto::handshake::{Config, DialerNonces, Handshake, Status};
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let (secret, me) = (
        secret.as_bytes().to_vec(),
        ident(node_id, "silent-owner", node_id, &["inline"]),
    );
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let config = Config {
                ident: me.clone(),
                secret: secret.clone(),
                limits: handoff::wire::Limits::default(),
                preamble: Preamble::OURS,
                role: auth::Role::Acceptor,
                nonce: rand::random(),
                deadline: Instant::now() + Duration::from_secs(10),
                progress_timeout: Duration::from_secs(10),
                dialed: std::sync::Arc::new(DialerNonces::new(Duration::from_secs(10))),
            };
            let mut hs = Handshake::new(config, Instant::now());
            loop {
                if hs.has_transmit() {
                    s.write_all(&hs.take_transmit()).unwrap();
                }
                match hs.status().clone() {
                    Status::Admit(_) => hs.admit(Ok(())),
                    Status::Done(_) => break,
                    Status::Failed(f) => panic!("the silent owner's handshake failed: {f:?}"),
                    Status::InProgress => {
                        let mut buf = vec![0u8; hs.wants()];
                        let n = s.read(&mut buf).unwrap();
                        hs.handle_read(&buf[..n], 0, Instant::now());
                    }
                }
            }
            if hs.has_transmit() {
                s.write_all(&hs.take_transmit()).unwrap();
            }
            kept.push(s); // read nothing more, answer nothing
        }
    });
    (addr, node_id.to_string())
}

//! One connection's TLS session (spec §3.1) between its socket and the engine, for every
//! driver: the tokio driver and the asyncio driver run the same code.
//!
//! rustls is sans-IO; so is this. A driver lends the session its socket as a non-blocking
//! [`Read`] + [`Write`] (a read or write that cannot go on now returns `WouldBlock`) and
//! waits for readiness itself. The session does no system call of its own.
//!
//! Reads go through a buffer of the session's: rustls takes ciphertext 4 KiB at a time, so a
//! session reading its socket through rustls would make four or five `recv` calls for each
//! 16 KiB record. One read of the socket takes up to [`READ_AHEAD`] bytes, and rustls is fed
//! from memory. Until the TLS handshake is over the buffer is [`HANDSHAKE_READ`] bytes: a
//! peer that has proven nothing costs no more.

use std::io::{IoSlice, Read, Write};
use std::sync::Arc;

use rustls::{ClientConnection, Connection, ServerConnection};

use crate::tls::{explain, server_name, Configs, Side};

/// Ciphertext one read of the socket takes once the TLS handshake is done.
pub const READ_AHEAD: usize = 64 << 10;
/// Ciphertext one read of the socket takes during the TLS handshake.
pub const HANDSHAKE_READ: usize = 4 << 10;
/// Plaintext rustls takes ahead of the socket: past this much waiting to be written as
/// records, a write takes nothing (so a large frame is not encrypted into memory at once).
pub const PLAINTEXT_AHEAD: usize = 256 << 10;

/// One connection's TLS session.
pub struct TlsSession {
    conn: Connection,
    /// How errors name the peer.
    peer: String,
    /// The name a dialing session checks the peer's certificate against (`None`: it
    /// accepted).
    checked_name: Option<String>,
    /// Ciphertext read from the socket that rustls has not taken yet: `inbox[start..end]`.
    inbox: Box<[u8]>,
    start: usize,
    end: usize,
    /// The socket ended.
    eof: bool,
}

/// What a read through TLS brought.
#[derive(Debug, PartialEq, Eq)]
pub enum TlsRead {
    /// Plaintext bytes (0: the peer ended the stream; whether cleanly is the engine's to
    /// judge, as a message cut short).
    Bytes(usize),
    /// Nothing now: wait until the socket is readable.
    WouldBlock,
    /// The TLS session failed: why, in words that say what to fix. Whatever alert tells
    /// the peer is queued ([`TlsSession::flush`]).
    Failed(String),
}

/// Where a TLS handshake is.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshaking {
    /// Over: plaintext may flow.
    Done,
    /// Waiting until the socket is readable.
    WantsRead,
    /// Waiting until the socket is writable.
    WantsWrite,
}

impl TlsSession {
    /// The dialing side, checking the peer's certificate against `host` (the host part of
    /// the address dialed, or the name the node was told to expect); `peer` names the peer
    /// in errors.
    pub fn client(configs: &Configs, host: &str, peer: &str) -> Result<TlsSession, String> {
        let name = server_name(host)?;
        let conn = ClientConnection::new(Arc::clone(&configs.client), name).map_err(|e| format!("TLS: {e}"))?;
        let mut session = TlsSession::new(conn.into(), peer);
        session.checked_name = Some(host.to_string());
        Ok(session)
    }

    /// The accepting side, asking for the peer's certificate.
    pub fn server(configs: &Configs, peer: &str) -> Result<TlsSession, String> {
        let conn = ServerConnection::new(Arc::clone(&configs.server)).map_err(|e| format!("TLS: {e}"))?;
        Ok(TlsSession::new(conn.into(), peer))
    }

    fn new(mut conn: Connection, peer: &str) -> TlsSession {
        conn.set_buffer_limit(Some(PLAINTEXT_AHEAD));
        TlsSession {
            conn,
            peer: peer.to_string(),
            checked_name: None,
            inbox: vec![0u8; HANDSHAKE_READ].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
        }
    }

    /// Reads plaintext into `buf`, taking TLS records from `socket` as needed (and writing
    /// what the TLS handshake answers, as far as the socket takes it now).
    pub fn read<S: Read + Write>(&mut self, socket: &mut S, buf: &mut [u8]) -> TlsRead {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return TlsRead::Bytes(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // The socket ended without TLS's close_notify.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return TlsRead::Bytes(0),
                Err(e) => return TlsRead::Failed(format!("TLS: {e}")),
            }
            if self.eof {
                return TlsRead::Bytes(0);
            }
            match self.take_records(socket) {
                Ok(true) => {}
                Ok(false) => return TlsRead::WouldBlock,
                Err(why) => return TlsRead::Failed(why),
            }
        }
    }

    /// Runs the TLS handshake as far as the socket lets it now.
    pub fn handshake<S: Read + Write>(&mut self, socket: &mut S) -> Result<Handshaking, String> {
        loop {
            match self.flush(socket) {
                Ok(true) => {}
                Ok(false) => return Ok(Handshaking::WantsWrite),
                Err(e) => return Err(format!("TLS handshake with {}: {e}", self.peer)),
            }
            if !self.conn.is_handshaking() {
                return Ok(Handshaking::Done);
            }
            if self.eof {
                return Err(format!("{} closed the connection during the TLS handshake", self.peer));
            }
            if !self.take_records(socket)? {
                return Ok(Handshaking::WantsRead);
            }
        }
    }

    /// Feeds rustls one batch of records, reading the socket when the buffer is empty;
    /// `false` when the socket has nothing now. A failure queues the alert for the peer.
    fn take_records<S: Read + Write>(&mut self, socket: &mut S) -> Result<bool, String> {
        if self.start == self.end {
            if !self.conn.is_handshaking() && self.inbox.len() < READ_AHEAD {
                // Only a peer whose certificate checked out gets the large buffer.
                self.inbox = vec![0u8; READ_AHEAD].into_boxed_slice();
            }
            let n = match socket.read(&mut self.inbox) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(true),
                Err(e) => return Err(format!("reading from {}: {e}", self.peer)),
            };
            (self.start, self.end) = (0, n);
            self.eof = n == 0;
        }
        let mut records = &self.inbox[self.start..self.end];
        let taken = self
            .conn
            .read_tls(&mut records)
            .map_err(|e| format!("TLS from {}: {e}", self.peer))?;
        if taken == 0 && !records.is_empty() {
            return Err(format!("TLS from {}: rustls took no records", self.peer));
        }
        self.start += taken;
        if let Err(e) = self.conn.process_new_packets() {
            // Tell the peer (an alert) as far as the socket takes it now.
            let _ = self.flush(socket);
            let side = match &self.checked_name {
                Some(name) => Side::Client { name },
                None => Side::Server,
            };
            return Err(explain(&e, &self.peer, side));
        }
        // Handshake messages to answer with (key updates after it).
        if let Err(e) = self.flush(socket) {
            return Err(format!("writing to {}: {e}", self.peer));
        }
        Ok(true)
    }

    /// Encrypts as much of `parts` as rustls takes now and writes records to `socket`;
    /// the plaintext bytes taken (0 when records wait for the socket: wait until it is
    /// writable).
    pub fn write<S: Write>(&mut self, socket: &mut S, parts: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.flush(socket)?;
        let taken = self.conn.writer().write_vectored(parts)?;
        self.flush(socket)?;
        Ok(taken)
    }

    /// Writes the records waiting, as far as `socket` takes them now; whether all went.
    pub fn flush<S: Write>(&mut self, socket: &mut S) -> std::io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(socket) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether the TLS handshake is still going on (no plaintext may flow yet).
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Whether records wait to be written.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Ends our sending direction with TLS's close_notify (queued; flushed with the rest).
    pub fn close_notify(&mut self) {
        self.conn.send_close_notify();
    }

    /// Ciphertext read from the socket and not yet taken by rustls.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::{IoSlice, Read, Write};
    use std::sync::{Arc, Mutex};

    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

    use super::*;
    use crate::tls::NameCheck;

    /// One direction of an in-memory socket pair: reads say `WouldBlock` while it is empty.
    #[derive(Clone, Default)]
    struct Pipe(Arc<Mutex<VecDeque<u8>>>);

    /// One end: reads from `rx`, writes to `tx`, and counts its reads.
    struct End {
        rx: Pipe,
        tx: Pipe,
        reads: usize,
        closed: bool,
    }

    impl Read for End {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let mut q = self.rx.0.lock().unwrap();
            if q.is_empty() {
                return if self.closed {
                    Ok(0)
                } else {
                    Err(std::io::ErrorKind::WouldBlock.into())
                };
            }
            self.reads += 1;
            let n = buf.len().min(q.len());
            for (b, byte) in buf.iter_mut().zip(q.drain(..n)) {
                *b = byte;
            }
            Ok(n)
        }
    }

    impl Write for End {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.tx.0.lock().unwrap().extend(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn pair() -> (End, End) {
        let (a, b) = (Pipe::default(), Pipe::default());
        let end = |rx: &Pipe, tx: &Pipe| End {
            rx: rx.clone(),
            tx: tx.clone(),
            reads: 0,
            closed: false,
        };
        (end(&a, &b), end(&b, &a))
    }

    /// Both sides' configurations: one certificate for 127.0.0.1 signed by a fresh CA.
    fn configs() -> Configs {
        configs_checking(NameCheck::Name)
    }

    fn configs_checking(check: NameCheck) -> Configs {
        configs_of("test CA", check)
    }

    /// A CA named `ca_name` and its certificate for 127.0.0.1, checked as `check` says.
    fn configs_of(ca_name: &str, check: NameCheck) -> Configs {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(rcgen::DnType::CommonName, ca_name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.subject_alt_names = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &Issuer::from_params(&ca, &ca_key)).unwrap();
        let policy = crate::tls::Policy {
            name_check: check,
            ..Default::default()
        };
        Configs::from_pem_with(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            ca_pem.as_bytes(),
            policy,
        )
        .unwrap()
    }

    /// Runs both handshakes to the end.
    fn handshake(c: &mut TlsSession, ce: &mut End, s: &mut TlsSession, se: &mut End) {
        for _ in 0..20 {
            let a = c.handshake(ce).unwrap();
            let b = s.handshake(se).unwrap();
            if a == Handshaking::Done && b == Handshaking::Done {
                return;
            }
        }
        panic!("the handshakes did not finish");
    }

    fn connected() -> (TlsSession, End, TlsSession, End) {
        let configs = configs();
        let (mut ce, mut se) = pair();
        let mut c = TlsSession::client(&configs, "127.0.0.1", "server").unwrap();
        let mut s = TlsSession::server(&configs, "client").unwrap();
        handshake(&mut c, &mut ce, &mut s, &mut se);
        (c, ce, s, se)
    }

    #[test]
    fn plaintext_crosses_both_ways_and_an_empty_socket_says_would_block() {
        let (mut c, mut ce, mut s, mut se) = connected();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut se, &mut buf), TlsRead::WouldBlock);
        assert_eq!(
            c.write(&mut ce, &[IoSlice::new(b"hello "), IoSlice::new(b"there")])
                .unwrap(),
            11
        );
        assert_eq!(s.read(&mut se, &mut buf), TlsRead::Bytes(11));
        assert_eq!(&buf[..11], b"hello there");
        assert_eq!(s.write(&mut se, &[IoSlice::new(b"back")]).unwrap(), 4);
        assert_eq!(c.read(&mut ce, &mut buf), TlsRead::Bytes(4));
        assert_eq!(&buf[..4], b"back");
    }

    #[test]
    fn one_socket_read_takes_many_records() {
        let (mut c, mut ce, mut s, mut se) = connected();
        let data = vec![7u8; 200 << 10];
        let mut sent = 0;
        while sent < data.len() {
            sent += c.write(&mut ce, &[IoSlice::new(&data[sent..])]).unwrap();
        }
        let before = se.reads;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        while got.len() < data.len() {
            match s.read(&mut se, &mut buf) {
                TlsRead::Bytes(n) => got.extend_from_slice(&buf[..n]),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, data);
        // 200 KiB of 16 KiB records: about 4 reads of 64 KiB (rustls alone makes ~50).
        let reads = se.reads - before;
        assert!(reads <= 5, "{reads} socket reads");
    }

    #[test]
    fn the_end_of_the_socket_reads_as_zero_and_close_notify_too() {
        let (mut c, mut ce, mut s, mut se) = connected();
        c.close_notify();
        assert!(c.flush(&mut ce).unwrap());
        let mut buf = [0u8; 16];
        assert_eq!(s.read(&mut se, &mut buf), TlsRead::Bytes(0));
        // A cut without close_notify: 0 as well (the engine judges a message cut short).
        se.closed = true;
        ce.closed = true;
        assert_eq!(c.read(&mut ce, &mut buf), TlsRead::Bytes(0));
    }

    #[test]
    fn garbage_fails_with_words_and_queues_an_alert() {
        let configs = configs();
        let (mut ce, mut se) = pair();
        let mut s = TlsSession::server(&configs, "client").unwrap();
        // A handshake record holding an empty ClientHello.
        ce.write_all(&[22, 3, 1, 0, 4, 1, 0, 0, 0]).unwrap();
        match s.handshake(&mut se) {
            Err(why) => assert!(why.contains("TLS"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(!se.tx.0.lock().unwrap().is_empty(), "an alert went to the peer");
    }

    #[test]
    fn a_peer_gone_mid_handshake_fails_and_the_buffer_stays_small_until_done() {
        let configs = configs();
        let (mut ce, mut se) = pair();
        let mut c = TlsSession::client(&configs, "127.0.0.1", "server").unwrap();
        let mut s = TlsSession::server(&configs, "client").unwrap();
        assert_eq!(c.handshake(&mut ce).unwrap(), Handshaking::WantsRead);
        assert_eq!(s.handshake(&mut se).unwrap(), Handshaking::WantsRead);
        assert_eq!(s.inbox.len(), HANDSHAKE_READ);
        // The server's answer never comes: the socket ends.
        ce.closed = true;
        se.tx.0.lock().unwrap().clear();
        let why = c.handshake(&mut ce).unwrap_err();
        assert!(why.contains("closed the connection during the TLS handshake"), "{why}");
        // A finished handshake gets the large buffer at the next read.
        let (mut c, mut ce, mut s, mut se) = connected();
        c.write(&mut ce, &[IoSlice::new(b"x")]).unwrap();
        assert_eq!(s.read(&mut se, &mut [0u8; 4]), TlsRead::Bytes(1));
        assert_eq!(s.inbox.len(), READ_AHEAD);
    }

    /// Why a client of `client` dialing `host` refuses the certificate of a server of
    /// `server` (it must).
    fn client_refusal(client: &Configs, host: &str, server: &Configs) -> String {
        let (mut ce, mut se) = pair();
        let mut c = TlsSession::client(client, host, "server").unwrap();
        let mut s = TlsSession::server(server, "client").unwrap();
        for _ in 0..10 {
            if let Err(why) = c.handshake(&mut ce) {
                return why;
            }
            let _ = s.handshake(&mut se);
        }
        panic!("the client took the certificate");
    }

    #[test]
    fn a_wrong_name_is_refused_in_words() {
        let configs = configs();
        let why = client_refusal(&configs, "10.9.9.9", &configs);
        assert!(why.to_lowercase().contains("name") || why.contains("10.9.9.9"), "{why}");
    }

    #[test]
    fn checking_the_chain_only_takes_a_certificate_that_does_not_name_the_host() {
        // The same dialed address the test above is refused for: its chain is good.
        let configs = configs_checking(NameCheck::ChainOnly);
        let (mut ce, mut se) = pair();
        let mut c = TlsSession::client(&configs, "10.9.9.9", "server").unwrap();
        let mut s = TlsSession::server(&configs, "client").unwrap();
        handshake(&mut c, &mut ce, &mut s, &mut se);
        // A certificate of another CA is still refused, whether or not it names the host.
        let other = configs_of("another CA", NameCheck::ChainOnly);
        for host in ["127.0.0.1", "10.9.9.9"] {
            let why = client_refusal(&configs, host, &other);
            assert!(why.contains("not signed by a CA this node trusts"), "{host}: {why}");
        }
    }
}

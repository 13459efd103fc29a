//! A peer that speaks the wire format by hand: it handshakes correctly (or not), then sends
//! whatever an attack needs, byte for byte, with file descriptors on a Unix socket.
//!
//! It handshakes as the dialer of protocol version 3 (the default of every node, spec
//! §5.7) or, on request, as a version-2 or version-1-only peer (§5.4, §5.1), which only a
//! victim that accepts such peers lets in. It keeps the first bytes the victim sends it, so that an attack can check what
//! the victim revealed before the handshake completed.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use handoff::wire::framing::encode_header_into;
use handoff::wire::{auth, Header, Hello, Ident, Limits, Preamble};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// How long an attacker waits for an answer it expects.
pub const ANSWER_TIME: Duration = Duration::from_secs(10);

/// The stream of a raw peer: TCP, or a Unix socket that can pass descriptors (or the
/// writing half of a TCP stream whose reading half another task owns).
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    TcpWrite(tokio::net::tcp::OwnedWriteHalf),
}

/// What a raw peer keeps of the bytes it reads: enough for the handshake and an `error`.
const SEEN_LIMIT: usize = 1 << 20;

/// A raw connection to the victim.
pub struct Raw {
    pub stream: Stream,
    /// The victim's identity (its ident, or its hello's fields), once handshaken.
    pub peer: Option<Ident>,
    /// The first bytes read from the victim (at most [`SEEN_LIMIT`]).
    pub seen: Vec<u8>,
}

/// Who a raw peer says it is.
#[derive(Clone)]
pub struct Identity {
    pub node_id: String,
    pub process_id: String,
    pub name: String,
}

impl Identity {
    /// A fresh identity named `name` (random node and process ids).
    pub fn fresh(name: &str) -> Identity {
        Identity {
            node_id: handoff::identity::random_id(),
            process_id: handoff::identity::random_id(),
            name: name.to_string(),
        }
    }

    /// The ident this identity sends (version 2).
    pub fn ident(&self) -> Ident {
        Ident {
            node_id: self.node_id.clone(),
            name: self.name.clone(),
            host_id: "hostile-host".into(),
            pid: std::process::id(),
            process_id: self.process_id.clone(),
            language: "hostile".into(),
            implementation: "handoff-hostile/0".into(),
            capabilities: vec!["inline".into(), "shm".into(), "ticket".into()],
            listen: None,
            unix: None,
        }
    }

    /// The hello this identity sends (version 1), with a fresh nonce.
    pub fn hello(&self) -> Hello {
        Hello::from_ident(self.ident(), 1, rand::random::<[u8; 32]>().to_vec())
    }
}

/// A challenge of version 3, the default, with a fresh nonce.
pub fn challenge() -> Header<'static> {
    challenge_of(3, rand::random::<[u8; 32]>().to_vec())
}

/// A challenge of `version` (2 or 3) with `nonce`.
pub fn challenge_of(version: u16, nonce: Vec<u8>) -> Header<'static> {
    Header::Challenge { version, nonce }
}

/// The bytes of a header with its length prefix.
pub fn framed(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

/// The bytes of a header given as raw msgpack, with its length prefix.
pub fn framed_raw(msgpack: &[u8]) -> Vec<u8> {
    let mut out = (msgpack.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(msgpack);
    out
}

impl Raw {
    /// A raw peer on `stream`, not handshaken.
    pub fn over(stream: Stream) -> Raw {
        Raw {
            stream,
            peer: None,
            seen: Vec::new(),
        }
    }

    /// Opens a TCP connection (no handshake yet).
    pub async fn tcp(addr: &str) -> Result<Raw> {
        let s = TcpStream::connect(addr.trim_start_matches("tcp://"))
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Raw::over(Stream::Tcp(s)))
    }

    /// Opens a Unix connection (no handshake yet).
    pub async fn unix(path: &str) -> Result<Raw> {
        let s = UnixStream::connect(path.trim_start_matches("unix://"))
            .await
            .with_context(|| format!("connecting to {path}"))?;
        Ok(Raw::over(Stream::Unix(s)))
    }

    /// Opens a TCP connection and handshakes as `who` with `secret`.
    pub async fn tcp_handshaken(addr: &str, who: &Identity, secret: &[u8]) -> Result<Raw> {
        let mut raw = Raw::tcp(addr).await?;
        raw.handshake(who, secret).await?;
        Ok(raw)
    }

    /// Opens a Unix connection and handshakes as `who` with `secret`.
    pub async fn unix_handshaken(path: &str, who: &Identity, secret: &[u8]) -> Result<Raw> {
        let mut raw = Raw::unix(path).await?;
        raw.handshake(who, secret).await?;
        Ok(raw)
    }

    /// The victim's node id.
    pub fn victim_id(&self) -> &str {
        self.peer.as_ref().map_or("", |i| i.node_id.as_str())
    }

    /// A correct handshake of version 3, the default, as the dialer; fails with the
    /// victim's error if it refuses.
    pub async fn handshake(&mut self, who: &Identity, secret: &[u8]) -> Result<()> {
        self.handshake_as(3, who, secret).await
    }

    /// A correct handshake of version 2 (or 3), as the dialer: only a victim that accepts
    /// version 2 runs it.
    pub async fn handshake_as(&mut self, version: u16, who: &Identity, secret: &[u8]) -> Result<()> {
        let own_preamble = Preamble::range(version, version).encode();
        self.write(&own_preamble).await?;
        let own = framed(&challenge_of(version, rand::random::<[u8; 32]>().to_vec()));
        self.write(&own).await?;
        let mut pre = [0u8; 16];
        self.read_exact(&mut pre).await?;
        let peer_challenge = self.read_header_bytes().await?;
        self.expect(&peer_challenge, "challenge")?;
        let ours = auth::Sent {
            preamble: &own_preamble,
            challenge: &own[4..],
        };
        let theirs = auth::Sent {
            preamble: &pre,
            challenge: &peer_challenge,
        };
        let proof = match version {
            2 => auth::proof_v2(secret, ours, theirs),
            _ => auth::dialer_proof(secret, &auth::Transcript::of(auth::Role::Dialer, ours, theirs)),
        };
        self.write(&framed(&Header::Auth { mac: proof.to_vec() })).await?;
        let h = self.read_header_bytes().await?;
        self.expect(&h, "auth")?;
        self.write(&framed(&Header::Ident(who.ident()))).await?;
        let h = self.read_header_bytes().await?;
        let Header::Ident(ident) = self.expect(&h, "ident")? else {
            unreachable!("expect checked the kind")
        };
        self.write(&framed(&Header::Ready)).await?;
        let h = self.read_header_bytes().await?;
        self.expect(&h, "ready")?;
        self.peer = Some(ident);
        Ok(())
    }

    /// A correct handshake as a peer that speaks version 1 only: only a victim that accepts
    /// v1 peers lets it in (others refuse it with `unsupported-version`).
    pub async fn handshake_v1(&mut self, who: &Identity, secret: &[u8]) -> Result<()> {
        self.write(&Preamble::V1_ONLY.encode()).await?;
        let mut pre = [0u8; 16];
        self.read_exact(&mut pre).await?;
        let own = framed(&Header::Hello(who.hello()));
        self.write(&own).await?;
        let peer_hello = self.read_header_bytes().await?;
        let Header::Hello(hello) = self.expect(&peer_hello, "hello")? else {
            unreachable!("expect checked the kind")
        };
        let proof = auth::proof(secret, &own[4..], &peer_hello);
        self.write(&framed(&Header::Auth { mac: proof.to_vec() })).await?;
        let h = self.read_header_bytes().await?;
        self.expect(&h, "auth")?;
        self.write(&framed(&Header::Ready)).await?;
        let h = self.read_header_bytes().await?;
        self.expect(&h, "ready")?;
        self.peer = Some(hello.ident());
        Ok(())
    }

    /// Decodes a handshake header that must be of kind `kind`; the victim's `error` fails.
    fn expect<'h>(&self, bytes: &'h [u8], kind: &str) -> Result<Header<'h>> {
        match Header::decode(bytes, &Limits::default())? {
            Header::Error { code, message } => bail!("refused: {message} [{code}]"),
            h if h.kind() == kind => Ok(h),
            other => bail!("expected {kind}, got {other:?}"),
        }
    }

    /// Writes bytes.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        match &mut self.stream {
            Stream::Tcp(s) => s.write_all(bytes).await?,
            Stream::Unix(s) => s.write_all(bytes).await?,
            Stream::TcpWrite(s) => s.write_all(bytes).await?,
        }
        Ok(())
    }

    /// Writes `bytes` with `fds` attached to the first byte (Unix only).
    pub async fn write_with_fds(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        let Stream::Unix(s) = &mut self.stream else {
            bail!("descriptors travel only on a Unix socket")
        };
        let sent;
        loop {
            s.writable().await?;
            let r = s.try_io(tokio::io::Interest::WRITABLE, || {
                let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                    return Err(std::io::Error::other("too many descriptors"));
                }
                rustix::net::sendmsg(s.as_fd(), &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)
                    .map_err(std::io::Error::from)
            });
            match r {
                Ok(n) => {
                    sent = n;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        }
        s.write_all(&bytes[sent..]).await?;
        Ok(())
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        let read = async {
            match &mut self.stream {
                Stream::Tcp(s) => s.read_exact(buf).await.map(|_| ()),
                Stream::Unix(s) => s.read_exact(buf).await.map(|_| ()),
                Stream::TcpWrite(_) => Err(std::io::Error::other("this half only writes")),
            }
        };
        tokio::time::timeout(ANSWER_TIME, read)
            .await
            .context("no answer in time")?
            .context("the victim closed the connection")?;
        let keep = buf.len().min(SEEN_LIMIT.saturating_sub(self.seen.len()));
        self.seen.extend_from_slice(&buf[..keep]);
        Ok(())
    }

    /// Reads whatever the victim sends until it closes the connection (or resets it), or
    /// `limit` passes; returns the bytes and whether it closed in time.
    pub async fn until_closed(&mut self, limit: Duration) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let read = async {
                match &mut self.stream {
                    Stream::Tcp(s) => s.read(&mut buf).await,
                    Stream::Unix(s) => s.read(&mut buf).await,
                    Stream::TcpWrite(_) => Err(std::io::Error::other("this half only writes")),
                }
            };
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Ok(0)) | Ok(Err(_)) => break (got, true),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Err(_) => break (got, false),
            }
        }
    }

    /// The next header's bytes (without the prefix).
    pub async fn read_header_bytes(&mut self) -> Result<Vec<u8>> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        anyhow::ensure!(n <= 16 << 20, "the victim announced a header of {n} bytes");
        let mut h = vec![0u8; n];
        self.read_exact(&mut h).await?;
        Ok(h)
    }

    /// Reads `n` bytes and drops them (the bytes after a `pulled` or inline frames).
    pub async fn skip(&mut self, n: u64) -> Result<()> {
        let mut left = n;
        let mut buf = vec![0u8; 64 << 10];
        while left > 0 {
            let take = left.min(buf.len() as u64) as usize;
            self.read_exact(&mut buf[..take]).await?;
            left -= take as u64;
        }
        Ok(())
    }

    /// Reads until the victim sends an `error`, closes, or `limit` passes; returns the
    /// error's code and message, if one came. Skips the frames of messages in between.
    pub async fn error_before_close(&mut self, limit: Duration) -> Option<(String, String)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let h = tokio::time::timeout_at(deadline, self.read_header_bytes())
                .await
                .ok()?
                .ok()?;
            match Header::decode(&h, &Limits::default()).ok()? {
                Header::Error { code, message } => return Some((code, message)),
                Header::Msg { frames, .. } => {
                    let inline: u64 = frames.iter().map(|d| d.inline_len()).sum();
                    self.skip(inline).await.ok()?;
                }
                Header::Ticket(handoff::wire::TicketOp::Pulled { len, .. }) => self.skip(len).await.ok()?,
                _ => {}
            }
        }
    }
}

/// A memfd of `size` bytes (sparse), with `seals`.
pub fn memfd(size: u64, seals: rustix::fs::SealFlags) -> Result<std::os::fd::OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "handoff-hostile",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, size)?;
    if !seals.is_empty() {
        rustix::fs::fcntl_add_seals(&fd, seals)?;
    }
    Ok(fd)
}

//! The connection handshake over a stream: preambles, hellos, proofs of the secret, ready.
//!
//! Both sides run the same steps (the protocol is symmetric), each writing before it
//! reads, so neither waits on the other.

use handoff_wire::framing::encode_header_into;
use handoff_wire::{auth, Endpoint, Header, Hello, Limits, Preamble, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::io::{write_all, MessageReader};
use crate::{Error, Result};

/// Capabilities of this implementation in protocol version 1 (`shm` only where the node
/// has a Unix socket for same-host peers).
pub(crate) const CAPABILITIES: &[&str] = &["inline", "shm", "ticket"];

/// What we know about the peer once the handshake succeeded.
pub(crate) struct Handshaken {
    pub(crate) hello: Hello,
}

async fn send_header<W: AsyncWrite + Unpin>(w: &mut W, header: &Header<'_>, label: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    encode_header_into(header, &mut out);
    write_all(w, &out)
        .await
        .map_err(|e| Error::io(format!("handshake with {label}"), e))?;
    Ok(out.split_off(4))
}

/// Sends an `error` header to the peer, best effort, before we close.
pub(crate) async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, err: &WireError) {
    let mut out = Vec::new();
    encode_header_into(
        &Header::Error {
            code: err.code().to_string(),
            message: err.to_string(),
        },
        &mut out,
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write_all(w, &out)).await;
}

async fn read_header<R: AsyncRead + Unpin>(
    r: &mut MessageReader<R>,
    limits: &Limits,
    label: &str,
    step: &str,
) -> Result<bytes::Bytes> {
    r.read_header(limits)
        .await?
        .ok_or_else(|| Error::PeerClosed(format!("{label} (during the handshake, waiting for {step})")))
}

/// The error for a header that is not the expected handshake step; unless the peer
/// itself reported an error, the peer is told why we close.
async fn refused<W: AsyncWrite + Unpin>(writer: &mut W, label: &str, header: Header<'_>, step: &str) -> Error {
    match header {
        Header::Error { code, message } => Error::Refused {
            peer: label.to_string(),
            code,
            message,
        },
        other => {
            let e = WireError::Handshake(format!("expected {step}, got a {:?} header", kind_of(&other)));
            send_error(writer, &e).await;
            e.into()
        }
    }
}

fn kind_of(h: &Header<'_>) -> &'static str {
    match h {
        Header::Hello(_) => "hello",
        Header::Auth { .. } => "auth",
        Header::Ready => "ready",
        Header::Release { .. } => "release",
        Header::Ticket(op) => op.kind(),
        Header::Msg { .. } => "msg",
        Header::Error { .. } => "error",
    }
}

/// What we say about ourselves in a handshake, and what we check the peer against.
pub(crate) struct OurSide<'a> {
    pub(crate) me: &'a Endpoint,
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    pub(crate) secret: &'a [u8],
    pub(crate) limits: &'a Limits,
}

/// Runs the handshake; on any failure the peer is told why (when possible) and an error returned.
pub(crate) async fn handshake<R, W>(
    reader: &mut MessageReader<R>,
    writer: &mut W,
    ours: OurSide<'_>,
    label: &str,
) -> Result<Handshaken>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let OurSide {
        me,
        listen,
        unix,
        secret,
        limits,
    } = ours;
    write_all(writer, &Preamble::OURS.encode())
        .await
        .map_err(|e| Error::io(format!("handshake with {label}"), e))?;
    let peer_preamble = Preamble::decode(&reader.read_preamble().await?);
    let version = match peer_preamble.and_then(|p| Preamble::OURS.negotiate(&p)) {
        Ok(v) => v,
        Err(e) => {
            send_error(writer, &e).await;
            return Err(e.into());
        }
    };

    let nonce: [u8; 32] = rand::random();
    let hello = Hello {
        node_id: me.node_id.clone(),
        name: me.name.clone(),
        host_id: me.host_id.clone(),
        pid: std::process::id(),
        process_id: me.process_id.clone(),
        language: me.language.clone(),
        implementation: concat!("handoff-rs/", env!("CARGO_PKG_VERSION")).to_string(),
        version,
        capabilities: me.capabilities.clone(),
        nonce: nonce.to_vec(),
        listen,
        unix,
    };
    let own_hello = send_header(writer, &Header::Hello(hello), label).await?;
    let peer_hello_bytes = read_header(reader, limits, label, "hello").await?;
    let peer_hello = match Header::decode(&peer_hello_bytes, limits) {
        Ok(Header::Hello(h)) => h,
        Ok(other) => return Err(refused(writer, label, other, "hello").await),
        Err(e) => {
            send_error(writer, &e).await;
            return Err(e.into());
        }
    };
    if peer_hello.nonce == nonce {
        let e = WireError::Handshake("the peer echoed our own nonce (a reflected handshake)".into());
        send_error(writer, &e).await;
        return Err(e.into());
    }
    if peer_hello.version != version {
        let e = WireError::Handshake(format!(
            "peer's hello says version {}, the preambles chose {version}",
            peer_hello.version
        ));
        send_error(writer, &e).await;
        return Err(e.into());
    }

    let proof = auth::proof(secret, &own_hello, &peer_hello_bytes);
    send_header(writer, &Header::Auth { mac: proof.to_vec() }, label).await?;
    let peer_auth = read_header(reader, limits, label, "auth").await?;
    match Header::decode(&peer_auth, limits) {
        Ok(Header::Auth { mac }) => {
            if let Err(e) = auth::verify(secret, &mac, &peer_hello_bytes, &own_hello) {
                send_error(writer, &e).await;
                return Err(e.into());
            }
        }
        Ok(other) => return Err(refused(writer, label, other, "auth").await),
        Err(e) => {
            send_error(writer, &e).await;
            return Err(e.into());
        }
    }

    send_header(writer, &Header::Ready, label).await?;
    let ready = read_header(reader, limits, label, "ready").await?;
    match Header::decode(&ready, limits) {
        Ok(Header::Ready) => Ok(Handshaken { hello: peer_hello }),
        Ok(other) => Err(refused(writer, label, other, "ready").await),
        Err(e) => {
            send_error(writer, &e).await;
            Err(e.into())
        }
    }
}

//! TLS between hosts (`spec/WIRE.md` §3.1): mutual TLS below the preamble on TCP.
//!
//! A node given a [`TlsConfig`] runs every TCP connection inside TLS 1.3 (or 1.2): the
//! connecting side checks the accepting side's certificate chain against the configured
//! certificate authorities and its name against the address it dialed; the accepting side
//! asks for the connecting side's certificate and checks its chain the same way. Unix-socket
//! connections (same host) do not use it.
//!
//! This module holds the configuration, the two handshakes and the translation of TLS
//! failures into errors that say what to fix. It knows nothing of nodes or peers.

use std::path::Path;
use std::sync::Arc;

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Header, Preamble};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::error::{Error, Result};
use crate::read_ahead::ReadAhead;

/// The first byte of a TLS handshake record (a ClientHello starts with it).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// The first byte of a handoff preamble (`H` of `HANDOFF\0`).
const PREAMBLE_FIRST_BYTE: u8 = b'H';

/// What the accepting side of a plain connection tells a peer when it requires TLS.
pub const TLS_REQUIRED_MESSAGE: &str =
    "this node requires TLS: connect with TLS on (a certificate, its key and the cluster's CA)";

/// Bytes a TLS connection reads from its socket at a time once its TLS handshake is done:
/// rustls takes them 4 KiB at a time from this buffer instead of from the socket (one
/// buffer of this size per TLS connection, fixed).
pub const TLS_READ_AHEAD: usize = 64 << 10;

/// The TCP socket under a TLS stream, read through a buffer of [`TLS_READ_AHEAD`] bytes.
pub(crate) type TlsSocket = ReadAhead<TcpStream>;
/// A TCP stream inside TLS, as the connecting side holds it.
pub(crate) type ClientStream = tokio_rustls::client::TlsStream<TlsSocket>;
/// A TCP stream inside TLS, as the accepting side holds it.
pub(crate) type ServerStream = tokio_rustls::server::TlsStream<TlsSocket>;

/// A node's TLS settings: its certificate chain and key, and the certificate authorities
/// its peers' certificates must chain to. Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Builds the configuration from PEM: the node's certificate chain (its own certificate
    /// first), its private key (PKCS#8, PKCS#1 or SEC1), and one or more CA certificates.
    pub fn from_pem(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<TlsConfig> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Config(format!("TLS certificate chain: not PEM certificates: {e}")))?;
        if chain.is_empty() {
            return Err(Error::Config("TLS certificate chain: no certificate in it".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| Error::Config(format!("TLS private key: not a PEM private key: {e}")))?;
        let mut roots = RootCertStore::empty();
        let mut cas = 0;
        for ca_cert in CertificateDer::pem_slice_iter(ca) {
            let ca_cert = ca_cert.map_err(|e| Error::Config(format!("TLS CA: not PEM certificates: {e}")))?;
            roots
                .add(ca_cert)
                .map_err(|e| Error::Config(format!("TLS CA: a certificate that cannot be a trust anchor: {e}")))?;
            cas += 1;
        }
        if cas == 0 {
            return Err(Error::Config("TLS CA: no certificate in it".into()));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| Error::Config(format!("TLS: the key does not fit the certificate: {e}")))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| Error::Config(format!("TLS CA: {e}")))?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| Error::Config(format!("TLS: the key does not fit the certificate: {e}")))?;
        Ok(TlsConfig {
            client: Arc::new(client),
            server: Arc::new(server),
            server_name: None,
        })
    }

    /// As [`TlsConfig::from_pem`], reading the three PEM files.
    pub fn from_pem_files(cert_chain: &Path, key: &Path, ca: &Path) -> Result<TlsConfig> {
        let read = |what: &str, p: &Path| {
            std::fs::read(p).map_err(|e| Error::io(format!("reading the TLS {what} {}", p.display()), e))
        };
        TlsConfig::from_pem(
            &read("certificate chain", cert_chain)?,
            &read("private key", key)?,
            &read("CA", ca)?,
        )
    }

    /// Checks every peer this node connects to against `name` instead of the host part of
    /// the address it dialed (for certificates that name the cluster, not each host).
    pub fn expect_server_name(mut self, name: impl Into<String>) -> TlsConfig {
        self.server_name = Some(name.into());
        self
    }

    /// The rustls configurations of the two sides (client, server), for tools that measure
    /// or embed handoff's TLS, such as `handoff bench`'s raw TLS baseline.
    pub fn rustls_configs(&self) -> (Arc<ClientConfig>, Arc<ServerConfig>) {
        (self.client.clone(), self.server.clone())
    }

    /// The TLS handshake of the connecting side, on a fresh TCP connection to `dialed_host`
    /// (the host part of the address: a name or an IP address).
    pub(crate) async fn connect(&self, tcp: TcpStream, dialed_host: &str) -> Result<ClientStream> {
        let expected = self.server_name.as_deref().unwrap_or(dialed_host);
        let name = ServerName::try_from(expected.trim_start_matches('[').trim_end_matches(']').to_string())
            .map_err(|_| Error::Config(format!("TLS: {expected:?} is not a DNS name or an IP address")))?;
        let mut stream = tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(name, ReadAhead::new(tcp))
            .await
            .map_err(|e| handshake_error(e, dialed_host, "connecting to"))?;
        stream.get_mut().0.read_ahead(TLS_READ_AHEAD);
        Ok(stream)
    }

    /// The accepting side: reads the first byte without taking it. A TLS handshake record
    /// starts the TLS handshake; a plain preamble is answered, in plain text, with our
    /// preamble and an `error` of code `tls-required`, and refused.
    pub(crate) async fn accept(&self, tcp: TcpStream, peer: &str) -> Result<ServerStream> {
        match first_byte(&tcp).await {
            Some(TLS_HANDSHAKE_RECORD) => {
                let mut stream = tokio_rustls::TlsAcceptor::from(self.server.clone())
                    .accept(ReadAhead::new(tcp))
                    .await
                    .map_err(|e| handshake_error(e, peer, "accepting"))?;
                // Only a peer whose certificate checked out gets the read-ahead buffer.
                stream.get_mut().0.read_ahead(TLS_READ_AHEAD);
                Ok(stream)
            }
            Some(PREAMBLE_FIRST_BYTE) => {
                refuse_plain(tcp).await;
                Err(Error::Refused {
                    peer: peer.to_string(),
                    code: "tls-required".into(),
                    message: "the peer connected without TLS; this node requires it".into(),
                })
            }
            Some(other) => Err(Error::Tls {
                peer: peer.to_string(),
                reason: format!("it sent neither a TLS handshake nor a handoff preamble (first byte {other:#04x})"),
            }),
            None => Err(Error::PeerClosed(peer.to_string())),
        }
    }
}

async fn first_byte(tcp: &TcpStream) -> Option<u8> {
    let mut byte = [0u8; 1];
    match tcp.peek(&mut byte).await {
        Ok(1) => Some(byte[0]),
        _ => None,
    }
}

/// How long, and how many bytes, a refused plain peer is read for after the refusal: its
/// preamble and first handshake message cross ours, and closing with them unread would
/// reset the connection before the peer reads why.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);
const DRAIN_BYTES: usize = 64 << 10;

/// Our preamble, then `error {code: "tls-required"}`, best effort; then reads what the
/// peer still sends (bounded) until it closes, so that it reads the error.
async fn refuse_plain(mut tcp: TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut out = Preamble::OURS.encode().to_vec();
    encode_header_into(
        &Header::Error {
            code: "tls-required".into(),
            message: TLS_REQUIRED_MESSAGE.into(),
        },
        &mut out,
    );
    let _ = tokio::time::timeout(DRAIN_LIMIT, tcp.write_all(&out)).await;
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    let _ = tokio::time::timeout(DRAIN_LIMIT, async {
        while drained < DRAIN_BYTES {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// The reason in an I/O error that TLS raised after its handshake (an alert the peer sent
/// when it checked our certificate, say), if it is one.
pub(crate) fn explain_io(e: &std::io::Error, peer: &str) -> Option<Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|tls| tls_error(tls, peer))
}

/// Turns a failed TLS handshake into an error that says what to fix.
fn handshake_error(e: std::io::Error, peer: &str, doing: &str) -> Error {
    match explain_io(&e, peer) {
        Some(explained) => explained,
        None => Error::io(format!("TLS handshake {doing} {peer}"), e),
    }
}

fn tls_error(tls: &rustls::Error, peer: &str) -> Error {
    let why = match tls {
        rustls::Error::InvalidCertificate(CertificateError::Expired)
        | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "the peer's certificate has expired".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidYet)
        | rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { .. }) => {
            "the peer's certificate is not valid yet".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the peer's certificate is not signed by a CA this node trusts (its TLS CA)".to_string()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName)
        | rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            format!("the peer's certificate does not name {peer} (or the name this node was told to expect)")
        }
        rustls::Error::InvalidMessage(_) => "the peer did not answer in TLS: it has no TLS configured".to_string(),
        rustls::Error::NoCertificatesPresented => {
            "the peer sent no certificate, and this node requires one (mutual TLS)".to_string()
        }
        rustls::Error::AlertReceived(alert) => format!(
            "the peer refused this node's certificate (TLS alert {alert:?}): it does not trust the CA that signed it, \
             or the certificate has expired"
        ),
        other => format!("{other}"),
    };
    Error::Tls {
        peer: peer.to_string(),
        reason: why,
    }
}

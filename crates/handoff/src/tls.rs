//! TLS between hosts (`spec/WIRE.md` §3.1): mutual TLS below the preamble on TCP.
//!
//! A node given a [`TlsConfig`] runs every TCP connection inside TLS 1.3 (or 1.2): the
//! connecting side checks the accepting side's certificate chain against the configured
//! certificate authorities and its name against the address it dialed; the accepting side
//! asks for the connecting side's certificate and checks its chain the same way. Unix-socket
//! connections (same host) do not use it.
//!
//! The configurations, the opening check, the words for TLS failures and the TLS session
//! itself are the engine's (`handoff_proto::tls`, `handoff_proto::tls_session`), shared
//! with the asyncio driver; this module runs the two handshakes on tokio sockets. It knows
//! nothing of nodes or peers.

use std::path::Path;
use std::sync::Arc;

pub use handoff_proto::tls::TLS_REQUIRED_MESSAGE;
use handoff_proto::tls::{plain_refusal, refusal, Configs, Opening};
use handoff_proto::tls_session::{Handshaking, TlsSession};
use rustls::{ClientConfig, ServerConfig};
use tokio::net::TcpStream;

use crate::error::{Error, Result};
use crate::socket::{Socket, TryIo};
use handoff_sys::stream::TlsFailed;

/// A TCP connection after its TLS handshake, with its session.
pub(crate) type TlsTcp = (TcpStream, TlsSession);

/// A node's TLS settings: its certificate chain and key, and the certificate authorities
/// its peers' certificates must chain to. Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    configs: Configs,
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
        Ok(TlsConfig {
            configs: Configs::from_pem(cert_chain, key, ca).map_err(Error::Config)?,
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
        (self.configs.client.clone(), self.configs.server.clone())
    }

    /// The TLS handshake of the connecting side, on a fresh TCP connection to `dialed_host`
    /// (the host part of the address: a name or an IP address).
    pub(crate) async fn connect(&self, tcp: TcpStream, dialed_host: &str) -> Result<TlsTcp> {
        let name = self.server_name.as_deref().unwrap_or(dialed_host);
        let session = TlsSession::client(&self.configs, name, dialed_host).map_err(Error::Config)?;
        handshake(tcp, session, dialed_host).await
    }

    /// The accepting side: reads the first byte without taking it. A TLS handshake record
    /// starts the TLS handshake; a plain preamble is answered, in plain text, with our
    /// preamble and an `error` of code `tls-required`, and refused.
    pub(crate) async fn accept(&self, tcp: TcpStream, peer: &str) -> Result<TlsTcp> {
        let mut byte = [0u8; 1];
        let first = match tcp.peek(&mut byte).await {
            Ok(1) => Opening::of(byte[0]),
            _ => return Err(Error::PeerClosed(peer.to_string())),
        };
        let peer_s = peer.to_string();
        match refusal(first) {
            None => {
                let session = TlsSession::server(&self.configs, peer).map_err(Error::Config)?;
                handshake(tcp, session, peer).await
            }
            Some(Ok((code, message))) => {
                refuse_plain(tcp).await;
                let (code, message) = (code.into(), message.into());
                Err(Error::Refused {
                    peer: peer_s,
                    code,
                    message,
                })
            }
            Some(Err(reason)) => Err(Error::Tls { peer: peer_s, reason }),
        }
    }
}

/// Runs a TLS handshake to its end, waiting for the socket as the session asks.
async fn handshake(tcp: TcpStream, mut session: TlsSession, peer: &str) -> Result<TlsTcp> {
    loop {
        let waited = match session.handshake(&mut TryIo(&tcp)) {
            Ok(Handshaking::Done) => return Ok((tcp, session)),
            Ok(Handshaking::WantsRead) => tcp.readable().await,
            Ok(Handshaking::WantsWrite) => tcp.writable().await,
            Err(reason) => {
                return Err(Error::Tls {
                    peer: peer.to_string(),
                    reason,
                })
            }
        };
        waited.map_err(|e| Error::io(format!("TLS handshake with {peer}"), e))?;
    }
}

/// Our preamble, then `error {code: "tls-required"}`, best effort; then reads what the
/// peer still sends (its preamble and first handshake message cross ours, spec §11.3) until
/// it closes, as after any `error`, so that it reads the error.
async fn refuse_plain(tcp: TcpStream) {
    use handoff_proto::handshake::{DRAIN_BYTES, DRAIN_TIME, ERROR_WRITE_LIMIT};
    let socket = Socket::tcp(tcp, None, ERROR_WRITE_LIMIT);
    socket.say_and_shutdown(plain_refusal(), ERROR_WRITE_LIMIT).await;
    socket.drain(DRAIN_BYTES, DRAIN_TIME).await;
}

/// The reason in an I/O error that the TLS session raised after its handshake (an alert the
/// peer sent when it checked our certificate, say), if it is one.
pub(crate) fn explain_io(e: &std::io::Error, peer: &str) -> Option<Error> {
    TlsFailed::of(e).map(|reason| Error::Tls {
        peer: peer.to_string(),
        reason: reason.to_string(),
    })
}

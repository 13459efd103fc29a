//! TLS between hosts (spec §3.1), with no I/O: the rustls configurations of the two sides,
//! how an accepting node tells a TLS handshake from a plain preamble, the refusal a plain
//! peer gets, and what a TLS failure means in words that say what to fix. rustls is sans-IO
//! itself, so every driver runs these configurations on its own sockets.

use std::sync::Arc;

use handoff_wire::framing::encode_header_into;
use handoff_wire::{Header, Preamble};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// What the accepting side of a plain connection tells a peer when it requires TLS.
pub const TLS_REQUIRED_MESSAGE: &str =
    "this node requires TLS: connect with TLS on (a certificate, its key and the cluster's CA)";

/// The rustls configurations of mutual TLS 1.3 (or 1.2): the connecting side checks the
/// accepting side's chain against the CAs and its name against the address it dialed; the
/// accepting side asks for the connecting side's certificate and checks its chain the same
/// way.
#[derive(Clone)]
pub struct Configs {
    /// The connecting side's.
    pub client: Arc<ClientConfig>,
    /// The accepting side's.
    pub server: Arc<ServerConfig>,
}

impl Configs {
    /// Both sides from PEM: the node's certificate chain (its own certificate first), its
    /// private key (PKCS#8, PKCS#1 or SEC1), and one or more CA certificates. The error says
    /// which of the three is wrong, and how.
    pub fn from_pem(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<Configs, String> {
        Configs::from_pem_with(cert_chain, key, ca, Policy::default())
    }

    /// [`Configs::from_pem`], with the `policy` given: the connecting side's check of the
    /// accepting side's certificate (its chain and its name, or its chain alone, as Dask's
    /// TLS does: its nodes are dialed by IP address, and their certificates need not name
    /// it), and whether TLS 1.2 is allowed besides 1.3.
    pub fn from_pem_with(cert_chain: &[u8], key: &[u8], ca: &[u8], policy: Policy) -> Result<Configs, String> {
        let check = policy.name_check;
        let versions: &[&'static rustls::SupportedProtocolVersion] = if policy.tls13_only {
            &[&rustls::version::TLS13]
        } else {
            rustls::DEFAULT_VERSIONS
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("TLS certificate chain: not PEM certificates: {e}"))?;
        if chain.is_empty() {
            return Err("TLS certificate chain: no certificate in it".into());
        }
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("TLS private key: not a PEM private key: {e}"))?;
        let mut roots = RootCertStore::empty();
        for ca_cert in CertificateDer::pem_slice_iter(ca) {
            let ca_cert = ca_cert.map_err(|e| format!("TLS CA: not PEM certificates: {e}"))?;
            roots
                .add(ca_cert)
                .map_err(|e| format!("TLS CA: a certificate that cannot be a trust anchor: {e}"))?;
        }
        if roots.is_empty() {
            return Err("TLS CA: no certificate in it".into());
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let misfit = |e: rustls::Error| format!("TLS: the key does not fit the certificate: {e}");
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| format!("TLS: {e}"))?;
        let client = match check {
            NameCheck::Name => client.with_root_certificates(roots.clone()),
            NameCheck::ChainOnly => client.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly {
                roots: roots.clone(),
                algorithms: provider.signature_verification_algorithms,
            })),
        }
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(misfit)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| format!("TLS CA: {e}"))?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| format!("TLS: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(misfit)?;
        Ok(Configs {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }
}

/// What a node's TLS allows and checks, beyond mutual TLS from one CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// What a connecting side checks of the accepting side's certificate.
    pub name_check: NameCheck,
    /// TLS 1.3 only (else 1.2 too).
    pub tls13_only: bool,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            name_check: NameCheck::Name,
            tls13_only: false,
        }
    }
}

/// What a connecting side checks of the accepting side's certificate, besides its dates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameCheck {
    /// Its chain up to a trusted CA, and that it names the dialed host (or the name it was
    /// told to expect).
    Name,
    /// Its chain up to a trusted CA only.
    ChainOnly,
}

/// A verifier that checks the certificate's chain up to a trusted CA (its signatures,
/// dates and server-auth usage: rustls's `verify_server_cert_signed_by_trust_anchor`) and
/// not its name; the handshake's signatures as rustls's WebPKI verifier checks them.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(&cert, &self.roots, intermediates, now, self.algorithms.all)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The name a connecting side checks the accepting side's certificate against: `expected`,
/// a DNS name or an IP address (an IPv6 one with or without its brackets).
pub fn server_name(expected: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(expected.trim_start_matches('[').trim_end_matches(']').to_string())
        .map_err(|_| format!("TLS: {expected:?} is not a DNS name or an IP address"))
}

/// What the first byte of an accepted TCP connection says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// A TLS handshake record (a ClientHello starts with it).
    Tls,
    /// A plain handoff preamble (`H` of `HANDOFF\0`).
    Plain,
    /// Neither.
    Other(u8),
}

impl Opening {
    /// Tells the two openings apart by the first byte.
    pub fn of(first: u8) -> Opening {
        match first {
            0x16 => Opening::Tls,
            b'H' => Opening::Plain,
            other => Opening::Other(other),
        }
    }
}

/// Why a node that requires TLS refuses a connection that opened with something else: a
/// plain preamble (`Ok((code, message))`, which the peer is told) or neither a TLS
/// handshake nor a preamble (`Err(reason)`: a TLS failure); `None` for a TLS handshake.
pub fn refusal(opening: Opening) -> Option<Result<(&'static str, &'static str), String>> {
    match opening {
        Opening::Tls => None,
        Opening::Plain => Some(Ok((
            "tls-required",
            "the peer connected without TLS; this node requires it",
        ))),
        Opening::Other(byte) => Some(Err(format!(
            "it sent neither a TLS handshake nor a handoff preamble (first byte {byte:#04x})"
        ))),
    }
}

/// What a node that requires TLS writes to a peer that opened in plain text: our preamble,
/// then `error {code: "tls-required"}` (readable by every version).
pub fn plain_refusal() -> Vec<u8> {
    let mut out = Preamble::OURS.encode().to_vec();
    let refusal = Header::Error {
        code: "tls-required".into(),
        message: TLS_REQUIRED_MESSAGE.into(),
    };
    encode_header_into(&refusal, &mut out);
    out
}

/// How a node learns to trust the cluster's CA, in the words an error gives.
const HOW_TO_TRUST: &str = "the cluster's CA (its TLS CA: --tls-ca, TlsConfig.from_files)";

/// Which end of the TLS session a node is, for [`explain`].
#[derive(Debug, Clone, Copy)]
pub enum Side<'a> {
    /// It dialed, and checked that the peer's certificate names `name`.
    Client {
        /// The name it checked (the dialed host, or the name it was told to expect).
        name: &'a str,
    },
    /// It accepted, and checked the connecting peer's certificate.
    Server,
}

/// What a TLS failure with `peer` means, in words that say what to fix: whose certificate
/// failed which check, or what the peer's alert says of ours, or that the peer does not
/// speak TLS. The Python peer words the same failures alike (`handoff.tls.explain`).
pub fn explain(tls: &rustls::Error, peer: &str, side: Side<'_>) -> String {
    use rustls::Error::{AlertReceived, InvalidCertificate, InvalidMessage, NoCertificatesPresented};
    let whose = match side {
        Side::Server => "the certificate the connecting peer presented".to_string(),
        Side::Client { .. } => format!("the certificate of {peer}"),
    };
    match tls {
        InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            format!("{whose} has expired; renew it (and check both hosts' clocks)")
        }
        InvalidCertificate(CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }) => {
            format!("{whose} is not valid yet; check both hosts' clocks, or wait for its start date")
        }
        InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "{whose} is not signed by a CA this node trusts; give the peer a certificate signed by the \
             cluster's CA, or give this node {HOW_TO_TRUST}"
        ),
        InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }) => {
            let name = match side {
                Side::Client { name } => name,
                Side::Server => "?",
            };
            format!(
                "{whose} does not name '{name}', the name this node checked; issue it with '{name}' among \
                 its subject alternative names (an IP or DNS entry), or give this node the name to expect \
                 (server_name)"
            )
        }
        InvalidMessage(_) => match side {
            Side::Server => "the connecting peer did not start a TLS handshake (it answered in plain text)".into(),
            Side::Client { .. } => "the peer does not speak TLS (it has no TLS configured: it answered in plain \
                                    text); turn TLS on there as well, or off here"
                .into(),
        },
        NoCertificatesPresented => "the connecting peer sent no certificate, and this node requires one; give it \
                                    a certificate signed by the cluster's CA, and its key"
            .into(),
        AlertReceived(alert) => format!("the peer refused this node's certificate: {}", alert_says(*alert)),
        other => format!("{other}"),
    }
}

/// What an alert the peer sent says about this node's certificate, and what to fix.
fn alert_says(alert: rustls::AlertDescription) -> String {
    use rustls::AlertDescription as A;
    match alert {
        A::UnknownCA => format!(
            "it does not trust the CA that signed our certificate; give it {HOW_TO_TRUST}, or us a \
             certificate signed by the cluster's CA"
        ),
        A::CertificateExpired => {
            "it says our certificate has expired (or is not valid yet by its clock); renew it".into()
        }
        A::CertificateRequired => {
            "it requires a certificate and we sent none; give this node its certificate and key".into()
        }
        A::BadCertificate | A::CertificateUnknown | A::UnsupportedCertificate | A::DecryptError => {
            "it refused our certificate; check that the certificate is signed by the cluster's CA and is valid \
             now (not expired)"
                .into()
        }
        A::ProtocolVersion | A::HandshakeFailure | A::InsufficientSecurity => {
            "it shares no TLS version or cipher with this node (TLS 1.2 at least on both)".into()
        }
        other => format!("it sent the alert {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opening_other_than_tls_is_refused_in_words() {
        assert_eq!(refusal(Opening::of(0x16)), None);
        assert_eq!(refusal(Opening::of(b'H')).unwrap().unwrap().0, "tls-required");
        assert!(refusal(Opening::of(0x47))
            .unwrap()
            .unwrap_err()
            .contains("first byte 0x47"));
    }

    #[test]
    fn the_first_byte_tells_tls_from_a_preamble() {
        assert_eq!(Opening::of(0x16), Opening::Tls);
        assert_eq!(Opening::of(Preamble::OURS.encode()[0]), Opening::Plain);
        assert_eq!(Opening::of(0x47), Opening::Other(0x47));
    }

    #[test]
    fn a_plain_peer_reads_our_preamble_then_tls_required() {
        let out = plain_refusal();
        let preamble = Preamble::OURS.encode();
        assert_eq!(&out[..preamble.len()], &preamble[..]);
        let limits = handoff_wire::Limits::DEFAULT;
        let rest = &out[preamble.len()..];
        let len = handoff_wire::framing::header_len(rest[..4].try_into().unwrap(), &limits).unwrap();
        let Header::Error { code, message } = Header::decode(&rest[4..4 + len], &limits).unwrap() else {
            panic!("an error header")
        };
        assert_eq!(
            (code.as_ref(), message.as_ref()),
            ("tls-required", TLS_REQUIRED_MESSAGE)
        );
    }

    #[test]
    fn bad_pem_says_which_part_is_wrong() {
        let err = |r: Result<Configs, String>| r.err().expect("refused");
        assert!(err(Configs::from_pem(b"", b"", b"")).starts_with("TLS certificate chain: no certificate"));
        assert!(server_name("[::1]").is_ok() && server_name("a b").is_err());
    }
}

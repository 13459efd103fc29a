//! A throwaway certificate authority and node certificate for the `tls-stream` case: made
//! fresh in each run (rcgen), valid for 127.0.0.1, never written to disk.

use anyhow::{Context, Result};
use handoff::TlsConfig;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

/// TLS settings that both bench nodes (and the raw baseline) share: one certificate for
/// 127.0.0.1 signed by a CA made for this run.
pub(super) fn throwaway_tls() -> Result<TlsConfig> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().context("CA key")?;
    let ca_pem = ca.self_signed(&ca_key).context("CA certificate")?.pem();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).context("node parameters")?;
    leaf.subject_alt_names = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
    let key = KeyPair::generate().context("node key")?;
    let cert = leaf
        .signed_by(&key, &Issuer::from_params(&ca, &ca_key))
        .context("node certificate")?;
    Ok(TlsConfig::from_pem(
        cert.pem().as_bytes(),
        key.serialize_pem().as_bytes(),
        ca_pem.as_bytes(),
    )?)
}

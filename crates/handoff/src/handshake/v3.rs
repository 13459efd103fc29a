//! The handshake of protocol version 3 (spec §5.7): challenges; then the dialer's proof, and
//! only once the acceptor verified it, the acceptor's; each over the whole transcript under
//! a label for its role; then the identities.
//!
//! What it fixes (§5.6): the proofs of versions 1 and 2 name neither the prover's role nor
//! the connection, so a peer without the secret can make nodes write each other's proofs.
//! Here a proof of one role never verifies as the other's; an acceptor writes nothing
//! computed with the secret for a peer that has not proven it; and a challenge that carries
//! a nonce this node sent as a dialer (one of its own handshakes relayed back to it) is
//! refused.

use handoff_wire::auth::{self, Role, Sent, Transcript};
use handoff_wire::{Header, Ident, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conversation::{check_capabilities, Conversation};
use super::nonces::DialerNonces;
use super::v2::Preambles;
use crate::io::FdSource;
use crate::Result;

const VERSION: u16 = 3;

/// Runs steps 2–6 of §5.7 in `role`; returns the peer's ident, its capabilities checked.
pub(super) async fn exchange<R, W>(
    talk: &mut Conversation<'_, '_, '_, R, W>,
    secret: &[u8],
    (role, dialed): (Role, &DialerNonces),
    (own_preamble, peer_preamble): Preambles<'_>,
    ident: Ident,
) -> Result<Ident>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    // Step 2; a dialer's nonce is remembered for the node's window.
    let nonce = dialed.fresh(role == Role::Dialer);
    let own_challenge = talk
        .send(&Header::Challenge {
            version: VERSION,
            nonce: nonce.to_vec(),
        })
        .await?;
    let peer_challenge = talk.read("challenge").await?;
    let Header::Challenge {
        version,
        nonce: peer_nonce,
    } = talk.expect(&peer_challenge, "challenge").await?
    else {
        unreachable!("expect checked the kind")
    };
    // Step 3, in the spec's order: our own nonce, one we sent as a dialer, the version.
    if peer_nonce == nonce {
        let e = WireError::Handshake("the peer echoed our own nonce (a reflected handshake)".into());
        return talk.refuse(e).await;
    }
    if dialed.sent_as_dialer(&peer_nonce) {
        let e = WireError::Handshake(
            "the peer's challenge carries a nonce this node sent when it dialed a peer \
             (one of our own handshakes relayed back to us)"
                .into(),
        );
        return talk.refuse(e).await;
    }
    if version != VERSION {
        let e = WireError::Handshake(format!(
            "peer's challenge says version {version}, the preambles chose {VERSION}"
        ));
        return talk.refuse(e).await;
    }

    let own = Sent {
        preamble: own_preamble,
        challenge: &own_challenge,
    };
    let peer = Sent {
        preamble: peer_preamble,
        challenge: &peer_challenge,
    };
    let transcript = Transcript::of(role, own, peer);
    // Step 4: the dialer proves first; the acceptor proves only to a peer that did.
    match role {
        Role::Dialer => {
            let proof = auth::dialer_proof(secret, &transcript);
            talk.send(&Header::Auth { mac: proof.to_vec() }).await?;
            let mac = read_auth(talk).await?;
            if let Err(e) = auth::verify_acceptor(secret, &mac, &transcript, &proof) {
                return talk.refuse(e).await;
            }
        }
        Role::Acceptor => {
            let mac = read_auth(talk).await?;
            if let Err(e) = auth::verify_dialer(secret, &mac, &transcript) {
                return talk.refuse(e).await;
            }
            let proof = auth::acceptor_proof(secret, &transcript, &mac);
            talk.send(&Header::Auth { mac: proof.to_vec() }).await?;
        }
    }

    // Steps 5 and 6: the peer proved the secret; now, and only now, say who we are.
    talk.send(&Header::Ident(ident)).await?;
    let peer_ident = talk.read("ident").await?;
    let Header::Ident(peer_ident) = talk.expect(&peer_ident, "ident").await? else {
        unreachable!("expect checked the kind")
    };
    if let Err(e) = check_capabilities(&peer_ident.capabilities) {
        return talk.refuse(e).await;
    }
    Ok(peer_ident)
}

/// Reads the peer's `auth` and returns its mac.
async fn read_auth<R, W>(talk: &mut Conversation<'_, '_, '_, R, W>) -> Result<Vec<u8>>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    let bytes = talk.read("auth").await?;
    let Header::Auth { mac } = talk.expect(&bytes, "auth").await? else {
        unreachable!("expect checked the kind")
    };
    Ok(mac)
}

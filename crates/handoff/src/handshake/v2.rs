//! The handshake of protocol version 2 (spec §5.4 steps 2–7): challenges, proofs over both
//! preambles and both challenges (§5.5), and only then the identities.
//!
//! Before it has verified the peer's proof a side sends nothing about itself: a challenge
//! (the version and a nonce), its proof, and perhaps an `error` that names neither it nor
//! its addresses. A peer that cannot prove the secret learns a nonce.

use handoff_wire::auth::{self, Sent};
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::{Header, Ident, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conversation::{check_capabilities, Conversation};
use crate::io::FdSource;
use crate::Result;

/// The two preambles as they travelled: ours as sent, the peer's as received.
pub(super) type Preambles<'p> = (&'p [u8; PREAMBLE_LEN], &'p [u8; PREAMBLE_LEN]);

/// Sends our challenge, reads and checks the peer's, exchanges and verifies the proofs, and
/// then the idents; returns the peer's ident, its capabilities checked.
pub(super) async fn exchange<R, W>(
    talk: &mut Conversation<'_, '_, '_, R, W>,
    secret: &[u8],
    (own_preamble, peer_preamble): Preambles<'_>,
    ident: Ident,
) -> Result<Ident>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    const VERSION: u16 = 2;
    let nonce: [u8; 32] = rand::random();
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
    // Step 3, in the spec's order: a reflected nonce, then the version.
    if peer_nonce == nonce {
        let e = WireError::Handshake("the peer echoed our own nonce (a reflected handshake)".into());
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
    let proof = auth::proof_v2(secret, own, peer);
    talk.send(&Header::Auth { mac: proof.to_vec() }).await?;
    let peer_auth = talk.read("auth").await?;
    let Header::Auth { mac } = talk.expect(&peer_auth, "auth").await? else {
        unreachable!("expect checked the kind")
    };
    if let Err(e) = auth::verify_v2(secret, &mac, peer, own) {
        return talk.refuse(e).await;
    }

    // The peer proved the secret: now, and only now, say who we are.
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

//! The handshake of protocol version 1 (spec §5.1 steps 2–5): hellos, then proofs over them.
//!
//! A hello carries our identity and goes out before the peer proved anything (spec §5.4), so
//! a node runs this only with a peer that speaks nothing newer, and only if its user
//! accepts version-1 peers.

use handoff_wire::{auth, Header, Hello, Ident, WireError};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conversation::{check_capabilities, Conversation};
use crate::io::FdSource;
use crate::Result;

/// Sends our hello, reads and checks the peer's, and exchanges and verifies the proofs;
/// returns the identity of the peer's hello.
pub(super) async fn exchange<R, W>(
    talk: &mut Conversation<'_, '_, '_, R, W>,
    secret: &[u8],
    ident: Ident,
) -> Result<Ident>
where
    R: AsyncRead + FdSource + Unpin,
    W: AsyncWrite + Unpin,
{
    const VERSION: u16 = 1;
    let nonce: [u8; 32] = rand::random();
    let hello = Hello::from_ident(ident, VERSION, nonce.to_vec());
    let own_hello = talk.send(&Header::Hello(hello)).await?;
    let peer_hello_bytes = talk.read("hello").await?;
    let Header::Hello(peer_hello) = talk.expect(&peer_hello_bytes, "hello").await? else {
        unreachable!("expect checked the kind")
    };
    // Step 3, in the spec's order: a reflected nonce, the version, the capabilities.
    if peer_hello.nonce == nonce {
        let e = WireError::Handshake("the peer echoed our own nonce (a reflected handshake)".into());
        return talk.refuse(e).await;
    }
    if peer_hello.version != VERSION {
        let e = WireError::Handshake(format!(
            "peer's hello says version {}, the preambles chose {VERSION}",
            peer_hello.version
        ));
        return talk.refuse(e).await;
    }
    if let Err(e) = check_capabilities(&peer_hello.capabilities) {
        return talk.refuse(e).await;
    }

    let proof = auth::proof(secret, &own_hello, &peer_hello_bytes);
    talk.send(&Header::Auth { mac: proof.to_vec() }).await?;
    let peer_auth = talk.read("auth").await?;
    let Header::Auth { mac } = talk.expect(&peer_auth, "auth").await? else {
        unreachable!("expect checked the kind")
    };
    if let Err(e) = auth::verify(secret, &mac, &peer_hello_bytes, &own_hello) {
        return talk.refuse(e).await;
    }
    Ok(peer_hello.ident())
}

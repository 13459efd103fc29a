//! Talking to owners: finding (or connecting to) the owner of a ticket, asking it to pull,
//! forward or renew, and releasing holds in the background when handles are dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use handoff_wire::{Header, TicketClaim, TicketOp};
use tokio::sync::{mpsc, oneshot};

use crate::node::NodeInner;
use crate::tickets::holder::TicketHandle;
use crate::{Error, Peer, Result};

/// An owner's answer to a pull or forward.
pub(crate) enum Answer {
    /// Pulled bytes (and their BLAKE3, when asked for).
    Bytes(Bytes, Option<[u8; 32]>),
    /// A new holder's token.
    Token(Vec<u8>),
    /// An answer that does not fit the request (bytes of another length, bytes to a
    /// forward): read past and dropped; says what came.
    Mismatch(String),
}

/// A request waiting for its answer on one connection.
pub(crate) struct Pending {
    pub(crate) tx: oneshot::Sender<Result<Answer>>,
    /// Hash the pulled bytes as they arrive (a whole-buffer redemption checks the digest).
    pub(crate) hash: bool,
    /// For a pull, the bytes asked for: a `pulled` of any other length is not read into
    /// memory (spec §9.1).
    pub(crate) len: Option<u64>,
}

fn lost(claim: &TicketClaim, owner: &str, reason: impl Into<String>) -> Error {
    Error::OwnerLost {
        owner: owner.to_string(),
        lease: claim.lease,
        len: claim.len,
        reason: reason.into(),
    }
}

impl NodeInner {
    /// The connected peer with node id `id`.
    pub(crate) fn peer_by_id(&self, id: &str) -> Option<Peer> {
        self.peers
            .read()
            .expect("peers lock")
            .get(id)
            .filter(|p| !p.is_closed())
            .cloned()
    }

    /// A connection to the ticket's owner: the one we have, or a new one to its address.
    pub(crate) async fn owner_peer(self: &Arc<Self>, claim: &TicketClaim, owner: &str) -> Result<Peer> {
        if claim.owner == self.me.node_id {
            return Err(lost(claim, owner, "the ticket names this node as its owner"));
        }
        if let Some(p) = self.peer_by_id(&claim.owner) {
            return Ok(p);
        }
        let addr = claim.addr.as_deref().ok_or_else(|| {
            lost(
                claim,
                &claim.owner,
                "not connected to the owner, and the ticket has no address",
            )
        })?;
        self.may_dial(addr).map_err(|why| lost(claim, owner, why))?;
        let deadline = tokio::time::Instant::now() + self.pull_timeout;
        // Only so many dials at once (spec §9.1): a flood of tickets cannot make this node
        // open connections without bound.
        let _dialing = tokio::time::timeout_at(deadline, self.ticket_dials.acquire())
            .await
            .map_err(|_| {
                lost(
                    claim,
                    owner,
                    format!("no turn to connect within {:?}", self.pull_timeout),
                )
            })?
            .expect("the semaphore is never closed");
        if let Some(p) = self.peer_by_id(&claim.owner) {
            return Ok(p);
        }
        let peer = tokio::time::timeout_at(deadline, crate::connection::connect(self, addr, None))
            .await
            .map_err(|_| lost(claim, owner, format!("connecting took over {:?}", self.pull_timeout)))?
            .map_err(|e| lost(claim, owner, format!("cannot connect: {e}")))?;
        if peer.endpoint().node_id != claim.owner {
            crate::connection::close(&peer).await;
            return Err(lost(
                claim,
                owner,
                format!(
                    "the node at {addr} is {}, not the ticket's owner",
                    peer.endpoint().node_id
                ),
            ));
        }
        Ok(peer)
    }

    /// Whether a ticket's `addr` may be dialled (spec §9.1): a `tcp://` address other than
    /// our own listen address.
    fn may_dial(&self, addr: &str) -> std::result::Result<(), String> {
        let Some(target) = addr.strip_prefix("tcp://") else {
            return Err(format!("the ticket's address {addr:?} is not a tcp:// address"));
        };
        let ours = self.listen_addr.as_deref().and_then(|l| l.strip_prefix("tcp://"));
        let same = |a: &str, b: &str| {
            a == b
                || matches!((a.parse::<std::net::SocketAddr>(), b.parse::<std::net::SocketAddr>()),
                    (Ok(x), Ok(y)) if x == y)
        };
        if ours.is_some_and(|o| same(o, target)) {
            return Err(format!("the ticket's address {addr} is this node's own"));
        }
        Ok(())
    }

    /// Sends a ticket request and waits (at most the pull timeout) for the owner's answer.
    pub(crate) async fn ticket_request(
        self: &Arc<Self>,
        handle: &TicketHandle,
        what: &'static str,
        hash: bool,
        len: Option<u64>,
        op: impl FnOnce(u64) -> TicketOp,
    ) -> Result<Answer> {
        let claim = &handle.claim;
        let peer = self.owner_peer(claim, &handle.owner_label).await?;
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        peer.0
            .pending
            .lock()
            .expect("pending lock")
            .insert(req, Pending { tx, hash, len });
        if let Err(e) = peer.write_control(&Header::Ticket(op(req)), &[]).await {
            peer.0.pending.lock().expect("pending lock").remove(&req);
            return Err(lost(claim, &handle.owner_label, format!("sending the {what}: {e}")));
        }
        match tokio::time::timeout(self.pull_timeout, rx).await {
            Ok(Ok(answer)) => answer.map_err(|e| match e {
                Error::TicketRefused { code, message, .. } => Error::TicketRefused {
                    owner: handle.owner_label.clone(),
                    lease: claim.lease,
                    what,
                    code,
                    message,
                },
                other => other,
            }),
            Ok(Err(_)) => Err(lost(
                claim,
                &handle.owner_label,
                "the connection closed before it answered",
            )),
            Err(_) => {
                peer.0.pending.lock().expect("pending lock").remove(&req);
                Err(lost(
                    claim,
                    peer.name(),
                    format!("no answer to the {what} within {:?}", self.pull_timeout),
                ))
            }
        }
    }

    /// Pulls `len` bytes from `offset` of a ticket's buffer; with `hash`, also returns
    /// their BLAKE3, computed while they arrive.
    pub(crate) async fn pull(
        self: &Arc<Self>,
        handle: &TicketHandle,
        offset: u64,
        len: u64,
        hash: bool,
    ) -> Result<(Bytes, Option<[u8; 32]>)> {
        let claim = &handle.claim;
        let answer = self
            .ticket_request(handle, "pull", hash, Some(len), |req| TicketOp::Pull {
                req,
                lease: claim.lease,
                token: claim.token.clone(),
                offset,
                len,
            })
            .await?;
        match answer {
            Answer::Bytes(b, digest) if b.len() as u64 == len => Ok((b, digest)),
            Answer::Bytes(b, _) => Err(lost(
                claim,
                &claim.owner,
                format!("asked for {len} bytes, got {}", b.len()),
            )),
            Answer::Token(_) => Err(lost(claim, &claim.owner, "answered a pull with a token")),
            Answer::Mismatch(why) => Err(lost(claim, &handle.owner_label, why)),
        }
    }

    /// Registers node `to` with the owner as a holder of the claim's lease; returns `to`'s claim.
    pub(crate) async fn forward_claim(self: &Arc<Self>, handle: &TicketHandle, to: &str) -> Result<TicketClaim> {
        let claim = &handle.claim;
        let answer = self
            .ticket_request(handle, "forward", false, None, |req| TicketOp::Forward {
                req,
                lease: claim.lease,
                token: claim.token.clone(),
                to: to.to_string(),
            })
            .await?;
        match answer {
            Answer::Token(token) => Ok(TicketClaim { token, ..claim.clone() }),
            Answer::Bytes(..) => Err(lost(claim, &handle.owner_label, "answered a forward with bytes")),
            Answer::Mismatch(why) => Err(lost(claim, &handle.owner_label, why)),
        }
    }

    /// Queues the release of a hold whose last handle was dropped.
    pub(crate) fn ticket_released(&self, claim: &TicketClaim) {
        let _ = self.unlease_tx.send(claim.clone());
    }
}

/// Sends `unlease` for dropped handles, on a connection we have to the owner: it never
/// dials just to release (the hold's deadline ends it, spec §9.1), and a write that takes
/// long is given up, so one owner that reads nothing cannot hold up the releases to others.
pub(crate) async fn unlease_loop(node: std::sync::Weak<NodeInner>, mut rx: mpsc::UnboundedReceiver<TicketClaim>) {
    while let Some(claim) = rx.recv().await {
        let Some(node) = node.upgrade() else { return };
        if node.is_shut_down() {
            return;
        }
        let Some(peer) = node.peer_by_id(&claim.owner) else {
            tracing::debug!(node = %node.me.name, lease = claim.lease, "not connected to the owner of lease {}; its deadline will end the hold", claim.lease);
            continue;
        };
        let op = TicketOp::Unlease {
            lease: claim.lease,
            token: claim.token.clone(),
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), peer.write_control(&Header::Ticket(op), &[])).await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!(node = %node.me.name, lease = claim.lease, "could not release a ticket hold; its deadline will");
        }
    }
}

//! Talking to owners: finding (or connecting to) the owner of a ticket, and asking it to
//! pull, forward or renew; the node's side of [`LocalNode`].

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use handoff_wire::{Header, TicketClaim};
use tokio::sync::oneshot;

use crate::connection;
use crate::context::{Context, LocalNode, NodeFuture};
use crate::state::NodeInner;
use crate::tickets::pending::Answer;
use crate::{Error, Peer, Result};
use handoff_proto::dialing;
use handoff_proto::ticket_requests::{renew_op, Ask};

/// A place among the kept owner connections, reserved by `make_room` for a dial: given up
/// on drop unless the dial reached its owner ([`Reserved::dialed`]).
struct Reserved<'a>(Option<&'a Context>);

impl Reserved<'_> {
    fn dialed(&mut self, owner: String) {
        if let Some(ctx) = self.0.take() {
            ctx.dials().dialed(owner, Instant::now());
        }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            ctx.dials().gave_up();
        }
    }
}

/// A ticket request waiting on `peer` for the owner's answer: forgotten when dropped (an
/// answer took it out already).
struct Asked<'a> {
    peer: &'a Peer,
    req: u64,
}

impl Drop for Asked<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .peer
            .0
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.complete(self.req);
    }
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
    /// A connection to the ticket's owner: the one we have, or a new one to its address.
    pub(crate) async fn owner_peer(self: &Arc<Self>, claim: &TicketClaim, owner: &str) -> Result<Peer> {
        handoff_proto::peers::check_owner(&claim.owner, &self.ctx.me.node_id).map_err(|why| lost(claim, owner, why))?;
        if let Some(p) = self.connected_owner(&claim.owner) {
            return Ok(p);
        }
        let addr =
            dialing::dial_target(claim, self.ctx.listen_addr.as_deref()).map_err(|why| lost(claim, owner, why))?;
        let deadline = tokio::time::Instant::now() + self.ctx.settings.pull_timeout;
        // Only so many dials at once (spec §9.1): a flood of tickets cannot make this node
        // open connections without bound.
        let _dialing = tokio::time::timeout_at(deadline, self.ctx.ticket_dials.acquire())
            .await
            .map_err(|_| {
                lost(
                    claim,
                    owner,
                    format!("no turn to connect within {:?}", self.ctx.settings.pull_timeout),
                )
            })?
            .expect("the semaphore is never closed");
        if let Some(p) = self.connected_owner(&claim.owner) {
            return Ok(p);
        }
        // Only so many kept (spec §9.1): the one unused longest, with no request of ours
        // outstanding and none of its tickets held, makes room.
        let alive = |id: &String| self.peer_by_id(id).is_some();
        let busy = |id: &String| self.peer_by_id(id).is_some_and(|p| p.has_requests());
        let make_room = self.ctx.dials().make_room(Instant::now(), alive, busy);
        let idle = make_room.map_err(|why| lost(claim, owner, why))?;
        // From here on the place is reserved: given up unless the dial reaches the owner,
        // however this ends (an error, or the caller dropping this future).
        let mut place = Reserved(Some(&self.ctx));
        if let Some(idle) = idle {
            if let Some(p) = self.peer_by_id(&idle) {
                tracing::debug!(node = %self.ctx.me.name, peer = %p.name(), "closing an idle connection to a ticket owner to dial another");
                // What we queued is written first, and the owner has a moment to close
                // its side; then the connection goes, whatever it still holds.
                tokio::spawn(async move {
                    connection::close(&p).await;
                    tokio::time::sleep(dialing::CLOSED_FOR_ROOM_DRAIN).await;
                    p.abort();
                });
            }
        }
        let peer = tokio::time::timeout_at(deadline, connection::connect(self, addr, None))
            .await
            .map_err(|_| {
                lost(
                    claim,
                    owner,
                    format!("connecting took over {:?}", self.ctx.settings.pull_timeout),
                )
            })?
            .map_err(|e| lost(claim, owner, format!("cannot connect: {}", e.chain())))?;
        if let Err(why) = dialing::check_reached_owner(addr, &peer.endpoint().node_id, &claim.owner) {
            connection::close(&peer).await;
            return Err(lost(claim, owner, why));
        }
        place.dialed(claim.owner.clone());
        Ok(peer)
    }

    /// The established connection to `owner`, if there is one; a request is about to go
    /// out on it (it is used, if it is one we dialed to reach an owner).
    fn connected_owner(&self, owner: &str) -> Option<Peer> {
        let peer = self.peer_by_id(owner)?;
        self.ctx.dials().used(&owner.to_string(), Instant::now());
        Some(peer)
    }

    /// Sends a ticket request and waits (at most the pull timeout) for the owner's answer.
    pub(crate) async fn ticket_request(
        self: &Arc<Self>,
        claim: &TicketClaim,
        owner: &str,
        ask: Ask<'_>,
    ) -> Result<Answer> {
        let (what, pull_timeout) = (ask.what(), self.ctx.settings.pull_timeout);
        let peer = self.owner_peer(claim, owner).await?;
        let req = self.ctx.next_request();
        let (tx, rx) = oneshot::channel();
        peer.0
            .pending
            .lock()
            .expect("pending lock")
            .insert(req, ask.asked(), tx);
        // Forgotten unless answered, however this ends (an error, the pull timeout, or the
        // caller dropping this future): the connection then waits for no answer of ours.
        let _asked = Asked { peer: &peer, req };
        if let Err(e) = peer.0.write_control(&Header::Ticket(ask.op(req, claim))).await {
            return Err(lost(claim, owner, format!("sending the {what}: {}", e.chain())));
        }
        match tokio::time::timeout(pull_timeout, rx).await {
            Ok(Ok(answer)) => answer.map_err(|r| Error::TicketRefused {
                owner: owner.to_string(),
                lease: claim.lease,
                what,
                code: r.code,
                message: r.message,
            }),
            Ok(Err(_)) => Err(lost(claim, owner, "the connection closed before it answered")),
            Err(_) => {
                let why = format!("no answer to the {what} within {pull_timeout:?}");
                Err(lost(claim, peer.name(), why))
            }
        }
    }
}

impl LocalNode for NodeInner {
    fn context(&self) -> &Context {
        &self.ctx
    }

    fn pull<'a>(
        self: Arc<Self>,
        claim: &'a TicketClaim,
        owner: &'a str,
        offset: u64,
        len: u64,
        hash: bool,
    ) -> NodeFuture<'a, (Bytes, Option<[u8; 32]>)> {
        Box::pin(async move {
            let answer = self
                .ticket_request(claim, owner, Ask::Pull { offset, len, hash })
                .await?;
            answer.into_pulled(len).map_err(|why| lost(claim, owner, why))
        })
    }

    fn forward<'a>(
        self: Arc<Self>,
        claim: &'a TicketClaim,
        owner: &'a str,
        to: &'a str,
    ) -> NodeFuture<'a, TicketClaim> {
        Box::pin(async move {
            let answer = self.ticket_request(claim, owner, Ask::Forward { to }).await?;
            let token = answer.into_token().map_err(|why| lost(claim, owner, why))?;
            Ok(TicketClaim { token, ..claim.clone() })
        })
    }

    fn renew<'a>(self: Arc<Self>, claim: &'a TicketClaim, owner: &'a str) -> NodeFuture<'a, ()> {
        Box::pin(async move {
            let peer = self.owner_peer(claim, owner).await?;
            peer.0.write_control(&Header::Ticket(renew_op(claim))).await
        })
    }
}

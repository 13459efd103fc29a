//! The node's background work on tickets: releasing the holds whose last handle was
//! dropped, and ending the holds on our leases whose deadline passed.

use std::sync::Weak;
use std::time::Duration;

use handoff_wire::{Header, TicketClaim};
use tokio::sync::mpsc;

use crate::state::NodeInner;

/// Ends holds whose deadline passed, as they pass, while the node lives.
pub(crate) async fn reap_expired(node: Weak<NodeInner>) {
    loop {
        let wait = {
            let Some(node) = node.upgrade() else { return };
            if node.ctx.is_shut_down() {
                return;
            }
            let n = node.ctx.leases.expire();
            if n > 0 {
                tracing::info!(node = %node.ctx.me.name, "{n} ticket holds ended by their deadline");
            }
            node.ctx.leases.reap_after(std::time::Instant::now())
        };
        tokio::time::sleep(wait).await;
    }
}

/// Sends `unlease` for dropped handles, on a connection we have to the owner: it never
/// dials just to release (the hold's deadline ends it, spec §9.1), and a write that takes
/// long is given up, so one owner that reads nothing cannot hold up the releases to others.
pub(crate) async fn unlease_loop(node: Weak<NodeInner>, mut rx: mpsc::UnboundedReceiver<TicketClaim>) {
    while let Some(claim) = rx.recv().await {
        let Some(node) = node.upgrade() else { return };
        if node.ctx.is_shut_down() {
            return;
        }
        let Some(peer) = node.peer_by_id(&claim.owner) else {
            tracing::debug!(node = %node.ctx.me.name, lease = claim.lease, "not connected to the owner of lease {}; its deadline will end the hold", claim.lease);
            continue;
        };
        let op = handoff_proto::ticket_requests::unlease_op(&claim);
        let sent = tokio::time::timeout(Duration::from_secs(1), peer.write_control(&Header::Ticket(op), &[])).await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!(node = %node.ctx.me.name, lease = claim.lease, "could not release a ticket hold; its deadline will");
        }
    }
}

//! The node's background work on tickets: releasing the holds whose last handle was
//! dropped, and ending the holds on our leases whose deadline passed.

use std::sync::{Arc, Weak};

use handoff_wire::Header;
use tokio::sync::Notify;

use crate::state::NodeInner;

/// Ends holds whose deadline passed, as they pass, while the node lives.
pub(crate) async fn reap_expired(node: Weak<NodeInner>) {
    crate::state::while_alive(node, |node| {
        let n = node.ctx.leases.expire();
        if n > 0 {
            tracing::info!(node = %node.ctx.me.name, "{n} ticket holds ended by their deadline");
        }
        node.ctx.leases.reap_after(std::time::Instant::now())
    })
    .await
}

/// Sends `unlease` for the holds that ended here (`handoff_proto::ended_holds`), on a
/// connection we have to the owner: it never dials just to release (the hold's deadline
/// ends it, spec §9.1), and it never waits for the write, so that an owner that reads
/// nothing delays only its own (past a MiB of them unwritten, its further ones are dropped,
/// and its connection fails past the write timeout).
pub(crate) async fn unlease_loop(node: Weak<NodeInner>, owed: Arc<Notify>) {
    let mut shutdown = match node.upgrade() {
        Some(node) if !node.ctx.is_shut_down() => node.ctx.shutdown.subscribe(),
        _ => return,
    };
    loop {
        tokio::select! {
            _ = owed.notified() => {}
            _ = shutdown.changed() => return,
        }
        let Some(node) = node.upgrade() else { return };
        if node.ctx.is_shut_down() {
            return;
        }
        for claim in node.ctx.ended_holds.take() {
            let Some(peer) = node.peer_by_id(&claim.owner) else {
                tracing::debug!(node = %node.ctx.me.name, lease = claim.lease, "not connected to the owner of lease {}; its deadline will end the hold", claim.lease);
                continue;
            };
            let op = handoff_proto::ticket_requests::unlease_op(&claim);
            if !peer.0.queue_unlease(&Header::Ticket(op)).await {
                tracing::debug!(node = %node.ctx.me.name, lease = claim.lease, "too many unleases unwritten to the owner of lease {}; its deadline will end the hold", claim.lease);
            }
        }
    }
}

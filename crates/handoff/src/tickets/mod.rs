//! Tickets: a large buffer sent as a small claim that the receiver — or a third node it
//! forwards the claim to — redeems by pulling the bytes straight from the owner, who keeps
//! them under a lease until every holder has released it.

pub(crate) mod client;
pub(crate) mod holder;
pub(crate) mod owner;

pub use holder::Ticket;
pub use owner::{LeaseConfig, LeaseTableStats, WhenFull};

/// Ends holds whose deadline passed, as they pass, while the node lives.
pub(crate) async fn reap_expired(node: std::sync::Weak<crate::node::NodeInner>) {
    loop {
        let wait = {
            let Some(node) = node.upgrade() else { return };
            if node.is_shut_down() {
                return;
            }
            let n = node.leases.expire();
            if n > 0 {
                tracing::info!(node = %node.me.name, "{n} ticket holds ended by their deadline");
            }
            node.leases
                .next_deadline()
                .map(|d| d.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or(std::time::Duration::from_millis(250))
                .clamp(
                    std::time::Duration::from_millis(5),
                    std::time::Duration::from_millis(250),
                )
        };
        tokio::time::sleep(wait).await;
    }
}

/// When a node's received tickets are redeemed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeem {
    /// Before the message is delivered: its `Buffer`s hold the bytes (the default).
    Eager,
    /// On first use: the message's ticketed `Buffer`s are empty placeholders; get the
    /// bytes with [`Ticket::of`] and [`Ticket::redeem`] or [`Ticket::read`].
    Lazy,
}

//! Tickets: a large buffer sent as a small claim that the receiver — or a third node it
//! forwards the claim to — redeems by pulling the bytes straight from the owner, who keeps
//! them under a lease until every holder has released it.

pub(crate) mod client;
pub(crate) mod holder;
pub(crate) mod owner;

use handoff_wire::Buffer;

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

/// Marks `buffer` to travel only as an on-demand ticket: to a peer that takes tickets it is
/// sent as a claim flagged `lazy`, which the receiver pulls only when the bytes are used, even
/// on a node that redeems eagerly. For a fallback the receiver may never need — the bytes of
/// a data handle the receiver normally fetches from storage itself. A peer without tickets
/// gets the bytes.
///
/// `digest`, if given, must be the BLAKE3 hash of the bytes (a content-addressed cache knows
/// it): the owner then does not hash the buffer each time it issues a ticket for it. A wrong
/// digest makes every redemption fail its check.
pub fn on_demand(buffer: Buffer, digest: Option<[u8; 32]>) -> Buffer {
    let bytes = buffer.into_bytes();
    Buffer::with_origin(bytes, std::sync::Arc::new(OnDemand { digest }))
}

/// The origin of a buffer marked by [`on_demand`].
pub(crate) struct OnDemand {
    /// The bytes' BLAKE3 hash, if the caller knew it.
    pub(crate) digest: Option<[u8; 32]>,
}

impl OnDemand {
    /// The mark on `buffer`, if [`on_demand`] made it.
    pub(crate) fn of(buffer: &Buffer) -> Option<&OnDemand> {
        buffer.origin().and_then(|o| o.downcast_ref::<OnDemand>())
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

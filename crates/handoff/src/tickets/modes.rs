//! How tickets are asked for and taken: a buffer marked to travel as an on-demand ticket,
//! and when a node redeems the tickets it receives.

use handoff_wire::Buffer;

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

/// When a node's received tickets are redeemed (the engine's setting): before delivery (the
/// default, its `Buffer`s then hold the bytes), or on first use, with [`Ticket::of`](crate::Ticket::of)
/// and [`Ticket::redeem`](crate::Ticket::redeem) or [`Ticket::read`](crate::Ticket::read).
pub use handoff_proto::settings::Redeem;

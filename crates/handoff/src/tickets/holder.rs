//! The holder's side of tickets: handles that redeem from the owner, forward, renew, and
//! release their hold when the last one is dropped.

use std::ops::Range;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use handoff_wire::{Buffer, TicketClaim, TicketDigest};

use crate::context::LocalNode;
use crate::{Error, Result};

/// One hold on a lease at its owner; the hold is released when the last handle drops.
pub(crate) struct TicketHandle {
    pub(crate) claim: TicketClaim,
    /// The node that holds it, which asks the owner.
    pub(crate) node: Weak<dyn LocalNode>,
    /// How errors name the owner: its node name (if we knew it) and address.
    pub(crate) owner_label: String,
}

impl TicketHandle {
    /// A claim this node received: a hold at its owner until the last handle is dropped
    /// (counted, so that the connection to that owner is kept while it lasts, spec §9.1).
    pub(crate) fn held(
        claim: TicketClaim,
        ctx: &crate::context::Context,
        node: Weak<dyn LocalNode>,
        owner_label: String,
    ) -> TicketHandle {
        ctx.hold(&claim);
        TicketHandle {
            claim,
            node,
            owner_label,
        }
    }
}

impl Drop for TicketHandle {
    fn drop(&mut self) {
        if let Some(node) = self.node.upgrade() {
            node.context().ticket_released(&self.claim);
        }
    }
}

/// The origin of a placeholder `Buffer` that stands for a ticket not yet redeemed.
pub(crate) struct TicketOrigin(pub(crate) Arc<TicketHandle>);

/// A received ticket: a claim on bytes that another node owns.
///
/// Get one from a placeholder buffer with [`Ticket::of`] (on a node that redeems lazily).
#[derive(Clone)]
pub struct Ticket(pub(crate) Arc<TicketHandle>);

impl Ticket {
    /// The ticket behind a placeholder buffer, if it is one.
    pub fn of(buf: &Buffer) -> Option<Ticket> {
        buf.origin()
            .and_then(|o| o.downcast_ref::<TicketOrigin>())
            .map(|t| Ticket(t.0.clone()))
    }

    /// Length of the owner's buffer.
    pub fn len(&self) -> u64 {
        self.0.claim.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.0.claim.len == 0
    }

    /// Node id of the owner.
    pub fn owner(&self) -> &str {
        &self.0.claim.owner
    }

    /// The owner as errors name it: its node name if known, and its address.
    pub fn owner_label(&self) -> &str {
        &self.0.owner_label
    }

    /// The digest the holder checks a full redemption against (§7.5).
    pub fn digest(&self) -> TicketDigest {
        self.0.claim.digest
    }

    /// The owner's lease id.
    pub fn lease(&self) -> u64 {
        self.0.claim.lease
    }

    /// Whether the sender asked for this ticket to be pulled only on use (a fallback,
    /// see [`on_demand`](crate::tickets::on_demand)); such tickets are never redeemed on receipt.
    pub fn is_on_demand(&self) -> bool {
        self.0.claim.lazy
    }

    fn node(&self) -> Result<Arc<dyn LocalNode>> {
        self.0.node.upgrade().ok_or(Error::NodeClosed)
    }

    /// Pulls the whole buffer from the owner and checks it against the ticket's digest.
    pub async fn redeem(&self) -> Result<Buffer> {
        let node = self.node()?;
        let want = self.0.claim.digest;
        let hash_behind = handoff_proto::ticket_requests::hash_while_pulling(want);
        let (bytes, digest) = node
            .pull(&self.0.claim, &self.0.owner_label, 0, self.0.claim.len, hash_behind)
            .await?;
        if !handoff_proto::ticket_requests::redeemed_intact(want, &bytes, digest) {
            return Err(Error::Corrupt {
                owner: self.0.owner_label.clone(),
                lease: self.0.claim.lease,
            });
        }
        Ok(Buffer::from(bytes))
    }

    /// A placeholder buffer for this ticket: put it in a value sent to another node and the
    /// ticket is forwarded (the owner registers that node first), not redeemed.
    pub fn placeholder(&self) -> Buffer {
        Buffer::with_origin(Bytes::new(), Arc::new(TicketOrigin(self.0.clone())))
    }

    /// Pulls only `range` of the buffer.
    pub async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let node = self.node()?;
        let len = range.end.saturating_sub(range.start);
        node.pull(&self.0.claim, &self.0.owner_label, range.start, len, false)
            .await
            .map(|(b, _)| b)
    }

    /// Extends this node's hold by the lease's ttl.
    pub async fn renew(&self) -> Result<()> {
        self.node()?.renew(&self.0.claim, &self.0.owner_label).await
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("owner", &self.0.claim.owner)
            .field("lease", &self.0.claim.lease)
            .field("len", &self.0.claim.len)
            .finish()
    }
}

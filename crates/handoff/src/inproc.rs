//! In-process peers: connecting two nodes of this process, and delivering a message straight
//! into the other node's inbox (no socket; a value may travel unencoded).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use handoff_wire::Channel;

use crate::budget::Permit;
use crate::directory;
use crate::envelope::Envelope;
use crate::link::{InprocTarget, Link};
use crate::payload::Payload;
use crate::peer::{PeerAddrs, PeerInner};
use crate::state::NodeInner;
use crate::{Error, Peer, Result};
use handoff_proto::bounds::MESSAGE_OVERHEAD;

/// Connects `node` to the node of this process named `name` (`inproc://NAME`): each gets a
/// peer for the other, whose sends go straight into the other's inbox.
pub(crate) fn connect(node: &Arc<NodeInner>, name: &str) -> Result<Peer> {
    let other = directory::lookup(name)
        .ok_or_else(|| Error::Config(format!("no node named {name:?} in this process (inproc://{name})")))?;
    if Arc::ptr_eq(&other, node) {
        return Err(Error::Config("a node cannot connect to itself".into()));
    }
    handoff_proto::peers::inproc_admit(name, &node.ctx.secret, &other.ctx.secret)?;
    let force = node.ctx.settings.force_encode_inproc || other.ctx.settings.force_encode_inproc;
    let to_other = InprocRoute::to(&other);
    let to_us = InprocRoute::to(node);
    let ours = Peer::new(
        node,
        other.ctx.me.clone(),
        PeerAddrs {
            listen: other.ctx.listen_addr.clone(),
            unix: other.ctx.unix_addr(),
            version: None,
        },
        Channel::Inproc,
        Link::Inproc(to_other.clone()),
        force,
    );
    let theirs = Peer::new(
        &other,
        node.ctx.me.clone(),
        PeerAddrs {
            listen: node.ctx.listen_addr.clone(),
            unix: node.ctx.unix_addr(),
            version: None,
        },
        Channel::Inproc,
        Link::Inproc(to_us.clone()),
        force,
    );
    let _ = to_other.reverse.set(Arc::downgrade(&theirs.0));
    let _ = to_us.reverse.set(Arc::downgrade(&ours.0));
    other.add_peer(theirs);
    node.add_peer(ours.clone());
    tracing::debug!(from = %node.ctx.me.name, to = %name, "connected in-process");
    Ok(ours)
}

/// A static name as one word, its address and its length, where both fit (on 64-bit
/// systems, whose user addresses fit in 48 bits); 0 where they do not.
fn name_key(name: &'static str) -> u64 {
    let (address, len) = (name.as_ptr() as u64, name.len() as u64);
    if address < 1 << 48 && len < 1 << 16 {
        address | len << 48
    } else {
        0
    }
}

/// One direction of an in-process connection: the receiving node, and its peer for the
/// sender (the `from` of what it receives).
pub(crate) struct InprocRoute {
    target: Weak<NodeInner>,
    /// The receiving node's name: how errors name the peer.
    name: String,
    /// The target's `Peer` for us, set once both sides exist (the sender of replies).
    reverse: OnceLock<Weak<PeerInner>>,
    /// The type name the target took last ([`name_key`]): a sender's names are static, and
    /// a node's registry does not change once built, so the same name is not looked up
    /// again.
    accepted: AtomicU64,
}

impl InprocRoute {
    fn to(target: &Arc<NodeInner>) -> Arc<InprocRoute> {
        Arc::new(InprocRoute {
            target: Arc::downgrade(target),
            name: target.ctx.me.name.clone(),
            reverse: OnceLock::new(),
            accepted: AtomicU64::new(0),
        })
    }

    /// The receiving node and its peer for us, while both live.
    fn ends(&self) -> Result<(Arc<NodeInner>, Arc<PeerInner>)> {
        let closed = || Error::PeerClosed(self.name.clone());
        let target = self.target.upgrade().ok_or_else(closed)?;
        let reverse = self.reverse.get().and_then(Weak::upgrade).ok_or_else(closed)?;
        Ok((target, reverse))
    }
}

impl InprocTarget for InprocRoute {
    fn check(&self, type_name: &'static str) -> Result<()> {
        let key = name_key(type_name);
        if key == 0 || self.accepted.load(Ordering::Relaxed) != key {
            let (target, _) = self.ends()?;
            target.ctx.registry.check(type_name)?;
            self.accepted.store(key, Ordering::Relaxed);
        }
        Ok(())
    }

    fn try_deliver(&self, type_name: &'static str, payload: Payload) -> Result<std::result::Result<(), Payload>> {
        let (target, reverse) = self.ends()?;
        let Some(permit) = target.ctx.budget.try_acquire(&reverse.account, MESSAGE_OVERHEAD, 1, 0) else {
            return Ok(Err(payload));
        };
        arrive(&target, reverse, type_name, payload, permit)?;
        Ok(Ok(()))
    }

    fn deliver(
        &self,
        type_name: &'static str,
        payload: Payload,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + Send + '_>> {
        Box::pin(async move {
            let (target, reverse) = self.ends()?;
            // In-process values count against the receiver's budget like any message
            // (their overhead only: the value is the sender's memory, moved).
            let permit = target.ctx.budget.acquire(&reverse.account, MESSAGE_OVERHEAD, 1).await;
            arrive(&target, reverse, type_name, payload, permit)
        })
    }
}

/// Puts a message, with its room, into the receiving node's inbox, from that node's peer for
/// the sender.
fn arrive(
    target: &NodeInner,
    reverse: Arc<PeerInner>,
    type_name: &'static str,
    payload: Payload,
    permit: Permit,
) -> Result<()> {
    target.deliver(Envelope {
        from: Peer(reverse),
        type_name: type_name.into(),
        payload,
        permit: Some(permit),
    })
}

#[cfg(test)]
mod tests {
    use super::name_key;

    #[test]
    fn a_name_and_its_prefix_are_told_apart() {
        let long: &'static str = "handoff.test.long-name";
        let prefix: &'static str = &long[..7];
        assert_eq!(long.as_ptr(), prefix.as_ptr(), "one address");
        assert_ne!(name_key(long), name_key(prefix));
        assert_ne!(name_key(long), 0);
    }
}

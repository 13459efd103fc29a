//! [`NodeInner`]: the state of a running node that its tasks share — its [`Context`], the
//! peers connected to it, and its inbox — with what connections and read loops do to it
//! (register and drop peers, deliver messages, shut down).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::inbox::Inbox;
use crate::link::Link;
use crate::{Error, Peer, Result};

/// A running node: what its façade (`Node`), connections, read loops and background tasks
/// share.
pub(crate) struct NodeInner {
    /// Settings and shared state, apart from peers and inbox.
    pub(crate) ctx: Context,
    /// Connected peers, by node id.
    pub(crate) peers: RwLock<HashMap<String, Peer>>,
    /// Notified when a peer is added or removed.
    pub(crate) peers_changed: Notify,
    /// Messages waiting for the application, taken one connection at a time; bounded by
    /// the receive budget (bytes and messages per peer, bytes in total), which every
    /// envelope in it holds a share of.
    pub(crate) inbox: Inbox,
}

impl NodeInner {
    /// Puts an envelope into the inbox (its permit in the receive budget bounds it).
    pub(crate) fn deliver(&self, envelope: Envelope) -> Result<()> {
        if self.ctx.is_shut_down() {
            return Err(Error::NodeClosed);
        }
        self.inbox.push(envelope);
        Ok(())
    }

    /// Counts an established connection until the guard is dropped.
    pub(crate) fn connection_guard(self: &Arc<Self>) -> ConnectionGuard {
        self.ctx.connections.fetch_add(1, Ordering::AcqRel);
        ConnectionGuard(self.clone())
    }

    /// Registers a connected peer; one with the same node id is replaced (and closed).
    pub(crate) fn add_peer(&self, peer: Peer) {
        let old = self
            .peers
            .write()
            .expect("peers lock")
            .insert(peer.0.remote.node_id.clone(), peer);
        if let Some(old) = old {
            old.0.mark_closed();
        }
        self.peers_changed.notify_waiters();
    }

    /// Drops `peer` from the peers, unless another connection replaced it already.
    pub(crate) fn remove_peer(&self, peer: &Peer) {
        let mut peers = self.peers.write().expect("peers lock");
        if let Some(current) = peers.get(&peer.0.remote.node_id) {
            if Arc::ptr_eq(&current.0, &peer.0) {
                peers.remove(&peer.0.remote.node_id);
            }
        }
        drop(peers);
        self.peers_changed.notify_waiters();
    }

    /// The connected peer with node id `id`.
    pub(crate) fn peer_by_id(&self, id: &str) -> Option<Peer> {
        self.peers
            .read()
            .expect("peers lock")
            .get(id)
            .filter(|p| !p.is_closed())
            .cloned()
    }

    /// Marks the node shut down, empties the inbox, closes every peer and removes the Unix
    /// socket's file.
    pub(crate) fn shutdown(&self) {
        self.ctx.shut_down.store(true, Ordering::Release);
        self.ctx.shutdown.send_replace(true);
        self.inbox.clear();
        let peers: Vec<Peer> = self
            .peers
            .write()
            .expect("peers lock")
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in peers {
            p.0.mark_closed();
            if let Link::Shm(link) = &p.0.link {
                link.release_all();
            }
        }
        if let Some(path) = &self.ctx.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One established connection, counted against [`Bounds::max_connections`](crate::Bounds).
pub(crate) struct ConnectionGuard(Arc<NodeInner>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.ctx.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `tick` on the node, then sleeps as long as it says, until the node is gone or shut
/// down (a node's periodic chores: expiring holds, sweeping idle memory).
pub(crate) async fn while_alive(
    node: std::sync::Weak<NodeInner>,
    mut tick: impl FnMut(&NodeInner) -> std::time::Duration,
) {
    loop {
        let wait = {
            let Some(node) = node.upgrade() else { return };
            if node.ctx.is_shut_down() {
                return;
            }
            tick(&node)
        };
        tokio::time::sleep(wait).await;
    }
}

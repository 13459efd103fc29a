//! What the parts of a running node share: the engine's [`NodeCore`] (identity, limits,
//! budget, buffers, mappings, lease table), with the tokio waits around it, and the type
//! registry, resources and counters ([`Context`]); and the node as its peers and the
//! tickets it holds reach it ([`LocalNode`]).
//!
//! Nothing here knows peers, connections or the inbox, so that connections, read loops,
//! peers and tickets can all build on it.

use std::future::Future;
use std::ops::Deref;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use handoff_proto::node::NodeCore;
use handoff_proto::settings::NodeSettings;
use handoff_wire::{Resources, TicketClaim};
use tokio::sync::{watch, Semaphore};

use crate::budget::RecvBudget;
use crate::message::TypeRegistry;
use crate::tickets::owner::LeaseTable;
use crate::tls::TlsConfig;
use crate::Result;
use handoff_proto::admission::Admission;
use handoff_proto::log_limit::LogLimiter;

/// The settings and shared state of a running node, apart from its peers and inbox; what
/// the asyncio driver shares too is its [`NodeCore`] (reached through `Deref`).
pub(crate) struct Context {
    pub(crate) core: NodeCore,
    pub(crate) registry: TypeRegistry,
    pub(crate) listen_addr: Option<String>,
    pub(crate) unix_path: Option<PathBuf>,
    /// Bytes and messages received and not yet taken by the application: the core's
    /// budget, and its waiting connections.
    pub(crate) budget: Arc<RecvBudget>,
    /// Handshakes in progress on accepted connections.
    pub(crate) handshakes: Arc<Admission<tokio::sync::oneshot::Sender<()>>>,
    /// Established connections (their read loops).
    pub(crate) connections: AtomicUsize,
    /// Connections being opened to reach owners of received tickets.
    pub(crate) ticket_dials: Arc<Semaphore>,
    /// Warnings about refused connections, at most so many per period.
    pub(crate) accept_log: LogLimiter,
    /// Every warning about peers passes this one too: at most so many per period in all,
    /// however many connections a peer opens.
    pub(crate) node_log: Arc<LogLimiter>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set with `shutdown`, first: read on every message, so it takes no lock.
    pub(crate) shut_down: std::sync::atomic::AtomicBool,
    /// Leases on buffers we sent as tickets: the core's table, and the sends waiting for
    /// room in it.
    pub(crate) leases: LeaseTable,
    /// Told when a hold ends here (its `unlease` waits in the core's `ended_holds`).
    pub(crate) unleases_owed: Arc<tokio::sync::Notify>,
    /// Local objects that values refer to by key (bound while decoding).
    pub(crate) resources: Arc<Resources>,
    /// TLS for TCP connections (spec §3.1), if the node has it: then required of every TCP peer.
    pub(crate) tls: Option<TlsConfig>,
    /// The node's settings as it was built (its secret taken out, into the core).
    pub(crate) settings: NodeSettings,
}

impl Deref for Context {
    type Target = NodeCore;

    fn deref(&self) -> &NodeCore {
        &self.core
    }
}

impl Context {
    /// Whether the node was shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// The address same-host peers connect to: `unix://PATH`, if the node has a Unix socket.
    pub(crate) fn unix_addr(&self) -> Option<String> {
        self.unix_path.as_ref().map(|p| format!("unix://{}", p.display()))
    }

    /// Established connections now.
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// The hold on `claim` ended here (its last handle was dropped): its owner is owed an
    /// `unlease`, which the unlease task sends.
    pub(crate) fn ticket_released(&self, claim: &TicketClaim) {
        if self.end_hold(claim) {
            self.unleases_owed.notify_one();
        }
    }
}

/// A future that a [`LocalNode`] returns, boxed so that the trait can be used as an object.
pub(crate) type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// A running node as its peers and the tickets it holds reach it: its [`Context`], and the
/// requests to the owner of a ticket, which may open a connection to that owner.
///
/// Peers and tickets hold their node weakly (they may outlive it) through this trait, so
/// that they need not know the node's peers and connections; the node implements it in
/// `tickets::client`. Each request names the ticket by its claim and the owner as errors
/// should name it.
pub(crate) trait LocalNode: Send + Sync {
    /// What the node's parts share.
    fn context(&self) -> &Context;

    /// Pulls `len` bytes from `offset` of the claim's buffer; with `hash`, also returns
    /// their BLAKE3, computed while they arrive.
    fn pull<'a>(
        self: Arc<Self>,
        claim: &'a TicketClaim,
        owner: &'a str,
        offset: u64,
        len: u64,
        hash: bool,
    ) -> NodeFuture<'a, (Bytes, Option<[u8; 32]>)>;

    /// Registers node `to` with the owner as a holder of the claim's lease; returns `to`'s claim.
    fn forward<'a>(self: Arc<Self>, claim: &'a TicketClaim, owner: &'a str, to: &'a str)
        -> NodeFuture<'a, TicketClaim>;

    /// Extends this node's hold on the claim's lease by the lease's ttl.
    fn renew<'a>(self: Arc<Self>, claim: &'a TicketClaim, owner: &'a str) -> NodeFuture<'a, ()>;
}

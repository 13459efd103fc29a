//! [`Node`]: a participant in a cluster. It listens, connects to peers, sends and receives.
//! [`NodeBuilder::build`] starts one from its settings: binds its listeners and starts its
//! accept loops and background tasks.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use handoff_wire::{Channel, Endpoint, Resources};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Notify, Semaphore};

use crate::accept::{self, Listening};
use crate::budget::RecvBudget;
use crate::builder::NodeBuilder;
use crate::connection;
use crate::context::Context;
use crate::directory;
use crate::envelope::Envelope;
use crate::inbox::Inbox;
use crate::link::LeaseStats;
use crate::message::TypeRegistry;
use crate::state::NodeInner;
use crate::tickets::owner::{LeaseTable, LeaseTableStats};
use crate::tickets::tasks::{reap_expired, unlease_loop};
use crate::{Error, Message, Peer, Result};
use handoff_proto::bounds::Bounds;
use handoff_proto::identity;
use handoff_proto::log_limit::LogLimiter;
use handoff_proto::node::NodeCore;

impl NodeBuilder {
    /// Starts the node: binds the listener (if any) and registers the node for in-process peers.
    pub async fn build(self) -> Result<Node> {
        let NodeBuilder {
            mut settings,
            registry,
            tls,
        } = self;
        settings.check().map_err(Error::Config)?;
        let secret = settings.secret.take().unwrap_or_else(|| {
            tracing::warn!(node = %settings.name, "no cluster secret set: using the empty secret; any peer without a secret can connect");
            Vec::new()
        });
        let listener = match &settings.listen {
            Some(addr) => {
                let addr = handoff_proto::dialing::strip_scheme(addr, "tcp://");
                Some(
                    TcpListener::bind(addr)
                        .await
                        .map_err(|e| Error::io(format!("listening on {addr}"), e))?,
                )
            }
            None => None,
        };
        let listen_addr = match &listener {
            Some(l) => Some(format!(
                "tcp://{}",
                l.local_addr().map_err(|e| Error::io("reading the listen address", e))?
            )),
            None => None,
        };
        let node_id = identity::random_id();
        let unix_listener = if settings.shm {
            let (listener, path) = handoff_sys::same_host::listen(&settings.name, &node_id)?;
            let listener = UnixListener::from_std(listener)
                .map_err(|e| Error::io(format!("listening on {}", path.display()), e))?;
            Some((listener, path))
        } else {
            None
        };
        // GPU memory by IPC handle (spec §7.10) where a CUDA driver works here.
        settings.device_memory = handoff_cuda::driver().is_ok();
        let me = settings.endpoint(node_id, "rust");
        let bounds = settings.bounds;
        let node_log = Arc::new(LogLimiter::new(
            bounds.warnings_in_all_per_period,
            bounds.warning_period,
        ));
        let (shutdown_tx, _) = watch::channel(false);
        let unleases_owed = Arc::new(Notify::new());
        settings.force_encode_inproc |= std::env::var("HANDOFF_FORCE_ENCODE").is_ok_and(|v| v == "1");
        let core = NodeCore::new(settings.core(me, secret));
        let ctx = Context {
            budget: Arc::new(RecvBudget::over(core.budget.clone())),
            leases: LeaseTable::over(core.leases.clone()),
            core,
            registry,
            listen_addr,
            unix_path: unix_listener.as_ref().map(|(_, p)| p.clone()),
            handshakes: handoff_proto::admission::Admission::new(bounds.max_handshakes),
            connections: AtomicUsize::new(0),
            ticket_dials: Arc::new(Semaphore::new(bounds.max_ticket_dials.max(1))),
            accept_log: LogLimiter::under(node_log.clone(), bounds.warnings_per_period, bounds.warning_period),
            node_log,
            shutdown: shutdown_tx,
            shut_down: std::sync::atomic::AtomicBool::new(false),
            unleases_owed: unleases_owed.clone(),
            resources: Arc::new(Resources::new(settings.name.clone())),
            tls,
            settings,
        };
        let inner = Arc::new(NodeInner {
            ctx,
            peers: RwLock::new(HashMap::new()),
            peers_changed: Notify::new(),
            inbox: Inbox::default(),
        });
        directory::register(&inner)?;
        if let Some(listener) = listener {
            tokio::spawn(accept::accept_loop(inner.clone(), Listening::Tcp(listener)));
        }
        if let Some((listener, _)) = unix_listener {
            tokio::spawn(accept::accept_loop(inner.clone(), Listening::Unix(listener)));
        }
        tokio::spawn(unlease_loop(Arc::downgrade(&inner), unleases_owed));
        tokio::spawn(reap_expired(Arc::downgrade(&inner)));
        tokio::spawn(sweep_idle_shm(Arc::downgrade(&inner)));
        tracing::info!(node = %inner.ctx.me.name, host = %inner.ctx.me.host_id, listen = ?inner.ctx.listen_addr, "node started");
        Ok(Node {
            inner: inner.clone(),
            _guard: Arc::new(ShutdownOnDrop(inner)),
        })
    }
}

/// Shuts the node down when the last clone of its `Node` is dropped.
struct ShutdownOnDrop(Arc<NodeInner>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        shut_down(&self.0);
    }
}

/// Shuts the node down and takes it out of this process's directory.
fn shut_down(inner: &NodeInner) {
    inner.shutdown();
    directory::unregister(&inner.ctx.me.name, inner);
}

/// A node: a named participant that listens, connects to peers, sends values and
/// receives envelopes. Cheap to clone; shuts down when the last clone is dropped
/// or [`shutdown`](Node::shutdown) is called.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
    _guard: Arc<ShutdownOnDrop>,
}

impl Node {
    /// Settings for a new node; `name` is required, the rest has defaults.
    pub fn builder(name: impl Into<String>) -> NodeBuilder {
        NodeBuilder::new(name)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.ctx.me.name
    }

    /// What this node tells peers about itself.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.ctx.me
    }

    /// The TCP address the node listens on (`tcp://ip:port`), if it listens.
    pub fn listen_addr(&self) -> Option<&str> {
        self.inner.ctx.listen_addr.as_deref()
    }

    /// The address same-host peers connect to: `unix://PATH`, if the node has a Unix socket.
    pub fn unix_addr(&self) -> Option<String> {
        self.inner.ctx.unix_addr()
    }

    /// Shared-memory leases this node holds for all its peers.
    pub fn leases(&self) -> LeaseStats {
        self.peers().iter().map(Peer::leases).sum()
    }

    /// The leases this node holds as the owner of tickets it sent.
    pub fn ticket_leases(&self) -> LeaseTableStats {
        self.inner.ctx.leases.stats()
    }

    /// Whether a lease this node issued is still alive (its buffer pinned).
    pub fn lease_alive(&self, lease: u64) -> bool {
        self.inner.ctx.leases.is_alive(lease)
    }

    /// Bytes of peers' segments mapped into this process.
    pub fn mapped_bytes(&self) -> usize {
        self.inner.ctx.mappings.mapped_bytes()
    }

    /// Bytes of received messages this node holds for all peers now: read, and not yet
    /// taken with [`recv`](Self::recv) (bounded by [`Bounds::max_buffered_bytes`]).
    pub fn buffered_bytes(&self) -> u64 {
        self.inner.ctx.budget.used()
    }

    /// Handshakes in progress on accepted connections now (bounded by
    /// [`Bounds::max_handshakes`]).
    pub fn handshakes_in_progress(&self) -> usize {
        self.inner.ctx.handshakes.count()
    }

    /// Established connections now (bounded by [`Bounds::max_connections`] for accepted ones).
    pub fn connection_count(&self) -> usize {
        self.inner.ctx.connections()
    }

    /// The bounds this node keeps on what peers can make it hold.
    pub fn bounds(&self) -> &Bounds {
        &self.inner.ctx.bounds
    }

    /// The address in-process peers connect to: `inproc://NAME`.
    pub fn inproc_addr(&self) -> String {
        format!("inproc://{}", self.inner.ctx.me.name)
    }

    /// This node's resources: local objects (a storage driver, a cache, a catalog) that
    /// values refer to by key. A [`Resource`](handoff_wire::Resource) or a data handle
    /// received by this node binds to the object registered here under its key, or opened
    /// by a resolver added here.
    pub fn resources(&self) -> &Arc<Resources> {
        &self.inner.ctx.resources
    }

    /// The types this node accepts.
    pub fn registry(&self) -> &TypeRegistry {
        &self.inner.ctx.registry
    }

    /// Connects to a peer at `addr`: `inproc://NAME` for a node in this process,
    /// `unix://PATH` for a same-host node's socket, `tcp://HOST:PORT` (or `HOST:PORT`) for
    /// any other. Over TCP, a peer that turns out to share our host identity and offers
    /// its Unix socket is reached through it (channel `shm`); if the socket cannot be
    /// reached the connection stays on `tcp` and a warning says why.
    pub async fn connect(&self, addr: &str) -> Result<Peer> {
        self.connect_with(addr, None).await
    }

    /// Like [`connect`](Self::connect), with the channel pinned: `Some(Channel::Tcp)` never
    /// switches to shared memory, `Some(Channel::Shm)` fails unless shared memory works.
    pub async fn connect_with(&self, addr: &str, channel: Option<Channel>) -> Result<Peer> {
        connection::connect(&self.inner, addr, channel).await
    }

    /// The connected peer named `name`, if any.
    pub fn peer(&self, name: &str) -> Option<Peer> {
        self.inner
            .peers
            .read()
            .expect("peers lock")
            .values()
            .find(|p| p.name() == name)
            .cloned()
    }

    /// Closes the connection to the peer named `name` (both sides then drop it, and its
    /// holds on our leases end). Returns whether such a peer was connected.
    pub async fn disconnect(&self, name: &str) -> bool {
        match self.peer(name) {
            Some(p) => {
                connection::close(&p).await;
                self.inner.remove_peer(&p);
                true
            }
            None => false,
        }
    }

    /// Every connected peer.
    pub fn peers(&self) -> Vec<Peer> {
        self.inner.peers.read().expect("peers lock").values().cloned().collect()
    }

    /// Waits until a peer named `name` is connected (for example one that connects to us).
    pub async fn wait_for_peer(&self, name: &str, timeout: Duration) -> Result<Peer> {
        let deadline = tokio::time::Instant::now() + timeout;
        match crate::wait::until(&self.inner.peers_changed, Some(deadline), None, || self.peer(name)).await {
            Some(peer) => Ok(peer),
            None => Err(Error::Timeout(format!(
                "no peer named {name:?} connected within {timeout:?}; connected: {}",
                self.peer_names()
            ))),
        }
    }

    /// The names of the connected peers, for errors.
    fn peer_names(&self) -> String {
        let names: Vec<String> = self.peers().iter().map(|p| p.name().to_string()).collect();
        names.join(", ")
    }

    /// Sends `value` to the connected peer named `to`.
    pub async fn send<T: Message>(&self, to: &str, value: T) -> Result<()> {
        let peer = self.peer(to).ok_or_else(|| Error::UnknownPeer {
            name: to.to_string(),
            known: self.peer_names(),
        })?;
        peer.send(value).await
    }

    /// The next received message.
    pub async fn recv(&self) -> Result<Envelope> {
        // A message waiting already (the common case under load) is taken at once.
        if !self.inner.ctx.is_shut_down() {
            if let Some(mut envelope) = self.inner.inbox.take() {
                envelope.permit = None;
                return Ok(envelope);
            }
        }
        let mut shutdown = self.inner.ctx.shutdown.subscribe();
        if *shutdown.borrow() {
            return Err(Error::NodeClosed);
        }
        let mut envelope = tokio::select! {
            biased;
            env = self.inner.inbox.pop() => env,
            _ = shutdown.changed() => return Err(Error::NodeClosed),
        };
        // Taken by the application: it no longer counts against the sender's budget.
        envelope.permit = None;
        Ok(envelope)
    }

    /// The next received message, or a timeout error.
    pub async fn recv_timeout(&self, timeout: Duration) -> Result<Envelope> {
        tokio::time::timeout(timeout, self.recv())
            .await
            .map_err(|_| Error::Timeout(format!("no message for node {} within {timeout:?}", self.name())))?
    }

    /// Closes the listener and every connection.
    pub fn shutdown(&self) {
        shut_down(&self.inner);
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name())
            .field("host_id", &self.inner.ctx.me.host_id)
            .field("listen", &self.inner.ctx.listen_addr)
            .finish()
    }
}

/// Gives idle shared memory back to the host from time to time, until the node goes: the
/// pool's segments and this node's mappings idle past their time
/// (`handoff_proto::shm::IdleTimes`, the same sweep the asyncio driver runs).
async fn sweep_idle_shm(node: std::sync::Weak<NodeInner>) {
    crate::state::while_alive(node, |node| {
        let times = handoff_proto::shm::IdleTimes::from_env();
        node.ctx.sweep_idle(&times, std::time::Instant::now())
    })
    .await
}

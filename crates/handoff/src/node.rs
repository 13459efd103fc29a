//! [`Node`]: a participant in a cluster. It listens, connects to peers, sends and receives.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use handoff_wire::{Channel, Endpoint, Limits, Preamble, Resources};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::inbox::Inbox;

use crate::accept::{self, Handshakes, Listening};
use crate::bounds::Bounds;
use crate::budget::Budget;
use crate::connection;
use crate::envelope::Envelope;
use crate::handshake::CAPABILITIES;
use crate::identity;
use crate::link::{LeaseStats, Link};
use crate::log_limit::LogLimiter;
use crate::message::TypeRegistry;
use crate::pool::RecvPool;
use crate::shm::MappingCache;
use crate::tickets::owner::LeaseTable;
use crate::tickets::{self, LeaseConfig, LeaseTableStats, Redeem};
use crate::unix;
use crate::{Error, Message, Peer, Result};

/// Default size from which buffers to a same-host peer travel as shared memory.
pub const DEFAULT_SHM_THRESHOLD: usize = 64 * 1024;

/// Settings for a [`Node`]; start with [`Node::builder`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: String,
    listen: Option<String>,
    host_id: Option<String>,
    secret: Option<Vec<u8>>,
    registry: TypeRegistry,
    limits: Limits,
    force_encode_inproc: bool,
    bounds: Bounds,
    pool_idle_bytes: usize,
    shm: bool,
    shm_threshold: usize,
    shm_sealed: bool,
    ticket_threshold: Option<usize>,
    lease_config: LeaseConfig,
    redeem: Redeem,
    pull_timeout: Duration,
    accept_v1: bool,
    preamble: Option<Preamble>,
}

impl NodeBuilder {
    /// Also accept peers that speak only protocol version 1 (default: off).
    ///
    /// Version 1's hello tells anyone who connects this node's id, name, host id, pid,
    /// process id, listen address and socket path **before either side has proven the
    /// cluster secret**; version 2, the default, says who the node is only to a peer whose
    /// proof it verified (spec §5.4). With this on, the node announces versions 1 and 2 and
    /// runs version 1 with a peer that speaks nothing newer (still version 2 with every
    /// peer that does); with it off, a v1-only peer is refused with `unsupported-version`.
    /// Turn it on only while such peers are being upgraded.
    pub fn accept_v1(mut self, on: bool) -> Self {
        self.accept_v1 = on;
        self
    }

    /// Sends `preamble` in place of the node's own, whatever [`accept_v1`](Self::accept_v1)
    /// says: for tests that play an older peer ([`Preamble::V1_ONLY`] makes a node that
    /// speaks version 1 only). Not for production use.
    #[doc(hidden)]
    pub fn preamble(mut self, preamble: Preamble) -> Self {
        self.preamble = Some(preamble);
        self
    }

    /// Send buffers of at least this many bytes to TCP peers as tickets (the receiver
    /// pulls them from us) instead of in the stream. Default: never (`None`);
    /// [`Peer::send_by_ticket`] asks for tickets explicitly.
    pub fn ticket_threshold(mut self, bytes: Option<usize>) -> Self {
        self.ticket_threshold = bytes;
        self
    }

    /// Lifetime and caps of the leases this node issues for its tickets.
    pub fn leases(mut self, config: LeaseConfig) -> Self {
        self.lease_config = config;
        self
    }

    /// When received tickets are redeemed: before delivery (default) or on first use.
    pub fn redeem(mut self, redeem: Redeem) -> Self {
        self.redeem = redeem;
        self
    }

    /// How long a pull or forward may wait for the owner before it fails (default 30 s).
    pub fn pull_timeout(mut self, timeout: Duration) -> Self {
        self.pull_timeout = timeout;
        self
    }

    /// The node's name (unique among nodes of one process; shown to peers).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Listen for TCP connections on `addr` (`127.0.0.1:0`, `tcp://[::1]:7000`, …).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = Some(addr.into());
        self
    }

    /// Override the host identity (default: from the kernel's machine and boot ids,
    /// or `HANDOFF_HOST_ID`). Nodes with different host ids treat each other as remote.
    pub fn host_id(mut self, host_id: impl Into<String>) -> Self {
        self.host_id = Some(host_id.into());
        self
    }

    /// The cluster secret both sides of every connection must share.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// Accept messages of type `T`.
    pub fn register<T: Message>(mut self) -> Self {
        self.registry.register::<T>();
        self
    }

    /// Use this registry of accepted types (replacing what was registered so far).
    pub fn registry(mut self, registry: TypeRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// Limits enforced on received messages.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Encode and decode even in-process (for tests: keeps both paths equal).
    /// The environment variable `HANDOFF_FORCE_ENCODE=1` sets it too.
    pub fn force_encode_inproc(mut self, on: bool) -> Self {
        self.force_encode_inproc = on;
        self
    }

    /// Messages that one peer may have waiting in the inbox before the node stops reading
    /// from it (backpressure); sets [`Bounds::max_buffered_messages_per_peer`].
    pub fn inbox_capacity(mut self, capacity: usize) -> Self {
        self.bounds.max_buffered_messages_per_peer = capacity.max(1);
        self
    }

    /// The bounds on what peers can make this node hold (spec §9.1): handshakes and
    /// connections, timeouts, buffered bytes per peer and in total, leases.
    pub fn bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Bytes of idle receive buffers kept for reuse.
    pub fn pool_idle_bytes(mut self, bytes: usize) -> Self {
        self.pool_idle_bytes = bytes;
        self
    }

    /// Whether to open a Unix socket for same-host peers and use shared memory with them
    /// (default: on).
    pub fn shm(mut self, on: bool) -> Self {
        self.shm = on;
        self
    }

    /// Buffers at least this large travel to same-host peers as shared memory (default 64 KiB);
    /// smaller ones are copied into the socket.
    pub fn shm_threshold(mut self, bytes: usize) -> Self {
        self.shm_threshold = bytes;
        self
    }

    /// Send only sealed segments to same-host peers: each shared frame is copied into a fresh
    /// memfd sealed against writes, for peers that must never see later reuse.
    pub fn shm_sealed(mut self, on: bool) -> Self {
        self.shm_sealed = on;
        self
    }

    /// Starts the node: binds the listener (if any) and registers the node for in-process peers.
    pub async fn build(self) -> Result<Node> {
        if self.name.is_empty() {
            return Err(Error::Config("a node needs a name".into()));
        }
        let secret = match self.secret {
            Some(s) => s,
            None => {
                tracing::warn!(node = %self.name, "no cluster secret set: using the empty secret; any peer without a secret can connect");
                Vec::new()
            }
        };
        let listener = match &self.listen {
            Some(addr) => {
                let addr = strip_scheme(addr, "tcp://");
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
        let unix_listener = if self.shm {
            let dir = unix::runtime_dir()?;
            let path = dir.join(format!("{}-{}.sock", sanitize(&self.name), &node_id[..12]));
            let _ = std::fs::remove_file(&path);
            let listener =
                UnixListener::bind(&path).map_err(|e| Error::io(format!("listening on {}", path.display()), e))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::io(format!("restricting {} to mode 0600", path.display()), e))?;
            Some((listener, path))
        } else {
            None
        };
        let capabilities = CAPABILITIES
            .iter()
            .filter(|c| self.shm || **c != "shm")
            .map(|c| c.to_string())
            .collect();
        let me = Endpoint {
            node_id,
            name: self.name.clone(),
            host_id: self.host_id.unwrap_or_else(identity::host_id),
            process_id: identity::process_id().to_string(),
            language: "rust".into(),
            capabilities,
        };
        let bounds = self.bounds;
        let node_log = Arc::new(LogLimiter::new(
            bounds.warnings_in_all_per_period,
            bounds.warning_period,
        ));
        let (shutdown_tx, _) = watch::channel(false);
        let (unlease_tx, unlease_rx) = mpsc::unbounded_channel();
        let force_env = std::env::var("HANDOFF_FORCE_ENCODE").is_ok_and(|v| v == "1");
        let inner = Arc::new(NodeInner {
            me,
            secret,
            limits: self.limits,
            registry: self.registry,
            force_encode_inproc: self.force_encode_inproc || force_env,
            listen_addr,
            unix_path: unix_listener.as_ref().map(|(_, p)| p.clone()),
            shm_threshold: self.shm_threshold.max(1),
            shm_sealed: self.shm_sealed,
            mappings: MappingCache::new(4 << 30),
            budget: Budget::new(
                bounds.max_buffered_bytes,
                bounds.max_buffered_bytes_per_peer,
                bounds.min_buffered_bytes_per_peer,
                bounds.max_buffered_messages_per_peer,
            ),
            handshakes: Handshakes::new(bounds.max_handshakes),
            connections: AtomicUsize::new(0),
            ticket_dials: Arc::new(Semaphore::new(bounds.max_ticket_dials.max(1))),
            accept_log: LogLimiter::under(node_log.clone(), bounds.warnings_per_period, bounds.warning_period),
            node_log,
            bounds,
            peers: RwLock::new(HashMap::new()),
            peers_changed: Notify::new(),
            inbox: Inbox::default(),
            pool: RecvPool::new(self.pool_idle_bytes),
            shutdown: shutdown_tx,
            leases: LeaseTable::new(self.lease_config, self.bounds.max_holders_per_lease),
            ticket_threshold: self.ticket_threshold,
            redeem: self.redeem,
            pull_timeout: self.pull_timeout,
            next_req: AtomicU64::new(1),
            unlease_tx,
            resources: Arc::new(Resources::new(self.name.clone())),
            preamble: self.preamble.unwrap_or(Preamble::ours(self.accept_v1)),
        });
        directory::register(&inner)?;
        if let Some(listener) = listener {
            tokio::spawn(accept::accept_loop(inner.clone(), Listening::Tcp(listener)));
        }
        if let Some((listener, _)) = unix_listener {
            tokio::spawn(accept::accept_loop(inner.clone(), Listening::Unix(listener)));
        }
        tokio::spawn(tickets::client::unlease_loop(Arc::downgrade(&inner), unlease_rx));
        tokio::spawn(tickets::reap_expired(Arc::downgrade(&inner)));
        tracing::info!(node = %inner.me.name, host = %inner.me.host_id, listen = ?inner.listen_addr, "node started");
        Ok(Node {
            inner: inner.clone(),
            _guard: Arc::new(ShutdownOnDrop(inner)),
        })
    }
}

pub(crate) fn strip_scheme<'a>(addr: &'a str, scheme: &str) -> &'a str {
    addr.strip_prefix(scheme).unwrap_or(addr)
}

/// A node name made safe for a file name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect()
}

pub(crate) struct NodeInner {
    pub(crate) me: Endpoint,
    pub(crate) secret: Vec<u8>,
    pub(crate) limits: Limits,
    pub(crate) registry: TypeRegistry,
    pub(crate) force_encode_inproc: bool,
    pub(crate) listen_addr: Option<String>,
    pub(crate) unix_path: Option<PathBuf>,
    pub(crate) shm_threshold: usize,
    pub(crate) shm_sealed: bool,
    pub(crate) mappings: MappingCache,
    pub(crate) peers: RwLock<HashMap<String, Peer>>,
    pub(crate) peers_changed: Notify,
    /// Messages waiting for the application, taken one connection at a time; bounded by
    /// the receive budget (bytes and messages per peer, bytes in total), which every
    /// envelope in it holds a share of.
    pub(crate) inbox: Inbox,
    /// What peers can make this node hold (spec §9.1).
    pub(crate) bounds: Bounds,
    /// Bytes and messages received and not yet taken by the application.
    pub(crate) budget: Arc<Budget>,
    /// Handshakes in progress on accepted connections.
    pub(crate) handshakes: Arc<Handshakes>,
    /// Established connections (their read loops).
    pub(crate) connections: AtomicUsize,
    /// Connections being opened to reach owners of received tickets.
    pub(crate) ticket_dials: Arc<Semaphore>,
    /// Warnings about refused connections, at most so many per period.
    pub(crate) accept_log: LogLimiter,
    /// Every warning about peers passes this one too: at most so many per period in all,
    /// however many connections a peer opens.
    pub(crate) node_log: Arc<LogLimiter>,
    pub(crate) pool: RecvPool,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Leases on buffers we sent as tickets.
    pub(crate) leases: LeaseTable,
    pub(crate) ticket_threshold: Option<usize>,
    pub(crate) redeem: Redeem,
    pub(crate) pull_timeout: Duration,
    /// Ids of ticket requests we send.
    pub(crate) next_req: AtomicU64,
    pub(crate) unlease_tx: mpsc::UnboundedSender<handoff_wire::TicketClaim>,
    /// Local objects that values refer to by key (bound while decoding).
    pub(crate) resources: Arc<Resources>,
    /// The preamble this node sends: version 2 only, or 1 and 2 with `accept_v1` (spec §3).
    pub(crate) preamble: Preamble,
}

impl NodeInner {
    /// Puts an envelope into the inbox (its permit in the receive budget bounds it).
    pub(crate) async fn deliver(&self, envelope: Envelope) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::NodeClosed);
        }
        self.inbox.push(envelope);
        Ok(())
    }

    /// Established connections now.
    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// Counts an established connection until the guard is dropped.
    pub(crate) fn connection_guard(self: &Arc<Self>) -> ConnectionGuard {
        self.connections.fetch_add(1, Ordering::AcqRel);
        ConnectionGuard(self.clone())
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub(crate) fn add_peer(&self, peer: Peer) {
        let old = self
            .peers
            .write()
            .expect("peers lock")
            .insert(peer.0.remote.node_id.clone(), peer);
        if let Some(old) = old {
            old.mark_closed();
        }
        self.peers_changed.notify_waiters();
    }

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

    pub(crate) fn shutdown(&self) {
        self.shutdown.send_replace(true);
        self.inbox.clear();
        let peers: Vec<Peer> = self
            .peers
            .write()
            .expect("peers lock")
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in peers {
            p.mark_closed();
            if let Link::Shm(link) = &p.0.link {
                link.release_all();
            }
        }
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
        directory::unregister(&self.me.name, self);
    }

    pub(crate) fn unix_addr(&self) -> Option<String> {
        self.unix_path.as_ref().map(|p| format!("unix://{}", p.display()))
    }
}

/// One established connection, counted against [`Bounds::max_connections`].
pub(crate) struct ConnectionGuard(Arc<NodeInner>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

struct ShutdownOnDrop(Arc<NodeInner>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.shutdown();
    }
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
        NodeBuilder {
            name: name.into(),
            listen: None,
            host_id: None,
            secret: None,
            registry: TypeRegistry::new(),
            limits: Limits::default(),
            force_encode_inproc: false,
            bounds: Bounds::DEFAULT,
            pool_idle_bytes: 1 << 30,
            shm: true,
            shm_threshold: DEFAULT_SHM_THRESHOLD,
            shm_sealed: false,
            ticket_threshold: None,
            lease_config: LeaseConfig::default(),
            redeem: Redeem::Eager,
            pull_timeout: Duration::from_secs(30),
            accept_v1: false,
            preamble: None,
        }
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.me.name
    }

    /// What this node tells peers about itself.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.me
    }

    /// The TCP address the node listens on (`tcp://ip:port`), if it listens.
    pub fn listen_addr(&self) -> Option<&str> {
        self.inner.listen_addr.as_deref()
    }

    /// The address same-host peers connect to: `unix://PATH`, if the node has a Unix socket.
    pub fn unix_addr(&self) -> Option<String> {
        self.inner.unix_addr()
    }

    /// Shared-memory leases this node holds for all its peers.
    pub fn leases(&self) -> LeaseStats {
        self.peers().iter().fold(LeaseStats::default(), |acc, p| {
            let l = p.leases();
            LeaseStats {
                count: acc.count + l.count,
                bytes: acc.bytes + l.bytes,
            }
        })
    }

    /// The leases this node holds as the owner of tickets it sent.
    pub fn ticket_leases(&self) -> LeaseTableStats {
        self.inner.leases.stats()
    }

    /// Whether a lease this node issued is still alive (its buffer pinned).
    pub fn lease_alive(&self, lease: u64) -> bool {
        self.inner.leases.is_alive(lease)
    }

    /// Bytes of peers' segments mapped into this process.
    pub fn mapped_bytes(&self) -> usize {
        self.inner.mappings.mapped_bytes()
    }

    /// Bytes of received messages this node holds for all peers now: read, and not yet
    /// taken with [`recv`](Self::recv) (bounded by [`Bounds::max_buffered_bytes`]).
    pub fn buffered_bytes(&self) -> u64 {
        self.inner.budget.used()
    }

    /// Handshakes in progress on accepted connections now (bounded by
    /// [`Bounds::max_handshakes`]).
    pub fn handshakes_in_progress(&self) -> usize {
        self.inner.handshakes.count()
    }

    /// Established connections now (bounded by [`Bounds::max_connections`] for accepted ones).
    pub fn connection_count(&self) -> usize {
        self.inner.connections()
    }

    /// The bounds this node keeps on what peers can make it hold.
    pub fn bounds(&self) -> &Bounds {
        &self.inner.bounds
    }

    /// The address in-process peers connect to: `inproc://NAME`.
    pub fn inproc_addr(&self) -> String {
        format!("inproc://{}", self.inner.me.name)
    }

    /// This node's resources: local objects (a storage driver, a cache, a catalog) that
    /// values refer to by key. A [`Resource`](handoff_wire::Resource) or a data handle
    /// received by this node binds to the object registered here under its key, or opened
    /// by a resolver added here.
    pub fn resources(&self) -> &Arc<Resources> {
        &self.inner.resources
    }

    /// The types this node accepts.
    pub fn registry(&self) -> &TypeRegistry {
        &self.inner.registry
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
        loop {
            let changed = self.inner.peers_changed.notified();
            if let Some(p) = self.peer(name) {
                return Ok(p);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let known: Vec<String> = self.peers().iter().map(|p| p.name().to_string()).collect();
                return Err(Error::Timeout(format!(
                    "no peer named {name:?} connected within {timeout:?}; connected: {}",
                    known.join(", ")
                )));
            }
        }
    }

    /// Sends `value` to the connected peer named `to`.
    pub async fn send<T: Message>(&self, to: &str, value: T) -> Result<()> {
        let peer = self.peer(to).ok_or_else(|| Error::UnknownPeer {
            name: to.to_string(),
            known: self
                .peers()
                .iter()
                .map(|p| p.name().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        peer.send(value).await
    }

    /// The next received message.
    pub async fn recv(&self) -> Result<Envelope> {
        let mut shutdown = self.inner.shutdown.subscribe();
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
        self.inner.shutdown();
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name())
            .field("host_id", &self.inner.me.host_id)
            .field("listen", &self.inner.listen_addr)
            .finish()
    }
}

/// The nodes of this process, by name, for `inproc://` connections.
pub(crate) mod directory {
    use super::*;

    fn nodes() -> &'static Mutex<HashMap<String, Weak<NodeInner>>> {
        static NODES: OnceLock<Mutex<HashMap<String, Weak<NodeInner>>>> = OnceLock::new();
        NODES.get_or_init(Default::default)
    }

    pub(crate) fn register(node: &Arc<NodeInner>) -> Result<()> {
        let mut map = nodes().lock().expect("directory lock");
        if let Some(existing) = map.get(&node.me.name).and_then(Weak::upgrade) {
            if !existing.is_shut_down() {
                return Err(Error::Config(format!(
                    "a node named {:?} already runs in this process",
                    node.me.name
                )));
            }
        }
        map.insert(node.me.name.clone(), Arc::downgrade(node));
        Ok(())
    }

    pub(crate) fn lookup(name: &str) -> Option<Arc<NodeInner>> {
        nodes()
            .lock()
            .expect("directory lock")
            .get(name)
            .and_then(Weak::upgrade)
            .filter(|n| !n.is_shut_down())
    }

    pub(crate) fn unregister(name: &str, node: &NodeInner) {
        let mut map = nodes().lock().expect("directory lock");
        if let Some(existing) = map.get(name) {
            if std::ptr::eq(existing.as_ptr(), node) {
                map.remove(name);
            }
        }
    }
}

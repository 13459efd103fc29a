//! [`Node`]: a participant in a cluster. It listens, connects to peers, sends and receives.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use handoff_wire::framing::inline_frame_lengths;
use handoff_wire::{Buffer, Channel, Descriptor, Endpoint, Header, Limits, Locality, WireError};
use tokio::io::AsyncRead;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch, Notify};

use crate::envelope::{Envelope, Payload};
use crate::handshake::{handshake, send_error, OurSide, CAPABILITIES};
use crate::identity;
use crate::io::{FdSource, MessageReader};
use crate::message::TypeRegistry;
use crate::peer::{LeaseStats, Link, PeerAddrs, PeerInner, ShmLink};
use crate::pool::RecvPool;
use crate::shm::{self, MappingCache, RemoteView};
use crate::unix::{self, FdReader, UnixWriter};
use crate::{Error, Message, Peer, Result};

/// Default size from which buffers to a same-host peer travel as shared memory.
pub const DEFAULT_SHM_THRESHOLD: usize = 64 * 1024;

/// How long a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    inbox_capacity: usize,
    pool_idle_bytes: usize,
    shm: bool,
    shm_threshold: usize,
    shm_sealed: bool,
}

impl NodeBuilder {
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

    /// Messages that may wait in the inbox before senders wait (backpressure).
    pub fn inbox_capacity(mut self, capacity: usize) -> Self {
        self.inbox_capacity = capacity.max(1);
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
        let (inbox_tx, inbox_rx) = mpsc::channel(self.inbox_capacity);
        let (shutdown_tx, _) = watch::channel(false);
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
            peers: RwLock::new(HashMap::new()),
            peers_changed: Notify::new(),
            inbox_tx,
            inbox_rx: tokio::sync::Mutex::new(inbox_rx),
            pool: RecvPool::new(self.pool_idle_bytes),
            shutdown: shutdown_tx,
        });
        directory::register(&inner)?;
        if let Some(listener) = listener {
            tokio::spawn(accept_loop(inner.clone(), listener));
        }
        if let Some((listener, _)) = unix_listener {
            tokio::spawn(unix_accept_loop(inner.clone(), listener));
        }
        tracing::info!(node = %inner.me.name, host = %inner.me.host_id, listen = ?inner.listen_addr, "node started");
        Ok(Node {
            inner: inner.clone(),
            _guard: Arc::new(ShutdownOnDrop(inner)),
        })
    }
}

fn strip_scheme<'a>(addr: &'a str, scheme: &str) -> &'a str {
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
    secret: Vec<u8>,
    pub(crate) limits: Limits,
    pub(crate) registry: TypeRegistry,
    pub(crate) force_encode_inproc: bool,
    listen_addr: Option<String>,
    unix_path: Option<PathBuf>,
    shm_threshold: usize,
    shm_sealed: bool,
    mappings: MappingCache,
    peers: RwLock<HashMap<String, Peer>>,
    peers_changed: Notify,
    inbox_tx: mpsc::Sender<Envelope>,
    inbox_rx: tokio::sync::Mutex<mpsc::Receiver<Envelope>>,
    pool: RecvPool,
    shutdown: watch::Sender<bool>,
}

impl NodeInner {
    /// Puts an envelope into the inbox, waiting while it is full.
    pub(crate) async fn deliver(&self, envelope: Envelope) -> Result<()> {
        self.inbox_tx.send(envelope).await.map_err(|_| Error::NodeClosed)
    }

    fn is_shut_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn add_peer(&self, peer: Peer) {
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

    fn remove_peer(&self, peer: &Peer) {
        let mut peers = self.peers.write().expect("peers lock");
        if let Some(current) = peers.get(&peer.0.remote.node_id) {
            if Arc::ptr_eq(&current.0, &peer.0) {
                peers.remove(&peer.0.remote.node_id);
            }
        }
        drop(peers);
        self.peers_changed.notify_waiters();
    }

    fn shutdown(&self) {
        self.shutdown.send_replace(true);
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

    fn our_side(&self) -> OurSide<'_> {
        OurSide {
            me: &self.me,
            listen: self.listen_addr.clone(),
            unix: self.unix_addr(),
            secret: &self.secret,
            limits: &self.limits,
        }
    }

    fn unix_addr(&self) -> Option<String> {
        self.unix_path.as_ref().map(|p| format!("unix://{}", p.display()))
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
            inbox_capacity: 1024,
            pool_idle_bytes: 1 << 30,
            shm: true,
            shm_threshold: DEFAULT_SHM_THRESHOLD,
            shm_sealed: false,
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

    /// Bytes of peers' segments mapped into this process.
    pub fn mapped_bytes(&self) -> usize {
        self.inner.mappings.mapped_bytes()
    }

    /// The address in-process peers connect to: `inproc://NAME`.
    pub fn inproc_addr(&self) -> String {
        format!("inproc://{}", self.inner.me.name)
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
        if self.inner.is_shut_down() {
            return Err(Error::NodeClosed);
        }
        if let Some(name) = addr.strip_prefix("inproc://") {
            return self.connect_inproc(name);
        }
        if let Some(path) = addr.strip_prefix("unix://") {
            return self.connect_unix(path).await;
        }
        let target = strip_scheme(addr, "tcp://");
        let stream = TcpStream::connect(target)
            .await
            .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
        let label = addr.to_string();
        let peer = with_timeout(addr, open_tcp(self.inner.clone(), stream, label)).await?;
        if channel == Some(Channel::Tcp) {
            return Ok(peer);
        }
        let why_not = if peer.locality() == Locality::Remote {
            Some("it is on another host".to_string())
        } else if self.inner.unix_path.is_none() {
            Some("this node has shared memory turned off".to_string())
        } else if !peer.endpoint().has_capability("shm") || peer.unix_addr().is_none() {
            Some("it offers no Unix socket".to_string())
        } else {
            None
        };
        if let Some(reason) = why_not {
            if channel == Some(Channel::Shm) {
                close_tcp(&peer).await;
                return Err(Error::Config(format!("cannot use shm with {}: {reason}", peer.name())));
            }
            return Ok(peer);
        }
        let path = peer.unix_addr().expect("checked above").to_string();
        match self.connect_unix(strip_scheme(&path, "unix://")).await {
            Ok(shm_peer) => {
                close_tcp(&peer).await;
                tracing::info!(node = %self.name(), peer = %shm_peer.name(), "same-host peer: using shm");
                Ok(shm_peer)
            }
            Err(e) if channel == Some(Channel::Shm) => {
                close_tcp(&peer).await;
                Err(e)
            }
            Err(e) => {
                tracing::warn!(
                    node = %self.name(),
                    peer = %peer.name(),
                    "same-host peer, but its Unix socket {path} cannot be reached ({e}); falling back to tcp"
                );
                Ok(peer)
            }
        }
    }

    async fn connect_unix(&self, path: &str) -> Result<Peer> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| Error::io(format!("connecting to unix://{path}"), e))?;
        let label = format!("unix://{path}");
        with_timeout(&label.clone(), open_unix(self.inner.clone(), stream, label)).await
    }

    fn connect_inproc(&self, name: &str) -> Result<Peer> {
        let other = directory::lookup(name)
            .ok_or_else(|| Error::Config(format!("no node named {name:?} in this process (inproc://{name})")))?;
        if Arc::ptr_eq(&other, &self.inner) {
            return Err(Error::Config("a node cannot connect to itself".into()));
        }
        if !constant_time_eq(&other.secret, &self.inner.secret) {
            return Err(Error::Wire(WireError::AuthFailed(format!(
                "node {name:?} has a different cluster secret"
            ))));
        }
        let force = self.inner.force_encode_inproc || other.force_encode_inproc;
        let ours = Peer::new(
            &self.inner.me,
            other.me.clone(),
            PeerAddrs {
                listen: other.listen_addr.clone(),
                unix: other.unix_addr(),
            },
            Channel::Inproc,
            Link::Inproc {
                target: Arc::downgrade(&other),
                reverse: OnceLock::new(),
            },
            force,
        );
        let theirs = Peer::new(
            &other.me,
            self.inner.me.clone(),
            PeerAddrs {
                listen: self.inner.listen_addr.clone(),
                unix: self.inner.unix_addr(),
            },
            Channel::Inproc,
            Link::Inproc {
                target: Arc::downgrade(&self.inner),
                reverse: OnceLock::new(),
            },
            force,
        );
        set_reverse(&ours.0, &theirs.0);
        set_reverse(&theirs.0, &ours.0);
        other.add_peer(theirs);
        self.inner.add_peer(ours.clone());
        tracing::debug!(from = %self.name(), to = %name, "connected in-process");
        Ok(ours)
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
        let mut rx = self.inner.inbox_rx.lock().await;
        tokio::select! {
            biased;
            env = rx.recv() => env.ok_or(Error::NodeClosed),
            _ = shutdown.changed() => Err(Error::NodeClosed),
        }
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

fn set_reverse(peer: &Arc<PeerInner>, reverse: &Arc<PeerInner>) {
    if let Link::Inproc { reverse: slot, .. } = &peer.link {
        let _ = slot.set(Arc::downgrade(reverse));
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn with_timeout<F: std::future::Future<Output = Result<Peer>>>(what: &str, f: F) -> Result<Peer> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, f)
        .await
        .map_err(|_| Error::Timeout(format!("handshake with {what} took over {HANDSHAKE_TIMEOUT:?}")))?
}

/// Closes a TCP connection we replaced with a same-host one.
async fn close_tcp(peer: &Peer) {
    peer.mark_closed();
    if let Link::Tcp { writer } = &peer.0.link {
        use tokio::io::AsyncWriteExt;
        let _ = writer.lock().await.shutdown().await;
    }
}

fn log_accept(node: &NodeInner, label: &str, result: std::result::Result<Result<Peer>, tokio::time::error::Elapsed>) {
    match result {
        Ok(Ok(peer)) => tracing::info!(
            node = %node.me.name,
            peer = %peer.name(),
            locality = %peer.locality(),
            channel = %peer.channel(),
            "accepted peer"
        ),
        Ok(Err(e)) => tracing::warn!(node = %node.me.name, from = %label, "refused connection: {e}"),
        Err(_) => tracing::warn!(node = %node.me.name, from = %label, "refused connection: handshake timed out"),
    }
}

async fn accept_loop(node: Arc<NodeInner>, listener: TcpListener) {
    let mut shutdown = node.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, addr)) => {
                let node = node.clone();
                tokio::spawn(async move {
                    let label = format!("tcp://{addr}");
                    let result =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, open_tcp(node.clone(), stream, label.clone())).await;
                    log_accept(&node, &label, result);
                });
            }
            Err(e) => {
                tracing::warn!(node = %node.me.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn unix_accept_loop(node: Arc<NodeInner>, listener: UnixListener) {
    let mut shutdown = node.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                let node = node.clone();
                tokio::spawn(async move {
                    let label = format!("unix peer (pid {:?})", stream.peer_cred().ok().and_then(|c| c.pid()));
                    let result =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, open_unix(node.clone(), stream, label.clone())).await;
                    log_accept(&node, &label, result);
                });
            }
            Err(e) => {
                tracing::warn!(node = %node.me.name, "unix accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn endpoint_of(hello: &handoff_wire::Hello) -> Endpoint {
    Endpoint {
        node_id: hello.node_id.clone(),
        name: hello.name.clone(),
        host_id: hello.host_id.clone(),
        process_id: hello.process_id.clone(),
        language: hello.language.clone(),
        capabilities: hello.capabilities.clone(),
    }
}

/// Handshakes on a fresh TCP stream, registers the peer and starts its reader.
async fn open_tcp(node: Arc<NodeInner>, stream: TcpStream, label: String) -> Result<Peer> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("setting TCP_NODELAY for {label}"), e))?;
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = MessageReader::new(read_half, label.clone());
    let hello = handshake(&mut reader, &mut write_half, node.our_side(), &label)
        .await?
        .hello;
    let peer = Peer::new(
        &node.me,
        endpoint_of(&hello),
        PeerAddrs {
            listen: hello.listen,
            unix: hello.unix,
        },
        Channel::Tcp,
        Link::Tcp {
            writer: tokio::sync::Mutex::new(write_half),
        },
        false,
    );
    node.add_peer(peer.clone());
    tracing::debug!(node = %node.me.name, peer = %peer.name(), locality = %peer.locality(), "tcp peer ready");
    tokio::spawn(read_loop(node, peer.clone(), reader, None));
    Ok(peer)
}

/// Handshakes on a Unix stream from or to a same-host node; the peer's uid must be ours.
async fn open_unix(node: Arc<NodeInner>, stream: UnixStream, label: String) -> Result<Peer> {
    unix::check_peer_uid(&stream)?;
    let stream = Arc::new(stream);
    let mut reader = MessageReader::new(FdReader::new(stream.clone()), label.clone());
    let mut writer = UnixWriter::new(stream);
    let hello = handshake(&mut reader, &mut writer, node.our_side(), &label)
        .await?
        .hello;
    if hello.host_id != node.me.host_id {
        tracing::warn!(
            node = %node.me.name,
            peer = %hello.name,
            "peer on our Unix socket claims another host id ({}); it shares our memory all the same",
            hello.host_id
        );
    }
    let link = Arc::new(ShmLink::new(writer, node.shm_threshold, node.shm_sealed));
    let peer = Peer::new(
        &node.me,
        endpoint_of(&hello),
        PeerAddrs {
            listen: hello.listen,
            unix: hello.unix,
        },
        Channel::Shm,
        Link::Shm(link.clone()),
        false,
    );
    node.add_peer(peer.clone());
    tracing::debug!(node = %node.me.name, peer = %peer.name(), "shm peer ready");
    let (release_tx, release_rx) = mpsc::unbounded_channel();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(release_loop(link, release_rx, closed_rx));
    let reading = peer.clone();
    tokio::spawn(async move {
        read_loop(node, reading, reader, Some(release_tx)).await;
        drop(closed_tx);
    });
    Ok(peer)
}

/// Sends `release` messages for the leases whose last local view was dropped.
async fn release_loop(
    link: Arc<ShmLink>,
    mut rx: mpsc::UnboundedReceiver<u64>,
    mut closed: tokio::sync::oneshot::Receiver<()>,
) {
    use handoff_wire::framing::encode_header_into;
    loop {
        let first = tokio::select! {
            l = rx.recv() => match l { Some(l) => l, None => return },
            _ = &mut closed => return,
        };
        let mut leases = vec![first];
        while leases.len() < 4096 {
            match rx.try_recv() {
                Ok(l) => leases.push(l),
                Err(_) => break,
            }
        }
        let mut head = Vec::with_capacity(16 + leases.len() * 9);
        encode_header_into(&Header::Release { leases }, &mut head);
        let mut w = link.writer.lock().await;
        if crate::io::write_all(&mut *w, &head).await.is_err() {
            return;
        }
    }
}

/// Receives messages from one peer until it closes or breaks the protocol.
async fn read_loop<R>(
    node: Arc<NodeInner>,
    peer: Peer,
    mut reader: MessageReader<R>,
    releases: Option<mpsc::UnboundedSender<u64>>,
) where
    R: AsyncRead + FdSource + Unpin,
{
    let mut shutdown = node.shutdown.subscribe();
    let result = tokio::select! {
        r = read_messages(&node, &peer, &mut reader, releases.as_ref()) => r,
        _ = shutdown.changed() => Ok(()),
    };
    peer.mark_closed();
    node.remove_peer(&peer);
    match result {
        Ok(()) => tracing::debug!(node = %node.me.name, peer = %peer.name(), "connection closed"),
        Err(Error::Refused { code, message, .. }) => {
            tracing::warn!(node = %node.me.name, peer = %peer.name(), "peer closed the connection: {message} [{code}]")
        }
        Err(e) => {
            tracing::warn!(node = %node.me.name, peer = %peer.name(), "closing connection: {e}");
            if let Error::Wire(w) = &e {
                match &peer.0.link {
                    Link::Tcp { writer } => send_error(&mut *writer.lock().await, w).await,
                    Link::Shm(link) => send_error(&mut *link.writer.lock().await, w).await,
                    Link::Inproc { .. } => {}
                }
            }
        }
    }
    use tokio::io::AsyncWriteExt;
    match &peer.0.link {
        Link::Tcp { writer } => {
            let _ = writer.lock().await.shutdown().await;
        }
        Link::Shm(link) => {
            let freed = link.release_all();
            if freed > 0 {
                tracing::info!(node = %node.me.name, peer = %peer.name(), "peer gone: {freed} shared-memory leases ended");
            }
            let _ = link.writer.lock().await.shutdown().await;
            node.mappings.forget_idle();
        }
        Link::Inproc { .. } => {}
    }
}

async fn read_messages<R>(
    node: &NodeInner,
    peer: &Peer,
    reader: &mut MessageReader<R>,
    releases: Option<&mpsc::UnboundedSender<u64>>,
) -> Result<()>
where
    R: AsyncRead + FdSource + Unpin,
{
    let supported: &[&str] = if releases.is_some() {
        &["inline", "shm"]
    } else {
        &["inline"]
    };
    loop {
        let Some(header_bytes) = reader.read_header(&node.limits).await? else {
            return Ok(());
        };
        if let Some(problem) = reader.stream_mut().take_fd_error() {
            return Err(WireError::BadShm(problem).into());
        }
        let header = Header::decode(&header_bytes, &node.limits)?;
        match header {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                node.registry.check(type_name)?;
                let lengths = inline_frame_lengths(&frames, supported)?;
                let shared = frames.iter().filter(|d| matches!(d, Descriptor::Shm { .. })).count();
                let mut fds = reader
                    .stream_mut()
                    .take_fds(shared)
                    .ok_or_else(|| {
                        WireError::BadShm(format!(
                            "the message announces {shared} shared segments, but fewer descriptors arrived"
                        ))
                    })?
                    .into_iter();
                let mut received = Vec::with_capacity(lengths.len());
                for (desc, len) in frames.iter().zip(lengths) {
                    let buffer = match desc {
                        Descriptor::Shm {
                            len,
                            offset,
                            size,
                            lease,
                            sealed,
                        } => {
                            let fd = fds.next().expect("counted above");
                            let mapping = node
                                .mappings
                                .map(fd, *size, *sealed)
                                .map_err(|e| WireError::BadShm(e.0))?;
                            shm::remote_buffer(RemoteView {
                                mapping,
                                offset: *offset as usize,
                                len: *len as usize,
                                lease: *lease,
                                release: releases.expect("shm frames only on shm links").clone(),
                            })
                        }
                        _ => Buffer::from(reader.read_frame(len, &node.pool).await?),
                    };
                    received.push(buffer);
                }
                let stray = reader.stream_mut().pending_fds();
                if stray > 0 && reader.buffered() == 0 {
                    return Err(
                        WireError::BadShm(format!("{stray} descriptors arrived that no header announced")).into(),
                    );
                }
                let envelope = Envelope {
                    from: peer.clone(),
                    type_name: type_name.to_string(),
                    payload: Payload::Encoded {
                        body: header_bytes.slice_ref(body),
                        frames: received,
                    },
                };
                node.deliver(envelope).await?;
            }
            Header::Release { leases } => match &peer.0.link {
                Link::Shm(link) => {
                    let ended = link.release(&leases);
                    if ended < leases.len() {
                        tracing::debug!(
                            node = %node.me.name,
                            peer = %peer.name(),
                            "{} released leases were unknown (already ended)",
                            leases.len() - ended
                        );
                    }
                }
                _ => return Err(WireError::Handshake("a release on a connection without shared memory".into()).into()),
            },
            Header::Error { code, message } => {
                return Err(Error::Refused {
                    peer: peer.name().to_string(),
                    code,
                    message,
                })
            }
            other => {
                return Err(WireError::Handshake(format!("unexpected {other:?} after the handshake")).into());
            }
        }
    }
}

/// The nodes of this process, by name, for `inproc://` connections.
mod directory {
    use super::*;

    fn nodes() -> &'static Mutex<HashMap<String, Weak<NodeInner>>> {
        static NODES: OnceLock<Mutex<HashMap<String, Weak<NodeInner>>>> = OnceLock::new();
        NODES.get_or_init(Default::default)
    }

    pub(super) fn register(node: &Arc<NodeInner>) -> Result<()> {
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

    pub(super) fn lookup(name: &str) -> Option<Arc<NodeInner>> {
        nodes()
            .lock()
            .expect("directory lock")
            .get(name)
            .and_then(Weak::upgrade)
            .filter(|n| !n.is_shut_down())
    }

    pub(super) fn unregister(name: &str, node: &NodeInner) {
        let mut map = nodes().lock().expect("directory lock");
        if let Some(existing) = map.get(name) {
            if std::ptr::eq(existing.as_ptr(), node) {
                map.remove(name);
            }
        }
    }
}

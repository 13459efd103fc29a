//! [`Node`]: a participant in a cluster. It listens, connects to peers, sends and receives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use handoff_wire::framing::inline_frame_lengths;
use handoff_wire::{Buffer, Channel, Endpoint, Header, Limits, WireError};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};

use crate::envelope::{Envelope, Payload};
use crate::handshake::{handshake, send_error, CAPABILITIES};
use crate::identity;
use crate::io::MessageReader;
use crate::message::TypeRegistry;
use crate::peer::{Link, PeerInner};
use crate::pool::RecvPool;
use crate::{Error, Message, Peer, Result};

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
        let me = Endpoint {
            node_id: identity::random_id(),
            name: self.name.clone(),
            host_id: self.host_id.unwrap_or_else(identity::host_id),
            process_id: identity::process_id().to_string(),
            language: "rust".into(),
            capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
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

pub(crate) struct NodeInner {
    pub(crate) me: Endpoint,
    secret: Vec<u8>,
    pub(crate) limits: Limits,
    pub(crate) registry: TypeRegistry,
    pub(crate) force_encode_inproc: bool,
    listen_addr: Option<String>,
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
        }
        directory::unregister(&self.me.name, self);
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

    /// The address in-process peers connect to: `inproc://NAME`.
    pub fn inproc_addr(&self) -> String {
        format!("inproc://{}", self.inner.me.name)
    }

    /// The types this node accepts.
    pub fn registry(&self) -> &TypeRegistry {
        &self.inner.registry
    }

    /// Connects to a peer at `addr`: `inproc://NAME` for a node in this process,
    /// `tcp://HOST:PORT` (or `HOST:PORT`) for any other.
    pub async fn connect(&self, addr: &str) -> Result<Peer> {
        if self.inner.is_shut_down() {
            return Err(Error::NodeClosed);
        }
        if let Some(name) = addr.strip_prefix("inproc://") {
            return self.connect_inproc(name);
        }
        let target = strip_scheme(addr, "tcp://");
        let stream = TcpStream::connect(target)
            .await
            .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
        let inner = self.inner.clone();
        let label = addr.to_string();
        tokio::time::timeout(HANDSHAKE_TIMEOUT, open_tcp(inner, stream, label))
            .await
            .map_err(|_| Error::Timeout(format!("handshake with {addr} took over {HANDSHAKE_TIMEOUT:?}")))?
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
            other.listen_addr.clone(),
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
            self.inner.listen_addr.clone(),
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
                    match result {
                        Ok(Ok(peer)) => {
                            tracing::info!(node = %node.me.name, peer = %peer.name(), locality = %peer.locality(), "accepted peer")
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(node = %node.me.name, from = %label, "refused connection: {e}")
                        }
                        Err(_) => {
                            tracing::warn!(node = %node.me.name, from = %label, "refused connection: handshake timed out")
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(node = %node.me.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Handshakes on a fresh TCP stream, registers the peer and starts its reader.
async fn open_tcp(node: Arc<NodeInner>, stream: TcpStream, label: String) -> Result<Peer> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("setting TCP_NODELAY for {label}"), e))?;
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = MessageReader::new(read_half, label.clone());
    let done = handshake(
        &mut reader,
        &mut write_half,
        &node.me,
        node.listen_addr.clone(),
        &node.secret,
        &node.limits,
        &label,
    )
    .await?;
    let hello = done.hello;
    let remote = Endpoint {
        node_id: hello.node_id,
        name: hello.name,
        host_id: hello.host_id,
        process_id: hello.process_id,
        language: hello.language,
        capabilities: hello.capabilities,
    };
    let peer = Peer::new(
        &node.me,
        remote,
        hello.listen,
        Channel::Tcp,
        Link::Tcp {
            writer: tokio::sync::Mutex::new(write_half),
        },
        false,
    );
    node.add_peer(peer.clone());
    tracing::debug!(node = %node.me.name, peer = %peer.name(), locality = %peer.locality(), "tcp peer ready");
    tokio::spawn(read_loop(node, peer.clone(), reader));
    Ok(peer)
}

/// Receives messages from one TCP peer until it closes or breaks the protocol.
async fn read_loop(node: Arc<NodeInner>, peer: Peer, mut reader: MessageReader<OwnedReadHalf>) {
    let mut shutdown = node.shutdown.subscribe();
    let result = tokio::select! {
        r = read_messages(&node, &peer, &mut reader) => r,
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
            if let (Error::Wire(w), Link::Tcp { writer }) = (&e, &peer.0.link) {
                let mut w_half = writer.lock().await;
                send_error(&mut *w_half, w).await;
            }
        }
    }
    if let Link::Tcp { writer } = &peer.0.link {
        use tokio::io::AsyncWriteExt;
        let _ = writer.lock().await.shutdown().await;
    }
}

async fn read_messages(node: &NodeInner, peer: &Peer, reader: &mut MessageReader<OwnedReadHalf>) -> Result<()> {
    loop {
        let Some(header_bytes) = reader.read_header(&node.limits).await? else {
            return Ok(());
        };
        let header = Header::decode(&header_bytes, &node.limits)?;
        match header {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                node.registry.check(type_name)?;
                let lengths = inline_frame_lengths(&frames, &["inline"])?;
                let mut received = Vec::with_capacity(lengths.len());
                for len in lengths {
                    received.push(Buffer::from(reader.read_frame(len, &node.pool).await?));
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

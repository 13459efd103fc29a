//! Setting up connections: connecting (unix, tcp with the switch to shm; in-process peers
//! in `inproc`), and the handshake-then-register step that connecting and accepting share.

use std::sync::Arc;

use handoff_wire::{Channel, Ident};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;

use crate::handshake::handshake;
use crate::inproc;
use crate::link::{Link, ShmLink};
use crate::peer::PeerAddrs;
use crate::receive::read_loop;
use crate::socket::Socket;
use crate::state::NodeInner;
use crate::{Error, Peer, Result};
use handoff_proto::dialing::{self, Switch, Target};
use handoff_proto::tls_session::TlsSession;
use handoff_proto::{peers, Handshaken};
use handoff_wire::auth::Role;

/// Connects `node` to `addr` (see `Node::connect_with`).
pub(crate) async fn connect(node: &Arc<NodeInner>, addr: &str, channel: Option<Channel>) -> Result<Peer> {
    if node.ctx.is_shut_down() {
        return Err(Error::NodeClosed);
    }
    let target = match Target::of(addr) {
        Target::Inproc(name) => return inproc::connect(node, name),
        Target::Unix(path) => return connect_unix(node, path).await,
        Target::Tcp(target) => target,
    };
    let stream = tokio::time::timeout(node.ctx.bounds.handshake_timeout, TcpStream::connect(target))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "connecting to {addr} took over {:?}",
                node.ctx.bounds.handshake_timeout
            ))
        })?
        .map_err(|e| Error::io(format!("connecting to {addr}"), e))?;
    let label = addr.to_string();
    set_tcp_timeout(node, &stream, &label)?;
    let (stream, tls) = match &node.ctx.tls {
        None => (stream, None),
        Some(tls) => {
            set_nodelay(&stream, &label)?;
            let host = dialing::host_of(target);
            let tls_stream = tokio::time::timeout(node.ctx.bounds.handshake_timeout, tls.connect(stream, host))
                .await
                .map_err(|_| {
                    Error::Timeout(format!(
                        "the TLS handshake with {addr} took over {:?}",
                        node.ctx.bounds.handshake_timeout
                    ))
                })??;
            (tls_stream.0, Some(tls_stream.1))
        }
    };
    let peer = open_tcp(node.clone(), stream, tls, label, Side::Dialed).await?;
    let switch = dialing::switch_after_tcp(
        channel,
        peer.locality(),
        node.ctx.unix_path.is_some(),
        peer.endpoint(),
        peer.unix_addr(),
    );
    let path = match switch {
        Switch::Try(path) => path.to_string(),
        Switch::Refuse(reason) => {
            close(&peer).await;
            return Err(Error::Config(format!("cannot use shm with {}: {reason}", peer.name())));
        }
        Switch::Stay => return Ok(peer),
    };
    match connect_unix(node, dialing::strip_scheme(&path, "unix://")).await {
        Ok(shm_peer) => {
            close(&peer).await;
            tracing::info!(node = %node.ctx.me.name, peer = %shm_peer.name(), "same-host peer: using shm");
            Ok(shm_peer)
        }
        Err(e) if channel == Some(Channel::Shm) => {
            close(&peer).await;
            Err(e)
        }
        Err(e) => {
            tracing::warn!(
                node = %node.ctx.me.name,
                peer = %peer.name(),
                "same-host peer, but its Unix socket {path} cannot be reached ({}); falling back to tcp",
                e.chain()
            );
            Ok(peer)
        }
    }
}

async fn connect_unix(node: &Arc<NodeInner>, path: &str) -> Result<Peer> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|e| Error::io(format!("connecting to unix://{path}"), e))?;
    let label = format!("unix://{path}");
    open_unix(node.clone(), stream, label, Side::Dialed).await
}

/// Closes our side of a connection (the peer sees the end of the stream and closes too).
pub(crate) async fn close(peer: &Peer) {
    peer.0.mark_closed();
    peer.0.shutdown_writing().await;
}

/// How a fresh connection came to be: we dialed it, or we accepted it (and then the node may
/// need its handshake's place for a newer one: `evicted` fires).
pub(crate) enum Side {
    /// We connected to the peer.
    Dialed,
    /// We accepted it from a listening socket.
    Accepted {
        /// Fires when the node evicts this handshake to make room (spec §9.1).
        evicted: oneshot::Receiver<()>,
    },
}

/// Runs the handshake on a fresh connection.
async fn run_handshake(node: &Arc<NodeInner>, socket: &Arc<Socket>, label: &str, side: Side) -> Result<Handshaken> {
    let check = |ident: &Ident| {
        let connected = node.peer_by_id(&ident.node_id);
        peers::admit(&node.ctx.me.node_id, ident, connected.as_ref().map(Peer::endpoint))
    };
    let ctx = &node.ctx;
    let role = match side {
        Side::Dialed => Role::Dialer,
        Side::Accepted { .. } => Role::Acceptor,
    };
    let implementation = concat!("handoff-rs/", env!("CARGO_PKG_VERSION"));
    // On tokio's clock, as the handshake driver's (paused in some tests).
    let now = tokio::time::Instant::now().into_std();
    let config = ctx.handshake_config(role, implementation, ctx.listen_addr.clone(), ctx.unix_addr(), now);
    let evicted = match side {
        Side::Dialed => None,
        Side::Accepted { evicted } => Some(evicted),
    };
    handshake(socket, config, &check, label, evicted).await
}

fn set_nodelay(stream: &TcpStream, label: &str) -> Result<()> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::io(format!("setting TCP_NODELAY for {label}"), e))
}

/// Keepalive and `TCP_USER_TIMEOUT` on a TCP connection, if the node has a TCP timeout:
/// a silent peer then fails its connection within it (`NodeBuilder::tcp_timeout`).
pub(crate) fn set_tcp_timeout(node: &NodeInner, stream: &TcpStream, label: &str) -> Result<()> {
    use std::os::fd::AsFd;
    match node.ctx.settings.tcp_timeout {
        Some(t) => handoff_sys::set_tcp_timeout(stream.as_fd(), t).map_err(|why| {
            Error::io(
                format!("setting the TCP timeout for {label}"),
                std::io::Error::other(why),
            )
        }),
        None => Ok(()),
    }
}

/// The peer a handshake established, registered with the node (a newer connection of the
/// same node replaces the older).
fn register(node: &Arc<NodeInner>, done: Handshaken, channel: Channel, link: Link) -> Peer {
    let Handshaken { ident, version } = done;
    let endpoint = peers::endpoint_of(&ident);
    let addrs = PeerAddrs {
        listen: ident.listen,
        unix: ident.unix,
        version: Some(version),
    };
    let peer = Peer::new(node, endpoint, addrs, channel, link, false);
    node.add_peer(peer.clone());
    peer
}

/// Handshakes on a fresh TCP connection (plain, or after its TLS handshake), registers the
/// peer and starts its reader.
pub(crate) async fn open_tcp(
    node: Arc<NodeInner>,
    stream: TcpStream,
    tls: Option<TlsSession>,
    label: String,
    side: Side,
) -> Result<Peer> {
    let tls_on = tls.is_some();
    set_nodelay(&stream, &label)?;
    let socket = Socket::tcp(stream, tls, node.ctx.bounds.write_timeout);
    let done = match run_handshake(&node, &socket, &label, side).await {
        // In TLS 1.3 the peer checks our certificate after its handshake: its refusal (an
        // alert) arrives with the first read of ours.
        Err(Error::Io { source, .. }) if tls_on && crate::tls::explain_io(&source, &label).is_some() => {
            return Err(crate::tls::explain_io(&source, &label).expect("checked"));
        }
        other => other?,
    };
    let peer = register(&node, done, Channel::Tcp, Link::Tcp(socket.clone()));
    tracing::debug!(node = %node.ctx.me.name, peer = %peer.name(), locality = %peer.locality(), "tcp peer ready");
    tokio::spawn(read_loop(node, peer.clone(), socket));
    Ok(peer)
}

/// Handshakes on a Unix stream from or to a same-host node; the peer's uid must be ours.
pub(crate) async fn open_unix(node: Arc<NodeInner>, stream: UnixStream, label: String, side: Side) -> Result<Peer> {
    let peer_pid = handoff_sys::same_host::check_peer_uid(std::os::fd::AsFd::as_fd(&stream))?;
    let socket = Socket::unix(stream, node.ctx.bounds.write_timeout);
    let done = run_handshake(&node, &socket, &label, side).await?;
    let ident = &done.ident;
    if ident.host_id != node.ctx.me.host_id {
        crate::limited_warn!(
            node.ctx.accept_log,
            node = %node.ctx.me.name,
            peer = %ident.name,
            "peer on our Unix socket claims another host id ({}); it shares our memory all the same",
            ident.host_id
        );
    }
    let link = Arc::new(ShmLink::new(socket.clone(), &node.ctx, peer_pid));
    let peer = register(&node, done, Channel::Shm, Link::Shm(link));
    tracing::debug!(node = %node.ctx.me.name, peer = %peer.name(), "shm peer ready");
    tokio::spawn(read_loop(node, peer.clone(), socket));
    Ok(peer)
}

//! Accepting connections: the listeners, and the bounds on established connections and
//! on handshakes in progress (spec §9.1; the latter kept by `handoff_proto::admission`).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::connection::{open_tcp, open_unix, Side};
use crate::handshake::refuse_overloaded;
use crate::state::NodeInner;
use crate::{limited_warn, Error, Peer, Result};
use handoff_proto::tls_session::TlsSession;

/// A listening socket of a node: TCP for any peer, Unix for same-host peers.
pub(crate) enum Listening {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Accepted {
    Tcp(TcpStream, String),
    Unix(UnixStream, String),
}

impl Listening {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listening::Tcp(l) => l
                .accept()
                .await
                .map(|(s, addr)| Accepted::Tcp(s, format!("tcp://{addr}"))),
            Listening::Unix(l) => l.accept().await.map(|(s, _)| {
                let label = format!("unix peer (pid {:?})", s.peer_cred().ok().and_then(|c| c.pid()));
                Accepted::Unix(s, label)
            }),
        }
    }
}

fn log_accept(node: &NodeInner, label: &str, result: &Result<Peer>) {
    match result {
        Ok(peer) => tracing::info!(
            node = %node.ctx.me.name,
            peer = %peer.name(),
            locality = %peer.locality(),
            channel = %peer.channel(),
            "accepted peer"
        ),
        Err(e) => {
            limited_warn!(node.ctx.accept_log, node = %node.ctx.me.name, from = %label, "refused connection: {}", e.chain())
        }
    }
}

/// An accepted TCP stream as the handshake gets it (with the node's TCP timeout, if any):
/// plain, or after the TLS handshake when
/// the node has TLS (spec §3.1; a plain peer is then refused with `tls-required`). The TLS
/// handshake counts against the same deadline as the handoff handshake.
async fn tcp_conn(node: &NodeInner, stream: TcpStream, label: &str) -> Result<(TcpStream, Option<TlsSession>)> {
    crate::connection::set_tcp_timeout(node, &stream, label)?;
    let Some(tls) = &node.ctx.tls else {
        return Ok((stream, None));
    };
    let _ = stream.set_nodelay(true);
    let limit = node.ctx.bounds.handshake_timeout;
    let tls_stream = tokio::time::timeout(limit, tls.accept(stream, label))
        .await
        .map_err(|_| Error::Timeout(format!("the TLS handshake with {label} took over {limit:?}")))??;
    Ok((tls_stream.0, Some(tls_stream.1)))
}

/// Accepts connections until the node shuts down; each handshakes in a task of its own.
pub(crate) async fn accept_loop(node: Arc<NodeInner>, listener: Listening) {
    let mut shutdown = node.ctx.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok(conn) => {
                let node = node.clone();
                tokio::spawn(async move {
                    let max = node.ctx.bounds.max_connections;
                    if let Some(why) = handoff_proto::admission::over_connections(node.ctx.connections(), max) {
                        limited_warn!(node.ctx.accept_log, node = %node.ctx.me.name, "refused a connection: {why}");
                        match conn {
                            Accepted::Tcp(mut s, _) => refuse_overloaded(&mut s, node.ctx.preamble, why).await,
                            Accepted::Unix(mut s, _) => refuse_overloaded(&mut s, node.ctx.preamble, why).await,
                        }
                        return;
                    }
                    let (evict, mut evicted) = tokio::sync::oneshot::channel();
                    let (slot, older) = node.ctx.handshakes.enter(evict);
                    for oldest in older {
                        let _ = oldest.send(());
                    }
                    let (label, result) = match conn {
                        Accepted::Tcp(stream, label) => {
                            // The TLS handshake holds the handshake's place too: a newer
                            // handshake that needs it ends this one here as well.
                            let tls = tokio::select! {
                                conn = tcp_conn(&node, stream, &label) => conn,
                                _ = &mut evicted => Err(Error::Timeout(format!(
                                    "the TLS handshake with {label} made way for a newer one"
                                ))),
                            };
                            let r = match tls {
                                Ok((stream, tls)) => {
                                    let side = Side::Accepted { evicted };
                                    open_tcp(node.clone(), stream, tls, label.clone(), side).await
                                }
                                Err(e) => Err(e),
                            };
                            (label, r)
                        }
                        Accepted::Unix(stream, label) => {
                            let r = open_unix(node.clone(), stream, label.clone(), Side::Accepted { evicted }).await;
                            (label, r)
                        }
                    };
                    drop(slot);
                    log_accept(&node, &label, &result);
                });
            }
            Err(e) => {
                // Out of descriptors, most likely: wait a little instead of spinning.
                limited_warn!(node.ctx.accept_log, node = %node.ctx.me.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

//! Accepting connections: the listeners, the bound on handshakes in progress (the oldest
//! gives way to a new one), and the bound on established connections (spec §9.1).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::oneshot;

use crate::connection::{open_tcp, open_unix};
use crate::handshake::refuse_overloaded;
use crate::node::NodeInner;
use crate::{limited_warn, Peer, Result};

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

/// The handshakes a node runs now, oldest first. When a new one would pass the bound, the
/// oldest is told to give up its place: a connection that has proven nothing cannot keep
/// a newer one, perhaps a legitimate peer, out.
pub(crate) struct Handshakes {
    max: usize,
    next_id: AtomicU64,
    running: Mutex<VecDeque<(u64, oneshot::Sender<()>)>>,
}

/// A place among the handshakes in progress; given back when dropped.
pub(crate) struct HandshakeSlot {
    id: u64,
    handshakes: Arc<Handshakes>,
}

impl Handshakes {
    pub(crate) fn new(max: usize) -> Arc<Handshakes> {
        Arc::new(Handshakes {
            max: max.max(1),
            next_id: AtomicU64::new(1),
            running: Mutex::default(),
        })
    }

    /// A place for a new handshake, evicting the oldest if all are taken; the receiver
    /// fires when this one is evicted in turn.
    pub(crate) fn enter(self: &Arc<Self>) -> (HandshakeSlot, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut running = self.running.lock().expect("handshakes lock");
        while running.len() >= self.max {
            if let Some((_, oldest)) = running.pop_front() {
                let _ = oldest.send(());
            }
        }
        running.push_back((id, tx));
        (
            HandshakeSlot {
                id,
                handshakes: self.clone(),
            },
            rx,
        )
    }

    /// Handshakes in progress now.
    pub(crate) fn count(&self) -> usize {
        self.running.lock().expect("handshakes lock").len()
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut running = self.handshakes.running.lock().expect("handshakes lock");
        if let Some(pos) = running.iter().position(|(id, _)| *id == self.id) {
            running.remove(pos);
        }
    }
}

fn log_accept(node: &NodeInner, label: &str, result: &Result<Peer>) {
    match result {
        Ok(peer) => tracing::info!(
            node = %node.me.name,
            peer = %peer.name(),
            locality = %peer.locality(),
            channel = %peer.channel(),
            "accepted peer"
        ),
        Err(e) => limited_warn!(node.accept_log, node = %node.me.name, from = %label, "refused connection: {e}"),
    }
}

/// Accepts connections until the node shuts down; each handshakes in a task of its own.
pub(crate) async fn accept_loop(node: Arc<NodeInner>, listener: Listening) {
    let mut shutdown = node.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok(conn) => {
                let node = node.clone();
                tokio::spawn(async move {
                    if node.connections() >= node.bounds.max_connections {
                        // Said to a peer that proved nothing: no name, nothing that identifies us.
                        let why = format!(
                            "this node has {} connections, as many as it allows",
                            node.bounds.max_connections
                        );
                        limited_warn!(node.accept_log, node = %node.me.name, "refused a connection: {why}");
                        match conn {
                            Accepted::Tcp(mut s, _) => refuse_overloaded(&mut s, node.preamble, why).await,
                            Accepted::Unix(mut s, _) => refuse_overloaded(&mut s, node.preamble, why).await,
                        }
                        return;
                    }
                    let (slot, evicted) = node.handshakes.enter();
                    let (label, result) = match conn {
                        Accepted::Tcp(stream, label) => {
                            let r = open_tcp(node.clone(), stream, label.clone(), Some(evicted)).await;
                            (label, r)
                        }
                        Accepted::Unix(stream, label) => {
                            let r = open_unix(node.clone(), stream, label.clone(), Some(evicted)).await;
                            (label, r)
                        }
                    };
                    drop(slot);
                    log_accept(&node, &label, &result);
                });
            }
            Err(e) => {
                // Out of descriptors, most likely: wait a little instead of spinning.
                limited_warn!(node.accept_log, node = %node.me.name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_gives_way() {
        let h = Handshakes::new(2);
        let (a, mut a_rx) = h.enter();
        let (_b, mut b_rx) = h.enter();
        assert!(a_rx.try_recv().is_err());
        let (_c, _) = h.enter();
        assert!(a_rx.try_recv().is_ok(), "a was the oldest");
        assert!(b_rx.try_recv().is_err());
        assert_eq!(h.count(), 2);
        drop(a);
        assert_eq!(h.count(), 2, "a had already left");
    }
}

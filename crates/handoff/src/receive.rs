//! Receiving: the read loop of a connection, what it does with each kind of header,
//! and the release messages for shared-memory views.
//!
//! Everything a peer can make the loop hold is bounded (spec §9.1): a message's bytes take
//! room in the node's receive budget before they are read (the loop stops reading this
//! connection while there is none), `pulled` answers being written take one of a few
//! places, and a `pulled` nobody asked for is read into a small buffer and dropped.

use std::sync::Arc;

use bytes::Bytes;
use handoff_proto::established::{Established, Step};
use handoff_proto::inbound::{Digest, Event, Frame, Inbound};
use handoff_proto::receive::{self, Redemptions};
use handoff_proto::received;
use handoff_proto::ticket_leases::OwnerAnswer;
use handoff_wire::{Buffer, WireError};
use std::time::Instant;
use tokio::sync::mpsc;

use crate::device::DeviceBuffer;
use crate::envelope::Envelope;
use crate::handshake::{DRAIN_BYTES, DRAIN_TIME};
use crate::limited_warn;
use crate::link::Link;
use crate::payload::Payload;
use crate::shm::{self, RemoteView};
use crate::socket::Socket;
use crate::state::NodeInner;
use crate::tickets::holder::{Ticket, TicketHandle, TicketOrigin};
use crate::tickets::pending::{Answer, Waiter};
use crate::{Error, Peer, Result};
use handoff_proto::shm::buffers::Release;
use handoff_sys::hash_thread::HashThread;

/// Receives messages from one peer until it closes or breaks the protocol.
pub(crate) async fn read_loop(node: Arc<NodeInner>, peer: Peer, socket: Arc<Socket>) {
    let _counted = node.connection_guard();
    let mut shutdown = node.ctx.shutdown.subscribe();
    // A received view's last drop queues its lease's `release` (a view that outlives the
    // connection keeps no socket open).
    let release: Option<Release> = matches!(peer.0.link, Link::Shm(_)).then(|| {
        let socket = Arc::downgrade(&socket);
        Arc::new(move |lease| {
            if let Some(socket) = socket.upgrade() {
                socket.queue_release(lease);
            }
        }) as Release
    });
    let types = node.clone();
    let known_type = Arc::new(move |name: &str| types.ctx.registry.check(name));
    let inbound = node
        .ctx
        .inbound(
            release.is_some(),
            known_type,
            peer.0.account.clone(),
            &peer.0.remote.node_id,
        )
        .with_hash_behind(Box::new(HashThread::start));
    let mut conn = Established::new(inbound, peer.0.pending.clone(), node.ctx.budget.max_per_peer());
    let result = tokio::select! {
        r = read_messages(&node, &peer, &socket, &mut conn, release.as_ref()) => r,
        _ = shutdown.changed() => Ok(()),
    };
    // Whatever room the connection held goes back now, not after the goodbyes below.
    drop(conn);
    peer.0.mark_closed();
    node.remove_peer(&peer);
    node.inbox.closed(&peer);
    // Requests waiting on this connection fail now (their senders drop), and every hold
    // the peer had on our leases ends with its connection.
    peer.0.pending.lock().expect("pending lock").clear();
    // A node may hold a second connection to us (the switch from TCP to its Unix socket):
    // its holds end with the last one.
    if node.peer_by_id(&peer.0.remote.node_id).is_none() {
        let ended = node.ctx.last_connection_ended(&peer.0.remote.node_id);
        if ended > 0 {
            tracing::info!(node = %node.ctx.me.name, peer = %peer.name(), "peer gone: its holds on {ended} ticket leases ended");
        }
    }
    match result {
        Ok(()) => {
            tracing::debug!(node = %node.ctx.me.name, peer = %peer.name(), "connection closed");
            peer.0.shutdown_writing().await;
        }
        Err(Error::Refused { code, message, .. }) => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "peer closed the connection: {message} [{code}]");
            peer.0.shutdown_writing().await;
        }
        Err(Error::Wire(w)) => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "closing connection: {w}");
            // The error first, our sending side shut, and what the peer still sends read
            // and dropped for a moment, so the error is not reset away (spec §11.3).
            peer.0.link.send_error_and_shutdown(&w, DRAIN_TIME).await;
            if receive::drain_after(&w) {
                socket.drain(DRAIN_BYTES, DRAIN_TIME).await;
            }
        }
        Err(e) => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "closing connection: {}", e.chain());
            peer.0.shutdown_writing().await;
        }
    }
    if let Link::Shm(link) = &peer.0.link {
        let freed = link.release_all();
        if freed > 0 {
            tracing::info!(node = %node.ctx.me.name, peer = %peer.name(), "peer gone: {freed} shared-memory leases ended");
        }
        node.ctx.mappings.forget_idle();
    }
}

/// One read into the engine's space, within its progress timeout when a message is under
/// way; the descriptors that came with it go to the engine too.
async fn read_into(socket: &Arc<Socket>, inbound: &mut Inbound) -> Result<()> {
    let deadline = inbound.poll_timeout();
    let read = socket.read(inbound.recv_space(), true);
    let got = match deadline {
        Some(at) => match tokio::time::timeout_at(at.into(), read).await {
            Ok(got) => got,
            // The timer is the judge (its clock may run apart from the engine's).
            Err(_) => return Err(inbound.handle_timeout(at).expect_err("at the deadline").into()),
        },
        None => read.await,
    }
    .map_err(|e| Error::io("reading from the peer", e))?;
    Ok(inbound.handle_read(got.bytes, got.fds, got.truncated, Instant::now())?)
}

async fn read_messages(
    node: &Arc<NodeInner>,
    peer: &Peer,
    socket: &Arc<Socket>,
    conn: &mut Established<Waiter>,
    release: Option<&Release>,
) -> Result<()> {
    let mut delivery: Option<Delivery> = None;
    loop {
        let event = match conn.poll(Instant::now())? {
            Step::Read => {
                // The peer leaves our answers unread: nothing more of its is read or
                // answered until they drain (spec §9.1).
                socket.drained(node.ctx.bounds.max_pull_answers).await;
                read_into(socket, conn.inbound()).await?;
                continue;
            }
            Step::Room => {
                // A large header takes room before it is read (the connection waits, not
                // the node); the whole message takes room before any frame is read. While
                // we wait for answers on this connection the engine raises the bounds, and
                // whether we ask changes unannounced: looked at again every `ROOM_RECHECK`.
                let attempt = || conn.try_take_room(Instant::now()).then_some(());
                node.ctx.budget.wait_for(Some(receive::ROOM_RECHECK), attempt).await;
                continue;
            }
            Step::Answer { waiter, answer } => {
                let _ = waiter.send(answer);
                continue;
            }
            Step::Pulled { waiter, bytes, digest } => {
                let digest = match digest {
                    Digest::None => None,
                    Digest::Hashed(d) => Some(d),
                    // The helper thread reads `bytes` until it is done: wait for it first.
                    Digest::Behind(behind) => finish_hash(behind, bytes.clone()).await,
                };
                let _ = waiter.send(Ok(Answer::Bytes(bytes, digest)));
                continue;
            }
            Step::Unclaimed { digest, bytes } => {
                // A helper thread may still read the bytes: it finishes before they go.
                if let Digest::Behind(behind) = digest {
                    finish_hash(behind, bytes).await;
                }
                continue;
            }
            Step::Closed => return Ok(()),
            Step::Event(event) => event,
        };
        match event {
            Event::Message(incoming) => {
                let (eager, bytes) = (incoming.eager_tickets, incoming.eager_ticket_bytes);
                let frames = incoming
                    .frames
                    .into_iter()
                    .map(|frame| received_frame(node, peer, frame, release))
                    .collect::<Result<Vec<_>>>()?;
                let envelope = Envelope {
                    from: peer.clone(),
                    type_name: incoming.type_name.into(),
                    payload: Payload::Encoded {
                        body: incoming.body,
                        frames,
                    },
                    permit: incoming.permit,
                };
                let queued = delivery.as_ref().is_some_and(Delivery::busy);
                match received::redeem_first(eager, bytes, node.ctx.settings.redeem, queued) {
                    // Redeemed by a task of its own, so this loop keeps reading the owner's
                    // answers; later messages queue behind it to keep their order. The queue
                    // is bounded by the budget: each envelope in it holds its room.
                    Some(tickets) => delivery
                        .get_or_insert_with(|| Delivery::start(node.clone()))
                        .push(envelope, tickets),
                    None => node.deliver(envelope)?,
                }
            }
            Event::Owner { answer, .. } => answer_as_owner(node, peer, socket, answer).await,
            Event::Release(leases) => {
                let Link::Shm(link) = &peer.0.link else {
                    unreachable!("the engine takes releases only on shared-memory connections")
                };
                let ended = link.release(&leases);
                if ended < leases.len() {
                    tracing::debug!(
                        node = %node.ctx.me.name,
                        peer = %peer.name(),
                        "{} released leases were unknown (already ended)",
                        leases.len() - ended
                    );
                }
            }
            Event::PeerRefused { code, message } => {
                return Err(Error::Refused {
                    peer: peer.name().to_string(),
                    code,
                    message,
                })
            }
            // The engine answers the peer's requests itself (`with_owner`), and hands the
            // answers to ours to their requests: what is left is an answer nobody asked for.
            Event::Ticket(_) | Event::Pulled { .. } | Event::PulledMismatch { .. } => {}
        }
    }
}

/// Waits, off the runtime's threads, for the helper thread that hashes a pulled answer.
/// `bytes` are the bytes it reads: they stay alive until it stopped, even if this wait is
/// cancelled (the connection's reader stopped).
async fn finish_hash(behind: Box<dyn handoff_proto::inbound::HashBehind>, bytes: Bytes) -> Option<[u8; 32]> {
    tokio::task::spawn_blocking(move || {
        let digest = behind.finish();
        drop(bytes);
        digest
    })
    .await
    .ok()
    .flatten()
}

/// A received frame as the application sees it: bytes, a mapped shared-memory view, or a
/// ticket to redeem.
fn received_frame(node: &Arc<NodeInner>, peer: &Peer, frame: Frame, release: Option<&Release>) -> Result<Buffer> {
    Ok(match frame {
        Frame::Bytes(bytes) => Buffer::from(bytes),
        Frame::Mapped {
            mapping,
            at,
            len,
            lease,
        } => {
            let release = release.expect("shm frames only on shm links").clone();
            let view = RemoteView::new(mapping, at, len as usize, lease, release)
                .ok_or_else(|| WireError::BadShm("a frame outside its mapping".into()))?;
            shm::remote_buffer(view)
        }
        Frame::Shm { .. } => unreachable!("the engine maps segments itself (with_mappings)"),
        Frame::Ticket(claim) => {
            let connected_name = |id: &str| node.peer_by_id(id).map(|p| p.name().to_string());
            let owner_label = received::owner_label_at_receipt(&claim, &peer.0.remote, connected_name);
            let handle = Arc::new(TicketHandle::held(claim, &node.ctx, peer.0.local.clone(), owner_label));
            Buffer::with_origin(Bytes::new(), Arc::new(TicketOrigin(handle)))
        }
        // The sender's GPU memory (spec §7.10): mapped here if it can be; the hold on its
        // lease ends with the last handle, as a ticket's does.
        Frame::Device(claim) => {
            let owner = &peer.0.remote.node_id;
            let hold = Arc::new(TicketHandle::held(
                received::device_hold(&claim, owner),
                &node.ctx,
                peer.0.local.clone(),
                peer.name().to_string(),
            ));
            Buffer::from(DeviceBuffer::received(&claim, hold))
        }
    })
}

/// Carries out the owner's answer to a ticket request: queued for the peer, counted until
/// written (a peer that leaves them unread stops being read). A host copy of device memory
/// is made on a blocking thread first, while this connection's reader waits for it: a long
/// copy holds up only the peer that asked (spec §9.1).
async fn answer_as_owner(node: &Arc<NodeInner>, peer: &Peer, socket: &Arc<Socket>, answer: OwnerAnswer) {
    let answer = match answer {
        OwnerAnswer::CopyThenPull { req, copy } => {
            let copying = tokio::task::spawn_blocking(move || OwnerAnswer::CopyThenPull { req, copy }.finish());
            // (An error only if the copy panicked: the holder is refused, and hears at once.)
            copying.await.unwrap_or_else(|_| OwnerAnswer::copy_broke(req))
        }
        other => other,
    };
    match &answer {
        OwnerAnswer::Refused { what, refusal: r, .. } => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "refused a {what}: {} [{}]", r.message, r.code)
        }
        OwnerAnswer::ReleaseIgnored(r) => {
            tracing::debug!(node = %node.ctx.me.name, peer = %peer.name(), "ignored a release: {} [{}]", r.message, r.code)
        }
        OwnerAnswer::RenewalRefused(r) => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "refused a renewal: {} [{}]", r.message, r.code)
        }
        _ => {}
    }
    socket.queue_answer(answer).await;
}

/// Messages of one connection that wait for their tickets to be redeemed, in order, each
/// with the bytes of its tickets to redeem (the engine's `eager_ticket_bytes`), handed to
/// the task that redeems them; the engine's [`Redemptions`] counts them.
struct Delivery {
    tx: mpsc::UnboundedSender<(Envelope, u64)>,
    queue: Arc<Redemptions>,
}

impl Delivery {
    fn start(node: Arc<NodeInner>) -> Delivery {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Envelope, u64)>();
        let queue = Arc::new(Redemptions::default());
        let counts = queue.clone();
        tokio::spawn(async move {
            while let Some((mut envelope, tickets)) = rx.recv().await {
                counts.started(room_of(&envelope));
                redeem_all(&node, &mut envelope, tickets, &counts).await;
                let delivered = node.deliver(envelope);
                counts.finished();
                if delivered.is_err() {
                    return;
                }
            }
        });
        Delivery { tx, queue }
    }

    fn busy(&self) -> bool {
        self.queue.busy()
    }

    fn push(&self, envelope: Envelope, tickets: u64) {
        let room = room_of(&envelope);
        self.queue.queued(room);
        if self.tx.send((envelope, tickets)).is_err() {
            self.queue.withdrawn(room);
        }
    }
}

fn room_of(envelope: &Envelope) -> u64 {
    envelope.permit.as_ref().map_or(0, |p| p.bytes())
}

/// Pulls every ticket of an envelope; on failure the envelope carries the error instead.
///
/// The pulled bytes count against the sender's budget with the rest of the message, and
/// are admitted before the pulls are sent (spec §9.1): the redemption, not the connection's
/// reader, waits for room, so the owner's answers on that connection are still read.
/// `tickets` is the bytes of its tickets to redeem, `behind` the room of the messages queued
/// after it.
async fn redeem_all(node: &NodeInner, envelope: &mut Envelope, tickets: u64, behind: &Redemptions) {
    let Payload::Encoded { frames, .. } = &mut envelope.payload else {
        return;
    };
    if tickets > 0 {
        if let Some(permit) = envelope.permit.as_mut() {
            // Room given back wakes it; so does, within `ROOM_RECHECK`, a message queued
            // behind it (which the budget is not told of) or the node shutting down.
            let room = node
                .ctx
                .budget
                .wait_for(Some(receive::ROOM_RECHECK), || {
                    if node.ctx.is_shut_down() {
                        return Some(false);
                    }
                    permit.try_expand_ahead(tickets, behind.room_behind()).then_some(true)
                })
                .await;
            if !room {
                envelope.payload = Payload::Failed(Box::new(Error::NodeClosed));
                return;
            }
        }
    }
    for frame in frames.iter_mut() {
        if let Some(ticket) = Ticket::of(frame).filter(|t| !t.is_on_demand()) {
            match ticket.redeem().await {
                Ok(bytes) => *frame = bytes,
                Err(e) => {
                    limited_warn!(envelope.from.0.log, from = %envelope.from.name(), "a ticket could not be redeemed: {}", e.chain());
                    envelope.payload = Payload::Failed(Box::new(e));
                    return;
                }
            }
        }
    }
}

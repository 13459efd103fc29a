//! Receiving: the read loop of a connection, what it does with each kind of header,
//! and the release messages for shared-memory views.
//!
//! Everything a peer can make the loop hold is bounded (spec §9.1): a message's bytes take
//! room in the node's receive budget before they are read (the loop stops reading this
//! connection while there is none), `pulled` answers being written take one of a few
//! places, and a `pulled` nobody asked for is read into a small buffer and dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use handoff_proto::receive::{self, Pulled, Receiving, Step};
use handoff_proto::ticket_leases::OwnerAnswer;
use handoff_wire::{Buffer, Descriptor, Header, TicketOp, WireError};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use crate::budget::Permit;
use crate::envelope::Envelope;
use crate::handshake::{DRAIN_BYTES, DRAIN_TIME};
use crate::io::{FdSource, MessageReader};
use crate::limited_warn;
use crate::link::{Link, ShmLink};
use crate::payload::Payload;
use crate::shm::{self, RemoteView};
use crate::state::NodeInner;
use crate::tickets::holder::{Ticket, TicketHandle, TicketOrigin};
use crate::tickets::modes::Redeem;
use crate::tickets::pending::Answer;
use crate::{Error, Peer, Result};

/// Sends `release` messages for the leases whose last local view was dropped.
pub(crate) async fn release_loop(
    link: Arc<ShmLink>,
    mut rx: mpsc::UnboundedReceiver<u64>,
    mut closed: tokio::sync::oneshot::Receiver<()>,
    write_timeout: std::time::Duration,
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
        if crate::io::write_all(&mut *w, &head, write_timeout).await.is_err() {
            return;
        }
    }
}

/// Receives messages from one peer until it closes or breaks the protocol.
pub(crate) async fn read_loop<R>(
    node: Arc<NodeInner>,
    peer: Peer,
    mut reader: MessageReader<R>,
    releases: Option<mpsc::UnboundedSender<u64>>,
) where
    R: AsyncRead + FdSource + Unpin,
{
    let _counted = node.connection_guard();
    let mut shutdown = node.ctx.shutdown.subscribe();
    let result = tokio::select! {
        r = read_messages(&node, &peer, &mut reader, releases.as_ref()) => r,
        _ = shutdown.changed() => Ok(()),
    };
    peer.mark_closed();
    node.remove_peer(&peer);
    // Requests waiting on this connection fail now (their senders drop), and every hold
    // the peer had on our leases ends with its connection.
    peer.0.pending.lock().expect("pending lock").clear();
    // A node may hold a second connection to us (the switch from TCP to its Unix socket):
    // its holds end with the last one.
    if node.peer_by_id(&peer.0.remote.node_id).is_none() {
        let ended = node.ctx.leases.drop_holder(&peer.0.remote.node_id);
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
            if !matches!(w, WireError::Timeout(_)) {
                reader.drain(DRAIN_BYTES, DRAIN_TIME).await;
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

/// How often a connection waiting for room looks again whether its own ticket requests
/// are outstanding (they change without the budget being told).
const ROOM_RECHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// Takes room in the receive budget for `bytes` (and `messages`) of this peer's — more
/// room for `permit`, if given — waiting, and so not reading the connection, until there
/// is some.
///
/// While this node waits for answers to its own ticket requests on this connection (an
/// eager redemption), those answers may lie behind the message that waits: the bounds are
/// then raised by one per-peer bound (spec §9.1), so the stream moves on and the answers
/// arrive. A peer can thus hold at most twice its bound, and only while we asked it for
/// something.
async fn room(
    node: &Arc<NodeInner>,
    peer: &Peer,
    permit: Option<&mut Permit>,
    bytes: u64,
    messages: usize,
) -> Option<Permit> {
    let mut permit = permit;
    loop {
        let freed = node.ctx.budget.freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let asking = !peer.0.pending.lock().expect("pending lock").is_empty();
        let slack = receive::room_slack(asking, node.ctx.budget.max_per_peer());
        match permit.as_deref_mut() {
            Some(p) => {
                if p.try_expand(bytes, messages, slack) {
                    return None;
                }
            }
            None => {
                if let Some(p) = node.ctx.budget.try_acquire(&peer.0.account, bytes, messages, slack) {
                    return Some(p);
                }
            }
        }
        let _ = tokio::time::timeout(ROOM_RECHECK, freed).await;
    }
}

async fn read_messages<R>(
    node: &Arc<NodeInner>,
    peer: &Peer,
    reader: &mut MessageReader<R>,
    releases: Option<&mpsc::UnboundedSender<u64>>,
) -> Result<()>
where
    R: AsyncRead + FdSource + Unpin,
{
    let receiving = Receiving::new(node.ctx.limits, releases.is_some());
    let mut delivery: Option<Delivery> = None;
    loop {
        let Some(len) = reader.next_header_len(&node.ctx.limits).await? else {
            return Ok(());
        };
        // A large header takes room before it is read: the connection waits, not the node.
        let mut permit = match receiving.header_room(len) {
            Some(bytes) => room(node, peer, None, bytes, 0).await,
            None => None,
        };
        let header_bytes = reader.read_header_of(len).await?;
        if let Some(problem) = reader.stream_mut().take_fd_error() {
            return Err(WireError::BadShm(problem).into());
        }
        match receiving.plan(&header_bytes, |name| node.ctx.registry.check(name))? {
            Step::Message(plan) => {
                // The whole message takes room before any frame is read or mapped.
                let message_permit = match permit.take() {
                    Some(mut p) => {
                        room(node, peer, Some(&mut p), plan.room, 1).await;
                        p
                    }
                    None => room(node, peer, None, plan.room + len as u64, 1)
                        .await
                        .expect("a new permit"),
                };
                let received = read_frames(node, peer, reader, &plan, releases).await?;
                receive::stray_descriptors(reader.stream_mut().pending_fds(), reader.buffered())?;
                let envelope = Envelope {
                    from: peer.clone(),
                    type_name: plan.type_name.to_string(),
                    payload: Payload::Encoded {
                        body: header_bytes.slice_ref(plan.body),
                        frames: received,
                    },
                    permit: Some(message_permit),
                };
                let queued = delivery.as_ref().is_some_and(Delivery::busy);
                if (plan.eager_tickets && node.ctx.redeem == Redeem::Eager) || queued {
                    // Redeemed by a task of its own, so this loop keeps reading the owner's
                    // answers; later messages queue behind it to keep their order. The queue
                    // is bounded by the budget: each envelope in it holds its room.
                    delivery
                        .get_or_insert_with(|| Delivery::start(node.clone()))
                        .push(envelope);
                } else {
                    node.deliver(envelope).await?;
                }
            }
            Step::Ticket(op) => handle_ticket_op(node, peer, reader, op).await?,
            Step::Release(leases) => {
                let Link::Shm(link) = &peer.0.link else {
                    unreachable!("the plan takes releases only on shared-memory connections")
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
            Step::PeerRefused { code, message } => {
                return Err(Error::Refused {
                    peer: peer.name().to_string(),
                    code,
                    message,
                })
            }
        }
    }
}

/// Reads (or maps, or takes the ticket of) each frame of a message whose room is taken.
async fn read_frames<R>(
    node: &Arc<NodeInner>,
    peer: &Peer,
    reader: &mut MessageReader<R>,
    plan: &receive::MessagePlan<'_>,
    releases: Option<&mpsc::UnboundedSender<u64>>,
) -> Result<Vec<Buffer>>
where
    R: AsyncRead + FdSource + Unpin,
{
    let announced = plan.descriptors;
    let fds = reader.stream_mut().take_fds(announced);
    receive::check_descriptors(announced, fds.as_ref().map_or(0, Vec::len))?;
    let mut fds = fds.unwrap_or_default().into_iter();
    let mut received = Vec::with_capacity(plan.frames.len());
    for (desc, &len) in plan.frames.iter().zip(&plan.inline_lengths) {
        let buffer = match desc {
            Descriptor::Shm {
                len,
                offset,
                size,
                lease,
                sealed,
            } => {
                let fd = fds.next().expect("counted above");
                let (mapping, at) = node
                    .ctx
                    .mappings
                    .map(fd, *size, *sealed, *offset, *len)
                    .map_err(|e| WireError::BadShm(e.0))?;
                shm::remote_buffer(RemoteView {
                    mapping,
                    offset: at,
                    len: *len as usize,
                    lease: *lease,
                    release: releases.expect("shm frames only on shm links").clone(),
                })
            }
            Descriptor::Ticket(claim) => {
                let owner_name = if claim.owner == peer.0.remote.node_id {
                    Some(peer.name().to_string())
                } else {
                    node.peer_by_id(&claim.owner).map(|p| p.name().to_string())
                };
                let owner_label = match (owner_name, &claim.addr) {
                    (Some(n), Some(a)) => format!("{n} ({a})"),
                    (Some(n), None) => n,
                    (None, Some(a)) => format!("{} ({a})", &claim.owner[..claim.owner.len().min(12)]),
                    (None, None) => claim.owner.clone(),
                };
                let handle = Arc::new(TicketHandle {
                    claim: claim.clone(),
                    node: peer.0.local.clone(),
                    owner_label,
                });
                Buffer::with_origin(Bytes::new(), Arc::new(TicketOrigin(handle)))
            }
            _ => Buffer::from(reader.read_frame(len, &node.ctx.pool).await?),
        };
        received.push(buffer);
    }
    Ok(received)
}

/// The ticket protocol on a connection: as the owner, answer pulls and forwards and take
/// releases and renewals; as a holder, hand answers to the requests waiting for them.
async fn handle_ticket_op<R>(
    node: &Arc<NodeInner>,
    peer: &Peer,
    reader: &mut MessageReader<R>,
    op: TicketOp,
) -> Result<()>
where
    R: AsyncRead + FdSource + Unpin,
{
    let holder = peer.0.remote.node_id.as_str();
    if let Some(owner_answer) = node.ctx.leases.answer(&op, holder, &node.ctx.me.node_id) {
        return answer_as_owner(node, peer, owner_answer).await;
    }
    match op {
        TicketOp::Pulled { req, len } => {
            let waiting = peer.0.pending.lock().expect("pending lock").asked(req);
            match receive::pulled(waiting, len) {
                Pulled::Read { hash } => {
                    let mut hasher = hash.then(blake3::Hasher::new);
                    let bytes = reader.read_frame_hashing(len, &node.ctx.pool, hasher.as_mut()).await?;
                    let digest = hasher.map(|h| *h.finalize().as_bytes());
                    answer(peer, req, Ok(Answer::Bytes(bytes, digest)));
                }
                Pulled::Mismatch(why) => {
                    // Not what we asked for: read past it without allocating it.
                    reader.discard(len).await?;
                    answer(peer, req, Ok(Answer::Mismatch(why)));
                }
                Pulled::Drop => reader.discard(len).await?,
            }
        }
        TicketOp::Forwarded { req, token } => answer(peer, req, Ok(Answer::Token(token))),
        TicketOp::Refused { req, code, message } => answer(
            peer,
            req,
            Err(Error::TicketRefused {
                owner: peer.name().to_string(),
                lease: 0,
                what: "request",
                code,
                message,
            }),
        ),
        TicketOp::Pull { .. } | TicketOp::Forward { .. } | TicketOp::Unlease { .. } | TicketOp::Renew { .. } => {
            unreachable!("the owner's side answered it")
        }
    }
    Ok(())
}

/// Carries out the owner's answer to a ticket request.
async fn answer_as_owner(node: &Arc<NodeInner>, peer: &Peer, owner_answer: OwnerAnswer) -> Result<()> {
    match owner_answer {
        OwnerAnswer::Pulled { req, bytes } => {
            let len = bytes.len() as u64;
            // Written by a task: a large answer must not stop this loop from reading.
            // Only so many at once: past that, this loop waits, and so reads no more
            // requests from this peer until its answers drain.
            let place = peer
                .0
                .pull_answers
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let peer = peer.clone();
            tokio::spawn(async move {
                let answer = Header::Ticket(TicketOp::Pulled { req, len });
                if let Err(e) = peer.write_control(&answer, &[bytes]).await {
                    tracing::debug!(peer = %peer.name(), "could not answer a pull: {}", e.chain());
                }
                drop(place);
            });
        }
        OwnerAnswer::Forwarded { req, token } => {
            let answer = TicketOp::Forwarded {
                req,
                token: token.to_vec(),
            };
            peer.write_control(&Header::Ticket(answer), &[]).await?;
        }
        // A refusal is small: answered in place, no task per refusal.
        OwnerAnswer::Refused { req, what, refusal: r } => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "refused a {what}: {} [{}]", r.message, r.code);
            let answer = TicketOp::Refused {
                req,
                code: r.code.to_string(),
                message: r.message,
            };
            peer.write_control(&Header::Ticket(answer), &[]).await?;
        }
        OwnerAnswer::Done => {}
        OwnerAnswer::ReleaseIgnored(r) => {
            tracing::debug!(node = %node.ctx.me.name, peer = %peer.name(), "ignored a release: {} [{}]", r.message, r.code);
        }
        OwnerAnswer::RenewalRefused(r) => {
            limited_warn!(peer.0.log, node = %node.ctx.me.name, peer = %peer.name(), "refused a renewal: {} [{}]", r.message, r.code);
        }
    }
    Ok(())
}

/// Completes the request `req` waiting on this connection (a late answer is dropped).
fn answer(peer: &Peer, req: u64, result: Result<Answer>) {
    let waiter = peer.0.pending.lock().expect("pending lock").complete(req);
    if let Some(tx) = waiter {
        let _ = tx.send(result);
    }
}

/// Messages of one connection that wait for their tickets to be redeemed, in order.
struct Delivery {
    tx: mpsc::UnboundedSender<Envelope>,
    queued: Arc<AtomicUsize>,
}

impl Delivery {
    fn start(node: Arc<NodeInner>) -> Delivery {
        let (tx, mut rx) = mpsc::unbounded_channel::<Envelope>();
        let queued = Arc::new(AtomicUsize::new(0));
        let count = queued.clone();
        tokio::spawn(async move {
            while let Some(mut envelope) = rx.recv().await {
                redeem_all(&mut envelope).await;
                let delivered = node.deliver(envelope).await;
                count.fetch_sub(1, Ordering::AcqRel);
                if delivered.is_err() {
                    return;
                }
            }
        });
        Delivery { tx, queued }
    }

    fn busy(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    fn push(&self, envelope: Envelope) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(envelope).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Pulls every ticket of an envelope; on failure the envelope carries the error instead.
/// The pulled bytes count against the sender's budget with the rest of the message (they
/// are bounded by our own requests, so they never wait for room).
async fn redeem_all(envelope: &mut Envelope) {
    let Payload::Encoded { frames, .. } = &mut envelope.payload else {
        return;
    };
    for frame in frames.iter_mut() {
        if let Some(ticket) = Ticket::of(frame).filter(|t| !t.is_on_demand()) {
            match ticket.redeem().await {
                Ok(bytes) => {
                    if let Some(p) = envelope.permit.as_mut() {
                        p.grow(bytes.len() as u64);
                    }
                    *frame = bytes;
                }
                Err(e) => {
                    limited_warn!(envelope.from.0.log, from = %envelope.from.name(), "a ticket could not be redeemed: {}", e.chain());
                    envelope.payload = Payload::Failed(e);
                    return;
                }
            }
        }
    }
}

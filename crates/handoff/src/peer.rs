//! [`Peer`]: a connected node, and how messages reach it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Channel, Endpoint, Header, Locality, Route};

use crate::budget::Account;
use crate::context::LocalNode;
use crate::device::DeviceBuffer;
use crate::link::{unsendable, LeaseStats, Link, Planned, Sending};
use crate::payload::Payload;
use crate::tickets::holder::Ticket;
use crate::tickets::modes::OnDemand;
use crate::tickets::pending::Waiter;
use crate::{Error, Message, Result};
use handoff_proto::log_limit::LogLimiter;
use handoff_proto::outbound::issued_leases;
use handoff_proto::send_policy::{self, issued_claim, FramePlan, TicketPolicy};
use handoff_proto::ticket_requests::Requests;

pub(crate) struct PeerInner {
    pub(crate) remote: Endpoint,
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    /// The wire protocol version of the connection; `None` in process.
    pub(crate) version: Option<u16>,
    pub(crate) outbound: Arc<Route>,
    pub(crate) inbound: Arc<Route>,
    pub(crate) link: Link,
    pub(crate) closed: AtomicBool,
    /// Told when `closed` is set: a send waiting for room gives up then.
    closing: tokio::sync::Notify,
    /// Encode even in-process (the test switch that keeps both paths equal).
    pub(crate) force_encode: bool,
    /// The node this peer belongs to (for tickets: its leases and settings).
    pub(crate) local: Weak<dyn LocalNode>,
    /// Ticket requests sent on this connection, waiting for the owner's answer.
    pub(crate) pending: Arc<StdMutex<Requests<Waiter>>>,
    /// This peer's share of the node's receive budget.
    pub(crate) account: Arc<Account>,
    /// Warnings about this peer, at most so many per period.
    pub(crate) log: LogLimiter,
    /// How long a write to this peer may make no progress.
    pub(crate) write_timeout: Duration,
}

impl PeerInner {
    /// Writes a control header on this connection, within the write timeout (a stall fails
    /// the connection).
    pub(crate) async fn write_control(&self, header: &Header<'_>) -> Result<()> {
        let mut head = Vec::with_capacity(96);
        encode_header_into(header, &mut head);
        let sent = match self.link.socket() {
            Some(socket) => socket.send(Bytes::from(head), Vec::new(), Vec::new(), || {}).await,
            None => Err(std::io::Error::other("no socket protocol between in-process nodes")),
        };
        sent.map_err(|e| {
            self.mark_closed();
            Error::io(format!("writing to {}", self.remote.name), e)
        })
    }

    /// Queues our `unlease` (a header that wants no answer) on this connection, without
    /// waiting for it to be written; `false` when it was dropped (see
    /// `Socket::queue_unlease`): the hold's deadline ends it then.
    pub(crate) async fn queue_unlease(&self, header: &Header<'_>) -> bool {
        let Some(socket) = self.link.socket() else { return false };
        let mut head = Vec::with_capacity(96);
        encode_header_into(header, &mut head);
        socket.queue_unlease(Bytes::from(head)).await
    }

    /// Marks the connection closed; a send waiting for room gives up.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.notify_waiters();
    }

    /// Shuts our sending direction down once what is queued is written (TLS's close_notify
    /// last), within the write timeout and a second at most: the peer sees the end of the
    /// stream.
    pub(crate) async fn shutdown_writing(&self) {
        if let Some(socket) = self.link.socket() {
            let limit = self.write_timeout.min(Duration::from_secs(1));
            socket.say_and_shutdown(Vec::new(), limit).await;
        }
    }
}

/// A connected node: send it messages, ask how it is reached.
///
/// Cheap to clone. Obtained from [`Node::connect`](crate::Node::connect),
/// [`Node::peer`](crate::Node::peer) or [`Envelope::from`].
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<PeerInner>);

/// What the handshake told us about a peer, besides its endpoint.
#[derive(Default)]
pub(crate) struct PeerAddrs {
    pub(crate) listen: Option<String>,
    pub(crate) unix: Option<String>,
    /// The protocol version the preambles chose; `None` in process.
    pub(crate) version: Option<u16>,
}

impl Peer {
    pub(crate) fn new<N: LocalNode + 'static>(
        node: &Arc<N>,
        remote: Endpoint,
        addrs: PeerAddrs,
        channel: Channel,
        link: Link,
        force_encode: bool,
    ) -> Peer {
        let ctx = node.context();
        let (outbound, inbound) = handoff_proto::peers::routes(&ctx.me, &remote, channel);
        Peer(Arc::new(PeerInner {
            remote,
            listen: addrs.listen,
            unix: addrs.unix,
            version: addrs.version,
            outbound: Arc::new(outbound),
            inbound: Arc::new(inbound),
            link,
            closed: AtomicBool::new(false),
            closing: tokio::sync::Notify::new(),
            force_encode,
            local: Arc::downgrade(node) as Weak<dyn LocalNode>,
            pending: Arc::default(),
            account: Arc::default(),
            log: LogLimiter::under(
                ctx.node_log.clone(),
                ctx.bounds.warnings_per_period,
                ctx.bounds.warning_period,
            ),
            write_timeout: ctx.bounds.write_timeout,
        }))
    }

    /// The peer's node name.
    pub fn name(&self) -> &str {
        &self.0.remote.name
    }

    /// What the peer said about itself in the handshake.
    pub fn endpoint(&self) -> &Endpoint {
        &self.0.remote
    }

    /// The address the peer listens on, if it announced one.
    pub fn listen_addr(&self) -> Option<&str> {
        self.0.listen.as_deref()
    }

    /// The peer's Unix socket for same-host connections, if it announced one.
    pub fn unix_addr(&self) -> Option<&str> {
        self.0.unix.as_deref()
    }

    /// The wire protocol version the connection runs (spec §3): 2, or 1 with a peer that
    /// speaks nothing newer when this node accepts v1 peers; `None` for an in-process peer.
    pub fn protocol_version(&self) -> Option<u16> {
        self.0.version
    }

    /// The route messages to this peer take.
    pub fn route(&self) -> &Arc<Route> {
        &self.0.outbound
    }

    pub(crate) fn inbound_route(&self) -> &Arc<Route> {
        &self.0.inbound
    }

    /// How near the peer is.
    pub fn locality(&self) -> Locality {
        self.0.outbound.locality
    }

    /// The channel messages to this peer use.
    pub fn channel(&self) -> Channel {
        self.0.outbound.channel
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Whether a ticket request of ours waits for its answer on this connection.
    pub(crate) fn has_requests(&self) -> bool {
        !self.0.pending.lock().expect("pending lock").is_empty()
    }

    /// Closes the connection at once, in both directions, whatever is queued (the peer
    /// sees it end; our read loop ends too, and the peer goes with it).
    pub(crate) fn abort(&self) {
        self.0.mark_closed();
        if let Some(socket) = self.0.link.socket() {
            socket.abort();
        }
    }

    /// Bytes of this peer's messages the node holds now: read, and not yet taken by the
    /// application (bounded by [`Bounds::max_buffered_bytes_per_peer`](crate::Bounds)).
    pub fn buffered_bytes(&self) -> u64 {
        self.0.account.bytes()
    }

    /// Shared-memory leases this node holds for the peer (zero on other channels).
    pub fn leases(&self) -> LeaseStats {
        match &self.0.link {
            Link::Shm(link) => link.stats(),
            _ => LeaseStats::default(),
        }
    }

    /// Sends `value` to the peer.
    ///
    /// In-process the value is moved and nothing is serialized; to a same-host peer large
    /// buffers travel as shared memory; over TCP the value is encoded for this route and
    /// its buffers are written straight from their memory.
    ///
    /// Dropping the returned future (a `timeout` around it, say) before the message is
    /// queued on the connection sends nothing and ends what was leased for it; once
    /// queued, the message is written in full by the node, so the peer never reads half
    /// of one.
    pub async fn send<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, false).await
    }

    async fn send_inner<T: Message>(&self, value: T, by_ticket: bool) -> Result<()> {
        if self.is_closed() {
            return Err(Error::PeerClosed(self.name().to_string()));
        }
        match &self.0.link {
            Link::Inproc(target) => {
                target.check(T::TYPE_NAME)?;
                // (`force_encode` is set when either node asked for it.)
                let payload = if self.0.force_encode {
                    let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                    Payload::Encoded {
                        body: Bytes::from(encoded.body),
                        frames: encoded.frames,
                    }
                } else {
                    Payload::Value(Box::new(value))
                };
                match target.try_deliver(T::TYPE_NAME, payload)? {
                    Ok(()) => Ok(()),
                    Err(payload) => target.deliver(T::TYPE_NAME, payload).await,
                }
            }
            // The wire path's future is large: boxed, so that an in-process send does not
            // move it around.
            Link::Tcp { .. } | Link::Shm(_) => Box::pin(self.send_wire(value, by_ticket)).await,
        }
    }

    /// Encodes `value` for this route, applies the ticket policy and writes the message.
    async fn send_wire<T: Message>(&self, value: T, by_ticket: bool) -> Result<()> {
        let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
        let limits = self.limits()?;
        // Refused before anything is planned or leased: more frames, or larger
        // ones, than the receiver accepts, or a body alone over its header limit.
        // (A device buffer counts its bytes, as the receiver counts a `cuda` frame's.)
        let lens = encoded
            .frames
            .iter()
            .map(|f| DeviceBuffer::of(f).map_or(f.len() as u64, |d| d.len()));
        limits
            .check_outgoing(encoded.body.len(), lens)
            .map_err(|reason| unsendable(T::TYPE_NAME, self.name(), reason))?;
        let sending = Sending {
            type_name: T::TYPE_NAME,
            peer: self.name(),
            limits: &limits,
            socket_failed: false.into(),
            queued: false.into(),
        };
        // The leases issued for the message end unless it goes: when a frame's plan or the
        // send fails, when the connection is lost, and when the send is dropped before the
        // message was queued.
        let mut issued = Issued {
            peer: self,
            leases: Vec::new(),
            sending: &sending,
        };
        // Planning may wait (for lease room, a redemption, a forward): it gives up when the
        // connection closes meanwhile, and what it issued ends. (Once queued, a message is
        // written, or fails with its connection.)
        let closing = self.0.closing.notified();
        tokio::pin!(closing);
        closing.as_mut().enable();
        if self.is_closed() {
            return Err(Error::PeerClosed(self.name().to_string()));
        }
        let planned = tokio::select! {
            biased;
            planned = self.plan(encoded.frames, by_ticket, &mut issued) => planned?,
            _ = closing => return Err(Error::PeerClosed(self.name().to_string())),
        };
        self.0
            .link
            .send(&sending, &encoded.body, planned)
            .await
            .inspect_err(|_| {
                // Only a failed socket closes the peer; a frame that could not be copied, or
                // a lease that did not come, fails this send alone.
                if sending.lost_the_connection() {
                    self.0.mark_closed();
                }
            })
    }

    /// The limits a receiver enforces: this node's, where smaller than the defaults of spec §9.
    fn limits(&self) -> Result<handoff_wire::Limits> {
        let node = self.0.local.upgrade().ok_or(Error::NodeClosed)?;
        Ok(node.context().limits.for_sending())
    }

    /// Ends the leases of tickets we issued for a message that was not sent after all.
    fn withdraw(&self, issued: &[(u64, Vec<u8>)]) {
        if let Some(node) = self.0.local.upgrade() {
            node.context().leases.withdraw(issued, &self.0.remote.node_id);
        }
    }

    /// Sends `value` with every non-empty buffer as a ticket: the peer pulls the bytes
    /// from us (or from their owner, for tickets we hold), and we keep them under a lease
    /// until it releases them. In-process peers get the value itself.
    pub async fn send_by_ticket<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, true).await
    }

    /// Carries out the ticket policy (`handoff_proto::send_policy`) for each frame; the
    /// leases it issues go to `issued`.
    async fn plan(&self, frames: Vec<Buffer>, by_ticket: bool, issued: &mut Issued<'_, '_>) -> Result<Vec<Planned>> {
        let node = self.0.local.upgrade().ok_or(Error::NodeClosed)?;
        let ctx = node.context();
        let policy = TicketPolicy {
            receiver: &self.0.remote,
            channel: self.channel(),
            threshold: ctx.settings.ticket_threshold,
            by_ticket,
        };
        let mut out = Vec::with_capacity(frames.len());
        for frame in frames {
            let planned = self.plan_frame(&node, &policy, frame).await?;
            issued
                .leases
                .extend(issued_leases(std::slice::from_ref(&planned), &ctx.me.node_id));
            out.push(planned);
        }
        Ok(out)
    }

    /// The ticket policy's answer for one frame, carried out.
    async fn plan_frame(&self, node: &Arc<dyn LocalNode>, policy: &TicketPolicy<'_>, frame: Buffer) -> Result<Planned> {
        let ctx = node.context();
        if let Some(device) = DeviceBuffer::of(&frame) {
            return self.plan_device(node, policy, device).await;
        }
        let held = Ticket::of(&frame);
        let on_demand = OnDemand::of(&frame);
        let kind = match &held {
            Some(ticket) => send_policy::Frame::Held(&ticket.0.claim),
            None => send_policy::Frame::Bytes {
                len: frame.len(),
                on_demand: on_demand.is_some(),
            },
        };
        let to = &self.0.remote.node_id;
        Ok(match policy.plan(kind) {
            // (The device plans answer device frames, which this driver never asks about.)
            FramePlan::Bytes | FramePlan::ShareDevice | FramePlan::CopyDevice => Planned::Bytes(frame),
            FramePlan::RedeemHeld => Planned::Bytes(held.expect("a held ticket").redeem().await?),
            FramePlan::ForwardHeld => {
                let ticket = held.expect("a held ticket");
                let (claim, owner) = (&ticket.0.claim, &ticket.0.owner_label);
                Planned::Ticket(node.clone().forward(claim, owner, to).await?)
            }
            FramePlan::Issue { lazy, xxh3 } => {
                let known_digest = on_demand.and_then(|o| o.digest).or_else(|| frame.known_digest());
                let issued = ctx.leases.issue(&frame, known_digest, xxh3, to, self.name()).await?;
                let (me, addr, ttl) = (&ctx.me.node_id, ctx.listen_addr.clone(), ctx.leases.config.ttl);
                Planned::Ticket(issued_claim(&issued, frame.len() as u64, me, addr, ttl, lazy))
            }
        })
    }

    /// A device buffer by its IPC handle to a peer that maps GPU memory, leased to it until
    /// it lets go; a host copy to any other, or where the memory has no handle (spec §7.10).
    async fn plan_device(
        &self,
        node: &Arc<dyn LocalNode>,
        policy: &TicketPolicy<'_>,
        device: DeviceBuffer,
    ) -> Result<Planned> {
        let ctx = node.context();
        let shared = match (policy.plan(send_policy::Frame::Device), device.leasable()) {
            (FramePlan::ShareDevice, Some((ptr, memory))) => handoff_cuda::driver()
                .ok()
                .and_then(|d| d.export(ptr, device.len()).ok())
                .map(|exported| (exported, memory)),
            _ => None,
        };
        let Some((exported, memory)) = shared else {
            return Ok(Planned::Bytes(Buffer::from(device.to_host().await?)));
        };
        let to = &self.0.remote.node_id;
        let (lease, token) = ctx.leases.issue_device(memory, to, self.name()).await?;
        Ok(Planned::Device(send_policy::device_claim(
            lease,
            token,
            device.len(),
            exported.ipc,
            exported.device,
            exported.offset,
        )))
    }
}

/// The ticket and device leases issued for a message being sent: they end, when this is
/// dropped, unless the message went (`Sending::went`), so that a message that failed, or
/// whose send was dropped, leaves none alive until its deadline.
struct Issued<'a, 'b> {
    peer: &'a Peer,
    leases: Vec<(u64, Vec<u8>)>,
    sending: &'a Sending<'b>,
}

impl Drop for Issued<'_, '_> {
    fn drop(&mut self) {
        if !self.leases.is_empty() && !self.sending.went() {
            self.peer.withdraw(&self.leases);
        }
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name())
            .field("locality", &self.locality())
            .field("channel", &self.channel())
            .finish()
    }
}

//! [`Peer`]: a connected node, and how messages reach it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use handoff_wire::framing::encode_header_into;
use handoff_wire::{Buffer, Channel, Descriptor, Endpoint, Header, Locality, Route, TicketClaim, CAP_XXH3};
use tokio::sync::Semaphore;

use crate::budget::Account;
use crate::context::LocalNode;
use crate::link::{LeaseStats, Link, Planned};
use crate::payload::Payload;
use crate::tickets::holder::Ticket;
use crate::tickets::modes::OnDemand;
use crate::tickets::pending::Waiter;
use crate::{Error, Message, Result};
use handoff_proto::log_limit::LogLimiter;
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
    /// Encode even in-process (the test switch that keeps both paths equal).
    pub(crate) force_encode: bool,
    /// The node this peer belongs to (for tickets: its leases and settings).
    pub(crate) local: Weak<dyn LocalNode>,
    /// Ticket requests sent on this connection, waiting for the owner's answer.
    pub(crate) pending: StdMutex<Requests<Waiter>>,
    /// This peer's share of the node's receive budget.
    pub(crate) account: Arc<Account>,
    /// Warnings about this peer, at most so many per period.
    pub(crate) log: LogLimiter,
    /// `pulled` answers being written to this peer (spec §9.1).
    pub(crate) pull_answers: Arc<Semaphore>,
    /// How long a write to this peer may make no progress.
    pub(crate) write_timeout: Duration,
}

impl PeerInner {
    /// Writes a control header (and its inline bytes) on this connection.
    pub(crate) async fn write_control(&self, header: &Header<'_>, frames: &[Buffer]) -> Result<()> {
        let mut head = Vec::with_capacity(96);
        encode_header_into(header, &mut head);
        self.link.write(&head, frames, self.write_timeout).await.map_err(|e| {
            self.closed.store(true, Ordering::Release);
            Error::io(format!("writing to {}", self.remote.name), e)
        })
    }

    /// Shuts our sending direction down: the peer sees the end of the stream.
    pub(crate) async fn shutdown_writing(&self) {
        self.link
            .shutdown_writing(self.write_timeout.min(Duration::from_secs(1)))
            .await;
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
        let local = &ctx.me;
        let locality = Locality::between(local, &remote);
        let outbound = Arc::new(Route {
            from: local.clone(),
            to: remote.clone(),
            locality,
            channel,
        });
        let inbound = Arc::new(Route {
            from: remote.clone(),
            to: local.clone(),
            locality,
            channel,
        });
        Peer(Arc::new(PeerInner {
            remote,
            listen: addrs.listen,
            unix: addrs.unix,
            version: addrs.version,
            outbound,
            inbound,
            link,
            closed: AtomicBool::new(false),
            force_encode,
            local: Arc::downgrade(node) as Weak<dyn LocalNode>,
            pending: StdMutex::default(),
            account: Arc::default(),
            log: LogLimiter::under(
                ctx.node_log.clone(),
                ctx.bounds.warnings_per_period,
                ctx.bounds.warning_period,
            ),
            pull_answers: Arc::new(Semaphore::new(ctx.bounds.max_pull_answers.max(1))),
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

    pub(crate) fn mark_closed(&self) {
        self.0.closed.store(true, Ordering::Release);
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
    pub async fn send<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, false).await
    }

    async fn send_inner<T: Message>(&self, value: T, by_ticket: bool) -> Result<()> {
        if self.is_closed() {
            return Err(Error::PeerClosed(self.name().to_string()));
        }
        match &self.0.link {
            Link::Inproc(target) => {
                let wants_encoded = target.accepts(T::TYPE_NAME)?;
                let payload = if self.0.force_encode || wants_encoded {
                    let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                    Payload::Encoded {
                        body: Bytes::from(encoded.body),
                        frames: encoded.frames,
                    }
                } else {
                    Payload::Value(Box::new(value))
                };
                target.deliver(T::TYPE_NAME, payload).await
            }
            Link::Tcp { .. } => {
                let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                self.check_sendable(T::TYPE_NAME, encoded.body.len(), &encoded.frames)?;
                let planned = self.plan(encoded.frames, by_ticket).await?;
                let mut descriptors = Vec::with_capacity(planned.len());
                let mut inline = Vec::new();
                for p in planned {
                    match p {
                        Planned::Bytes(b) => {
                            descriptors.push(Descriptor::Inline { len: b.len() as u64 });
                            inline.push(b);
                        }
                        Planned::Ticket(claim) => descriptors.push(Descriptor::Ticket(claim)),
                    }
                }
                let header = Header::Msg {
                    type_name: T::TYPE_NAME,
                    body: &encoded.body,
                    frames: descriptors,
                };
                let mut head = Vec::with_capacity(encoded.body.len() + 64);
                encode_header_into(&header, &mut head);
                if let Err(e) = self.check_header(T::TYPE_NAME, head.len() - 4) {
                    let Header::Msg { frames, .. } = header else {
                        unreachable!("built above")
                    };
                    self.withdraw(frames.iter().filter_map(|d| match d {
                        Descriptor::Ticket(claim) => Some(claim),
                        _ => None,
                    }));
                    return Err(e);
                }
                self.0
                    .link
                    .write(&head, &inline, self.0.write_timeout)
                    .await
                    .map_err(|e| {
                        self.mark_closed();
                        Error::io(format!("sending {} to {}", T::TYPE_NAME, self.name()), e)
                    })
            }
            Link::Shm(link) => {
                let encoded = handoff_wire::encode(&value, Some(&self.0.outbound))?;
                self.check_sendable(T::TYPE_NAME, encoded.body.len(), &encoded.frames)?;
                let planned = self.plan(encoded.frames, by_ticket).await?;
                let tickets: Vec<TicketClaim> = planned
                    .iter()
                    .filter_map(|p| match p {
                        Planned::Ticket(claim) => Some(claim.clone()),
                        Planned::Bytes(_) => None,
                    })
                    .collect();
                let limits = self.limits()?;
                link.send(T::TYPE_NAME, &encoded.body, planned, self.name(), &limits)
                    .await
                    .inspect_err(|e| match e {
                        Error::Io { .. } => self.mark_closed(),
                        Error::Unsendable { .. } => self.withdraw(tickets.iter()),
                        _ => {}
                    })
            }
        }
    }

    /// The limits a receiver enforces, as this node enforces them itself (spec §9).
    fn limits(&self) -> Result<handoff_wire::Limits> {
        let node = self.0.local.upgrade().ok_or(Error::NodeClosed)?;
        Ok(node.context().limits)
    }

    /// Refuses, before anything is planned or leased, a message a receiver would have to
    /// refuse: more frames, or larger ones, than it accepts, or a body that alone is over
    /// its header limit (spec §9).
    fn check_sendable(&self, type_name: &str, body_len: usize, frames: &[Buffer]) -> Result<()> {
        let limits = self.limits()?;
        limits
            .check_outgoing(body_len, frames.iter().map(|f| f.len() as u64))
            .map_err(|reason| Error::Unsendable {
                type_name: type_name.to_string(),
                peer: self.name().to_string(),
                reason: Box::new(reason),
            })
    }

    /// The exact header, once built, against the receiver's header limit.
    fn check_header(&self, type_name: &str, header_len: usize) -> Result<()> {
        let limits = self.limits()?;
        limits
            .check_outgoing(header_len, std::iter::empty())
            .map_err(|reason| Error::Unsendable {
                type_name: type_name.to_string(),
                peer: self.name().to_string(),
                reason: Box::new(reason),
            })
    }

    /// Ends the leases of tickets we issued for a message that was not sent after all.
    fn withdraw<'c>(&self, claims: impl Iterator<Item = &'c TicketClaim>) {
        let Some(node) = self.0.local.upgrade() else {
            return;
        };
        let ctx = node.context();
        for claim in claims.filter(|c| c.owner == ctx.me.node_id) {
            let _ = ctx.leases.unlease(claim.lease, &self.0.remote.node_id, &claim.token);
        }
    }

    /// Sends `value` with every non-empty buffer as a ticket: the peer pulls the bytes
    /// from us (or from their owner, for tickets we hold), and we keep them under a lease
    /// until it releases them. In-process peers get the value itself.
    pub async fn send_by_ticket<T: Message>(&self, value: T) -> Result<()> {
        self.send_inner(value, true).await
    }

    /// Applies the ticket policy to each frame: tickets we hold are forwarded (the owner
    /// registers the peer first), large or requested buffers are leased and sent as tickets.
    async fn plan(&self, frames: Vec<Buffer>, by_ticket: bool) -> Result<Vec<Planned>> {
        let node = self.0.local.upgrade().ok_or(Error::NodeClosed)?;
        let ctx = node.context();
        let to = &self.0.remote.node_id;
        // A peer that did not announce `ticket` gets bytes, never tickets.
        let takes_tickets = self.0.remote.has_capability("ticket");
        let mut out = Vec::with_capacity(frames.len());
        for frame in frames {
            if let Some(ticket) = Ticket::of(&frame) {
                let claim = &ticket.0.claim;
                let digest_ok = claim.digest.sendable_to(&self.0.remote.capabilities);
                if &claim.owner == to || !takes_tickets || !digest_ok {
                    // Back to its owner, to a peer without tickets, or to one that would refuse
                    // the ticket's XXH3 digest (§7.8): send the bytes.
                    out.push(Planned::Bytes(ticket.redeem().await?));
                } else {
                    let (claim, owner) = (&ticket.0.claim, &ticket.0.owner_label);
                    out.push(Planned::Ticket(node.clone().forward(claim, owner, to).await?));
                }
                continue;
            }
            let on_demand = OnDemand::of(&frame);
            let lazy = on_demand.is_some();
            let wanted = by_ticket
                || lazy
                || (self.channel() == Channel::Tcp && ctx.ticket_threshold.is_some_and(|t| frame.len() >= t));
            if wanted && takes_tickets && !frame.is_empty() {
                let known_digest = on_demand.and_then(|o| o.digest).or_else(|| frame.known_digest());
                let xxh3 = self.0.remote.has_capability(CAP_XXH3);
                let issued = ctx.leases.issue(&frame, known_digest, xxh3, to, self.name()).await?;
                out.push(Planned::Ticket(TicketClaim {
                    len: frame.len() as u64,
                    owner: ctx.me.node_id.clone(),
                    addr: ctx.listen_addr.clone(),
                    lease: issued.lease,
                    token: issued.token.to_vec(),
                    digest: issued.digest,
                    ttl_ms: ctx.leases.config.ttl.as_millis() as u64,
                    lazy,
                }));
            } else {
                out.push(Planned::Bytes(frame));
            }
        }
        Ok(out)
    }

    /// Writes a control header (and its inline bytes) on this connection.
    pub(crate) async fn write_control(&self, header: &Header<'_>, frames: &[Buffer]) -> Result<()> {
        self.0.write_control(header, frames).await
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

//! What `handoff node` does with the messages it receives (spec Appendix A), within bounds:
//! no request a peer sends can make the node allocate without limit, keep without limit, or
//! stop answering its other peers.
//!
//! The loop only decodes and dispatches. Each peer's answers (and the work behind them:
//! verifying a payload, preparing one) go through a queue of that peer's own, worked off
//! in order by a task of its own: a peer that sends more than it reads fills only its queue.
//! Work that waits on others (chaos transfers, reading a data handle) runs in tasks, at most
//! a fixed number at once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use handoff::{limited_warn, Buffer, LogLimiter, Message, Node, Peer, Ticket};
use tokio::sync::{mpsc, Semaphore};

use crate::protocol::{
    self, Blob, BlobReceipt, BlobWork, Disconnect, Forward, Held, Hold, Issue, Payload, Ping, RawSend, Receipt,
    Release, Report, SendRequest, Stats, StatsRequest, Take,
};

/// What `handoff node` bounds in the requests it serves (spec Appendix A).
#[derive(Debug, Clone, Copy)]
pub struct ServeBounds {
    /// Largest `bytes` of a `SendRequest`, `RawSend` or `chaos.Issue` (default 1 GiB).
    pub max_request_bytes: u64,
    /// Bytes of such payloads being prepared at once, over all peers (default 2 GiB).
    pub max_preparing_bytes: u64,
    /// Holds kept for one peer (default 1024).
    pub max_held: usize,
    /// Bytes held for one peer (default 4 GiB).
    pub max_held_bytes: u64,
    /// `Forward`s waiting for their `Held` answer (default 1024).
    pub max_relays: usize,
    /// Answers (and the work behind them) queued for one peer (default 64).
    pub queue_depth: usize,
    /// Bytes of received data waiting in one peer's queue (default 1 GiB).
    pub queue_bytes: u64,
    /// Tasks running at once for chaos transfers and data handles (default 64).
    pub max_tasks: usize,
    /// A pause before each message is handled: a slow application, for tests (default 0).
    pub delay: std::time::Duration,
}

impl Default for ServeBounds {
    fn default() -> Self {
        ServeBounds {
            max_request_bytes: 1 << 30,
            max_preparing_bytes: 2 << 30,
            max_held: 1024,
            max_held_bytes: 4 << 30,
            max_relays: 1024,
            queue_depth: 64,
            queue_bytes: 1 << 30,
            max_tasks: 64,
            delay: std::time::Duration::ZERO,
        }
    }
}

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One unit of a peer's queue: the work, and the bytes of received data it keeps.
struct Job {
    cost: u64,
    work: Work,
}

struct Worker {
    peer: Peer,
    tx: mpsc::Sender<Job>,
    queued_bytes: Arc<AtomicU64>,
}

/// The per-peer queues of answers.
pub(crate) struct Queues {
    workers: Mutex<HashMap<String, Worker>>,
    depth: usize,
    max_bytes: u64,
    log: LogLimiter,
}

impl Queues {
    fn new(bounds: &ServeBounds, log: LogLimiter) -> Arc<Queues> {
        Arc::new(Queues {
            workers: Mutex::default(),
            depth: bounds.queue_depth.max(1),
            max_bytes: bounds.queue_bytes,
            log,
        })
    }

    /// Queues `work` for `peer`; drops it, with a warning, when the peer's queue is full.
    fn push(&self, peer: &Peer, cost: u64, work: impl Future<Output = ()> + Send + 'static) {
        let mut workers = self.workers.lock().expect("queues lock");
        // Queues of peers that are gone end with them.
        workers.retain(|_, w| !w.peer.is_closed());
        let id = peer.endpoint().node_id.clone();
        let worker = workers.entry(id).or_insert_with(|| start_worker(peer, self.depth));
        let queued = worker.queued_bytes.load(Ordering::Acquire);
        if queued > 0 && queued + cost > self.max_bytes {
            limited_warn!(self.log, peer = %peer.name(), "dropping a request: {queued} bytes already wait in its queue");
            return;
        }
        worker.queued_bytes.fetch_add(cost, Ordering::AcqRel);
        let job = Job {
            cost,
            work: Box::pin(work),
        };
        if worker.tx.try_send(job).is_err() {
            worker.queued_bytes.fetch_sub(cost, Ordering::AcqRel);
            limited_warn!(
                self.log,
                peer = %peer.name(),
                "dropping an answer: its queue of {} is full (does it read what it is sent?)",
                self.depth
            );
        }
    }

    /// Queues sending `msg` to `peer`.
    fn reply<T: Message>(self: &Arc<Self>, peer: &Peer, msg: T) {
        let to = peer.clone();
        let queues = self.clone();
        self.push(peer, 0, async move {
            if let Err(e) = to.send(msg).await {
                limited_warn!(queues.log, peer = %to.name(), "reply failed: {}", e.chain());
            }
        });
    }
}

fn start_worker(peer: &Peer, depth: usize) -> Worker {
    let (tx, mut rx) = mpsc::channel::<Job>(depth);
    let queued_bytes = Arc::new(AtomicU64::new(0));
    let bytes = queued_bytes.clone();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            job.work.await;
            bytes.fetch_sub(job.cost, Ordering::AcqRel);
        }
    });
    Worker {
        peer: peer.clone(),
        tx,
        queued_bytes,
    }
}

/// What the node keeps for one peer (`Hold`).
#[derive(Default)]
struct Holds {
    items: HashMap<u64, Buffer>,
    bytes: u64,
}

/// The serve loop's state.
struct Server {
    node: Node,
    bounds: ServeBounds,
    queues: Arc<Queues>,
    holds: HashMap<String, (Peer, Holds)>,
    relays: HashMap<u64, Peer>,
    tasks: Arc<Semaphore>,
    preparing: Preparing,
    log: Arc<LogLimiter>,
}

/// Room for payloads being prepared, counted in KiB (a semaphore counts in u32).
#[derive(Clone)]
struct Preparing {
    room: Arc<Semaphore>,
    cap_kib: u32,
}

impl Preparing {
    fn new(max_bytes: u64) -> Preparing {
        let cap_kib = kib(max_bytes).max(1);
        Preparing {
            room: Arc::new(Semaphore::new(cap_kib as usize)),
            cap_kib,
        }
    }

    /// Waits until `bytes` fit among those being prepared (a request larger than the whole
    /// room waits for all of it).
    async fn take(&self, bytes: u64) -> Result<tokio::sync::SemaphorePermit<'_>> {
        self.room
            .acquire_many(kib(bytes).min(self.cap_kib))
            .await
            .context("the node is shutting down")
    }
}

/// Answers demo and bench messages until the node shuts down, with the default bounds.
pub async fn serve(node: &Node) -> Result<()> {
    serve_with(node, ServeBounds::default()).await
}

/// Answers demo and bench messages until the node shuts down.
pub async fn serve_with(node: &Node, bounds: ServeBounds) -> Result<()> {
    let limiter = || LogLimiter::new(node.bounds().warnings_per_period, node.bounds().warning_period);
    let mut server = Server {
        node: node.clone(),
        bounds,
        queues: Queues::new(&bounds, limiter()),
        holds: HashMap::new(),
        relays: HashMap::new(),
        tasks: Arc::new(Semaphore::new(bounds.max_tasks.max(1))),
        preparing: Preparing::new(bounds.max_preparing_bytes),
        log: Arc::new(limiter()),
    };
    loop {
        let env = match node.recv().await {
            Ok(env) => env,
            Err(handoff::Error::NodeClosed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let from = env.from().clone();
        let type_name = env.type_name().to_string();
        if !bounds.delay.is_zero() {
            tokio::time::sleep(bounds.delay).await;
        }
        // A message that cannot be handled is that peer's problem: say so, keep serving.
        if let Err(e) = server.handle(env).await {
            limited_warn!(server.log, peer = %from.name(), type_name = %type_name, "cannot serve a request: {e:#}");
        }
    }
}

fn kib(bytes: u64) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as u64) as u32
}

impl Server {
    async fn handle(&mut self, env: handoff::Envelope) -> Result<()> {
        let from = env.from().clone();
        match env.type_name() {
            Payload::TYPE_NAME => {
                let p: Payload = env.decode()?;
                let cost = p.data.len() as u64;
                let (to, queues) = (from.clone(), self.queues.clone());
                self.queues.push(&from, cost, async move {
                    let receipt = tokio::task::spawn_blocking(move || {
                        let (verified, verify_seconds) = protocol::verify(&p);
                        Receipt {
                            id: p.id,
                            bytes: p.data.len() as u64,
                            verified,
                            verify_seconds,
                        }
                    })
                    .await;
                    if let Ok(receipt) = receipt {
                        if let Err(e) = to.send(receipt).await {
                            limited_warn!(queues.log, peer = %to.name(), "reply failed: {}", e.chain());
                        }
                    }
                });
            }
            SendRequest::TYPE_NAME => {
                let req: SendRequest = env.decode()?;
                self.check_size(req.bytes, "SendRequest")?;
                let (to, queues, preparing) = (from.clone(), self.queues.clone(), self.preparing.clone());
                self.queues.push(&from, 0, async move {
                    let prepared = prepare(&preparing, req.bytes, move || {
                        protocol::try_make_payload(req.id, req.bytes)
                    })
                    .await;
                    match prepared {
                        Ok(payload) => {
                            if let Err(e) = to.send(payload).await {
                                limited_warn!(queues.log, peer = %to.name(), "reply failed: {}", e.chain());
                            }
                        }
                        Err(e) => limited_warn!(queues.log, peer = %to.name(), "cannot prepare a payload: {e:#}"),
                    }
                });
            }
            Ping::TYPE_NAME => self.queues.reply(&from, env.decode::<Ping>()?),
            RawSend::TYPE_NAME => {
                let req: RawSend = env.decode()?;
                self.check_size(req.bytes, "RawSend")?;
                let running = self.task_slot("RawSend")?;
                let (preparing, log) = (self.preparing.clone(), self.log.clone());
                tokio::spawn(async move {
                    let _place = running;
                    let _room = preparing.take(req.bytes).await;
                    if let Err(e) = protocol::raw_send(req).await {
                        limited_warn!(log, "raw stream for the bench failed: {e}");
                    }
                });
            }
            BlobWork::TYPE_NAME => {
                // A handle this node can neither bind nor pull fails to decode: say so, keep serving.
                match env.decode::<BlobWork>() {
                    Ok(work) => match self.task_slot("BlobWork") {
                        Ok(running) => {
                            // Read on a task of its own: a download must not hold up other messages.
                            let queues = self.queues.clone();
                            tokio::spawn(async move {
                                let receipt = protocol::read_blob_work(work).await;
                                drop(running);
                                queues.reply(&from, receipt);
                            });
                        }
                        Err(e) => self.queues.reply(&from, BlobReceipt::failed(work.id, e.to_string())),
                    },
                    Err(e) => self.queues.reply(&from, BlobReceipt::failed(0, e.chain().to_string())),
                }
            }
            Blob::TYPE_NAME => {
                let blob: Blob = env.decode()?;
                let ping = Ping {
                    seq: blob.seq,
                    data: Vec::new(),
                };
                self.queues.reply(&from, ping);
            }
            Hold::TYPE_NAME => {
                let h: Hold = env.decode()?;
                let answer = self.hold(&from, h);
                self.queues.reply(&from, answer);
            }
            Release::TYPE_NAME => {
                let r: Release = env.decode()?;
                let dropped = self.release(&from, r.id);
                let answer = Held {
                    id: r.id,
                    holder: self.node.name().to_string(),
                    bytes: dropped.map_or(0, |d| d.len() as u64),
                    segment: None,
                };
                self.queues.reply(&from, answer);
            }
            Forward::TYPE_NAME => {
                let f: Forward = env.decode()?;
                self.relays.retain(|_, asker| !asker.is_closed());
                anyhow::ensure!(
                    self.relays.len() < self.bounds.max_relays,
                    "{} forwards already wait for their answer, as many as this node allows",
                    self.bounds.max_relays
                );
                let next = self
                    .node
                    .peer(&f.to)
                    .with_context(|| format!("cannot forward: no peer named {:?}", f.to))?;
                self.relays.insert(f.id, from.clone());
                let cost = f.data.len() as u64;
                let hold = Hold { id: f.id, data: f.data };
                let (to, queues) = (next.clone(), self.queues.clone());
                self.queues.push(&next, cost, async move {
                    if let Err(e) = to.send(hold).await {
                        limited_warn!(queues.log, peer = %to.name(), "cannot forward: {}", e.chain());
                    }
                });
            }
            Held::TYPE_NAME => {
                let h: Held = env.decode()?;
                if let Some(asker) = self.relays.remove(&h.id) {
                    self.queues.reply(&asker, h);
                }
            }
            StatsRequest::TYPE_NAME => {
                env.decode::<StatsRequest>()?;
                self.queues.reply(&from, stats(&self.node));
            }
            Disconnect::TYPE_NAME => {
                let d: Disconnect = env.decode()?;
                self.node.disconnect(&d.peer).await;
            }
            Issue::TYPE_NAME => {
                let issue: Issue = env.decode()?;
                self.check_size(issue.bytes, "chaos.Issue")?;
                let running = self.task_slot("chaos.Issue")?;
                let (node, preparing) = (self.node.clone(), self.preparing.clone());
                // Issuing may wait for lease room; do not hold up other messages.
                tokio::spawn(async move {
                    let _place = running;
                    let id = issue.id;
                    let outcome = match issue_take(&node, &preparing, issue).await {
                        Ok(()) => ("issued".to_string(), String::new()),
                        Err(e) => {
                            let kind = e
                                .downcast_ref::<handoff::Error>()
                                .map_or("no-peer".into(), protocol::error_kind);
                            (format!("issue-{kind}"), format!("{e:#}"))
                        }
                    };
                    report(&node, id, outcome).await;
                });
            }
            Take::TYPE_NAME => {
                let take: Take = env.decode()?;
                let running = self.task_slot("chaos.Take")?;
                let node = self.node.clone();
                tokio::spawn(async move {
                    take_and_report(&node, take).await;
                    drop(running);
                });
            }
            other => anyhow::bail!("no handler for the type {other:?}"),
        }
        Ok(())
    }

    fn check_size(&self, bytes: u64, what: &str) -> Result<()> {
        anyhow::ensure!(
            bytes <= self.bounds.max_request_bytes,
            "{what} asks for {bytes} bytes; this node serves at most {} (--max-request-bytes)",
            self.bounds.max_request_bytes
        );
        Ok(())
    }

    fn task_slot(&self, what: &str) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.tasks.clone().try_acquire_owned().map_err(|_| {
            anyhow::anyhow!(
                "busy: {} tasks already run; {what} refused, try again later",
                self.bounds.max_tasks
            )
        })
    }

    /// Drops what is held under `id`: among `from`'s holds first, else any peer's (a hold
    /// made through a `Forward` belongs to the peer that forwarded it).
    fn release(&mut self, from: &Peer, id: u64) -> Option<Buffer> {
        let own = from.endpoint().node_id.clone();
        let key = if self.holds.get(&own).is_some_and(|(_, h)| h.items.contains_key(&id)) {
            own
        } else {
            self.holds
                .iter()
                .find(|(_, (_, h))| h.items.contains_key(&id))
                .map(|(k, _)| k.clone())?
        };
        let (_, holds) = self.holds.get_mut(&key)?;
        let dropped = holds.items.remove(&id)?;
        holds.bytes -= dropped.len() as u64;
        Some(dropped)
    }

    /// Keeps `h` for `from` if its holds have room; the answer says what is held.
    fn hold(&mut self, from: &Peer, h: Hold) -> Held {
        self.holds.retain(|_, (peer, _)| !peer.is_closed());
        let holder = self.node.name().to_string();
        let (_, holds) = self
            .holds
            .entry(from.endpoint().node_id.clone())
            .or_insert_with(|| (from.clone(), Holds::default()));
        let bytes = h.data.len() as u64;
        let replaces = holds.items.get(&h.id).map_or(0, |b| b.len() as u64);
        let room = (holds.items.len() < self.bounds.max_held || replaces > 0)
            && holds.bytes - replaces + bytes <= self.bounds.max_held_bytes;
        if !room {
            limited_warn!(
                self.log,
                peer = %from.name(),
                "not holding {bytes} more bytes: {} holds of {} bytes are kept for it already",
                holds.items.len(),
                holds.bytes
            );
            return Held {
                id: h.id,
                holder,
                bytes: 0,
                segment: None,
            };
        }
        let segment = handoff::shm::segment_info(&h.data);
        holds.bytes = holds.bytes - replaces + bytes;
        holds.items.insert(h.id, h.data);
        Held {
            id: h.id,
            holder,
            bytes,
            segment,
        }
    }
}

/// Runs `make` on a blocking thread once `bytes` fit among those being prepared.
async fn prepare<T: Send + 'static>(
    preparing: &Preparing,
    bytes: u64,
    make: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    let _room = preparing.take(bytes).await?;
    Ok(tokio::task::spawn_blocking(make).await??)
}

/// Chaos, owner side: makes the buffer and sends it by ticket.
async fn issue_take(node: &Node, preparing: &Preparing, issue: Issue) -> Result<()> {
    let id = issue.id;
    let data = prepare(preparing, issue.bytes, move || {
        let mut data = protocol::try_alloc(issue.bytes)?;
        protocol::fill_pattern(&mut data, id);
        Ok(data)
    })
    .await?;
    let take = Take {
        id: issue.id,
        digest: protocol::digest(&data),
        data: Buffer::from(data),
        forward_to: issue.forward_to,
        leak: issue.leak,
    };
    let peer = node.peer(&issue.to).with_context(|| format!("no peer {}", issue.to))?;
    peer.send_by_ticket(take).await?;
    Ok(())
}

/// Chaos, holder side: forwards, leaks, or redeems and verifies, then reports to `chaos`.
async fn take_and_report(node: &Node, take: Take) {
    let id = take.id;
    report(node, id, ("received".into(), String::new())).await;
    let outcome = match (&take.forward_to, Ticket::of(&take.data)) {
        (Some(next), _) => match node.peer(next) {
            Some(p) => {
                let forwarded = Take {
                    forward_to: None,
                    ..take.clone()
                };
                match p.send(forwarded).await {
                    Ok(()) => ("forwarded".to_string(), String::new()),
                    Err(e) => (protocol::error_kind(&e), e.chain().to_string()),
                }
            }
            None => ("no-peer".into(), format!("no peer {next}")),
        },
        (None, Some(ticket)) if take.leak => {
            std::mem::forget(ticket);
            ("leaked".into(), String::new())
        }
        (None, Some(ticket)) => match ticket.redeem().await {
            Ok(bytes) if protocol::digest(&bytes) == take.digest => ("ok".into(), String::new()),
            Ok(_) => ("corrupt".into(), "bytes differ from the digest".into()),
            // The runtime checks the ticket's digest too.
            Err(e) => (protocol::error_kind(&e), e.chain().to_string()),
        },
        (None, None) if protocol::digest(&take.data) == take.digest => ("ok".into(), String::new()),
        (None, None) => ("corrupt".into(), "bytes differ from the digest".into()),
    };
    drop(take);
    report(node, id, outcome).await;
}

/// Tells the peer named `chaos` what happened to transfer `id`.
async fn report(node: &Node, id: u64, (outcome, detail): (String, String)) {
    if let Some(chaos) = node.peer("chaos") {
        let _ = chaos
            .send(Report {
                id,
                node: node.name().to_string(),
                outcome,
                detail,
            })
            .await;
    }
}

/// The node's statistics, as `handoff stats` shows them.
pub fn stats(node: &Node) -> Stats {
    let peers = node.peers();
    Stats {
        node: node.name().to_string(),
        ticket_leases: node.ticket_leases(),
        shm_leases: node.leases(),
        shm_pool: handoff::shm::pool().stats(),
        peers: peers
            .iter()
            .take(crate::protocol::STATS_PEERS)
            .map(|p| (p.name().to_string(), p.channel().to_string()))
            .collect(),
        peers_total: Some(peers.len() as u64),
    }
}

//! `handoff node`: runs one node that serves the demo and bench protocol until killed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use handoff::{Message as _, Node};

use std::collections::HashMap;

use handoff::tickets::LeaseConfig;
use handoff::{Buffer, Peer, Redeem, Ticket};

use crate::protocol::{
    self, Blob, BlobWork, Disconnect, Forward, Held, Hold, Issue, Payload, Ping, RawSend, Receipt, Release, Report,
    SendRequest, Stats, StatsRequest, Take,
};

/// Options of `handoff node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The node's name.
    #[arg(long)]
    pub name: String,
    /// Address to listen on, e.g. 127.0.0.1:7000 (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Host identity (default: from the kernel's machine and boot ids).
    #[arg(long)]
    pub host_id: Option<String>,
    /// File holding the cluster secret (its bytes, trailing newline ignored).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Peers to connect to at start (repeatable).
    #[arg(long)]
    pub connect: Vec<String>,
    /// When received tickets are redeemed: before delivery, or on first use.
    #[arg(long, value_enum, default_value_t = RedeemArg::Eager)]
    pub redeem: RedeemArg,
    /// Send buffers of at least this many bytes to TCP peers as tickets.
    #[arg(long)]
    pub ticket_threshold: Option<usize>,
    /// How long a ticket hold lasts without renewal, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ttl_ms: u64,
    /// How long a pull may wait for the owner, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub pull_timeout_ms: u64,
    /// A DataSets.jl `Data.toml` catalog: data handles this node receives bind to it.
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// The cache folder for the catalog's datasets (nodes on one host may share one).
    #[arg(long, requires = "catalog")]
    pub cache_dir: Option<PathBuf>,
}

/// `--redeem` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RedeemArg {
    /// Pull before delivering the message.
    Eager,
    /// Pull on first use.
    Lazy,
}

/// Reads a secret file; the trailing newline (if any) is not part of the secret.
pub fn read_secret(path: &PathBuf) -> Result<Vec<u8>> {
    let mut bytes =
        std::fs::read(path).with_context(|| format!("reading the cluster secret from {}", path.display()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    anyhow::ensure!(!bytes.is_empty(), "the secret file {} is empty", path.display());
    Ok(bytes)
}

/// Runs the node until the process is killed.
pub async fn run(args: NodeArgs) -> Result<()> {
    let mut builder = protocol::register_all(Node::builder(&args.name).listen(&args.listen))
        .redeem(match args.redeem {
            RedeemArg::Eager => Redeem::Eager,
            RedeemArg::Lazy => Redeem::Lazy,
        })
        .ticket_threshold(args.ticket_threshold)
        .leases(LeaseConfig {
            ttl: Duration::from_millis(args.lease_ttl_ms),
            ..LeaseConfig::default()
        })
        .pull_timeout(Duration::from_millis(args.pull_timeout_ms));
    if let Some(h) = &args.host_id {
        builder = builder.host_id(h);
    }
    if let Some(f) = &args.secret_file {
        builder = builder.secret(read_secret(f)?);
    }
    let node = builder.build().await.context("starting the node")?;
    if let Some(file) = &args.catalog {
        let dir = args
            .cache_dir
            .clone()
            .unwrap_or_else(handoff_data::CacheConfig::default_dir);
        let cache = handoff_data::Cache::open(handoff_data::CacheConfig::new(dir))?;
        let catalog = handoff_data::Catalog::load(file, cache)?;
        std::sync::Arc::new(catalog).serve(node.resources());
    }
    for addr in &args.connect {
        let peer = node
            .connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        tracing::info!(peer = %peer.name(), locality = %peer.locality(), channel = %peer.channel(), "connected");
    }
    // One machine-readable line so that a parent process knows where we listen.
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "name": node.name(),
            "listen": node.listen_addr(),
            "host_id": node.endpoint().host_id,
            "pid": std::process::id(),
        })
    );
    serve(&node).await
}

/// Answers demo and bench messages until the node shuts down.
pub async fn serve(node: &Node) -> Result<()> {
    let mut held: HashMap<u64, Buffer> = HashMap::new();
    let mut forwarded: HashMap<u64, Peer> = HashMap::new();
    loop {
        let env = match node.recv().await {
            Ok(env) => env,
            Err(handoff::Error::NodeClosed) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let from = env.from().clone();
        let result = match env.type_name() {
            Payload::TYPE_NAME => {
                let p: Payload = env.decode()?;
                let (verified, verify_seconds) = protocol::verify(&p);
                from.send(Receipt {
                    id: p.id,
                    bytes: p.data.len() as u64,
                    verified,
                    verify_seconds,
                })
                .await
            }
            SendRequest::TYPE_NAME => {
                let req: SendRequest = env.decode()?;
                let payload = protocol::make_payload(req.id, req.bytes as usize);
                from.send(payload).await
            }
            Ping::TYPE_NAME => from.send(env.decode::<Ping>()?).await,
            RawSend::TYPE_NAME => {
                let req: RawSend = env.decode()?;
                tokio::spawn(async move {
                    if let Err(e) = protocol::raw_send(req).await {
                        tracing::warn!("raw stream for the bench failed: {e}");
                    }
                });
                Ok(())
            }
            BlobWork::TYPE_NAME => {
                // Read on a task of its own: a download must not hold up other messages.
                // A handle this node can neither bind nor pull fails to decode: say so, keep serving.
                match env.decode::<BlobWork>() {
                    Ok(work) => {
                        let from = from.clone();
                        tokio::spawn(async move {
                            let receipt = protocol::read_blob_work(work).await;
                            if let Err(e) = from.send(receipt).await {
                                tracing::warn!("cannot send a blob receipt: {e}");
                            }
                        });
                        Ok(())
                    }
                    Err(e) => from.send(protocol::BlobReceipt::failed(0, e.to_string())).await,
                }
            }
            Blob::TYPE_NAME => {
                let blob: Blob = env.decode()?;
                from.send(Ping {
                    seq: blob.seq,
                    data: Vec::new(),
                })
                .await
            }
            Hold::TYPE_NAME => {
                let h: Hold = env.decode()?;
                let answer = Held {
                    id: h.id,
                    holder: node.name().to_string(),
                    bytes: h.data.len() as u64,
                    segment: handoff::shm::segment_info(&h.data),
                };
                held.insert(h.id, h.data);
                from.send(answer).await
            }
            Release::TYPE_NAME => {
                let r: Release = env.decode()?;
                let dropped = held.remove(&r.id);
                from.send(Held {
                    id: r.id,
                    holder: node.name().to_string(),
                    bytes: dropped.map_or(0, |d| d.len() as u64),
                    segment: None,
                })
                .await
            }
            Forward::TYPE_NAME => {
                let f: Forward = env.decode()?;
                match node.peer(&f.to) {
                    Some(next) => {
                        forwarded.insert(f.id, from.clone());
                        next.send(Hold { id: f.id, data: f.data }).await
                    }
                    None => {
                        tracing::warn!(to = %f.to, "cannot forward: no such peer");
                        Ok(())
                    }
                }
            }
            Held::TYPE_NAME => {
                let h: Held = env.decode()?;
                match forwarded.remove(&h.id) {
                    Some(asker) => asker.send(h).await,
                    None => Ok(()),
                }
            }
            StatsRequest::TYPE_NAME => {
                env.decode::<StatsRequest>()?;
                from.send(stats(node)).await
            }
            Disconnect::TYPE_NAME => {
                let d: Disconnect = env.decode()?;
                node.disconnect(&d.peer).await;
                Ok(())
            }
            Issue::TYPE_NAME => {
                let issue: Issue = env.decode()?;
                let node = node.clone();
                // Issuing may wait for lease room; do not hold up other messages.
                tokio::spawn(async move {
                    let id = issue.id;
                    let outcome = match issue_take(&node, issue).await {
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
                Ok(())
            }
            Take::TYPE_NAME => {
                let take: Take = env.decode()?;
                let node = node.clone();
                tokio::spawn(async move { take_and_report(&node, take).await });
                Ok(())
            }
            other => {
                tracing::warn!(type_name = other, from = %from.name(), "no handler for this type");
                Ok(())
            }
        };
        if let Err(e) = result {
            tracing::warn!(peer = %from.name(), "reply failed: {e}");
        }
    }
}

/// Waits up to `timeout` for a line on `lines` that parses as the ready event.
pub async fn read_ready_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    timeout: Duration,
) -> Result<serde_json::Value> {
    let line = tokio::time::timeout(timeout, lines.next_line())
        .await
        .context("the child node did not report ready in time")??
        .context("the child node exited before reporting ready")?;
    let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("child said {line:?}"))?;
    anyhow::ensure!(v["event"] == "ready", "unexpected first line from child: {line}");
    Ok(v)
}

/// The node's statistics, as `handoff stats` shows them.
pub fn stats(node: &Node) -> Stats {
    Stats {
        node: node.name().to_string(),
        ticket_leases: node.ticket_leases(),
        shm_leases: node.leases(),
        shm_pool: handoff::shm::pool().stats(),
        peers: node
            .peers()
            .iter()
            .map(|p| (p.name().to_string(), p.channel().to_string()))
            .collect(),
    }
}

/// Chaos, owner side: makes the buffer and sends it by ticket.
async fn issue_take(node: &Node, issue: Issue) -> Result<()> {
    let mut data = vec![0u8; issue.bytes as usize];
    protocol::fill_pattern(&mut data, issue.id);
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
                    Err(e) => (protocol::error_kind(&e), e.to_string()),
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
            Err(e) => (protocol::error_kind(&e), e.to_string()),
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

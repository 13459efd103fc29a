//! `handoff stats`: asks a running node for its leases, shared memory and peers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use handoff::{Message as _, Node};

use crate::node_cmd::read_secret;
use crate::protocol::{self, Stats, StatsRequest};
use crate::table;

/// Options of `handoff stats`.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The node to ask (its `tcp://` or `unix://` address).
    #[arg(long)]
    pub connect: String,
    /// File holding the cluster secret.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Connects, asks, prints.
pub async fn run(args: StatsArgs) -> Result<()> {
    let mut builder = protocol::register_all(Node::builder(format!("stats-{}", std::process::id())));
    if let Some(f) = &args.secret_file {
        builder = builder.secret(read_secret(f)?);
    }
    let me = builder.shm(false).build().await?;
    let peer = me
        .connect(&args.connect)
        .await
        .map_err(|e| crate::dial::naming(&args.connect, e, None))?;
    peer.send(StatsRequest {}).await?;
    let stats: Stats = loop {
        let env = me
            .recv_timeout(Duration::from_secs(10))
            .await
            .with_context(|| format!("{} did not answer", peer.name()))?;
        if env.type_name() == Stats::TYPE_NAME {
            break env.decode()?;
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let t = &stats.ticket_leases;
    println!("node {}", stats.node);
    println!(
        "ticket leases: {} ({} held by {} holders), oldest {:.1} s, {} holds ended by deadline",
        t.count,
        table::size(t.bytes),
        t.holders,
        t.oldest_seconds,
        t.expired
    );
    println!(
        "shm leases: {} ({}); segment pool: {} segments ({}), {} idle ({})",
        stats.shm_leases.count,
        table::size(stats.shm_leases.bytes as u64),
        stats.shm_pool.segments,
        table::size(stats.shm_pool.bytes as u64),
        stats.shm_pool.idle_segments,
        table::size(stats.shm_pool.idle_bytes as u64)
    );
    for (name, channel) in &stats.peers {
        println!("peer {name} via {channel}");
    }
    let total = stats.peers_total.unwrap_or(stats.peers.len() as u64);
    if total > stats.peers.len() as u64 {
        println!("… and {} more peers", total - stats.peers.len() as u64);
    }
    Ok(())
}

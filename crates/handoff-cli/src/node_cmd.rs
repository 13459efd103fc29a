//! `handoff node`: runs one node that serves the demo and bench protocol until killed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use handoff::tickets::{LeaseConfig, WhenFull};
use handoff::{Bounds, Node, Redeem};

use crate::protocol;
use crate::serve::{serve_with, ServeBounds};

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
    /// Peers to connect to at start (repeatable), all at once; the node reports ready once
    /// it is connected to every one. A peer that is not up yet (connection refused, a
    /// timeout, an unreachable host, a close during the handshake) is tried again, with
    /// backoff, until --connect-timeout; a refusal (wrong secret, protocol version) fails
    /// at once.
    #[arg(long)]
    pub connect: Vec<String>,
    /// How long --connect keeps trying a peer that is not up yet, e.g. 500ms, 30s, 2m
    /// (a bare number is seconds; 0 tries once). Delays between attempts start at
    /// 50-100 ms and double, with jitter, up to 1-2 s.
    #[arg(long, value_parser = crate::dial::parse_duration, default_value = "30s")]
    pub connect_timeout: Duration,
    /// How long a TCP peer may stay silent (its host lost power or was cut off) before its
    /// connection fails, e.g. 30s: keepalive probes and TCP_USER_TIMEOUT, as Dask's
    /// distributed.comm.timeouts.tcp. At least 11s. Default: none (a silent peer's idle
    /// connection stays open until the peer comes back or the process ends).
    #[arg(long, value_parser = crate::dial::parse_duration)]
    pub tcp_timeout: Option<Duration>,
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
    /// A DataSets.jl `Data.toml` catalog: data handles this node receives bind to it. Give it several
    /// times for a stack: the first catalog that has a dataset's uuid binds it.
    #[arg(long)]
    pub catalog: Vec<PathBuf>,
    /// The cache folder for the catalog's datasets (nodes on one host may share one).
    #[arg(long, requires = "catalog")]
    pub cache_dir: Option<PathBuf>,
    /// Also accept peers that speak only protocol version 1 (and version 2). Their handshake
    /// reveals this node's id, name, host id, pid, listen address and socket path to anyone
    /// who connects, before any proof of the cluster secret (spec WIRE.md §5.4), and lets a
    /// peer without the secret authenticate by reflecting the nodes' proofs (§5.6); without
    /// it such peers are refused with `unsupported-version`.
    #[arg(long)]
    pub accept_v1: bool,
    /// Also accept peers that speak protocol version 2 at most, while a cluster upgrades.
    /// In version 2 a peer WITHOUT the cluster secret can authenticate by crossing the
    /// nodes' own challenges and proofs (spec WIRE.md §5.6): while any node of the old
    /// version is reachable, it can use that node and this one as each other's oracle
    /// (§5.8). Without it such peers are refused with `unsupported-version`. (--accept-v1
    /// accepts version 2 as well.)
    #[arg(long)]
    pub accept_v2: bool,
    /// TLS for every TCP connection (spec WIRE.md §3.1): this node's certificate chain, PEM.
    /// Needs --tls-key and --tls-ca; a peer without TLS is then refused (`tls-required`).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM.
    #[arg(long, requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The certificate authorities that peers' certificates must chain to, PEM.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Expect this name in every peer's certificate instead of the host it is dialed at.
    #[arg(long, requires = "tls_cert")]
    pub tls_server_name: Option<String>,
    /// Also serve `handoff bench --remote`'s raw baseline on this address: plain TCP, no
    /// handshake and no secret (an 8-byte request, answered with that many bytes or an echo;
    /// at most 16 connections and --max-request-bytes per answer). Only for benchmarks.
    #[arg(long)]
    pub raw_listen: Option<String>,
    /// What peers can make this node hold (spec WIRE.md §9.1 and Appendix A).
    #[command(flatten)]
    pub bounds: BoundsArgs,
}

/// A size from the command line: bytes, or with a suffix (`64KiB`, `8MiB`, `1GiB`, or
/// `K`, `M`, `G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or e.g. 64KiB, 8MiB, 1GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use KiB, MiB, GiB or TiB)"
            ))
        }
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}

/// The bounds of `handoff node`; the defaults are the reference's (spec §9.1, Appendix A).
/// Sizes take a suffix: `64KiB`, `8MiB`, `1GiB`.
#[derive(Debug, Clone, clap::Args)]
pub struct BoundsArgs {
    /// Bytes of one peer's received messages held until served (the node stops reading
    /// that peer past it).
    #[arg(long, value_parser = parse_size, default_value_t = Bounds::DEFAULT.max_buffered_bytes_per_peer)]
    pub max_buffered_bytes_per_peer: u64,
    /// Bytes of all peers' received messages held until served.
    #[arg(long, value_parser = parse_size, default_value_t = Bounds::DEFAULT.max_buffered_bytes)]
    pub max_buffered_bytes: u64,
    /// Bytes any peer may buffer whatever all peers hold together (its guaranteed share,
    /// so that small messages are never stuck behind another peer's large one).
    #[arg(long, value_parser = parse_size, default_value_t = Bounds::DEFAULT.min_buffered_bytes_per_peer)]
    pub min_buffered_bytes_per_peer: u64,
    /// Messages of one peer held until served.
    #[arg(long, default_value_t = Bounds::DEFAULT.max_buffered_messages_per_peer)]
    pub max_buffered_messages_per_peer: usize,
    /// Handshakes in progress at once (the oldest gives way to a new one).
    #[arg(long, default_value_t = Bounds::DEFAULT.max_handshakes)]
    pub max_handshakes: usize,
    /// Established connections at once.
    #[arg(long, default_value_t = Bounds::DEFAULT.max_connections)]
    pub max_connections: usize,
    /// Connections dialed to reach ticket owners that are kept open (the one unused
    /// longest makes room for another).
    #[arg(long, default_value_t = Bounds::DEFAULT.max_owner_connections)]
    pub max_owner_connections: usize,
    /// Time a handshake may take, in milliseconds.
    #[arg(long, default_value_t = Bounds::DEFAULT.handshake_timeout.as_millis() as u64)]
    pub handshake_timeout_ms: u64,
    /// Silence allowed inside a message, in milliseconds.
    #[arg(long, default_value_t = Bounds::DEFAULT.progress_timeout.as_millis() as u64)]
    pub progress_timeout_ms: u64,
    /// Time a write to a peer may make no progress, in milliseconds.
    #[arg(long, default_value_t = Bounds::DEFAULT.write_timeout.as_millis() as u64)]
    pub write_timeout_ms: u64,
    /// Bytes of shared-memory leases held for one peer that does not release them.
    #[arg(long, value_parser = parse_size, default_value_t = Bounds::DEFAULT.max_shm_lease_bytes_per_peer)]
    pub max_shm_bytes_per_peer: u64,
    /// How long a send waits for a peer to release shared memory or tickets before it
    /// fails, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub lease_wait_ms: u64,
    /// Largest `bytes` a SendRequest, RawSend or chaos.Issue may ask for.
    #[arg(long, value_parser = parse_size, default_value_t = ServeBounds::default().max_request_bytes)]
    pub max_request_bytes: u64,
    /// Holds kept for one peer (handoff.demo.Hold).
    #[arg(long, default_value_t = ServeBounds::default().max_held)]
    pub max_held: usize,
    /// Bytes held for one peer.
    #[arg(long, value_parser = parse_size, default_value_t = ServeBounds::default().max_held_bytes)]
    pub max_held_bytes: u64,
    /// Answers queued for one peer; further ones are dropped with a warning until it reads.
    #[arg(long, default_value_t = ServeBounds::default().queue_depth)]
    pub answer_queue: usize,
    /// Bytes of received data waiting in one peer's answer queue.
    #[arg(long, value_parser = parse_size, default_value_t = ServeBounds::default().queue_bytes)]
    pub answer_queue_bytes: u64,
    /// Wait this long before handling each message: a slow application, for tests of
    /// backpressure (milliseconds).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

impl BoundsArgs {
    /// The runtime's bounds.
    pub fn runtime(&self) -> Bounds {
        Bounds {
            max_buffered_bytes_per_peer: self.max_buffered_bytes_per_peer,
            max_buffered_bytes: self.max_buffered_bytes,
            max_buffered_messages_per_peer: self.max_buffered_messages_per_peer,
            min_buffered_bytes_per_peer: self.min_buffered_bytes_per_peer,
            max_handshakes: self.max_handshakes,
            max_connections: self.max_connections,
            max_owner_connections: self.max_owner_connections,
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
            progress_timeout: Duration::from_millis(self.progress_timeout_ms),
            write_timeout: Duration::from_millis(self.write_timeout_ms),
            max_shm_lease_bytes_per_peer: self.max_shm_bytes_per_peer,
            ..Bounds::DEFAULT
        }
    }

    /// The serve loop's bounds.
    pub fn serve(&self) -> ServeBounds {
        ServeBounds {
            max_request_bytes: self.max_request_bytes,
            max_held: self.max_held,
            max_held_bytes: self.max_held_bytes,
            queue_depth: self.answer_queue,
            queue_bytes: self.answer_queue_bytes,
            delay: Duration::from_millis(self.delay_ms),
            ..ServeBounds::default()
        }
    }
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
            when_full: WhenFull::Wait(Duration::from_millis(args.bounds.lease_wait_ms)),
            ..LeaseConfig::default()
        })
        .pull_timeout(Duration::from_millis(args.pull_timeout_ms))
        .tcp_timeout(args.tcp_timeout)
        .accept_v1(args.accept_v1)
        .accept_v2(args.accept_v2)
        .bounds(args.bounds.runtime());
    if let Some(h) = &args.host_id {
        builder = builder.host_id(h);
    }
    if let Some(f) = &args.secret_file {
        builder = builder.secret(read_secret(f)?);
    }
    if let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        let mut tls = handoff::TlsConfig::from_pem_files(cert, key, ca).context("--tls-cert/--tls-key/--tls-ca")?;
        if let Some(name) = &args.tls_server_name {
            tls = tls.expect_server_name(name);
        }
        builder = builder.tls(tls);
    }
    let node = builder.build().await.context("starting the node")?;
    if !args.catalog.is_empty() {
        let dir = args
            .cache_dir
            .clone()
            .unwrap_or_else(handoff_data::CacheConfig::default_dir);
        let cache = handoff_data::Cache::open(handoff_data::CacheConfig::new(dir))?;
        handoff_data::CatalogStack::load(&args.catalog, cache)?.serve(node.resources());
    }
    for peer in crate::dial::connect_all(&node, &args.connect, args.connect_timeout).await? {
        tracing::info!(peer = %peer.name(), locality = %peer.locality(), channel = %peer.channel(), "connected");
    }
    let raw_listen = match &args.raw_listen {
        Some(addr) => Some(
            crate::raw_serve::start(addr, args.bounds.max_request_bytes)
                .await?
                .to_string(),
        ),
        None => None,
    };
    // One machine-readable line so that a parent process knows where we listen.
    println!(
        "{}",
        serde_json::json!({
            "event": "ready",
            "name": node.name(),
            "listen": node.listen_addr(),
            "host_id": node.endpoint().host_id,
            "pid": std::process::id(),
            "raw_listen": raw_listen,
        })
    );
    serve_with(&node, args.bounds.serve()).await
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

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("12 parsecs").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("99999999999TiB").unwrap_err().contains("too large"));
    }
}

//! `handoff bench`: each channel against a raw baseline measured in the same run.
//!
//! Every case reports `ours` and `baseline` as the median seconds per operation over
//! several repetitions, and `efficiency = baseline / ours` (1.0 = as fast as the raw
//! baseline). Case names and JSON keys are a public interface: keep them stable.
//!
//! This file runs the cases and reports them; each family of cases lives in its own file below it:
//! `case` (the result row, the plan of sizes and repetitions), `messages` (inproc-msg, tcp-rtt,
//! tcp-stream, tls-stream; `tls` makes the latter its throwaway certificates), `shm` (shm-rtt, shm-view, shm-read, tcp-read, shm-copy-in), `tickets`
//! (ticket-pull, ticket-3party), `data` (blob-hit, blob-cold) and, with `--remote`, `remote`
//! (remote-rtt, remote-ticket-pull against a node on another host).

mod case;
mod data;
mod messages;
mod remote;
mod shm;
mod tickets;
mod tls;

use anyhow::{Context, Result};
use handoff::Node;
use indicatif::{ProgressBar, ProgressStyle};

use crate::protocol;
use crate::table;
use case::{case, parse_size, Case, Plan};
use shm::ShmBench;
use tickets::TicketBench;

/// Options of `handoff bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Print the results as a JSON array.
    #[arg(long)]
    pub json: bool,
    /// A short run (under 30 seconds): fewer sizes and repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Run only the cases whose name contains this text.
    #[arg(long)]
    pub only: Option<String>,
    /// Sizes to measure the size-dependent cases at, comma-separated (`1K,64K,16M,1G`:
    /// powers of 1024); ticket cases only at sizes of 64 KiB and up (the owner's ticket
    /// threshold). Default: the built-in lists.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Option<Vec<u64>>,
    /// Measured repetitions per case, after one warm-up (default 7, 3 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: Option<u64>,
    /// Also measure against a `handoff node` on another host, at this address
    /// (`tcp://HOST:PORT`): the cases `remote-rtt` and `remote-ticket-pull`. That node needs
    /// `--ticket-threshold 65536` (or lower) and `--raw-listen`, the raw baseline, whose
    /// address goes in --raw-remote.
    #[arg(long, requires_all = ["raw_remote", "secret_file"])]
    pub remote: Option<String>,
    /// The remote node's raw baseline address (its `--raw-listen`), `HOST:PORT`.
    #[arg(long, requires = "remote")]
    pub raw_remote: Option<String>,
    /// The cluster secret's file, for --remote.
    #[arg(long, requires = "remote")]
    pub secret_file: Option<std::path::PathBuf>,
}

/// Runs the benchmark and prints the table or JSON.
pub async fn run(args: BenchArgs) -> Result<()> {
    let plan = Plan::new(args.quick, args.sizes.as_deref(), args.reps);
    let remote = match (&args.remote, &args.raw_remote, &args.secret_file) {
        (Some(addr), Some(raw_addr), Some(secret_file)) => Some(remote::Remote {
            addr,
            raw_addr,
            secret_file,
        }),
        _ => None,
    };
    if remote.is_none() && args.only.as_deref().is_some_and(|o| o.starts_with("remote")) {
        anyhow::bail!("the remote cases need --remote, --raw-remote and --secret-file");
    }
    let cases = run_cases(plan, args.only.as_deref(), remote.as_ref()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cases)?);
    } else {
        let rows: Vec<Vec<String>> = cases
            .iter()
            .map(|c| {
                vec![
                    c.case.clone(),
                    c.channel.clone(),
                    table::size(c.bytes),
                    table::duration(c.ours),
                    table::duration(c.baseline),
                    format!("{:.2}", c.efficiency),
                    if c.bytes >= 1 << 20 {
                        table::throughput(c.bytes, c.ours)
                    } else {
                        String::new()
                    },
                ]
            })
            .collect();
        print!(
            "{}",
            table::render(
                &[
                    "case",
                    "channel",
                    "bytes",
                    "ours",
                    "baseline",
                    "efficiency",
                    "throughput"
                ],
                &rows
            )
        );
        for c in cases.iter().filter(|c| c.extra_round_trips.is_some()) {
            println!(
                "{} {}: {:+.2} round trips of {} over the raw request-response",
                c.case,
                table::size(c.bytes),
                c.extra_round_trips.unwrap_or_default(),
                table::duration(c.round_trip.unwrap_or_default()),
            );
        }
    }
    Ok(())
}

/// Measures every case (or those matching `only`); the remote cases only with `remote`.
async fn run_cases(plan: Plan, only: Option<&str>, remote: Option<&remote::Remote<'_>>) -> Result<Vec<Case>> {
    let wanted =
        |name: &str| only.is_none_or(|o| name.contains(o)) && (remote.is_some() || !name.starts_with("remote"));
    let shm_cases = ["shm-view", "shm-read", "tcp-read", "shm-copy-in"];
    let ticket_cases = ["ticket-pull", "ticket-3party"];
    let blob_cases = ["blob-hit", "blob-cold"];
    let total = [wanted("inproc-msg"), wanted("tcp-rtt"), wanted("shm-rtt")]
        .iter()
        .filter(|w| **w)
        .count()
        + if wanted("tcp-stream") { plan.sizes.len() } else { 0 }
        + if wanted("tls-stream") { plan.sizes.len() } else { 0 }
        + shm_cases.iter().filter(|c| wanted(c)).count() * plan.shm_sizes.len()
        + ticket_cases.iter().filter(|c| wanted(c)).count() * plan.ticket_sizes.len()
        + blob_cases.iter().filter(|c| wanted(c)).count() * plan.blob_sizes.len()
        + usize::from(wanted("remote-rtt"))
        + if wanted("remote-ticket-pull") {
            plan.ticket_sizes.len()
        } else {
            0
        };
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template("{spinner} bench [{bar:30}] {pos}/{len} {msg}").expect("template"));
    let secret = hex::encode(rand::random::<[u8; 16]>());
    let mut out = Vec::new();

    if wanted("inproc-msg") {
        bar.set_message("inproc-msg");
        out.push(messages::inproc_msg(&plan, &secret).await?);
        bar.inc(1);
    }
    if wanted("tcp-rtt") || wanted("tcp-stream") {
        let pair = ServingPair::start(&secret, None).await?;
        if wanted("tcp-rtt") {
            bar.set_message("tcp-rtt");
            out.push(messages::tcp_rtt(&plan, &pair.client, &pair.peer).await?);
            bar.inc(1);
        }
        if wanted("tcp-stream") {
            for &size in &plan.sizes {
                bar.set_message(format!("tcp-stream {}", table::size(size)));
                out.push(messages::tcp_stream(&plan, &pair.client, &pair.peer, size).await?);
                bar.inc(1);
            }
        }
        pair.stop().await;
    }
    if wanted("tls-stream") {
        let tls = tls::throwaway_tls()?;
        let pair = ServingPair::start(&secret, Some(tls.clone())).await?;
        for &size in &plan.sizes {
            bar.set_message(format!("tls-stream {}", table::size(size)));
            out.push(messages::tls_stream(&plan, &pair.client, &pair.peer, size, &tls).await?);
            bar.inc(1);
        }
        pair.stop().await;
    }
    if wanted("shm-rtt") {
        bar.set_message("shm-rtt");
        out.push(shm::shm_rtt(&plan, &secret).await?);
        bar.inc(1);
    }
    if shm_cases.iter().any(|c| wanted(c)) {
        let bench = ShmBench::start(&secret).await?;
        for name in shm_cases.into_iter().filter(|c| wanted(c)) {
            for &size in &plan.shm_sizes {
                bar.set_message(format!("{name} {}", table::size(size)));
                out.push(bench.run(name, size, plan.reps).await?);
                bar.inc(1);
            }
        }
        bench.stop();
    }
    if ticket_cases.iter().any(|c| wanted(c)) {
        let bench = TicketBench::start(&secret).await?;
        for name in ticket_cases.into_iter().filter(|c| wanted(c)) {
            for &size in &plan.ticket_sizes {
                bar.set_message(format!("{name} {}", table::size(size)));
                out.push(bench.run(name, size, plan.ticket_reps).await?);
                bar.inc(1);
            }
        }
        bench.stop();
    }
    for name in blob_cases.into_iter().filter(|c| wanted(c)) {
        for &size in &plan.blob_sizes {
            bar.set_message(format!("{name} {}", table::size(size)));
            let measured = match name {
                // A cached blob read, against a plain read of the same file.
                "blob-hit" => data::blob_hit(size as usize).await.map(|t| (t, "file")),
                // A first fetch from a local S3-compatible server (moto) into an empty cache,
                // against a plain object_store GET of the same object.
                _ => data::blob_cold(size as usize).await.map(|t| (t, "s3")),
            };
            match measured {
                Ok(((ours, baseline), channel)) => out.push(case(name, channel, size, ours, baseline)),
                Err(e) => {
                    bar.suspend(|| eprintln!("note: {name} skipped: {e:#}"));
                }
            }
            bar.inc(1);
        }
    }
    if let Some(remote) = remote.filter(|_| wanted("remote-rtt") || wanted("remote-ticket-pull")) {
        let mut bench = remote::RemoteBench::start(remote).await?;
        if wanted("remote-rtt") {
            bar.set_message("remote-rtt");
            out.push(bench.rtt(&plan).await?);
            bar.inc(1);
        }
        if wanted("remote-ticket-pull") {
            for &size in &plan.ticket_sizes {
                bar.set_message(format!("remote-ticket-pull {}", table::size(size)));
                out.push(bench.ticket_pull(&plan, size).await?);
                bar.inc(1);
            }
        }
        bench.stop();
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Two nodes of different host ids over TCP (inside TLS, with `tls`): a server running the
/// `handoff node` serve loop and a client connected to it.
struct ServingPair {
    server: Node,
    client: Node,
    peer: handoff::Peer,
    server_task: tokio::task::JoinHandle<Result<()>>,
}

impl ServingPair {
    async fn start(secret: &str, tls: Option<handoff::TlsConfig>) -> Result<ServingPair> {
        let mut server = Node::builder("bench-server").listen("127.0.0.1:0").secret(secret);
        let mut client = Node::builder("bench-client").secret(secret);
        if let Some(tls) = tls {
            server = server.tls(tls.clone());
            client = client.tls(tls);
        }
        let server = protocol::register_all(server).host_id("bench-host-b").build().await?;
        let client = protocol::register_all(client).host_id("bench-host-a").build().await?;
        let serving = server.clone();
        let server_task = tokio::spawn(async move { crate::serve::serve(&serving).await });
        let peer = client.connect(server.listen_addr().context("listen address")?).await?;
        Ok(ServingPair {
            server,
            client,
            peer,
            server_task,
        })
    }

    async fn stop(self) {
        self.server.shutdown();
        self.client.shutdown();
        let _ = self.server_task.await;
    }
}

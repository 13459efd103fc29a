//! `handoff chaos`: fault injection with real processes, checking the lease invariants.
//!
//! Each iteration starts an owner and two holders (`b`, and `c` for forwarded tickets) as
//! child processes, has the owner send a buffer by ticket to `b` (which redeems it, or
//! forwards it to `c`), and injects one fault at a random moment: SIGKILL of the owner or
//! of a holder, a dropped connection, or a lost release. Then it checks that every lease at
//! a live owner ends (no leak), that no holder's hold ended while it still needed it (no
//! premature free), and that every completed read matched its digest.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Message as _, Node};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::node_cmd::read_ready_line;
use crate::protocol::{self, Disconnect, Issue, Report, Stats, StatsRequest};
use handoff::proto::seeded::SplitMix64 as Rng;

/// Options of `handoff chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// How many iterations to run.
    #[arg(long, default_value_t = 20)]
    pub iterations: u32,
    /// Seed of the random choices (default: from the clock); the same seed makes the same choices.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Largest buffer an iteration sends, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_bytes: u64,
    /// Run the nodes on the hosts of a network-namespace lab and add partitions (a link down,
    /// then up, at a random moment) to the faults. Run inside host 1 of a lab of three hosts:
    /// `scripts/netlab run --hosts 3 -- ip netns exec hlab-h1 handoff chaos --lab` (reads
    /// the lab from `NETLAB` and `NETLAB_HOSTS`, which `netlab run` sets).
    #[arg(long, conflicts_with = "hostile")]
    pub lab: bool,
    /// Instead of ticket faults, run the hostile-peer suite: attacks (one per class of
    /// issue 11) on a real victim node with small bounds, checking that it lives, stays
    /// within its memory bounds and keeps serving a legitimate peer.
    #[arg(long)]
    pub hostile: bool,
    /// With --hostile: run only this attack (repeatable; default: all).
    #[arg(long = "attack", requires = "hostile")]
    pub attacks: Vec<String>,
    /// With --hostile: the victim's implementation.
    #[arg(long, value_enum, default_value_t = crate::hostile::victim::Kind::Rust, requires = "hostile")]
    pub victim: crate::hostile::victim::Kind,
    /// With --hostile and a Python victim: the interpreter that has the Python peer
    /// (default: $HANDOFF_PYTHON, else .venv/bin/python).
    #[arg(long, requires = "hostile")]
    pub python: Option<std::path::PathBuf>,
}

/// The result (keys are a public interface: keep them stable).
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// Iterations run.
    pub iterations: u32,
    /// Leases still alive at a live owner after every holder was done or gone.
    pub leaked_leases: u64,
    /// Holds that ended while their holder still needed them.
    pub premature_frees: u64,
    /// Completed reads whose bytes did not match the digest.
    pub corrupt_reads: u64,
    /// Errors the holders reported, by kind (expected ones included: a killed owner
    /// gives `owner-lost`).
    pub errors: BTreeMap<String, u64>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// The seed used.
    pub seed: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
}

const LEASE_TTL_MS: u64 = 500;
const PULL_TIMEOUT_MS: u64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    KillOwner,
    KillHolder,
    KillThird,
    DropConnection,
    LostRelease,
    /// The owner's host is cut off (its link down), then comes back.
    Partition,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillOwner => "kill-owner",
            Fault::KillHolder => "kill-holder",
            Fault::KillThird => "kill-third",
            Fault::DropConnection => "drop-connection",
            Fault::LostRelease => "lost-release",
            Fault::Partition => "partition",
        }
    }
}

struct Child {
    child: tokio::process::Child,
    listen: String,
}

/// The lab the nodes run in (`--lab`): its name and its hosts' addresses, from the
/// environment `scripts/netlab run` sets.
pub struct Lab {
    name: String,
    hosts: BTreeMap<u32, String>,
}

/// The host of the lab each role runs on: the driver and `c` on host 1, the owner on host 2
/// (the one partitions cut off), `b` on host 3.
const OWNER_HOST: u32 = 2;

impl Lab {
    /// Reads `NETLAB` and `NETLAB_HOSTS` (`LAB-hN=ADDRESS ...`).
    pub fn from_env() -> Result<Lab> {
        let name = std::env::var("NETLAB").map_err(|_| {
            anyhow::anyhow!(
                "--lab: not in a lab (NETLAB is not set); run inside host 1 of one: \
                 scripts/netlab run --hosts 3 -- ip netns exec hlab-h1 handoff chaos --lab"
            )
        })?;
        let mut hosts = BTreeMap::new();
        for entry in std::env::var("NETLAB_HOSTS").unwrap_or_default().split_whitespace() {
            let (ns, addr) = entry
                .split_once('=')
                .with_context(|| format!("NETLAB_HOSTS entry {entry:?}: expected NAMESPACE=ADDRESS"))?;
            let n = ns
                .rsplit_once("-h")
                .and_then(|(_, n)| n.parse().ok())
                .with_context(|| format!("NETLAB_HOSTS entry {entry:?}: the namespace does not end in -hN"))?;
            hosts.insert(n, addr.to_string());
        }
        anyhow::ensure!(
            (1..=3).all(|n| hosts.contains_key(&n)),
            "--lab needs hosts 1, 2 and 3; NETLAB_HOSTS has {:?}",
            hosts.keys().collect::<Vec<_>>()
        );
        Ok(Lab { name, hosts })
    }

    fn address(&self, host: u32) -> &str {
        &self.hosts[&host]
    }

    /// Takes `host`'s link down or up (the switch's port towards it).
    async fn link(&self, host: u32, up: bool) -> Result<()> {
        let status = tokio::process::Command::new("ip")
            .args(["-n", &format!("{}-sw", self.name), "link", "set", &format!("p{host}")])
            .arg(if up { "up" } else { "down" })
            .status()
            .await
            .context("running ip link set")?;
        anyhow::ensure!(status.success(), "ip link set p{host} failed ({status})");
        Ok(())
    }
}

/// Starts `handoff node` as `name`: here, or on `host` of the lab.
async fn spawn(name: &str, secret: &std::path::Path, extra: &[&str], lab: Option<(&Lab, u32)>) -> Result<Child> {
    let exe = std::env::current_exe().context("finding the handoff executable")?;
    let mut command = match lab {
        None => {
            let mut c = tokio::process::Command::new(&exe);
            c.args(["node", "--name", name, "--host-id", &format!("chaos-{name}")]);
            c
        }
        Some((lab, host)) => {
            // The host id comes from the namespace: nodes on different hosts use TCP.
            let mut c = tokio::process::Command::new("ip");
            c.args(["netns", "exec", &format!("{}-h{host}", lab.name)])
                .arg(&exe)
                .args(["node", "--name", name, "--listen", &format!("{}:0", lab.address(host))]);
            c
        }
    };
    let mut child = command
        .arg("--secret-file")
        .arg(secret)
        .args(["--lease-ttl-ms", &LEASE_TTL_MS.to_string()])
        .args(["--pull-timeout-ms", &PULL_TIMEOUT_MS.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting node {name}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = read_ready_line(&mut lines, Duration::from_secs(20)).await?;
    let listen = ready["listen"].as_str().context("listen address")?.to_string();
    Ok(Child { child, listen })
}

/// What the nodes of one iteration reported so far.
#[derive(Default)]
struct Tally {
    received: Vec<String>,
    finished: Vec<String>,
    issued: Option<bool>,
}

impl Tally {
    /// Takes in one message to the driver; reports of other iterations are ignored.
    fn absorb(
        &mut self,
        env: handoff::Envelope,
        i: u32,
        fault: Fault,
        b_name: &str,
        owner_alive: bool,
        summary: &mut Summary,
    ) -> Result<()> {
        if env.type_name() != Report::TYPE_NAME {
            return Ok(());
        }
        let report: Report = env.decode()?;
        if report.id != i as u64 {
            return Ok(());
        }
        match report.outcome.as_str() {
            "received" => self.received.push(report.node),
            "issued" => self.issued = Some(true),
            kind if kind.starts_with("issue-") => {
                self.issued = Some(false);
                *summary.errors.entry(kind.to_string()).or_default() += 1;
            }
            "ok" | "forwarded" | "leaked" => self.finished.push(report.node),
            "corrupt" => {
                self.finished.push(report.node);
                summary.corrupt_reads += 1;
            }
            kind => {
                *summary.errors.entry(kind.to_string()).or_default() += 1;
                let refused = matches!(kind, "unknown-lease" | "expired" | "bad-token");
                // A holder whose connection was dropped lost its hold by design; a refusal
                // anywhere else, with the owner alive, is a hold that ended too early.
                // A partition likewise: a holder cut off from the owner cannot renew, and
                // the owner ends its lease by the deadline, as it must.
                let explained = (fault == Fault::DropConnection && report.node == b_name) || fault == Fault::Partition;
                if refused && owner_alive && !explained {
                    summary.premature_frees += 1;
                    tracing::error!(
                        "iteration {i}: premature free: {} got {kind}: {}",
                        report.node,
                        report.detail
                    );
                }
                tracing::debug!("iteration {i}: {} reported {kind}: {}", report.node, report.detail);
                self.finished.push(report.node);
            }
        }
        Ok(())
    }
}

/// Runs the harness and prints the summary.
pub async fn run(args: ChaosArgs) -> Result<()> {
    if args.hostile {
        let python = args
            .python
            .clone()
            .or_else(|| std::env::var_os("HANDOFF_PYTHON").map(Into::into))
            .unwrap_or_else(|| ".venv/bin/python".into());
        return crate::hostile::run(args.victim, python, &args.attacks, args.json).await;
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let lab = if args.lab { Some(Lab::from_env()?) } else { None };
    let summary = run_iterations(args.iterations, seed, args.max_bytes, lab.as_ref()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "{} iterations in {:.1} s (seed {}): {} leaked leases, {} premature frees, {} corrupt reads",
            summary.iterations,
            summary.seconds,
            summary.seed,
            summary.leaked_leases,
            summary.premature_frees,
            summary.corrupt_reads
        );
        println!("faults: {:?}", summary.faults);
        println!("errors: {:?}", summary.errors);
    }
    anyhow::ensure!(
        summary.leaked_leases == 0 && summary.premature_frees == 0 && summary.corrupt_reads == 0,
        "an invariant was broken"
    );
    Ok(())
}

/// Runs `iterations` iterations from `seed`.
pub async fn run_iterations(iterations: u32, seed: u64, max_bytes: u64, lab: Option<&Lab>) -> Result<Summary> {
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let secret = hex::encode(rand::random::<[u8; 16]>());
    let dir = std::env::temp_dir().join(format!("handoff-chaos-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, &secret)?;
    let listen = lab.map_or("127.0.0.1:0".to_string(), |l| format!("{}:0", l.address(1)));
    let mut driver = protocol::register_all(Node::builder("chaos").listen(listen).secret(secret.clone()));
    if lab.is_none() {
        driver = driver.host_id("chaos-driver");
    }
    let chaos = driver.build().await?;
    let chaos_addr = chaos.listen_addr().context("listen")?.to_string();
    let mut summary = Summary {
        seed,
        ..Summary::default()
    };
    let harness = Harness {
        chaos: &chaos,
        chaos_addr: &chaos_addr,
        secret: &secret_file,
        lab,
    };
    for i in 0..iterations {
        iteration(&harness, i, &mut rng, max_bytes, &mut summary)
            .await
            .with_context(|| format!("iteration {i}"))?;
        summary.iterations += 1;
    }
    chaos.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// What every iteration works with: the driver node and its address, the secret's file,
/// and the lab when there is one.
struct Harness<'a> {
    chaos: &'a Node,
    chaos_addr: &'a str,
    secret: &'a std::path::Path,
    lab: Option<&'a Lab>,
}

async fn iteration(harness: &Harness<'_>, i: u32, rng: &mut Rng, max_bytes: u64, summary: &mut Summary) -> Result<()> {
    let Harness {
        chaos,
        chaos_addr,
        secret,
        lab,
    } = *harness;
    let (owner_name, b_name, c_name) = (format!("owner-{i}"), format!("b-{i}"), format!("c-{i}"));
    let forward = rng.below(2) == 0;
    let faults: &[Fault] = if forward {
        &[
            Fault::None,
            Fault::KillOwner,
            Fault::KillHolder,
            Fault::KillThird,
            Fault::DropConnection,
            Fault::LostRelease,
        ]
    } else {
        &[
            Fault::None,
            Fault::KillOwner,
            Fault::KillHolder,
            Fault::DropConnection,
            Fault::LostRelease,
        ]
    };
    // In a lab, half the iterations cut the owner's host off; the rest draw as elsewhere.
    let fault = if lab.is_some() && rng.below(2) == 0 {
        Fault::Partition
    } else {
        faults[rng.below(faults.len() as u64) as usize]
    };
    let partition_ms = 100 + rng.below(1_400);
    let bytes = 64 * 1024 + rng.below(max_bytes.saturating_sub(64 * 1024).max(1));
    let delay = Duration::from_micros(rng.below(6_000));
    let on_received = rng.below(2) == 0;
    *summary.faults.entry(fault.name().into()).or_default() += 1;

    let on = |host: u32| lab.map(|l| (l, host));
    let mut owner = spawn(&owner_name, secret, &["--connect", chaos_addr], on(OWNER_HOST)).await?;
    let owner_listen = owner.listen.clone();
    let mut c = spawn(
        &c_name,
        secret,
        &["--redeem", "lazy", "--connect", chaos_addr, "--connect", &owner_listen],
        on(1),
    )
    .await?;
    let mut b = spawn(
        &b_name,
        secret,
        &[
            "--redeem",
            "lazy",
            "--connect",
            chaos_addr,
            "--connect",
            &owner_listen,
            "--connect",
            &c.listen,
        ],
        on(3),
    )
    .await?;
    let to_owner = chaos.wait_for_peer(&owner_name, Duration::from_secs(20)).await?;
    let to_b = chaos.wait_for_peer(&b_name, Duration::from_secs(20)).await?;
    chaos.wait_for_peer(&c_name, Duration::from_secs(20)).await?;
    // The holders dial at start, each on its own: wait until the owner knows b (and b knows
    // c), or the ticket would go to no one and the iteration test nothing.
    wait_connected(chaos, &to_owner, &b_name).await?;
    if forward {
        wait_connected(chaos, &to_b, &c_name).await?;
    }

    to_owner
        .send(Issue {
            id: i as u64,
            bytes,
            to: b_name.clone(),
            forward_to: forward.then(|| c_name.clone()),
            leak: fault == Fault::LostRelease,
        })
        .await?;
    // The fault comes at a random moment after the issue, or just after b received the
    // ticket (so that it lands while b pulls).
    let mut tally = Tally::default();
    let delay = if on_received {
        let until = Instant::now() + Duration::from_secs(2);
        while !tally.received.contains(&b_name) && Instant::now() < until {
            if let Ok(env) = chaos.recv_timeout(Duration::from_millis(100)).await {
                tally.absorb(env, i, fault, &b_name, true, summary)?;
            }
        }
        delay / 8
    } else {
        delay
    };
    tokio::time::sleep(delay).await;
    let owner_alive = fault != Fault::KillOwner;
    match fault {
        Fault::KillOwner => owner.child.kill().await?,
        Fault::KillHolder => b.child.kill().await?,
        Fault::KillThird => c.child.kill().await?,
        Fault::DropConnection => to_owner.send(Disconnect { peer: b_name.clone() }).await?,
        Fault::Partition => {
            let lab = lab.context("a partition needs the lab")?;
            lab.link(OWNER_HOST, false).await?;
            tokio::time::sleep(Duration::from_millis(partition_ms)).await;
            lab.link(OWNER_HOST, true).await?;
        }
        Fault::None | Fault::LostRelease => {}
    }

    // What the nodes report: the owner says whether it issued the ticket; a holder says
    // when it received one, then how it ended. A holder that received a ticket and lives
    // must report its outcome within a bounded time (else it hung).
    let killed: Vec<&str> = match fault {
        Fault::KillOwner => vec![owner_name.as_str()],
        Fault::KillHolder => vec![b_name.as_str()],
        Fault::KillThird => vec![c_name.as_str()],
        _ => vec![],
    };
    let started = Instant::now();
    let grace = Duration::from_millis(300);
    let limit = Duration::from_millis(PULL_TIMEOUT_MS + 1500);
    loop {
        let alive = |n: &str| !killed.contains(&n);
        // A holder that received the ticket and lives owes us its outcome.
        let holder_busy = tally.received.iter().any(|n| !tally.finished.contains(n) && alive(n));
        // The owner, while alive, tells whether it issued the ticket.
        let owner_pending = tally.issued.is_none() && owner_alive;
        // b gets the ticket if the owner issued it (certainly) or may have (killed owner: a grace).
        let b_due = !tally.received.contains(&b_name)
            && alive(&b_name)
            && (tally.issued == Some(true) || (tally.issued.is_none() && started.elapsed() < grace));
        // c gets it once b forwarded it.
        let c_due = forward && tally.finished.contains(&b_name) && !tally.received.contains(&c_name) && alive(&c_name);
        if !(holder_busy || owner_pending || b_due || c_due) {
            break;
        }
        let Some(left) = limit.checked_sub(started.elapsed()) else {
            break;
        };
        if let Ok(env) = chaos.recv_timeout(left.min(grace)).await {
            tally.absorb(env, i, fault, &b_name, owner_alive, summary)?;
        }
    }
    let (received, finished) = (tally.received, tally.finished);
    for n in received
        .iter()
        .filter(|n| !finished.contains(n) && !killed.contains(&n.as_str()))
    {
        *summary.errors.entry("hang".into()).or_default() += 1;
        tracing::error!(
            "iteration {i}: {n} received a ticket and never reported how it ended (fault {})",
            fault.name()
        );
    }

    // Every lease at a live owner must end: released, or by its deadline.
    if owner_alive {
        let deadline = Instant::now() + Duration::from_millis(LEASE_TTL_MS * 3 + 1000);
        let mut left = u64::MAX;
        let mut to_owner = to_owner;
        while Instant::now() < deadline {
            if to_owner.send(StatsRequest {}).await.is_err() {
                // The driver's own connection to the owner did not outlive a partition:
                // connect again (the owner lives; its leases are what is checked).
                to_owner = chaos
                    .connect(&owner_listen)
                    .await
                    .context("reconnecting to the owner")?;
                continue;
            }
            let stats = loop {
                let env = chaos.recv_timeout(Duration::from_secs(5)).await?;
                if env.type_name() == Stats::TYPE_NAME {
                    break env.decode::<Stats>()?;
                }
            };
            left = stats.ticket_leases.count as u64;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if left > 0 {
            tracing::error!(
                "iteration {i}: {left} leases leaked at the owner (fault {})",
                fault.name()
            );
            summary.leaked_leases += left;
        }
    }
    for child in [&mut owner, &mut b, &mut c] {
        let _ = child.child.kill().await;
    }
    Ok(())
}

/// Waits until the node behind `to` lists `name` among its peers (its statistics say so).
async fn wait_connected(chaos: &Node, to: &handoff::Peer, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        to.send(StatsRequest {}).await?;
        let stats = loop {
            let env = chaos.recv_timeout(Duration::from_secs(5)).await?;
            if env.type_name() == Stats::TYPE_NAME {
                break env.decode::<Stats>()?;
            }
        };
        if stats.peers.iter().any(|(peer, _)| peer == name) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} did not connect to {name} within 20 s",
            stats.node
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! `handoff bench`: each channel against a raw baseline measured in the same run.
//!
//! Every case reports `ours` and `baseline` as the median seconds per operation over
//! several repetitions, and `efficiency = baseline / ours` (1.0 = as fast as the raw
//! baseline). Case names and JSON keys are a public interface: keep them stable.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Buffer, Node, Peer};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::protocol::{self, Blob, Payload, Ping, SendRequest};
use crate::table;

#[path = "bench_peers.rs"]
mod peers;

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
    #[arg(long, value_delimiter = ',', value_parser = peers::parse_size)]
    pub sizes: Option<Vec<u64>>,
    /// Measured repetitions per case, after one warm-up (default 7, 3 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: Option<u64>,
}

/// One result row (keys are a public interface: keep them stable).
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Case name: `inproc-msg`, `tcp-rtt`, `shm-rtt`, `tcp-stream`, `shm-view`, `shm-read`,
    /// `tcp-read`, `shm-copy-in`, `ticket-pull`, `ticket-3party`, `blob-hit`, `blob-cold`.
    pub case: String,
    /// Channel measured.
    pub channel: String,
    /// Bytes per operation.
    pub bytes: u64,
    /// Median seconds per operation through handoff.
    pub ours: f64,
    /// Median seconds per operation of the raw baseline.
    pub baseline: f64,
    /// `baseline / ours`: 1.0 is as fast as the baseline, higher is better.
    pub efficiency: f64,
    /// Seconds per operation of each measured repetition through handoff (`ours` is their
    /// median); absent for cases that report only a median.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ours_runs: Vec<f64>,
    /// Seconds per operation of each repetition of the baseline (`baseline` is their median).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub baseline_runs: Vec<f64>,
}

struct Plan {
    reps: usize,
    /// Repetitions of the ticket cases: cross-process transfers whose raw baseline itself
    /// varies by a third from one repetition to the next on a small VM, so their medians
    /// need more runs to settle.
    ticket_reps: usize,
    msgs: u64,
    rtts: u64,
    sizes: Vec<u64>,
    shm_sizes: Vec<u64>,
    ticket_sizes: Vec<u64>,
    blob_sizes: Vec<u64>,
}

impl Plan {
    fn new(quick: bool, sizes: Option<&[u64]>, reps: Option<u64>) -> Plan {
        let mut plan = Plan::default_for(quick);
        if let Some(sizes) = sizes {
            plan.sizes = sizes.to_vec();
            plan.shm_sizes = sizes.to_vec();
            plan.ticket_sizes = sizes.iter().copied().filter(|&s| s >= 64 << 10).collect();
            plan.blob_sizes = sizes.to_vec();
        }
        if let Some(reps) = reps {
            plan.reps = reps as usize;
            plan.ticket_reps = reps as usize;
        }
        plan
    }

    fn default_for(quick: bool) -> Plan {
        if quick {
            Plan {
                reps: 3,
                ticket_reps: 3,
                msgs: 20_000,
                rtts: 300,
                sizes: vec![1 << 20, 16 << 20, 64 << 20],
                shm_sizes: vec![1 << 20, 64 << 20],
                ticket_sizes: vec![64 << 20],
                blob_sizes: vec![64 << 20],
            }
        } else {
            Plan {
                reps: 7,
                ticket_reps: 11,
                msgs: 200_000,
                rtts: 3_000,
                sizes: vec![1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
                shm_sizes: vec![1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30],
                ticket_sizes: vec![64 << 20, 256 << 20, 1 << 30],
                blob_sizes: vec![64 << 20, 256 << 20],
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn case(name: &str, channel: &str, bytes: u64, ours: f64, baseline: f64) -> Case {
    Case {
        case: name.into(),
        channel: channel.into(),
        bytes,
        ours,
        baseline,
        efficiency: if ours > 0.0 { baseline / ours } else { 0.0 },
        ours_runs: Vec::new(),
        baseline_runs: Vec::new(),
    }
}

/// A case from every measured repetition: the medians, and the runs kept beside them.
fn case_runs(name: &str, channel: &str, bytes: u64, ours: Vec<f64>, baseline: Vec<f64>) -> Case {
    Case {
        ours_runs: ours.clone(),
        baseline_runs: baseline.clone(),
        ..case(name, channel, bytes, median(ours), median(baseline))
    }
}

/// Runs the benchmark and prints the table or JSON.
pub async fn run(args: BenchArgs) -> Result<()> {
    let plan = Plan::new(args.quick, args.sizes.as_deref(), args.reps);
    let cases = run_cases(plan, args.only.as_deref()).await?;
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
    }
    Ok(())
}

/// Measures every case (or those matching `only`).
async fn run_cases(plan: Plan, only: Option<&str>) -> Result<Vec<Case>> {
    let wanted = |name: &str| only.is_none_or(|o| name.contains(o));
    let shm_cases = ["shm-view", "shm-read", "tcp-read", "shm-copy-in"];
    let ticket_cases = ["ticket-pull", "ticket-3party"];
    let blob_cases = ["blob-hit", "blob-cold"];
    let total = [wanted("inproc-msg"), wanted("tcp-rtt"), wanted("shm-rtt")]
        .iter()
        .filter(|w| **w)
        .count()
        + if wanted("tcp-stream") { plan.sizes.len() } else { 0 }
        + shm_cases.iter().filter(|c| wanted(c)).count() * plan.shm_sizes.len()
        + ticket_cases.iter().filter(|c| wanted(c)).count() * plan.ticket_sizes.len()
        + blob_cases.iter().filter(|c| wanted(c)).count() * plan.blob_sizes.len();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(ProgressStyle::with_template("{spinner} bench [{bar:30}] {pos}/{len} {msg}").expect("template"));
    let secret = hex::encode(rand::random::<[u8; 16]>());
    let mut out = Vec::new();

    if wanted("inproc-msg") {
        bar.set_message("inproc-msg");
        out.push(inproc_msg(&plan, &secret).await?);
        bar.inc(1);
    }
    if wanted("tcp-rtt") || wanted("tcp-stream") {
        let server = protocol::register_all(
            Node::builder("bench-server")
                .listen("127.0.0.1:0")
                .secret(secret.clone()),
        )
        .host_id("bench-host-b")
        .build()
        .await?;
        let client = protocol::register_all(Node::builder("bench-client").secret(secret.clone()))
            .host_id("bench-host-a")
            .build()
            .await?;
        let serving = server.clone();
        let server_task = tokio::spawn(async move { crate::serve::serve(&serving).await });
        let peer = client.connect(server.listen_addr().context("listen address")?).await?;
        if wanted("tcp-rtt") {
            bar.set_message("tcp-rtt");
            out.push(tcp_rtt(&plan, &client, &peer).await?);
            bar.inc(1);
        }
        if wanted("tcp-stream") {
            for &size in &plan.sizes {
                bar.set_message(format!("tcp-stream {}", table::size(size)));
                out.push(tcp_stream(&plan, &client, &peer, size).await?);
                bar.inc(1);
            }
        }
        server.shutdown();
        client.shutdown();
        let _ = server_task.await;
    }
    if wanted("shm-rtt") {
        bar.set_message("shm-rtt");
        out.push(peers::shm_rtt(&plan, &secret).await?);
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
                "blob-hit" => crate::data_bench::blob_hit(size as usize).await.map(|t| (t, "file")),
                // A first fetch from a local S3-compatible server (moto) into an empty cache,
                // against a plain object_store GET of the same object.
                _ => crate::data_bench::blob_cold(size as usize).await.map(|t| (t, "s3")),
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
    bar.finish_and_clear();
    Ok(out)
}

/// The owner runs in a child process (`handoff node`, its own host identity) and sends its
/// payloads by ticket; `b` and `c` run here, redeem lazily, and `b` may forward to `c`.
struct TicketBench {
    owner: tokio::process::Child,
    _secret_dir: crate::demo::TempDir,
    b: Node,
    c: Node,
    to_owner: Peer,
    bc: Peer,
}

impl TicketBench {
    async fn start(secret: &str) -> Result<TicketBench> {
        let build = |name: &str| {
            protocol::register_all(Node::builder(name).listen("127.0.0.1:0").secret(secret))
                .host_id(format!("bench-{name}"))
                .redeem(handoff::Redeem::Lazy)
        };
        let b = build("bench-ticket-b").build().await?;
        let c = build("bench-ticket-c").build().await?;
        let bc = b.connect(c.listen_addr().context("listen")?).await?;
        let (secret_dir, secret_file) = crate::demo::write_secret(secret)?;
        let mut owner = tokio::process::Command::new(std::env::current_exe()?)
            .args(["node", "--name", "bench-ticket-owner", "--host-id", "bench-owner"])
            .args(["--ticket-threshold", "65536", "--secret-file"])
            .arg(&secret_file)
            .args(["--connect", b.listen_addr().context("listen")?])
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting the owner process")?;
        let stdout = owner.stdout.take().context("owner stdout")?;
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        crate::node_cmd::read_ready_line(&mut lines, Duration::from_secs(30)).await?;
        let to_owner = b.wait_for_peer("bench-ticket-owner", Duration::from_secs(30)).await?;
        Ok(TicketBench {
            owner,
            _secret_dir: secret_dir,
            b,
            c,
            to_owner,
            bc,
        })
    }

    fn stop(mut self) {
        let _ = self.owner.start_kill();
        self.b.shutdown();
        self.c.shutdown();
    }

    /// Seconds for a plain TCP stream of `size` bytes from the owner's process to this one,
    /// from the connection until the last byte is read (the owner prepares the bytes before
    /// it connects).
    async fn raw_from_owner(&self, listener: &TcpListener, buf: &mut [u8]) -> Result<f64> {
        self.to_owner
            .send(protocol::RawSend {
                addr: listener.local_addr()?.to_string(),
                bytes: buf.len() as u64,
            })
            .await?;
        let (mut stream, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
            .await
            .context("the owner did not open the raw stream")??;
        let started = Instant::now();
        stream.read_exact(buf).await?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// Median seconds to redeem a ticket (`ticket-pull`: b pulls from the owner;
    /// `ticket-3party`: b forwards the ticket to c, which pulls from the owner), beside a
    /// raw TCP stream of the same bytes between the same two processes.
    async fn run(&self, name: &str, size: u64, reps: usize) -> Result<Case> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let mut raw_buf = vec![1u8; size as usize];
        let mut ours = Vec::new();
        let mut base = Vec::new();
        for rep in 0..=reps {
            // The owner makes the payload and its digest (not timed), and sends it by ticket.
            self.to_owner
                .send(SendRequest {
                    id: rep as u64,
                    bytes: size,
                })
                .await?;
            let at_b: Payload = self.b.recv_timeout(Duration::from_secs(120)).await?.decode()?;
            let started = Instant::now();
            let bytes = match name {
                "ticket-pull" => handoff::Ticket::of(&at_b.data).context("a ticket")?.redeem().await?,
                _ => {
                    self.bc.send(at_b.clone()).await?;
                    let at_c: Payload = self.c.recv_timeout(Duration::from_secs(60)).await?.decode()?;
                    handoff::Ticket::of(&at_c.data).context("a ticket")?.redeem().await?
                }
            };
            let t = started.elapsed().as_secs_f64();
            anyhow::ensure!(bytes.len() as u64 == size, "redeemed {} bytes", bytes.len());
            drop((bytes, at_b));
            let t_base = self.raw_from_owner(&listener, &mut raw_buf).await?;
            if rep > 0 {
                ours.push(t);
                base.push(t_base);
            }
        }
        Ok(case_runs(name, "tcp", size, ours, base))
    }
}

/// Two receivers in this process: one reached over the Unix socket (shm), one pinned to
/// TCP with another host identity; the sender measures a transfer until the receiver
/// holds (or has read) the value.
struct ShmBench {
    sender: Node,
    shm_receiver: Node,
    tcp_receiver: Node,
    shm_peer: Peer,
    tcp_peer: Peer,
}

impl ShmBench {
    async fn start(secret: &str) -> Result<ShmBench> {
        let build = |name: &str, host: &str| {
            protocol::register_all(Node::builder(name).listen("127.0.0.1:0").secret(secret)).host_id(host)
        };
        let sender = build("bench-shm-sender", "bench-host").build().await?;
        let shm_receiver = build("bench-shm-receiver", "bench-host").build().await?;
        let tcp_receiver = build("bench-tcp-receiver", "bench-other-host").build().await?;
        let shm_peer = sender
            .connect_with(
                shm_receiver.listen_addr().context("listen")?,
                Some(handoff::Channel::Shm),
            )
            .await?;
        let tcp_peer = sender
            .connect_with(
                tcp_receiver.listen_addr().context("listen")?,
                Some(handoff::Channel::Tcp),
            )
            .await?;
        Ok(ShmBench {
            sender,
            shm_receiver,
            tcp_receiver,
            shm_peer,
            tcp_peer,
        })
    }

    fn stop(self) {
        self.sender.shutdown();
        self.shm_receiver.shutdown();
        self.tcp_receiver.shutdown();
    }

    /// One case at one size: median seconds of `reps` runs after a warm-up, beside memcpy.
    async fn run(&self, name: &str, size: u64, reps: usize) -> Result<Case> {
        let len = size as usize;
        let heap = Buffer::from(vec![0x3cu8; len]);
        let mut ours = Vec::new();
        for rep in 0..=reps {
            let t = match name {
                "shm-view" => {
                    self.transfer(&self.shm_peer, &self.shm_receiver, shared(len, rep)?, false)
                        .await?
                }
                "shm-read" => {
                    self.transfer(&self.shm_peer, &self.shm_receiver, shared(len, rep)?, true)
                        .await?
                }
                "tcp-read" => {
                    self.transfer(&self.tcp_peer, &self.tcp_receiver, shared(len, rep)?, true)
                        .await?
                }
                "shm-copy-in" => {
                    self.transfer(&self.shm_peer, &self.shm_receiver, heap.clone(), false)
                        .await?
                }
                other => anyhow::bail!("unknown case {other}"),
            };
            if rep > 0 {
                ours.push(t);
            }
            // Wait for the receiver's release, so the next run reuses the warm segment.
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.shm_peer.leases().count > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
        }
        let channel = if name.starts_with("tcp") { "tcp" } else { "shm" };
        Ok(case_runs(name, channel, size, ours, memcpy_runs(len, reps)))
    }

    /// Seconds from send until the receiver holds the decoded value (and, if `read`,
    /// has read every byte of it).
    async fn transfer(&self, peer: &Peer, receiver: &Node, data: Buffer, read: bool) -> Result<f64> {
        let started = Instant::now();
        peer.send(Blob { seq: 0, data }).await?;
        let blob: Blob = receiver.recv_timeout(Duration::from_secs(60)).await?.decode()?;
        if read {
            black_box(read_every_byte(&blob.data));
        }
        Ok(started.elapsed().as_secs_f64())
    }
}

/// A shared buffer written in place by the producer (not timed).
fn shared(len: usize, seed: usize) -> Result<Buffer> {
    let mut b = handoff::SharedBufMut::new(len)?;
    b.fill(seed as u8);
    Ok(b.freeze())
}

/// Reads every byte (a sum of 64-bit words).
fn read_every_byte(data: &[u8]) -> u64 {
    // SAFETY: any bytes are valid u64s; align_to splits off unaligned ends.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    let mut sum = words.iter().fold(0u64, |a, w| a.wrapping_add(*w));
    for b in head.iter().chain(tail) {
        sum = sum.wrapping_add(*b as u64);
    }
    sum
}

/// Seconds of each of several plain memcpys of `len` bytes between two warm buffers.
fn memcpy_runs(len: usize, reps: usize) -> Vec<f64> {
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src);
    let mut times = Vec::new();
    for _ in 0..reps.max(3) {
        let started = Instant::now();
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
        times.push(started.elapsed().as_secs_f64());
    }
    times
}

fn small_ping(seq: u64) -> Ping {
    Ping {
        seq,
        data: vec![0x5a; 100],
    }
}

/// One small message in-process, against a plain tokio channel carrying the same values.
async fn inproc_msg(plan: &Plan, secret: &str) -> Result<Case> {
    let a = protocol::register_all(Node::builder("bench-inproc-a").secret(secret))
        .build()
        .await?;
    let b = protocol::register_all(Node::builder("bench-inproc-b").secret(secret))
        .build()
        .await?;
    let peer = a.connect(&b.inproc_addr()).await?;
    let n = plan.msgs;
    let mut ours = Vec::new();
    let mut base = Vec::new();
    for rep in 0..=plan.reps {
        let started = Instant::now();
        for i in 0..n {
            peer.send(small_ping(i)).await?;
            let p: Ping = b.recv().await?.decode()?;
            black_box(p);
        }
        let t_ours = started.elapsed().as_secs_f64() / n as f64;

        let (tx, mut rx) = mpsc::channel::<Ping>(1024);
        let started = Instant::now();
        for i in 0..n {
            tx.send(small_ping(i)).await.ok().context("channel closed")?;
            black_box(rx.recv().await);
        }
        let t_base = started.elapsed().as_secs_f64() / n as f64;
        if rep > 0 {
            ours.push(t_ours);
            base.push(t_base);
        }
    }
    a.shutdown();
    b.shutdown();
    Ok(case_runs("inproc-msg", "inproc", 100, ours, base))
}

/// A small message there and back over TCP, against a raw TCP ping-pong of the same bytes.
async fn tcp_rtt(plan: &Plan, client: &Node, peer: &Peer) -> Result<Case> {
    let (mut raw_client, _echo) = raw_echo_pair(108).await?;
    let (ours, base) = rtt_runs(plan, client, peer, &mut raw_client).await?;
    Ok(case_runs("tcp-rtt", "tcp", 100, ours, base))
}

/// Seconds per round trip, one per repetition after a warm-up: `plan.rtts` small pings sent
/// to `peer` and echoed back to `client`, then as many 108-byte ping-pongs on `raw` (whose
/// other end echoes).
async fn rtt_runs<S: AsyncRead + AsyncWrite + Unpin>(
    plan: &Plan,
    client: &Node,
    peer: &Peer,
    raw: &mut S,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let n = plan.rtts;
    let mut ours = Vec::new();
    let mut base = Vec::new();
    let mut buf = [0u8; 108];
    for rep in 0..=plan.reps {
        let started = Instant::now();
        for i in 0..n {
            peer.send(small_ping(i)).await?;
            let p: Ping = client.recv_timeout(Duration::from_secs(30)).await?.decode()?;
            anyhow::ensure!(p.seq == i, "echo out of order");
        }
        let t_ours = started.elapsed().as_secs_f64() / n as f64;

        let started = Instant::now();
        for i in 0..n {
            buf[..8].copy_from_slice(&i.to_le_bytes());
            raw.write_all(&buf).await?;
            raw.read_exact(&mut buf).await?;
        }
        let t_base = started.elapsed().as_secs_f64() / n as f64;
        if rep > 0 {
            ours.push(t_ours);
            base.push(t_base);
        }
    }
    Ok((ours, base))
}

/// A raw TCP connection whose far end echoes fixed-size records.
async fn raw_echo_pair(record: usize) -> Result<(TcpStream, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        let mut buf = vec![0u8; record];
        while s.read_exact(&mut buf).await.is_ok() {
            if s.write_all(&buf).await.is_err() {
                return;
            }
        }
    });
    let client = TcpStream::connect(addr).await?;
    client.set_nodelay(true)?;
    Ok((client, echo))
}

/// Back-to-back buffers of `size` bytes over TCP, against a raw TCP stream of the same bytes.
async fn tcp_stream(plan: &Plan, client: &Node, peer: &Peer, size: u64) -> Result<Case> {
    let count = ((1u64 << 30) / size).clamp(4, 64);
    let count = if plan.reps <= 3 { count.min(8) } else { count };
    let data = Buffer::from(vec![0xa5u8; size as usize]);
    let mut raw = RawStream::start(size as usize).await?;
    let mut ours = Vec::new();
    let mut base = Vec::new();
    for rep in 0..=plan.reps {
        // Ours: the server acknowledges each blob with a small ping once decoded; we wait
        // for the acknowledgements after sending all, so transfers stream back to back.
        let started = Instant::now();
        for seq in 0..count {
            peer.send(Blob {
                seq,
                data: data.clone(),
            })
            .await?;
        }
        for _ in 0..count {
            let _: Ping = client.recv_timeout(Duration::from_secs(60)).await?.decode()?;
        }
        let t_ours = started.elapsed().as_secs_f64() / count as f64;
        let t_base = raw.run(&data, count).await? / count as f64;
        // The first repetition warms both sides up (receive buffers faulted in).
        if rep > 0 {
            ours.push(t_ours);
            base.push(t_base);
        }
    }
    Ok(case_runs("tcp-stream", "tcp", size, ours, base))
}

/// The raw baseline: a TCP stream whose receiver reads each record into one reused
/// buffer and acknowledges it with 8 bytes, as the handoff server acknowledges each blob.
struct RawStream {
    stream: TcpStream,
    _reader: tokio::task::JoinHandle<()>,
}

impl RawStream {
    async fn start(record: usize) -> Result<RawStream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let reader = tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let _ = s.set_nodelay(true);
            let mut buf = vec![1u8; record];
            while s.read_exact(&mut buf).await.is_ok() {
                if s.write_all(&[1u8; 8]).await.is_err() {
                    return;
                }
            }
        });
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawStream {
            stream,
            _reader: reader,
        })
    }

    /// Seconds to push `count` copies of `data` and receive every acknowledgement.
    async fn run(&mut self, data: &Buffer, count: u64) -> Result<f64> {
        let started = Instant::now();
        let (mut rd, mut wr) = self.stream.split();
        let write = async {
            for _ in 0..count {
                wr.write_all(data).await?;
            }
            anyhow::Ok(())
        };
        let acks = async {
            let mut ack = [0u8; 8];
            for _ in 0..count {
                rd.read_exact(&mut ack).await?;
            }
            anyhow::Ok(())
        };
        let (w, a) = tokio::join!(write, acks);
        w?;
        a?;
        Ok(started.elapsed().as_secs_f64())
    }
}

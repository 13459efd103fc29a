//! `handoff demo`: a small cluster on this machine, a transfer along every route, every byte verified.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use handoff::{Channel, Message as _, Node, Peer};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::demo_row::Row;
use crate::node_cmd::read_ready_line;
use crate::protocol::{self, Payload, Receipt, SendRequest};
use crate::scratch::{write_secret, TempDir};

/// Options of `handoff demo`.
///
/// The cluster: `alpha` and `beta` in this process, `gamma` in a child process with
/// another host identity (remote, tcp), `delta` in a child process with this host's
/// identity (same host, shm), and, when Python is available, the Python workers
/// `py-remote` (tcp) and `py-local` (shm); with Dask installed too, a Dask cluster on
/// `handoff://` (`python -m handoff.dask.demo`): `dask-a` to `dask-b` (shm) and to
/// `dask-r`, a worker of another host identity (tcp).
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Print the rows as a JSON array.
    #[arg(long)]
    pub json: bool,
    /// Size of the large buffer in each message, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub bytes: u64,
}

const WAIT: Duration = Duration::from_secs(60);

/// A child process running `handoff node`, killed when dropped.
struct Child {
    child: tokio::process::Child,
    _dir: TempDir,
}

/// What runs a child node: this executable (`handoff node`) or a Python interpreter
/// with the Python peer installed (`python -m handoff.worker`).
enum Runner<'a> {
    Rust,
    Python(&'a str),
}

async fn spawn_node(
    runner: Runner<'_>,
    name: &str,
    host_id: &str,
    secret: &str,
    connect: &str,
    extra: &[String],
) -> Result<Child> {
    let (dir, secret_path) = write_secret(secret)?;
    let mut command = match runner {
        Runner::Rust => {
            let mut c =
                tokio::process::Command::new(std::env::current_exe().context("finding the handoff executable")?);
            c.arg("node");
            c
        }
        Runner::Python(python) => {
            let mut c = tokio::process::Command::new(python);
            c.args(["-m", "handoff.worker"]);
            c
        }
    };
    let mut child = command
        .args(["--name", name, "--host-id", host_id, "--listen", "127.0.0.1:0"])
        .arg("--secret-file")
        .arg(&secret_path)
        .args(["--connect", connect])
        .args(extra)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the child node {name}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    read_ready_line(&mut lines, WAIT).await?;
    Ok(Child { child, _dir: dir })
}

fn row(from: &Peer, to_name: &str, bytes: u64, seconds: f64, verified: bool, sender: &str) -> Row {
    Row {
        from: sender.to_string(),
        to: to_name.to_string(),
        locality: from.locality().to_string(),
        channel: from.channel().to_string(),
        bytes,
        seconds,
        verified,
        data: None,
        path: None,
        storage_gets: None,
        dask_tcp_seconds: None,
        cold: true,
        warm_seconds: None,
        cold_seconds: None,
    }
}

/// Sends a payload from `src` to the in-process node `dst` and verifies it there.
async fn inproc_transfer(src: &Node, dst: &Node, id: u64, bytes: u64) -> Result<Row> {
    let peer = src.peer(dst.name()).context("in-process peer")?;
    let payload = protocol::make_payload(id, bytes as usize);
    let started = Instant::now();
    peer.send(payload).await?;
    let env = dst.recv_timeout(WAIT).await?;
    let got: Payload = env.decode()?;
    let seconds = started.elapsed().as_secs_f64();
    let (verified, _) = protocol::verify(&got);
    Ok(row(
        &peer,
        dst.name(),
        bytes,
        seconds,
        verified && got.id == id,
        src.name(),
    ))
}

/// Sends a payload from `src` to the remote peer; the peer verifies it and sends a receipt.
async fn send_to_remote(src: &Node, peer: &Peer, id: u64, bytes: u64) -> Result<Row> {
    let payload = protocol::make_payload(id, bytes as usize);
    let started = Instant::now();
    peer.send(payload).await?;
    let env = src.recv_timeout(WAIT).await?;
    let elapsed = started.elapsed().as_secs_f64();
    if env.type_name() != Receipt::TYPE_NAME {
        bail!("expected a receipt from {}, got {}", peer.name(), env.type_name());
    }
    let r: Receipt = env.decode()?;
    let verified = r.verified && r.id == id && r.bytes == bytes;
    Ok(row(
        peer,
        peer.name(),
        bytes,
        (elapsed - r.verify_seconds).max(0.0),
        verified,
        src.name(),
    ))
}

/// Asks the remote peer to send a payload to `dst`, which verifies it.
async fn receive_from_remote(dst: &Node, peer: &Peer, id: u64, bytes: u64) -> Result<Row> {
    let started = Instant::now();
    peer.send(SendRequest { id, bytes }).await?;
    let env = dst.recv_timeout(WAIT).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let p: Payload = env.decode().context("expected the requested payload")?;
    let (verified, _) = protocol::verify(&p);
    Ok(Row {
        from: peer.name().to_string(),
        to: dst.name().to_string(),
        locality: peer.locality().to_string(),
        channel: peer.channel().to_string(),
        bytes,
        seconds: (elapsed - p.prepare_seconds).max(0.0),
        verified: verified && p.id == id && p.data.len() as u64 == bytes,
        data: None,
        path: None,
        storage_gets: None,
        dask_tcp_seconds: None,
        cold: true,
        warm_seconds: None,
        cold_seconds: None,
    })
}

/// Transfers after a route's first one, whose median is the row's warm figure.
const WARM_REPS: u64 = 3;

/// Runs `transfer` once (cold) and then [`WARM_REPS`] times more along the same route: the first
/// transfer's row, with the median of the others as `warm_seconds` and verified only if all were.
/// `transfer` gets the repetition (0 for the first) to make each message's id distinct.
async fn cold_and_warm<F, Fut>(mut transfer: F) -> Result<Row>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Row>>,
{
    let mut first = transfer(0).await?;
    let mut warm = Vec::new();
    for rep in 1..=WARM_REPS {
        let again = transfer(rep).await?;
        first.verified &= again.verified;
        warm.push(again.seconds);
    }
    warm.sort_by(f64::total_cmp);
    first.cold = true;
    first.warm_seconds = Some(warm[warm.len() / 2]);
    Ok(first)
}

/// The id of repetition `rep` of the transfer `id` (distinct from every other transfer's).
fn rep_id(id: u64, rep: u64) -> u64 {
    id + rep * 1000
}

/// The Python interpreter that has the Python peer installed: `$HANDOFF_PYTHON` (set by
/// `scripts/demo`), else `.venv/bin/python`, else `python3`, if it can import `handoff`.
fn python() -> Result<String, String> {
    let candidates: Vec<String> = std::env::var("HANDOFF_PYTHON")
        .ok()
        .into_iter()
        .chain([".venv/bin/python".to_string(), "python3".to_string()])
        .collect();
    for candidate in &candidates {
        let ok = std::process::Command::new(candidate)
            .args(["-c", "import handoff.worker"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(candidate.clone());
        }
    }
    Err(format!(
        "none of {} can import the Python peer (run ./scripts/demo, which installs it)",
        candidates.join(", ")
    ))
}

/// The exit status of `python -m handoff.dask.demo` when Dask is not installed.
const NO_DASK: i32 = 3;
/// How long the Dask rows may take (two clusters of worker processes).
const DASK_WAIT: Duration = Duration::from_secs(300);

/// The Dask rows: `python -m handoff.dask.demo` starts a `LocalCluster` on `handoff://`
/// (and one on `tcp://` to compare), moves the array between its workers, verifies each
/// transfer (digest, and the channel the receiver's counters saw) and prints the rows.
/// `None` when Dask is not installed.
async fn dask_rows(python: &str, bytes: u64) -> Result<Option<Vec<Row>>> {
    let mut command = tokio::process::Command::new(python);
    command
        .args(["-m", "handoff.dask.demo", "--bytes", &bytes.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(DASK_WAIT, command.output())
        .await
        .with_context(|| format!("python -m handoff.dask.demo did not finish within {DASK_WAIT:?}"))?
        .context("running python -m handoff.dask.demo")?;
    if out.status.code() == Some(NO_DASK) {
        return Ok(None);
    }
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout).with_context(|| {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        format!(
            "python -m handoff.dask.demo ({}) printed no rows: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    })?;
    // Array rows carry their tcp:// figure; data-handle rows (with `data`) have none.
    if rows.is_empty() || rows.iter().any(|r| r.data.is_none() && r.dask_tcp_seconds.is_none()) {
        bail!("python -m handoff.dask.demo printed rows without their tcp:// figure");
    }
    // Rows that are not verified stay: the demo then fails, saying which.
    Ok(Some(rows))
}

/// Waits until the peer `name` is connected on `channel` (a same-host peer first arrives
/// over TCP and then switches to its Unix socket).
async fn wait_for_channel(node: &Node, name: &str, channel: Channel) -> Result<Peer> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(p) = node.peer(name).filter(|p| p.channel() == channel && !p.is_closed()) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            let now = node.peer(name).map(|p| p.channel().to_string());
            bail!("peer {name} did not connect over {channel} within {WAIT:?} (now: {now:?})");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs the demo and prints its rows.
pub async fn run(args: DemoArgs) -> Result<()> {
    let rows = run_rows(args.bytes).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", crate::demo_table::render(&rows, WARM_REPS));
    }
    if rows.iter().any(|r| !r.verified) {
        bail!("some transfers were not verified");
    }
    Ok(())
}

/// Starts the cluster and runs one transfer per route.
pub async fn run_rows(bytes: u64) -> Result<Vec<Row>> {
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let alpha = protocol::register_all(Node::builder("alpha").listen("127.0.0.1:0").secret(secret.clone()))
        .build()
        .await?;
    let beta = protocol::register_all(Node::builder("beta").secret(secret.clone()))
        .build()
        .await?;
    alpha.connect(&beta.inproc_addr()).await?;
    let remote_host = format!("{}-gamma", alpha.endpoint().host_id);
    let listen = alpha.listen_addr().context("alpha listens")?.to_string();
    // Storage and catalogs for the data-handle rows: gamma has its own cache, delta shares alpha's.
    let data = crate::demo_data::setup(&alpha, bytes).await?;
    let gamma_args = data.child_args(&data.gamma_cache);
    let mut children = vec![spawn_node(Runner::Rust, "gamma", &remote_host, &secret, &listen, &gamma_args).await?];
    let gamma = alpha.wait_for_peer("gamma", WAIT).await?;
    // Same host identity: delta reaches alpha over TCP, then switches to alpha's Unix socket.
    let host = alpha.endpoint().host_id.clone();
    let delta_args = data.child_args(&data.alpha_cache);
    children.push(spawn_node(Runner::Rust, "delta", &host, &secret, &listen, &delta_args).await?);
    let delta = wait_for_channel(&alpha, "delta", Channel::Shm).await?;

    let mut rows = Vec::new();
    rows.push(cold_and_warm(|rep| inproc_transfer(&alpha, &beta, rep_id(1, rep), bytes)).await?);
    rows.push(cold_and_warm(|rep| inproc_transfer(&beta, &alpha, rep_id(2, rep), bytes)).await?);
    rows.push(cold_and_warm(|rep| send_to_remote(&alpha, &gamma, rep_id(3, rep), bytes)).await?);
    rows.push(cold_and_warm(|rep| receive_from_remote(&alpha, &gamma, rep_id(4, rep), bytes)).await?);
    rows.push(cold_and_warm(|rep| send_to_remote(&alpha, &delta, rep_id(5, rep), bytes)).await?);
    rows.push(cold_and_warm(|rep| receive_from_remote(&alpha, &delta, rep_id(6, rep), bytes)).await?);
    rows.extend(data.rows(&alpha, &gamma, &delta).await?);

    // Python workers, one on another host identity (tcp) and one on ours (shm).
    match python() {
        Ok(python) => {
            let remote = format!("{host}-py");
            children.push(spawn_node(Runner::Python(&python), "py-remote", &remote, &secret, &listen, &[]).await?);
            let py_remote = alpha.wait_for_peer("py-remote", WAIT).await?;
            children.push(spawn_node(Runner::Python(&python), "py-local", &host, &secret, &listen, &[]).await?);
            let py_local = wait_for_channel(&alpha, "py-local", Channel::Shm).await?;
            rows.push(cold_and_warm(|rep| send_to_remote(&alpha, &py_remote, rep_id(7, rep), bytes)).await?);
            rows.push(cold_and_warm(|rep| receive_from_remote(&alpha, &py_remote, rep_id(8, rep), bytes)).await?);
            rows.push(cold_and_warm(|rep| send_to_remote(&alpha, &py_local, rep_id(9, rep), bytes)).await?);
            rows.push(cold_and_warm(|rep| receive_from_remote(&alpha, &py_local, rep_id(10, rep), bytes)).await?);
            // The Python worker has no catalog: a handle comes to it through the fallback.
            rows.push(data.send(&alpha, &py_remote, 104, "demo-blob").await?);
            match dask_rows(&python, bytes).await? {
                Some(dask) => rows.extend(dask),
                None => {
                    eprintln!("note: the Dask rows are skipped: Dask is not installed (pip install './python[dask]')")
                }
            }
        }
        Err(why) => eprintln!("note: the Python worker is skipped: {why}"),
    }

    for c in &mut children {
        let _ = c.child.start_kill();
        let _ = c.child.wait().await;
    }
    alpha.shutdown();
    beta.shutdown();
    Ok(rows)
}

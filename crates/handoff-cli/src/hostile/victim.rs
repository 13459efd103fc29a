//! The victim: a real node process (`handoff node`, or the Python peer's worker) started
//! with small bounds; what it uses, read from `/proc`; and a legitimate peer that keeps
//! asking it for 100-byte round trips on a thread of its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Channel, Message as _, Node};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::node_cmd::read_ready_line;
use crate::protocol::{self, Ping};

/// Which implementation the victim is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// `handoff node`.
    Rust,
    /// `python -m handoff.worker`.
    Python,
}

/// The bounds the victim runs with: small, so that attacks reach them quickly. What the
/// checks allow is derived from these.
pub struct Bounds {
    pub buffered_per_peer: u64,
    pub buffered_total: u64,
    pub queue_bytes: u64,
    pub max_held: usize,
    pub max_held_bytes: u64,
    pub max_request: u64,
    pub shm_per_peer: u64,
    pub handshakes: usize,
    pub timeout_ms: u64,
}

impl Bounds {
    pub const SMALL: Bounds = Bounds {
        buffered_per_peer: 16 << 20,
        buffered_total: 64 << 20,
        queue_bytes: 16 << 20,
        max_held: 64,
        max_held_bytes: 16 << 20,
        max_request: 64 << 20,
        shm_per_peer: 16 << 20,
        handshakes: 64,
        timeout_ms: 2000,
    };

    /// What the victim may hold for peers at most, all bounds together: every peer's
    /// buffered bytes (twice, while it waits for its own requests), answer queues and holds
    /// of the (few) peers an attack uses.
    pub fn memory_allowance(&self) -> u64 {
        2 * self.buffered_total + 4 * self.queue_bytes + 2 * self.max_held_bytes
    }
}

/// A running victim process.
pub struct Victim {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub listen: String,
    pub secret: Vec<u8>,
    pub log: PathBuf,
    _dir: TempDir,
}

/// A folder removed when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Victim {
    /// Starts a victim with [`Bounds::SMALL`] (plus `extra` arguments).
    pub async fn start(kind: Kind, python: &Path, extra: &[&str]) -> Result<Victim> {
        let dir = std::env::temp_dir().join(format!(
            "handoff-hostile-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let dir = TempDir(dir);
        let secret = b"hostile-secret".to_vec();
        let secret_file = dir.0.join("secret");
        std::fs::write(&secret_file, &secret)?;
        let log = dir.0.join("victim.log");
        let b = Bounds::SMALL;
        let mut cmd = match kind {
            Kind::Rust => {
                let exe = std::env::current_exe().context("finding the handoff executable")?;
                let mut c = tokio::process::Command::new(exe);
                c.args(["node", "--name", "victim"]);
                c
            }
            Kind::Python => {
                let mut c = tokio::process::Command::new(python);
                c.args(["-m", "handoff.worker", "--name", "victim"]);
                c
            }
        };
        cmd.arg("--secret-file").arg(&secret_file);
        let s = |v: u64| v.to_string();
        let args: Vec<(&str, String)> = vec![
            ("--max-buffered-bytes-per-peer", s(b.buffered_per_peer)),
            ("--max-buffered-bytes", s(b.buffered_total)),
            ("--max-handshakes", s(b.handshakes as u64)),
            ("--max-held", s(b.max_held as u64)),
            ("--max-held-bytes", s(b.max_held_bytes)),
            ("--max-request-bytes", s(b.max_request)),
            ("--max-shm-bytes-per-peer", s(b.shm_per_peer)),
            ("--answer-queue-bytes", s(b.queue_bytes)),
            ("--handshake-timeout-ms", s(b.timeout_ms)),
            ("--progress-timeout-ms", s(b.timeout_ms)),
            ("--write-timeout-ms", s(b.timeout_ms)),
            ("--lease-wait-ms", s(b.timeout_ms)),
            ("--pull-timeout-ms", s(b.timeout_ms)),
        ];
        for (flag, value) in &args {
            cmd.arg(flag).arg(value);
        }
        cmd.args(extra);
        let mut child = cmd
            .env("HANDOFF_LOG", "warn")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the {kind:?} victim"))?;
        let stdout = child.stdout.take().context("victim stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = read_ready_line(&mut lines, Duration::from_secs(30)).await?;
        // Keep reading its standard output so that it never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Victim {
            pid: child.id().context("victim pid")?,
            child,
            listen: ready["listen"].as_str().context("listen address")?.to_string(),
            secret,
            log,
            _dir: dir,
        })
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Bytes written to its log so far.
    pub fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    /// The last lines of its log (for a report).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

/// What `/proc/PID/status` says about memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub rss: u64,
    pub vm: u64,
}

/// Reads resident and virtual memory of `pid`.
pub fn memory(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        vm: field("VmSize:")?,
    })
}

/// Open descriptors of `pid`.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// How many of a process's open descriptors are files whose link names contain `what`
/// (`"memfd:handoff-hostile"`: the memfds an attacker passed it).
pub fn open_fds_naming(pid: u32, what: &str) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains(what))
        .count()
}

/// Samples a process's memory every few milliseconds; keeps the peaks.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<Mutex<Memory>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(Mutex::new(memory(pid).unwrap_or_default()));
        let (s, p) = (stop.clone(), peak.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Acquire) {
                if let Some(m) = memory(pid) {
                    let mut peak = p.lock().expect("sampler lock");
                    peak.rss = peak.rss.max(m.rss);
                    peak.vm = peak.vm.max(m.vm);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Sampler { stop, peak, task }
    }

    pub async fn finish(self) -> Memory {
        self.stop.store(true, Ordering::Release);
        let _ = self.task.await;
        let m = *self.peak.lock().expect("sampler lock");
        m
    }
}

/// Phases of the legitimate peer's measurements.
const IDLE: u8 = 0;
const ATTACK: u8 = 1;
const AFTER: u8 = 2;

/// A legitimate peer on a thread (and runtime) of its own: 100-byte round trips to the
/// victim, one every few milliseconds, recorded by phase.
pub struct Prober {
    phase: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u8, Duration)>>>,
    failures: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the legitimate peer saw.
#[derive(Debug, Clone, Default)]
pub struct Probes {
    pub idle: Vec<Duration>,
    pub attack: Vec<Duration>,
    pub after: Vec<Duration>,
    pub failures: Vec<String>,
}

pub fn median(v: &[Duration]) -> Option<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied()
}

impl Prober {
    /// Connects to the victim (over TCP) and starts probing; returns once connected.
    pub fn start(listen: &str, secret: &[u8]) -> Result<Prober> {
        let phase = Arc::new(AtomicU8::new(IDLE));
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let (ph, st, sa, fa) = (phase.clone(), stop.clone(), samples.clone(), failures.clone());
        let (listen, secret) = (listen.to_string(), secret.to_vec());
        let thread = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let node = match protocol::register_all(Node::builder("prober").secret(secret).shm(false))
                    .build()
                    .await
                {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let peer = match node.connect_with(&listen, Some(Channel::Tcp)).await {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut seq = 0u64;
                while !st.load(Ordering::Acquire) {
                    seq += 1;
                    let now_phase = ph.load(Ordering::Acquire);
                    let started = Instant::now();
                    let ping = Ping {
                        seq,
                        data: vec![7u8; 100],
                    };
                    let answered = async {
                        peer.send(ping).await?;
                        loop {
                            let env = node.recv().await?;
                            if env.type_name() == Ping::TYPE_NAME && env.decode::<Ping>()?.seq == seq {
                                return Ok::<_, handoff::Error>(());
                            }
                        }
                    };
                    match tokio::time::timeout(Duration::from_secs(5), answered).await {
                        Ok(Ok(())) => sa.lock().expect("probe lock").push((now_phase, started.elapsed())),
                        Ok(Err(e)) => fa.lock().expect("probe lock").push(format!("ping {seq}: {e}")),
                        Err(_) => fa
                            .lock()
                            .expect("probe lock")
                            .push(format!("ping {seq}: no answer within 5 s")),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .context("the legitimate peer did not connect in time")??;
        Ok(Prober {
            phase,
            stop,
            samples,
            failures,
            thread: Some(thread),
        })
    }

    /// Waits until `n` idle round trips are measured.
    pub async fn idle(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.count(IDLE) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn count(&self, phase: u8) -> usize {
        self.samples
            .lock()
            .expect("probe lock")
            .iter()
            .filter(|s| s.0 == phase)
            .count()
    }

    pub fn attack_begins(&self) {
        self.phase.store(ATTACK, Ordering::Release);
    }

    /// Ends the attack phase and waits for a few round trips after it.
    pub async fn attack_ends(&self) {
        self.phase.store(AFTER, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.count(AFTER) < 5 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn finish(mut self) -> Probes {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let samples = self.samples.lock().expect("probe lock");
        let pick = |p: u8| samples.iter().filter(|s| s.0 == p).map(|s| s.1).collect::<Vec<_>>();
        Probes {
            idle: pick(IDLE),
            attack: pick(ATTACK),
            after: pick(AFTER),
            failures: self.failures.lock().expect("probe lock").clone(),
        }
    }
}

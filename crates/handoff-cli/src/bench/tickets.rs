//! Tickets between processes: `ticket-pull` (a receiver redeems a ticket from the owner, a child process) and
//! `ticket-3party` (a receiver forwards the ticket and a third node redeems it), against the same bytes sent
//! plainly over TCP.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Node, Peer};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use super::case::{case_runs, Case};
use crate::protocol::{self, Payload, SendRequest};

/// The owner runs in a child process (`handoff node`, its own host identity) and sends its
/// payloads by ticket; `b` and `c` run here, redeem lazily, and `b` may forward to `c`.
pub(super) struct TicketBench {
    owner: tokio::process::Child,
    _secret_dir: crate::scratch::TempDir,
    b: Node,
    c: Node,
    to_owner: Peer,
    bc: Peer,
}

impl TicketBench {
    pub(super) async fn start(secret: &str) -> Result<TicketBench> {
        let build = |name: &str| {
            protocol::register_all(Node::builder(name).listen("127.0.0.1:0").secret(secret))
                .host_id(format!("bench-{name}"))
                .redeem(handoff::Redeem::Lazy)
        };
        let b = build("bench-ticket-b").build().await?;
        let c = build("bench-ticket-c").build().await?;
        let bc = b.connect(c.listen_addr().context("listen")?).await?;
        let (secret_dir, secret_file) = crate::scratch::write_secret(secret)?;
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

    pub(super) fn stop(mut self) {
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
    pub(super) async fn run(&self, name: &str, size: u64, reps: usize) -> Result<Case> {
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

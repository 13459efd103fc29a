//! Against a `handoff node` on another host (`--remote`): `remote-rtt` (a small message there
//! and back, against a raw 100-byte echo) and `remote-ticket-pull` (redeeming a ticket of
//! the remote's, against a raw request for the same number of bytes). The raw baseline is
//! the same node's `--raw-listen` server, so both cross the same network path in the same
//! run; behind a delay line (`bench/lab.py`'s `delay` case) both pay the same delay.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Node, Peer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::case::{case_runs, median, Case, Plan};
use crate::protocol::{self, Payload, Ping, SendRequest};
use crate::raw_serve::{bulk_request, echo_request};

/// Where the remote node is, and how to reach it.
pub(super) struct Remote<'a> {
    /// The node's handoff address, `tcp://HOST:PORT`.
    pub(super) addr: &'a str,
    /// The node's raw baseline address (`handoff node --raw-listen`), `HOST:PORT`.
    pub(super) raw_addr: &'a str,
    /// The cluster secret's file.
    pub(super) secret_file: &'a PathBuf,
}

/// A local node connected to the remote one, and a raw connection to its baseline server.
pub(super) struct RemoteBench {
    node: Node,
    peer: Peer,
    raw: TcpStream,
}

const PING_BYTES: usize = 100;

impl RemoteBench {
    pub(super) async fn start(remote: &Remote<'_>) -> Result<RemoteBench> {
        let secret = crate::node_cmd::read_secret(remote.secret_file)?;
        let name = format!("bench-remote-{}", std::process::id());
        let node = protocol::register_all(Node::builder(&name).secret(secret))
            .redeem(handoff::Redeem::Lazy)
            .build()
            .await?;
        let peer = node
            .connect(remote.addr)
            .await
            .with_context(|| format!("--remote {}", remote.addr))?;
        let raw = TcpStream::connect(remote.raw_addr)
            .await
            .with_context(|| format!("--raw-remote {} (the remote node's --raw-listen)", remote.raw_addr))?;
        raw.set_nodelay(true)?;
        Ok(RemoteBench { node, peer, raw })
    }

    pub(super) fn stop(self) {
        self.node.shutdown();
    }

    /// Seconds of each of `n` raw 100-byte echoes.
    async fn raw_round_trips(&mut self, n: u64) -> Result<Vec<f64>> {
        let mut out = vec![0u8; 8 + PING_BYTES];
        out[..8].copy_from_slice(&echo_request(PING_BYTES as u64));
        let mut back = [0u8; PING_BYTES];
        let mut times = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let started = Instant::now();
            self.raw.write_all(&out).await?;
            self.raw.read_exact(&mut back).await?;
            times.push(started.elapsed().as_secs_f64());
        }
        Ok(times)
    }

    /// `remote-rtt`: `plan.rtts` pings echoed by the remote node, then as many raw echoes,
    /// per repetition; seconds per round trip.
    pub(super) async fn rtt(&mut self, plan: &Plan) -> Result<Case> {
        let n = plan.rtts;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for rep in 0..=plan.reps {
            let started = Instant::now();
            for seq in 0..n {
                self.peer
                    .send(Ping {
                        seq,
                        data: vec![0x5a; PING_BYTES],
                    })
                    .await?;
                let p: Ping = self.node.recv_timeout(Duration::from_secs(30)).await?.decode()?;
                anyhow::ensure!(p.seq == seq, "echo out of order");
            }
            let t_ours = started.elapsed().as_secs_f64() / n as f64;
            let t_base = self.raw_round_trips(n).await?.iter().sum::<f64>() / n as f64;
            if rep > 0 {
                ours.push(t_ours);
                base.push(t_base);
            }
        }
        Ok(case_runs(
            "remote-rtt",
            &self.peer.channel().to_string(),
            PING_BYTES as u64,
            ours,
            base,
        ))
    }

    /// `remote-ticket-pull`: the remote node sends `size` bytes by ticket (not timed); we
    /// time redeeming it, from the pull's request to the last byte checked against the
    /// ticket's digest. The baseline: a raw request for `size` bytes, from the request to
    /// the last byte read. The row also gives the raw round trip measured in the same run,
    /// and how many of them the pull took over the raw request-response.
    pub(super) async fn ticket_pull(&mut self, plan: &Plan, size: u64) -> Result<Case> {
        let mut sink = vec![0u8; size as usize];
        let (mut ours, mut base, mut trips) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..=plan.ticket_reps {
            self.peer
                .send(SendRequest {
                    id: rep as u64,
                    bytes: size,
                })
                .await?;
            let payload: Payload = self.node.recv_timeout(Duration::from_secs(120)).await?.decode()?;
            let ticket = handoff::Ticket::of(&payload.data).context(
                "the remote node sent the bytes inline, not by ticket: start it with --ticket-threshold 65536",
            )?;
            let started = Instant::now();
            let bytes = ticket.redeem().await?;
            let t_ours = started.elapsed().as_secs_f64();
            anyhow::ensure!(bytes.len() as u64 == size, "redeemed {} bytes of {size}", bytes.len());
            drop((bytes, ticket, payload));

            let started = Instant::now();
            self.raw.write_all(&bulk_request(size)).await?;
            self.raw.read_exact(&mut sink).await?;
            let t_base = started.elapsed().as_secs_f64();
            let rtts = self.raw_round_trips(20).await?;
            if rep > 0 {
                ours.push(t_ours);
                base.push(t_base);
                trips.extend(rtts);
            }
        }
        let mut row = case_runs("remote-ticket-pull", &self.peer.channel().to_string(), size, ours, base);
        let round_trip = median(trips);
        row.round_trip = Some(round_trip);
        row.extra_round_trips = Some((row.ours - row.baseline) / round_trip);
        Ok(row)
    }
}

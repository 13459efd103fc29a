//! The shm channel against its baselines: `shm-rtt` (a small message there and back over the channel's Unix
//! socket, against a raw Unix socket ping-pong), and `shm-view`, `shm-read`, `tcp-read`, `shm-copy-in` (a large
//! shared buffer viewed, read or copied in, against a plain memcpy).

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Buffer, Node, Peer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::case::{case_runs, Case, Plan};
use super::messages::rtt_runs;
use crate::protocol::{self, Blob};

/// A 100-byte message there and back between two nodes of this process over the shm
/// channel (a Unix socket), against a raw Unix socket ping-pong of the same 108 bytes.
pub(super) async fn shm_rtt(plan: &Plan, secret: &str) -> Result<Case> {
    let build = |name: &str| {
        protocol::register_all(Node::builder(name).listen("127.0.0.1:0").secret(secret)).host_id("bench-rtt-host")
    };
    let server = build("bench-rtt-server").build().await?;
    let client = build("bench-rtt-client").build().await?;
    let serving = server.clone();
    let server_task = tokio::spawn(async move { crate::serve::serve(&serving).await });
    let peer = client
        .connect_with(
            server.listen_addr().context("listen address")?,
            Some(handoff::Channel::Shm),
        )
        .await?;
    anyhow::ensure!(
        peer.channel() == handoff::Channel::Shm,
        "shm-rtt: the peer is on {} instead of shm",
        peer.channel()
    );

    let (mut raw, far) = UnixStream::pair()?;
    let echo = tokio::spawn(async move {
        let mut far = far;
        let mut buf = [0u8; 108];
        while far.read_exact(&mut buf).await.is_ok() {
            if far.write_all(&buf).await.is_err() {
                return;
            }
        }
    });

    let (ours, base) = rtt_runs(plan, &client, &peer, &mut raw).await?;
    drop(raw);
    let _ = echo.await;
    server.shutdown();
    client.shutdown();
    let _ = server_task.await;
    Ok(case_runs("shm-rtt", "shm", 100, ours, base))
}

/// Two receivers in this process: one reached over the Unix socket (shm), one pinned to
/// TCP with another host identity; the sender measures a transfer until the receiver
/// holds (or has read) the value.
pub(super) struct ShmBench {
    sender: Node,
    shm_receiver: Node,
    tcp_receiver: Node,
    shm_peer: Peer,
    tcp_peer: Peer,
}

impl ShmBench {
    pub(super) async fn start(secret: &str) -> Result<ShmBench> {
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

    pub(super) fn stop(self) {
        self.sender.shutdown();
        self.shm_receiver.shutdown();
        self.tcp_receiver.shutdown();
    }

    /// One case at one size: median seconds of `reps` runs after a warm-up, beside memcpy.
    pub(super) async fn run(&self, name: &str, size: u64, reps: usize) -> Result<Case> {
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

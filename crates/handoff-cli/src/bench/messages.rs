//! Small messages and streams: `inproc-msg` (against a tokio channel), `tcp-rtt` (against a
//! raw TCP ping-pong), `tcp-stream` (against a raw TCP stream with the same acknowledgements)
//! and `tls-stream` (against a raw rustls stream), and the round-trip loop that `shm-rtt` shares.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::{Buffer, Node, Peer, TlsConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::case::{case_runs, Case, Plan};
use crate::protocol::{self, Blob, Ping};

fn small_ping(seq: u64) -> Ping {
    Ping {
        seq,
        data: vec![0x5a; 100],
    }
}

/// One small message in-process, against a plain tokio channel carrying the same values.
pub(super) async fn inproc_msg(plan: &Plan, secret: &str) -> Result<Case> {
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
pub(super) async fn tcp_rtt(plan: &Plan, client: &Node, peer: &Peer) -> Result<Case> {
    let (mut raw_client, _echo) = raw_echo_pair(108).await?;
    let (ours, base) = rtt_runs(plan, client, peer, &mut raw_client).await?;
    Ok(case_runs("tcp-rtt", "tcp", 100, ours, base))
}

/// Seconds per round trip, one per repetition after a warm-up: `plan.rtts` small pings sent
/// to `peer` and echoed back to `client`, then as many 108-byte ping-pongs on `raw` (whose
/// other end echoes).
pub(super) async fn rtt_runs<S: AsyncRead + AsyncWrite + Unpin>(
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
pub(super) async fn tcp_stream(plan: &Plan, client: &Node, peer: &Peer, size: u64) -> Result<Case> {
    let raw = RawStream::start(size as usize, None).await?;
    stream_case(plan, client, peer, size, raw, ("tcp-stream", "tcp")).await
}

/// As `tcp-stream` with both nodes' TCP inside TLS, against a raw TLS stream of the same
/// bytes made with the same TLS library and certificates (rustls).
pub(super) async fn tls_stream(plan: &Plan, client: &Node, peer: &Peer, size: u64, tls: &TlsConfig) -> Result<Case> {
    let raw = RawStream::start(size as usize, Some(tls)).await?;
    stream_case(plan, client, peer, size, raw, ("tls-stream", "tls")).await
}

async fn stream_case(
    plan: &Plan,
    client: &Node,
    peer: &Peer,
    size: u64,
    mut raw: RawStream,
    (name, channel): (&'static str, &'static str),
) -> Result<Case> {
    let count = ((1u64 << 30) / size).clamp(4, 64);
    let count = if plan.reps <= 3 { count.min(8) } else { count };
    let data = Buffer::from(vec![0xa5u8; size as usize]);
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
    Ok(case_runs(name, channel, size, ours, base))
}

/// A stream of the raw baselines: plain TCP or TLS over TCP.
trait RawIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawIo for T {}

/// The raw baseline: a TCP stream (inside TLS, for `tls-stream`) whose receiver reads each
/// record into one reused buffer and acknowledges it with 8 bytes, as the handoff server
/// acknowledges each blob.
struct RawStream {
    stream: Box<dyn RawIo>,
    _reader: tokio::task::JoinHandle<()>,
}

impl RawStream {
    async fn start(record: usize, tls: Option<&TlsConfig>) -> Result<RawStream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let acceptor = tls.map(|t| tokio_rustls::TlsAcceptor::from(t.rustls_configs().1));
        let reader = tokio::spawn(async move {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let _ = s.set_nodelay(true);
            let mut s: Box<dyn RawIo> = match acceptor {
                None => Box::new(s),
                Some(acceptor) => match acceptor.accept(s).await {
                    Ok(t) => Box::new(t),
                    Err(_) => return,
                },
            };
            let mut buf = vec![1u8; record];
            while s.read_exact(&mut buf).await.is_ok() {
                if s.write_all(&[1u8; 8]).await.is_err() || s.flush().await.is_err() {
                    return;
                }
            }
        });
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let stream: Box<dyn RawIo> = match tls {
            None => Box::new(stream),
            Some(t) => {
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").context("server name")?;
                let connector = tokio_rustls::TlsConnector::from(t.rustls_configs().0);
                Box::new(connector.connect(name, stream).await.context("raw TLS handshake")?)
            }
        };
        Ok(RawStream {
            stream,
            _reader: reader,
        })
    }

    /// Seconds to push `count` copies of `data` and receive every acknowledgement.
    async fn run(&mut self, data: &Buffer, count: u64) -> Result<f64> {
        let started = Instant::now();
        let (mut rd, mut wr) = tokio::io::split(&mut self.stream);
        let write = async {
            for _ in 0..count {
                wr.write_all(data).await?;
            }
            wr.flush().await?;
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

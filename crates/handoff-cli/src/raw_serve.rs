//! The raw baseline server of `handoff node --raw-listen`: plain TCP with no handshake, no
//! secret and no framing beyond one word per request, so that `handoff bench --remote` can
//! time handoff against a raw socket between the same two hosts.
//!
//! Each request is an 8-byte big-endian word `w`:
//! - top bit clear: the server writes `w` bytes back (a bulk response);
//! - top bit set: the server reads `n = w & !(1 << 63)` bytes (at most [`MAX_ECHO_BYTES`])
//!   and writes them back (an echo).
//!
//! A bulk response is written from one buffer of the largest size asked for so far, shared
//! by every connection and made once (a handoff owner too sends from a buffer as large as
//! what it sends, not from a small block that stays in the CPU's cache).
//!
//! Bounds: at most [`MAX_RAW_CONNECTIONS`] connections at once (more are closed at accept);
//! a bulk response is at most the node's `--max-request-bytes`, and so is the shared
//! buffer; an echo holds at most [`MAX_ECHO_BYTES`] per connection; a connection silent
//! for [`IDLE`] is closed. A request over a bound closes that connection and nothing else.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use handoff::{limited_warn, Bounds, LogLimiter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections served at once.
pub const MAX_RAW_CONNECTIONS: usize = 16;
/// Largest echo request.
pub const MAX_ECHO_BYTES: u64 = 64 << 10;
/// How long a connection may wait between requests.
pub const IDLE: Duration = Duration::from_secs(60);
const ECHO: u64 = 1 << 63;

/// The bulk responses' bytes: as large as the largest response so far.
type Shared = Arc<std::sync::Mutex<Arc<Vec<u8>>>>;

/// The shared buffer, grown to at least `n` bytes first.
fn bytes_for(shared: &Shared, n: usize) -> Arc<Vec<u8>> {
    let mut current = shared.lock().expect("raw buffer lock");
    if current.len() < n {
        *current = Arc::new(vec![0x5a; n]);
    }
    current.clone()
}

/// A request word asking for `n` bytes back.
pub fn bulk_request(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// A request word announcing `n` bytes to be echoed.
pub fn echo_request(n: u64) -> [u8; 8] {
    (n | ECHO).to_be_bytes()
}

/// Binds `addr` and serves raw requests until the process exits; returns the bound address.
pub async fn start(addr: &str, max_bytes: u64) -> Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--raw-listen {addr}"))?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(MAX_RAW_CONNECTIONS));
    let shared: Shared = Arc::default();
    // Warnings come from peers that prove nothing: as many as a node's, no more.
    let log = Arc::new(LogLimiter::new(
        Bounds::DEFAULT.warnings_per_period,
        Bounds::DEFAULT.warning_period,
    ));
    tokio::spawn(async move {
        loop {
            let Ok((stream, from)) = listener.accept().await else {
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                limited_warn!(log, %from, "raw baseline: over {MAX_RAW_CONNECTIONS} connections; closed a new one");
                continue;
            };
            let (shared, log) = (shared.clone(), log.clone());
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(e) = serve(stream, max_bytes, shared).await {
                    limited_warn!(log, %from, "raw baseline: {e:#}");
                }
            });
        }
    });
    Ok(bound)
}

/// Serves one connection until it closes, goes idle or breaks a bound.
async fn serve(mut stream: TcpStream, max_bytes: u64, shared: Shared) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut echo = Vec::new();
    loop {
        let mut word = [0u8; 8];
        match tokio::time::timeout(IDLE, stream.read_exact(&mut word)).await {
            Err(_) => anyhow::bail!("no request for {IDLE:?}; closed"),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(r) => r?,
        };
        let w = u64::from_be_bytes(word);
        if w & ECHO != 0 {
            let n = w & !ECHO;
            anyhow::ensure!(
                n <= MAX_ECHO_BYTES,
                "an echo of {n} bytes is over the {MAX_ECHO_BYTES}-byte bound"
            );
            echo.resize(n as usize, 0);
            tokio::time::timeout(IDLE, stream.read_exact(&mut echo))
                .await
                .context("the echo's bytes did not come")??;
            stream.write_all(&echo).await?;
        } else {
            anyhow::ensure!(
                w <= max_bytes,
                "a response of {w} bytes is over --max-request-bytes ({max_bytes})"
            );
            let bytes = bytes_for(&shared, w as usize);
            stream.write_all(&bytes[..w as usize]).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bulk_and_echo_answer_and_a_request_over_a_bound_closes_only_that_connection() {
        let addr = start("127.0.0.1:0", 3 << 20).await.unwrap();
        let mut a = TcpStream::connect(addr).await.unwrap();
        a.write_all(&bulk_request(3 << 20)).await.unwrap();
        let mut got = vec![0u8; 3 << 20];
        a.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|b| *b == 0x5a));
        a.write_all(&echo_request(5)).await.unwrap();
        a.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        a.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello");

        // Over the bulk bound, then over the echo bound: each closes its own connection.
        for word in [bulk_request((3 << 20) + 1), echo_request(MAX_ECHO_BYTES + 1)] {
            let mut b = TcpStream::connect(addr).await.unwrap();
            b.write_all(&word).await.unwrap();
            let mut rest = Vec::new();
            assert_eq!(
                b.read_to_end(&mut rest).await.unwrap(),
                0,
                "the over-bound request was answered"
            );
        }
        // The first connection is still served.
        a.write_all(&bulk_request(10)).await.unwrap();
        let mut ten = [0u8; 10];
        a.read_exact(&mut ten).await.unwrap();
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_a_freed_place_is_served_again() {
        let addr = start("127.0.0.1:0", 1 << 20).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..MAX_RAW_CONNECTIONS {
            let mut c = TcpStream::connect(addr).await.unwrap();
            // Answered, so the connection holds its place.
            c.write_all(&bulk_request(1)).await.unwrap();
            c.read_exact(&mut [0u8; 1]).await.unwrap();
            held.push(c);
        }
        let mut over = TcpStream::connect(addr).await.unwrap();
        let _ = over.write_all(&bulk_request(1)).await;
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), over.read_to_end(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a connection over the cap was served: {closed:?}"
        );
        // The held ones are still served, and a freed place takes a new connection.
        held[0].write_all(&bulk_request(3)).await.unwrap();
        held[0].read_exact(&mut [0u8; 3]).await.unwrap();
        drop(held.pop());
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let mut c = TcpStream::connect(addr).await.unwrap();
                if c.write_all(&bulk_request(2)).await.is_ok() && c.read_exact(&mut [0u8; 2]).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(served.is_ok(), "a freed place was not given to a new connection");
    }
}

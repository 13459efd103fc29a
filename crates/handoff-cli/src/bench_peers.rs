//! Additions to `handoff bench` for the side-by-side comparison in `bench/peers/`:
//! `--sizes` parsing and the `shm-rtt` case (a small message there and back over the
//! Unix socket of the shm channel, against a raw Unix socket ping-pong).

use anyhow::{Context, Result};
use handoff::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{case_runs, Case, Plan};
use crate::protocol;

/// Parses a size such as `1024`, `64K`, `64KiB`, `16M` or `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number.parse().map_err(|_| format!("not a size: {text:?}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("unknown unit in {text:?} (use K, M or G)")),
    };
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("too large: {text:?}"))?;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".into());
    }
    Ok(bytes)
}

/// A 100-byte message there and back between two nodes of this process over the shm
/// channel (a Unix socket), against a raw Unix socket ping-pong of the same 108 bytes.
pub async fn shm_rtt(plan: &Plan, secret: &str) -> Result<Case> {
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

    let (ours, base) = super::rtt_runs(plan, &client, &peer, &mut raw).await?;
    drop(raw);
    let _ = echo.await;
    server.shutdown();
    client.shutdown();
    let _ = server_task.await;
    Ok(case_runs("shm-rtt", "shm", 100, ours, base))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size(" 1G "), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("K").is_err());
    }
}

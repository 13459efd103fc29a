//! `--connect` at start: dial peers that may not be up yet, as the nodes of a cluster start
//! in any order. A failure that can heal (nothing listens yet, a timeout, an unreachable
//! host, a peer that closed during the handshake) is retried with exponential backoff and
//! jitter until a deadline; a refusal (wrong secret, version, a peer's `error`) fails at once.

use std::time::{Duration, Instant};

use anyhow::Result;
use handoff::{Error, Node, Peer, WireError};

/// The first delay between attempts is this, less up to half of it (jitter).
const FIRST_DELAY: Duration = Duration::from_millis(100);
/// Delays double up to this (less up to half of it).
const MAX_DELAY: Duration = Duration::from_secs(2);

/// A duration from the command line: a number with a unit (`500ms`, `30s`, `2m`, `1.5s`),
/// or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let bad = || format!("{s:?} is not a duration (e.g. 500ms, 30s, 2m)");
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {s:?} (use ms, s, m or h)")),
    };
    handoff::bounds::duration_from_secs(secs, true).ok_or_else(|| {
        if secs.is_finite() && secs >= 0.0 {
            format!("{s:?} is longer than a node takes (about 31 years)")
        } else {
            bad()
        }
    })
}

/// Whether a failed connect may succeed when tried again: the peer is not listening yet,
/// is not reachable yet, or went away during the handshake. A refusal is final.
pub fn can_heal(e: &Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        Error::Io { source, .. } => {
            matches!(
                source.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::TimedOut
                    // A Unix socket whose node has not created it yet.
                    | K::NotFound
            ) || rustix::io::Errno::from_io_error(source).is_some_and(|errno| {
                use rustix::io::Errno;
                // Their io::ErrorKinds are newer than this crate's rust-version.
                [Errno::HOSTUNREACH, Errno::NETUNREACH, Errno::NETDOWN].contains(&errno)
            })
        }
        Error::Timeout(_) | Error::Wire(WireError::Timeout(_)) | Error::PeerClosed(_) => true,
        _ => false,
    }
}

/// The wait before attempt `attempt + 1` (`attempt` counts from 1): the nominal delay
/// doubles from [`FIRST_DELAY`] up to [`MAX_DELAY`], and `jitter` (in [0, 1)) takes up to
/// half of it off, so that nodes started together do not dial in step.
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let nominal = FIRST_DELAY
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(MAX_DELAY);
    nominal.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
}

/// Connects `node` to `addr`, retrying what can heal until `timeout` has passed (no attempt
/// starts after it; one in progress is bounded by the handshake timeout). One log line per
/// failed attempt names the address, the attempt, the cause and the next delay.
pub async fn connect_retrying(node: &Node, addr: &str, timeout: Duration) -> Result<Peer> {
    let started = Instant::now();
    let deadline = started + timeout;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let e = match node.connect(addr).await {
            Ok(peer) => return Ok(peer),
            Err(e) => e,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if !can_heal(&e) {
            return Err(naming(addr, e, None));
        }
        if left.is_zero() {
            let gave_up = format!(
                "gave up after {attempt} attempt{} in {:.1} s (--connect-timeout {})",
                if attempt == 1 { "" } else { "s" },
                started.elapsed().as_secs_f64(),
                show(timeout)
            );
            return Err(naming(addr, e, Some(gave_up)));
        }
        let delay = backoff(attempt, rand::random::<f64>()).min(left);
        tracing::warn!(
            peer = %addr,
            attempt,
            retry_in_ms = delay.as_millis() as u64,
            "not up yet, retrying: {}",
            e.chain()
        );
        tokio::time::sleep(delay).await;
    }
}

/// Connects to every address at once (a slow peer does not hold up the others) and
/// returns the peers in the order of `addrs`; the first failure ends the wait.
pub async fn connect_all(node: &Node, addrs: &[String], timeout: Duration) -> Result<Vec<Peer>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, addr) in addrs.iter().enumerate() {
        let (node, addr) = (node.clone(), addr.clone());
        tasks.spawn(async move { (i, connect_retrying(&node, &addr, timeout).await) });
    }
    let mut peers: Vec<Option<Peer>> = vec![None; addrs.len()];
    while let Some(joined) = tasks.join_next().await {
        let (i, result) = joined?;
        peers[i] = Some(result?);
    }
    Ok(peers.into_iter().map(|p| p.expect("every task answered")).collect())
}

/// `e` as an anyhow error that names `addr` once: the runtime's errors of a connect name
/// it already, others get it as context (with `more`, if any).
pub fn naming(addr: &str, e: Error, more: Option<String>) -> anyhow::Error {
    let named = e.chain().to_string().contains(addr);
    let context = match (named, more) {
        (true, None) => return e.into(),
        (true, Some(more)) => more,
        (false, None) => format!("connecting to {addr}"),
        (false, Some(more)) => format!("connecting to {addr}: {more}"),
    };
    anyhow::Error::new(e).context(context)
}

/// A duration as the command line takes it.
fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> Error {
        Error::Io {
            context: "connecting to 127.0.0.1:1".into(),
            source: std::io::Error::from(kind),
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 fortnights").unwrap_err().contains("unknown unit"));
        // Longer than a deadline counted from now can be (the clock would overflow): refused.
        assert!(parse_duration("10000000000000000000s")
            .unwrap_err()
            .contains("longer than a node takes"));
        assert!(parse_duration("1000000000s").is_ok());
        assert_eq!(show(Duration::from_secs(30)), "30s");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn only_what_can_heal_is_retried() {
        use std::io::ErrorKind as K;
        for k in [
            K::ConnectionRefused,
            K::ConnectionReset,
            K::TimedOut,
            K::UnexpectedEof,
            K::NotFound,
        ] {
            assert!(can_heal(&io(k)), "{k:?}");
        }
        let unreachable = Error::Io {
            context: "connecting to 10.0.0.1:1".into(),
            source: std::io::Error::from_raw_os_error(rustix::io::Errno::HOSTUNREACH.raw_os_error()),
        };
        assert!(can_heal(&unreachable));
        assert!(can_heal(&Error::Timeout("connecting took too long".into())));
        assert!(can_heal(&Error::Wire(WireError::Timeout("handshake".into()))));
        assert!(can_heal(&Error::PeerClosed("p (during the handshake)".into())));

        assert!(!can_heal(&io(K::PermissionDenied)));
        assert!(!can_heal(&Error::Refused {
            peer: "p".into(),
            code: "auth-failed".into(),
            message: "wrong secret".into(),
        }));
        assert!(!can_heal(&Error::Wire(WireError::AuthFailed("wrong secret".into()))));
        assert!(!can_heal(&Error::Wire(WireError::Handshake("version".into()))));
        assert!(!can_heal(&Error::Config("bad address".into())));
    }

    #[test]
    fn delays_double_with_jitter_up_to_the_cap() {
        assert_eq!(backoff(1, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(1, 1.0), Duration::from_millis(50));
        assert_eq!(backoff(2, 0.0), Duration::from_millis(200));
        assert_eq!(backoff(5, 0.0), Duration::from_millis(1600));
        assert_eq!(backoff(6, 0.0), MAX_DELAY);
        assert_eq!(backoff(1000, 0.0), MAX_DELAY);
        assert_eq!(backoff(1000, 1.0), MAX_DELAY / 2);
    }

    #[test]
    fn the_address_and_the_cause_are_each_named_once() {
        let refused = io(std::io::ErrorKind::ConnectionRefused);
        let shown = format!(
            "{:#}",
            naming("127.0.0.1:1", refused, Some("gave up after 3 attempts".into()))
        );
        assert_eq!(shown.matches("127.0.0.1:1").count(), 1, "{shown}");
        assert_eq!(shown.matches("refused").count(), 1, "{shown}");
        assert!(
            shown.starts_with("gave up after 3 attempts: connecting to 127.0.0.1:1: "),
            "{shown}"
        );

        let auth = Error::Wire(WireError::AuthFailed("the proof does not match".into()));
        let shown = format!("{:#}", naming("127.0.0.1:1", auth, None));
        assert_eq!(
            shown,
            "connecting to 127.0.0.1:1: authentication failed: the proof does not match"
        );
    }
}

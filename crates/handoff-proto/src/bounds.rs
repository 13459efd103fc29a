//! [`Bounds`]: what all of a peer's messages, connections and requests together can make a
//! node hold (spec §9.1), so that one peer — buggy, slow or hostile — slows or breaks only
//! its own connections.

use std::time::Duration;

/// The bounds a node keeps on what its peers can make it hold (spec `WIRE.md` §9.1).
///
/// The defaults are the reference's, shared with the Python peer. Every field can be
/// changed with [`NodeBuilder::bounds`](crate::NodeBuilder::bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Handshakes in progress at once, over all listeners (default 256). When a new
    /// connection arrives at the bound, the oldest handshake is closed (`overloaded`).
    pub max_handshakes: usize,
    /// Established connections at once (default 1024). A connection accepted beyond it is
    /// refused with `overloaded` right after the preambles.
    pub max_connections: usize,
    /// Time a handshake may take from the connection's start (default 10 s): `timeout`.
    pub handshake_timeout: Duration,
    /// Silence allowed inside a message, after its first byte and before its last
    /// (default 30 s): `timeout`. An idle connection between messages has no limit.
    pub progress_timeout: Duration,
    /// Time a write may make no progress (the peer reads nothing, default 120 s); the
    /// connection is then closed and only that peer's sends fail. Long on purpose: a
    /// receiver whose application is busy stops reading too (its receive budget is full),
    /// and that is backpressure, not a dead peer.
    pub write_timeout: Duration,
    /// Bytes of received messages one peer can have buffered, read but not yet taken by
    /// the application with `Node::recv` (default 1 GiB). Past it the node stops reading
    /// that connection; a message that does not fit is admitted alone.
    pub max_buffered_bytes_per_peer: u64,
    /// The same for all peers together (default 4 GiB).
    pub max_buffered_bytes: u64,
    /// Messages one peer can have buffered (default 1024), whatever their size.
    pub max_buffered_messages_per_peer: usize,
    /// Bytes any peer may have buffered whatever all peers hold together (default 1 MiB),
    /// so that small messages are never stuck behind another peer's large one: the total
    /// can exceed [`max_buffered_bytes`](Self::max_buffered_bytes) by at most this much
    /// per connection.
    pub min_buffered_bytes_per_peer: u64,
    /// `pulled` answers being written to one connection at once (default 64); past it the
    /// node stops reading that connection until one is written.
    pub max_pull_answers: usize,
    /// Holds one ticket lease can have (default 64): a `forward` past it is refused with
    /// `too-many-holders`.
    pub max_holders_per_lease: usize,
    /// Bytes of shared-memory leases held for one peer (default 8 GiB).
    pub max_shm_lease_bytes_per_peer: u64,
    /// Shared-memory leases held for one peer (default 65 536).
    pub max_shm_leases_per_peer: usize,
    /// Connections opened at once to reach the owners of received tickets (default 16).
    pub max_ticket_dials: usize,
    /// Connections opened to reach the owners of received tickets that are kept open for
    /// later requests (default 64). Before another owner is dialed at the bound, the one
    /// unused longest is closed, if it has no request outstanding or made in the last
    /// 100 ms and no ticket of its owner is held here; when none can close, the redemption
    /// fails at once ([`OwnerDials`](crate::dialing::OwnerDials)).
    pub max_owner_connections: usize,
    /// Warnings logged about one peer per [`warning_period`](Self::warning_period)
    /// (default 10); the rest are counted and reported once per period.
    pub warnings_per_period: u32,
    /// See [`warnings_per_period`](Self::warnings_per_period) (default 10 s).
    pub warning_period: Duration,
    /// Warnings logged about all peers together per period (default 100): a peer that
    /// opens many connections does not multiply its share.
    pub warnings_in_all_per_period: u32,
}

impl Bounds {
    /// The reference defaults of spec §9.1.
    pub const DEFAULT: Bounds = Bounds {
        max_handshakes: 256,
        max_connections: 1024,
        handshake_timeout: Duration::from_secs(10),
        progress_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(120),
        max_buffered_bytes_per_peer: 1 << 30,
        max_buffered_bytes: 4 << 30,
        max_buffered_messages_per_peer: 1024,
        min_buffered_bytes_per_peer: 1 << 20,
        max_pull_answers: 64,
        max_holders_per_lease: 64,
        max_shm_lease_bytes_per_peer: 8 << 30,
        max_shm_leases_per_peer: 65_536,
        max_ticket_dials: 16,
        max_owner_connections: 64,
        warnings_per_period: 10,
        warning_period: Duration::from_secs(10),
        warnings_in_all_per_period: 100,
    };
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds::DEFAULT
    }
}

/// Bytes every buffered message is charged besides its wire bytes: the envelope, its
/// frames' bookkeeping and the queue entry, so that a flood of empty messages is bounded
/// by the byte budget too.
pub const MESSAGE_OVERHEAD: u64 = 1024;

/// Headers up to this size are read without asking the budget first (a connection holds
/// at most one at a time, so they are bounded by the connection count).
pub const SMALL_HEADER: u64 = 64 * 1024;

/// The longest time any timeout, lease or wait of a node may be (10⁹ s, about 31 years):
/// past any that means something, and short enough that a deadline counted from now never
/// overflows the clock (`Instant + Duration` panics there). Longer ones are refused by
/// name ([`NodeSettings::check`](crate::settings::NodeSettings::check), the drivers'
/// parsers).
pub const MAX_DURATION: Duration = Duration::from_secs(1_000_000_000);

/// `seconds` as a duration a node takes: finite, at most [`MAX_DURATION`], and positive
/// (or zero, where `zero` allows it); `None` otherwise.
pub fn duration_from_secs(seconds: f64, zero: bool) -> Option<Duration> {
    let in_range = seconds > 0.0 || (zero && seconds == 0.0);
    (seconds.is_finite() && in_range && seconds <= MAX_DURATION.as_secs_f64()).then(|| Duration::from_secs_f64(seconds))
}

impl Bounds {
    /// The first of these bounds' times longer than [`MAX_DURATION`], named.
    pub fn check(&self) -> Result<(), String> {
        let times = [
            ("handshake_timeout", self.handshake_timeout),
            ("progress_timeout", self.progress_timeout),
            ("write_timeout", self.write_timeout),
        ];
        check_durations(&times)
    }
}

/// Refuses the first of `times` longer than [`MAX_DURATION`], by its name.
pub fn check_durations(times: &[(&str, Duration)]) -> Result<(), String> {
    match times.iter().find(|(_, t)| *t > MAX_DURATION) {
        Some((name, t)) => Err(format!(
            "{name} is {t:?}, longer than the {} s a node takes (about 31 years)",
            MAX_DURATION.as_secs()
        )),
        None => Ok(()),
    }
}

/// Keepalive probes a TCP connection sends before it gives a silent peer up.
pub const KEEPALIVE_PROBES: u32 = 10;

/// `(idle, interval, probes)` in whole seconds for a TCP connection that must notice a
/// silent peer (its host lost power, or was cut off) within `timeout`: `idle + interval *
/// probes == timeout`, a quarter of the timeout (at least 2 s) idle before the first probe
/// and the rest spread over [`KEEPALIVE_PROBES`] probes at least 1 s apart, as Dask's TCP
/// comm derives them from `distributed.comm.timeouts.tcp`. A driver sets them with
/// `TCP_USER_TIMEOUT` of `timeout`; below `probes + 1` seconds there is no such plan.
pub fn keepalive_plan(timeout: Duration) -> Result<(u32, u32, u32), String> {
    let whole = timeout.as_secs();
    if whole < u64::from(KEEPALIVE_PROBES) + 1 {
        return Err(format!(
            "a TCP timeout is at least {} s (one per keepalive probe), got {timeout:?}",
            KEEPALIVE_PROBES + 1
        ));
    }
    let whole = whole.min(u64::from(u32::MAX / 1000)) as u32;
    let first = (whole / 4).max(2);
    let interval = ((whole - first) / KEEPALIVE_PROBES).max(1);
    Ok((whole - interval * KEEPALIVE_PROBES, interval, KEEPALIVE_PROBES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepalive_plan_adds_up_to_the_timeout() {
        for secs in [11u64, 12, 30, 31, 300, 86_400] {
            let (idle, interval, probes) = keepalive_plan(Duration::from_secs(secs)).unwrap();
            assert_eq!(u64::from(idle + interval * probes), secs, "{secs} s");
            assert!(idle >= 1 && interval >= 1 && probes == KEEPALIVE_PROBES);
        }
        // What the Python peer's transport.keepalive_plan gives (Dask's derivation).
        assert_eq!(keepalive_plan(Duration::from_secs(30)).unwrap(), (10, 2, 10));
        assert_eq!(keepalive_plan(Duration::from_secs(300)).unwrap(), (80, 22, 10));
        assert!(keepalive_plan(Duration::from_secs(10))
            .unwrap_err()
            .contains("at least 11 s"));
    }
}

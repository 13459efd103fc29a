//! A node's settings before it starts: their defaults, what is refused before anything is
//! bound, and what the node presents and shares from them (its capabilities, its endpoint,
//! its preamble, its [`CoreSettings`]). A driver keeps its own settings beside these (the
//! types it accepts, TLS files) and its own way to set them (a builder, keyword arguments).

use std::time::Duration;

use handoff_wire::{Endpoint, Limits, Preamble};

use crate::node::{CoreSettings, DEFAULT_KEPT_MAPPINGS};
use crate::ticket_leases::LeaseConfig;
use crate::Bounds;

/// Default size from which buffers to a same-host peer travel as shared memory.
pub const DEFAULT_SHM_THRESHOLD: usize = 64 * 1024;

/// Default bytes of idle receive buffers a node keeps for reuse.
pub const DEFAULT_RECV_POOL_BYTES: usize = 1 << 30;

/// Default time a pull or forward waits for the ticket's owner.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(30);

/// Capabilities of a node that takes everything this engine receives, the same in every
/// protocol version (`shm` only where the node has a Unix socket for same-host peers).
pub const CAPABILITIES: &[&str] = &["inline", "shm", "ticket", handoff_wire::CAP_XXH3];

/// When a node's received tickets are redeemed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeem {
    /// Before the message is delivered: its buffers hold the bytes (the default).
    Eager,
    /// On first use: the message's ticketed buffers are empty placeholders, and the
    /// application redeems (or reads part of) each ticket when it needs the bytes.
    Lazy,
}

/// A node's settings (see the module's text), with their defaults from [`NodeSettings::new`].
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The node's name (unique among nodes of one process; shown to peers).
    pub name: String,
    /// The TCP address to listen on, if any.
    pub listen: Option<String>,
    /// The host identity, if not the kernel's.
    pub host_id: Option<String>,
    /// The cluster secret (none: the empty secret).
    pub secret: Option<Vec<u8>>,
    /// Limits enforced on received messages (spec §9).
    pub limits: Limits,
    /// Encode and decode even in-process.
    pub force_encode_inproc: bool,
    /// What peers can make the node hold (spec §9.1).
    pub bounds: Bounds,
    /// Bytes of idle receive buffers kept for reuse.
    pub pool_idle_bytes: usize,
    /// Whether the node opens a Unix socket for same-host peers (shared memory).
    pub shm: bool,
    /// Whether the node maps same-host peers' GPU memory by IPC handle (it announces `cuda`
    /// with `shm`, spec §7.10): the driver sets it where a CUDA driver works.
    pub device_memory: bool,
    /// Buffers at least this large travel to same-host peers as shared memory (see
    /// [`shm_threshold`](Self::shm_threshold)).
    pub shm_threshold: usize,
    /// Send only sealed segments to same-host peers.
    pub shm_sealed: bool,
    /// Buffers at least this large travel to TCP peers as tickets (none: never).
    pub ticket_threshold: Option<usize>,
    /// The leases of what the node sends as tickets.
    pub leases: LeaseConfig,
    /// When received tickets are redeemed.
    pub redeem: Redeem,
    /// How long a pull or forward waits for the owner.
    pub pull_timeout: Duration,
    /// Also accept version-1 peers (and version-2 ones).
    pub accept_v1: bool,
    /// Also accept version-2 peers.
    pub accept_v2: bool,
    /// A preamble sent in place of the node's own (tests that play an older peer).
    pub preamble: Option<Preamble>,
    /// How long a TCP peer may stay silent (keepalive and `TCP_USER_TIMEOUT`), if at all.
    pub tcp_timeout: Option<Duration>,
}

impl NodeSettings {
    /// The defaults for a node named `name`.
    pub fn new(name: impl Into<String>) -> NodeSettings {
        NodeSettings {
            name: name.into(),
            listen: None,
            host_id: None,
            secret: None,
            limits: Limits::default(),
            force_encode_inproc: false,
            bounds: Bounds::DEFAULT,
            pool_idle_bytes: DEFAULT_RECV_POOL_BYTES,
            shm: true,
            device_memory: false,
            shm_threshold: DEFAULT_SHM_THRESHOLD,
            shm_sealed: false,
            ticket_threshold: None,
            leases: LeaseConfig::default(),
            redeem: Redeem::Eager,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            accept_v1: false,
            accept_v2: false,
            preamble: None,
            tcp_timeout: None,
        }
    }

    /// What a node cannot start with, in words: no name, a name or host id longer than
    /// peers accept (spec §5.2), a TCP timeout shorter than its keepalive plan, a time
    /// longer than [`MAX_DURATION`](crate::bounds::MAX_DURATION).
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("a node needs a name".into());
        }
        crate::peers::check_own_identity(&self.name, self.host_id.as_deref())?;
        if let Some(t) = self.tcp_timeout {
            crate::bounds::keepalive_plan(t)?;
        }
        self.bounds.check()?;
        let mut times = vec![("lease_ttl", self.leases.ttl), ("pull_timeout", self.pull_timeout)];
        times.extend(self.tcp_timeout.map(|t| ("tcp_timeout", t)));
        crate::bounds::check_durations(&times)
    }

    /// The size from which buffers travel as shared memory (at least one byte).
    pub fn shm_threshold(&self) -> usize {
        self.shm_threshold.max(1)
    }

    /// The capabilities the node announces: [`CAPABILITIES`], without `shm` when it has no
    /// Unix socket.
    pub fn capabilities(&self) -> Vec<String> {
        let mut caps: Vec<String> = CAPABILITIES
            .iter()
            .filter(|c| self.shm || **c != "shm")
            .map(|c| c.to_string())
            .collect();
        if self.shm && self.device_memory {
            caps.push(handoff_wire::CAP_CUDA.to_string());
        }
        caps
    }

    /// What the node presents as node `node_id`, written in `language`: its host id the
    /// one set, or the kernel's.
    pub fn endpoint(&self, node_id: String, language: &str) -> Endpoint {
        Endpoint {
            node_id,
            name: self.name.clone(),
            host_id: self.host_id.clone().unwrap_or_else(crate::identity::host_id),
            process_id: crate::identity::process_id().to_string(),
            language: language.into(),
            capabilities: self.capabilities(),
        }
    }

    /// The preamble the node sends: the one set, or its own with the versions it accepts.
    pub fn preamble(&self) -> Preamble {
        self.preamble.unwrap_or(Preamble::ours(self.accept_v1, self.accept_v2))
    }

    /// What the node's engine is made of, as node `me` with `secret`.
    pub fn core(&self, me: Endpoint, secret: Vec<u8>) -> CoreSettings {
        CoreSettings {
            me,
            secret,
            limits: self.limits,
            bounds: self.bounds,
            preamble: self.preamble(),
            leases: self.leases,
            recv_pool_bytes: self.pool_idle_bytes,
            kept_mapping_bytes: DEFAULT_KEPT_MAPPINGS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_a_name_or_with_a_short_tcp_timeout_is_refused() {
        assert_eq!(NodeSettings::new("").check().unwrap_err(), "a node needs a name");
        let mut s = NodeSettings::new("a");
        assert!(s.check().is_ok());
        s.tcp_timeout = Some(Duration::from_secs(1));
        assert!(s.check().unwrap_err().contains("TCP timeout"));
        let long = NodeSettings::new("n".repeat(10_000));
        assert!(long.check().unwrap_err().contains("name"));
    }

    #[test]
    fn a_time_longer_than_a_deadline_can_be_is_refused_by_name() {
        let mut s = NodeSettings::new("a");
        s.leases.ttl = Duration::MAX;
        assert!(s.check().unwrap_err().starts_with("lease_ttl is"));
        let mut s = NodeSettings::new("a");
        s.bounds.write_timeout = crate::bounds::MAX_DURATION + Duration::from_secs(1);
        assert!(s.check().unwrap_err().starts_with("write_timeout is"));
        s.bounds.write_timeout = crate::bounds::MAX_DURATION;
        assert!(s.check().is_ok(), "the longest is taken");
        assert_eq!(crate::bounds::duration_from_secs(1e20, false), None);
        assert_eq!(crate::bounds::duration_from_secs(f64::NAN, true), None);
        assert_eq!(crate::bounds::duration_from_secs(0.0, true), Some(Duration::ZERO));
        assert_eq!(crate::bounds::duration_from_secs(0.0, false), None);
    }

    #[test]
    fn shm_is_announced_only_with_a_unix_socket() {
        let mut s = NodeSettings::new("a");
        assert!(s.capabilities().iter().any(|c| c == "shm"));
        s.shm = false;
        assert_eq!(s.capabilities(), ["inline", "ticket", handoff_wire::CAP_XXH3]);
        let me = s.endpoint("id".into(), "rust");
        assert_eq!((me.name.as_str(), me.language.as_str()), ("a", "rust"));
        assert_eq!(me.capabilities, s.capabilities());
    }

    #[test]
    fn the_preamble_follows_consent_unless_one_is_set() {
        let mut s = NodeSettings::new("a");
        assert_eq!(s.preamble(), Preamble::ours(false, false));
        s.accept_v2 = true;
        assert_eq!(s.preamble(), Preamble::ours(false, true));
        s.preamble = Some(Preamble::V1_ONLY);
        assert_eq!(s.preamble(), Preamble::V1_ONLY);
        s.shm_threshold = 0;
        assert_eq!(s.shm_threshold(), 1);
        let core = s.core(s.endpoint("id".into(), "rust"), b"k".to_vec());
        assert_eq!(core.preamble, Preamble::V1_ONLY);
        assert_eq!(core.recv_pool_bytes, DEFAULT_RECV_POOL_BYTES);
    }
}

//! [`NodeBuilder`]: the settings of a node before it starts, and their defaults.
//! [`build`](NodeBuilder::build), which starts the node, is with [`Node`](crate::Node).

use std::time::Duration;

use handoff_wire::{Limits, Preamble};

use crate::message::TypeRegistry;
use crate::tickets::modes::Redeem;
use crate::tickets::owner::LeaseConfig;
use crate::tls::TlsConfig;
use crate::Message;
use handoff_proto::bounds::Bounds;
use handoff_proto::settings::NodeSettings;

/// Settings for a [`Node`]; start with [`Node::builder`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    /// What the engine's settings hold (their defaults are `handoff_proto::settings`'s).
    pub(crate) settings: NodeSettings,
    pub(crate) registry: TypeRegistry,
    pub(crate) tls: Option<TlsConfig>,
}

impl NodeBuilder {
    /// Settings for a new node; `name` is required, the rest has defaults.
    pub(crate) fn new(name: impl Into<String>) -> NodeBuilder {
        NodeBuilder {
            settings: NodeSettings::new(name),
            registry: TypeRegistry::new(),
            tls: None,
        }
    }

    /// Runs every TCP connection of this node inside TLS (`spec/WIRE.md` §3.1; default: off).
    ///
    /// Both sides present certificates that must chain to the configured CA, and the
    /// connecting side checks the accepting side's name (the host part of the address it
    /// dialed, or the name set by [`TlsConfig::expect_server_name`]). A peer that connects
    /// without TLS is refused with `tls-required`. Same-host connections on the Unix socket
    /// (shared memory) are not affected. The cluster secret is still proven inside TLS.
    pub fn tls(mut self, config: TlsConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Also accept peers that speak only protocol version 1, and version-2 peers too
    /// (default: off).
    ///
    /// Version 1's hello tells anyone who connects this node's id, name, host id, pid,
    /// process id, listen address and socket path **before either side has proven the
    /// cluster secret** (spec §5.4), and in versions 1 and 2 a peer without the secret can
    /// authenticate by reflecting the nodes' own proofs (§5.6). With this on, the node
    /// announces versions 1 to 3 and runs the oldest one with a peer that speaks nothing
    /// newer, so **anyone who can connect can choose it**; with it off, such peers are
    /// refused with `unsupported-version`. Turn it on only while such peers are being
    /// upgraded, inside a network you trust.
    pub fn accept_v1(mut self, on: bool) -> Self {
        self.settings.accept_v1 = on;
        self
    }

    /// Also accept peers that speak protocol version 2 at most (default: off).
    ///
    /// Version 3, the default, binds each proof to the prover's role and the whole
    /// transcript (spec §5.7). In version 2 a peer **without the cluster secret** can
    /// authenticate by opening two connections and crossing the nodes' own challenges and
    /// proofs (§5.6). A node with this on announces versions 2 and 3, which its version-2
    /// proofs cover, so it is no oracle on its own; but while any node of the old version
    /// is reachable, an attacker uses each as the other's oracle and is let into both
    /// (§5.8). It runs version 3 with every peer that speaks it. Turn it on only while a
    /// cluster upgrades, inside a network you trust.
    pub fn accept_v2(mut self, on: bool) -> Self {
        self.settings.accept_v2 = on;
        self
    }

    /// Sends `preamble` in place of the node's own, whatever [`accept_v1`](Self::accept_v1)
    /// and [`accept_v2`](Self::accept_v2) say: for tests that play an older peer ([`Preamble::V1_ONLY`] makes a node that
    /// speaks version 1 only). Not for production use.
    #[doc(hidden)]
    pub fn preamble(mut self, preamble: Preamble) -> Self {
        self.settings.preamble = Some(preamble);
        self
    }

    /// Send buffers of at least this many bytes to TCP peers as tickets (the receiver
    /// pulls them from us) instead of in the stream. Default: never (`None`);
    /// [`Peer::send_by_ticket`] asks for tickets explicitly.
    pub fn ticket_threshold(mut self, bytes: Option<usize>) -> Self {
        self.settings.ticket_threshold = bytes;
        self
    }

    /// Lifetime and caps of the leases this node issues for its tickets.
    pub fn leases(mut self, config: LeaseConfig) -> Self {
        self.settings.leases = config;
        self
    }

    /// When received tickets are redeemed: before delivery (default) or on first use.
    pub fn redeem(mut self, redeem: Redeem) -> Self {
        self.settings.redeem = redeem;
        self
    }

    /// How long a TCP peer may stay silent before its connection fails (default: none, as a
    /// plain socket). A peer whose host lost power or was cut off sends nothing, not even
    /// an end of stream: with a timeout, each TCP connection sends keepalive probes while
    /// idle and bounds unacknowledged data with `TCP_USER_TIMEOUT`, so that the connection
    /// fails with `ETIMEDOUT` within `timeout` and only that peer's sends and requests fail
    /// (the plan is `handoff_proto::bounds::keepalive_plan`, as Dask derives it from
    /// `distributed.comm.timeouts.tcp`). At least 11 s; [`build`](Self::build) refuses less.
    /// Same-host Unix connections need none: the kernel ends them with their process.
    pub fn tcp_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.settings.tcp_timeout = timeout;
        self
    }

    /// How long a pull or forward may wait for the owner before it fails (default 30 s).
    pub fn pull_timeout(mut self, timeout: Duration) -> Self {
        self.settings.pull_timeout = timeout;
        self
    }

    /// The node's name (unique among nodes of one process; shown to peers).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = name.into();
        self
    }

    /// Listen for TCP connections on `addr` (`127.0.0.1:0`, `tcp://[::1]:7000`, …).
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.settings.listen = Some(addr.into());
        self
    }

    /// Override the host identity (default: from the kernel's machine and boot ids,
    /// or `HANDOFF_HOST_ID`). Nodes with different host ids treat each other as remote.
    pub fn host_id(mut self, host_id: impl Into<String>) -> Self {
        self.settings.host_id = Some(host_id.into());
        self
    }

    /// The cluster secret both sides of every connection must share.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.settings.secret = Some(secret.into());
        self
    }

    /// Accept messages of type `T`.
    pub fn register<T: Message>(mut self) -> Self {
        self.registry.register::<T>();
        self
    }

    /// Use this registry of accepted types (replacing what was registered so far).
    pub fn registry(mut self, registry: TypeRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// Limits enforced on received messages.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.settings.limits = limits;
        self
    }

    /// Encode and decode even in-process (for tests: keeps both paths equal).
    /// The environment variable `HANDOFF_FORCE_ENCODE=1` sets it too.
    pub fn force_encode_inproc(mut self, on: bool) -> Self {
        self.settings.force_encode_inproc = on;
        self
    }

    /// Messages that one peer may have waiting in the inbox before the node stops reading
    /// from it (backpressure); sets [`Bounds::max_buffered_messages_per_peer`].
    pub fn inbox_capacity(mut self, capacity: usize) -> Self {
        self.settings.bounds.max_buffered_messages_per_peer = capacity.max(1);
        self
    }

    /// The bounds on what peers can make this node hold (spec §9.1): handshakes and
    /// connections, timeouts, buffered bytes per peer and in total, leases.
    pub fn bounds(mut self, bounds: Bounds) -> Self {
        self.settings.bounds = bounds;
        self
    }

    /// Bytes of idle receive buffers kept for reuse.
    pub fn pool_idle_bytes(mut self, bytes: usize) -> Self {
        self.settings.pool_idle_bytes = bytes;
        self
    }

    /// Whether to open a Unix socket for same-host peers and use shared memory with them
    /// (default: on).
    pub fn shm(mut self, on: bool) -> Self {
        self.settings.shm = on;
        self
    }

    /// Buffers at least this large travel to same-host peers as shared memory (default 64 KiB);
    /// smaller ones are copied into the socket.
    pub fn shm_threshold(mut self, bytes: usize) -> Self {
        self.settings.shm_threshold = bytes;
        self
    }

    /// Send only sealed segments to same-host peers: each shared frame is copied into a fresh
    /// memfd sealed against writes, for peers that must never see later reuse.
    pub fn shm_sealed(mut self, on: bool) -> Self {
        self.settings.shm_sealed = on;
        self
    }
}

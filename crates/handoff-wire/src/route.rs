//! The route a value takes: who sends it, who receives it, how near they are, and over what.
//!
//! This is the `serialize(obj, source, destination)` of the first seed: while a
//! value is encoded for (or decoded from) a peer, [`Route::current`] tells any
//! `Serialize`/`Deserialize` implementation the route, so a type can encode itself
//! differently for a same-host peer than for a remote one.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One end of a route: what a node said about itself in the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Random node id, hex.
    pub node_id: String,
    /// Human-readable node name.
    pub name: String,
    /// Host identity.
    pub host_id: String,
    /// Random id of the node's process instance, hex.
    pub process_id: String,
    /// Implementation language (`rust`, `python`, …).
    pub language: String,
    /// Capabilities the node announced.
    pub capabilities: Vec<String>,
}

impl Endpoint {
    /// Whether the endpoint announced a capability.
    pub fn has_capability(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// How near two nodes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Locality {
    /// Both nodes live in one process.
    SameProcess,
    /// Different processes with the same host identity.
    SameHost,
    /// Different host identities.
    Remote,
}

impl Locality {
    /// The locality of two endpoints, from their host and process identities.
    pub fn between(a: &Endpoint, b: &Endpoint) -> Locality {
        if a.host_id != b.host_id {
            Locality::Remote
        } else if a.process_id == b.process_id {
            Locality::SameProcess
        } else {
            Locality::SameHost
        }
    }

    /// The name used in CLI output and JSON (`same-process`, `same-host`, `remote`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Locality::SameProcess => "same-process",
            Locality::SameHost => "same-host",
            Locality::Remote => "remote",
        }
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The channel a message travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Channel {
    /// In one process: the value is moved, not serialized.
    Inproc,
    /// A TCP stream carrying the wire format.
    Tcp,
    /// A Unix socket between same-host processes; large buffers travel as shared memory.
    Shm,
}

impl Channel {
    /// The name used in CLI output and JSON (`inproc`, `tcp`, `shm`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Channel::Inproc => "inproc",
            Channel::Tcp => "tcp",
            Channel::Shm => "shm",
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The route of one message: sender, receiver, their locality and the channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The sending node.
    pub from: Endpoint,
    /// The receiving node.
    pub to: Endpoint,
    /// How near they are.
    pub locality: Locality,
    /// What carries the message.
    pub channel: Channel,
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Route>>> = const { RefCell::new(None) };
}

impl Route {
    /// The route of the value being encoded or decoded on this thread, if any.
    ///
    /// `None` outside handoff's codec (for example under plain `serde_json`).
    pub fn current() -> Option<Arc<Route>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Runs `f` with `route` as the current route, restoring the previous one afterwards
    /// (also when `f` panics).
    pub fn with<R>(route: &Arc<Route>, f: impl FnOnce() -> R) -> R {
        crate::scope::with_current(&CURRENT, route, f)
    }
}

//! # handoff
//!
//! Moves objects between the workers of a distributed program, choosing how each
//! object is encoded by *where it goes*: in one process the value is moved and
//! nothing is serialized; to another process it is encoded with its large
//! [`Buffer`]s travelling out of band, written straight from their memory and
//! received as zero-copy views.
//!
//! ```no_run
//! use handoff::{Buffer, Message, Node};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Chunk { index: u32, data: Buffer }
//! impl Message for Chunk { const TYPE_NAME: &'static str = "example.Chunk"; }
//!
//! # async fn run() -> handoff::Result<()> {
//! let a = Node::builder("a").secret("s3cret").build().await?;
//! let b = Node::builder("b").secret("s3cret").listen("127.0.0.1:0").register::<Chunk>().build().await?;
//! let peer = a.connect(b.listen_addr().unwrap()).await?;
//! peer.send(Chunk { index: 0, data: Buffer::from(vec![7u8; 1 << 20]) }).await?;
//! let chunk: Chunk = b.recv().await?.decode()?;
//! assert_eq!(chunk.data.len(), 1 << 20);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// This crate is the tokio driver of the protocol engine `handoff_proto` (no I/O, no async):
// the engine decides, this crate moves bytes, descriptors and time, and keeps the public API.
// The modules, bottom up; each uses only modules below it.
// - leaves: error, limited_warn, budget (waiting for room), message, payload,
//   socket (a connection's socket: the engine's write queue and TLS session, reads
//   with descriptors), shm (buffers that are views of segments), handshake (drives the
//   engine's handshake), tickets::{owner (waiting for a lease), modes, pending};
// - context: what the parts of a running node share (`Context`), and `LocalNode`, the node
//   as its peers and tickets reach it;
// - link (how bytes reach a peer), tickets::holder (received tickets), peer, envelope, inbox;
// - state: `NodeInner`, a running node (context, peers, inbox); directory (nodes by name);
// - receive (read loops), inproc and connection (connecting), tickets::{client, tasks}, accept;
// - builder (settings) and node (the `Node` façade, which starts everything).
mod accept;
mod budget;
mod builder;
mod connection;
mod context;
pub mod device;
mod directory;
mod envelope;
mod error;
#[cfg(doctest)]
mod guide_examples;
mod handshake;
mod inbox;
mod inproc;
mod limited_warn;
mod link;
mod message;
mod node;
mod payload;
mod peer;
mod receive;
pub mod shm;
mod socket;
mod state;
pub mod tickets;
pub mod tls;
mod wait;

pub use builder::NodeBuilder;
pub use device::DeviceBuffer;
pub use envelope::Envelope;
pub use error::{Chain, Error, Result};
pub use handoff_proto::bounds::{self, Bounds};
pub use handoff_proto::LogLimiter;
pub use handoff_proto::{identity, log_limit};
pub use handoff_wire::resource::Resolver;
pub use handoff_wire::{
    Buffer, Channel, Endpoint, Limits, Locality, Resource, ResourceError, Resources, Route, WireError,
};
pub use link::LeaseStats;
pub use message::{Message, TypeRegistry};
pub use node::Node;
pub use peer::Peer;
pub use shm::{ArenaBufMut, SharedBufMut};
pub use tickets::{Redeem, Ticket};
pub use tls::TlsConfig;

/// The protocol engine this crate drives (handshake, node-level state), for other drivers,
/// simulations and tests.
pub use handoff_proto as proto;
/// The wire-format crate, for lower-level use (codec, headers, vectors).
pub use handoff_wire as wire;

//! # handoff-proto
//!
//! handoff's protocol engine with no I/O and no async runtime, in the manner of
//! quinn-proto and rustls: a driver owns sockets, timers and tasks, feeds the engine the
//! bytes and descriptors it received and the time, and writes what the engine says to
//! write. The tokio driver is the `handoff` crate; the asyncio driver is the Python
//! extension's.
//!
//! What is here, bottom up:
//! - [`bounds`]: what a node's peers can make it hold (spec §9.1);
//! - [`identity`]: node, process and host ids;
//! - [`log_limit`]: how many warnings about a peer reach the log;
//! - [`recv_buffers`]: reused receive buffers for large inline frames;
//! - [`shm`]: the memfd segment pool (sending) and the mapping cache (receiving);
//! - [`handshake`]: the handshake of every version as a state machine (spec §5), with the
//!   node's set of dialer nonces.

#![warn(missing_docs)]

pub mod bounds;
pub mod handshake;
pub mod identity;
pub mod log_limit;
pub mod recv_buffers;
pub mod shm;

pub use bounds::Bounds;
pub use handshake::{Handshake, Handshaken};
pub use log_limit::LogLimiter;

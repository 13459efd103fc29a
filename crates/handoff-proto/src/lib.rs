//! # handoff-proto
//!
//! handoff's protocol engine with no I/O and no async runtime, in the manner of
//! quinn-proto and rustls: a driver owns sockets, timers and tasks, feeds the engine the
//! bytes and descriptors it received and the time, and writes what the engine says to
//! write. The tokio driver is the `handoff` crate; the asyncio driver is the Python
//! extension's.
//!
//! What is here, bottom up:
//! - [`admission`]: the bound on handshakes in progress, the oldest giving way;
//! - [`bounds`]: what a node's peers can make it hold (spec §9.1);
//! - [`dialing`]: what an address names, the switch to shm a dialer makes, and reaching a
//!   ticket's owner;
//! - [`budget`]: the receive budget and its permits (spec §9.1);
//! - [`ended_holds`]: holds on other nodes' buffers that ended here, owing `unlease`s;
//! - [`identity`]: node, process and host ids;
//! - [`inbound`]: the receiving half of an established connection, as a push-based state
//!   machine (bytes and descriptors in, messages and ticket traffic out);
//! - [`inbox`]: received messages waiting for the application, taken fairly by bytes;
//! - [`log_limit`]: how many warnings about a peer reach the log;
//! - [`node`]: what every connection of a node shares, and how a connection is built from it;
//! - [`peers`]: the identity a node presents, node-id admission and the switch to shm;
//! - [`outbound`]: how a message's frames travel on a same-host connection, and its header;
//! - [`receive`]: what an established connection decides about each header it reads (§9, §11.2);
//! - [`received`]: what a node decides about a received message: an unknown type's refusal,
//!   whether it waits for its tickets, how a received ticket names its owner;
//! - [`recv_buffers`]: reused receive buffers for large inline frames;
//! - [`shm`]: the memfd segment pool (sending) and the mapping cache (receiving);
//! - [`ticket_leases`]: the leases a ticket owner keeps for its holders (spec §7.7);
//! - [`ticket_requests`]: a holder's requests waiting for the owner's answers;
//! - [`tls`]: the rustls configurations, the plain-or-TLS opening and TLS failures in words
//!   (spec §3.1);
//! - [`seeded`]: the seeded generator of simulations and chaos runs;
//! - [`send_policy`]: which frames of a message travel as tickets (spec §7.5, §7.8);
//! - [`waiting`]: the waits in progress on a table, so that its waker wakes a driver only
//!   while someone waits;
//! - [`settings`]: a node's settings, their defaults and checks, and what it presents from them;
//! - [`handshake`]: the handshake of every version as a state machine (spec §5), with the
//!   node's set of dialer nonces.

#![warn(missing_docs)]

pub mod admission;
pub mod bounds;
pub mod budget;
pub mod dialing;
pub mod ended_holds;
pub mod established;
pub mod handshake;
pub mod identity;
pub mod inbound;
pub mod inbox;
pub mod log_limit;
pub mod node;
pub mod outbound;
pub mod outgoing;
pub mod peers;
pub mod receive;
pub mod received;
pub mod recv_buffers;
pub mod seeded;
pub mod send_policy;
pub mod settings;
pub mod shm;
pub mod ticket_leases;
pub mod ticket_requests;
pub mod tls;
pub mod tls_session;
pub mod waiting;

pub use bounds::Bounds;
pub use handshake::{Handshake, Handshaken};
pub use log_limit::LogLimiter;

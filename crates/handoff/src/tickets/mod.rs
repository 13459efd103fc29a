//! Tickets: a large buffer sent as a small claim that the receiver — or a third node it
//! forwards the claim to — redeems by pulling the bytes straight from the owner, who keeps
//! them under a lease until every holder has released it.
//!
//! From the bottom up: `owner` keeps the leases this node issued, `modes` says how tickets
//! are asked for and redeemed, `pending` holds the requests waiting for an owner's answer and
//! `holder` the tickets this node received; `client` sends the requests to owners, and
//! `tasks` runs the node's background work on tickets.

pub(crate) mod client;
pub(crate) mod holder;
pub(crate) mod modes;
pub(crate) mod owner;
pub(crate) mod pending;
pub(crate) mod tasks;

pub use holder::Ticket;
pub use modes::{on_demand, Redeem};
pub use owner::{LeaseConfig, LeaseTableStats, WhenFull};

//! Real storage servers on loopback for tests and benchmarks: an S3-compatible server (moto, spawned as a child
//! process), a small HTTP file server with Range, ETag and PROPFIND (in-process), and a proxy that counts the
//! requests a client sends to a server. Every server listens on 127.0.0.1 with a free port and stops when dropped.
//!
//! Not published: `handoff-data`'s tests, the `handoff` demo and `handoff bench` use it; a user of the data
//! library never compiles it.

#![warn(missing_docs)]

mod counter;
mod http_server;
mod httpdate;
mod moto;
mod proxy;
mod wire;

pub use counter::{RequestCounter, RequestCounts};
pub use http_server::HttpFileServer;
pub use moto::{MotoServer, MOTO_INSTALL_HINT};
pub use proxy::CountingProxy;

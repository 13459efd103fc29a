//! Real storage servers on loopback for tests and benchmarks: an S3-compatible server (moto, spawned as a child
//! process), a small HTTP file server with Range, ETag and PROPFIND (in-process), and a proxy that counts the
//! requests a client sends to a server. Every server listens on 127.0.0.1 with a free port and stops when dropped.
//!
//! Also the TCP delay line of the network lab ([`DelayLine`], and the `delay-line` program), which listens where
//! it is told and runs until its process exits.
//!
//! Not published: `handoff-data`'s tests, the `handoff` demo and `handoff bench` use it; a user of the data
//! library never compiles it.

#![warn(missing_docs)]

mod counter;
mod delay_line;
mod http_server;
mod httpdate;
mod moto;
mod proxy;
mod wire;

pub use counter::{RequestCounter, RequestCounts};
pub use delay_line::{DelayLine, MAX_ARRIVALS, MAX_CONNECTIONS, PIPE_BYTES};
pub use http_server::HttpFileServer;
pub use moto::{MotoServer, MOTO_INSTALL_HINT};
pub use proxy::CountingProxy;

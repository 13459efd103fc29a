//! # handoff-wire
//!
//! The sans-IO core of handoff's wire format, versions 1, 2 and 3 (see `spec/WIRE.md`):
//! the connection [preamble](preamble) and version negotiation, the
//! [header](header) with its frame [descriptors](header::Descriptor), message
//! [framing](framing), the [limits](Limits) a receiver enforces, the
//! challenge–response [authentication](auth), and the route-aware
//! [codec](codec) that moves [`Buffer`]s out of band.
//!
//! Nothing here does I/O: the runtime crate `handoff` reads and writes sockets
//! around these functions, and the test vectors in `spec/vectors/` are checked
//! against them.

#![warn(missing_docs)]

pub mod auth;
mod buffer;
mod buffer_serde;
pub mod codec;
mod error;
pub mod framing;
pub mod header;
mod limits;
pub mod msgpack;
pub mod preamble;
pub mod resource;
pub mod route;
mod scope;

pub use buffer::Buffer;
pub use codec::{decode, encode, EncodeError, EncodedBody, EXT_FRAME_REF};
pub use error::WireError;
pub use framing::{decode_message, DecodedMessage};
pub use header::{
    Descriptor, DeviceClaim, Header, Hello, Ident, TicketClaim, TicketDigest, TicketOp, CAP_CUDA, CAP_XXH3,
};
pub use limits::{identity as identity_lengths, Limits, HANDSHAKE_HEADER_BYTES, HANDSHAKE_HEADER_VALUES};
pub use preamble::{Preamble, MAX_VERSION, MIN_VERSION};
pub use resource::{Resource, ResourceError, ResourceKey, Resources, EXT_RESOURCE_KEY};
pub use route::{Channel, Endpoint, Locality, Route};

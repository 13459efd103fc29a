//! [`Payload`]: what a message carries on its way to the application — a moved value, or
//! encoded bytes and their frames.

use std::any::Any;

use bytes::Bytes;
use handoff_wire::Buffer;

use crate::Error;

/// What an envelope carries: a moved value (in-process) or encoded bytes.
pub(crate) enum Payload {
    /// The value itself, moved from the sender: nothing was serialized.
    Value(Box<dyn Any + Send>),
    /// A msgpack body and its frames.
    Encoded { body: Bytes, frames: Vec<Buffer> },
    /// The message could not be completed (a ticket could not be redeemed).
    Failed(Box<Error>),
}

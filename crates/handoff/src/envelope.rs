//! [`Envelope`]: a received message, not yet decoded.

use std::any::Any;
use std::sync::Arc;

use handoff_wire::{Channel, Resources, Route};

use crate::message::TypeRegistry;
use crate::payload::Payload;
use crate::{Error, Message, Peer, Result};

/// A received message: who sent it, its type name, and the value, decoded on demand.
pub struct Envelope {
    pub(crate) from: Peer,
    /// The type name: the sender's static name in process, or as read from the wire.
    pub(crate) type_name: std::borrow::Cow<'static, str>,
    pub(crate) payload: Payload,
    /// The room this message takes in the node's receive budget, until the application
    /// takes it from the inbox (`Node::recv` drops it).
    pub(crate) permit: Option<crate::budget::Permit>,
}

impl Envelope {
    /// The peer that sent the message; use it to reply.
    pub fn from(&self) -> &Peer {
        &self.from
    }

    /// The type name in the message header.
    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// Whether the message was encoded on the wire (`false`: the value was moved in-process).
    pub fn is_encoded(&self) -> bool {
        !matches!(self.payload, Payload::Value(_))
    }

    /// The channel it came on.
    pub fn channel(&self) -> Channel {
        self.from.channel()
    }

    /// The route it took (sender to this node).
    pub fn route(&self) -> &Arc<Route> {
        self.from.inbound_route()
    }

    /// Bytes of the encoded body and frames (0 for a moved value).
    pub fn wire_bytes(&self) -> u64 {
        match &self.payload {
            Payload::Value(_) | Payload::Failed(_) => 0,
            Payload::Encoded { body, frames } => body.len() as u64 + frames.iter().map(|f| f.len() as u64).sum::<u64>(),
        }
    }

    /// Decodes the value as `T`; fails if the envelope carries another type.
    ///
    /// Buffers in an encoded value are zero-copy views of the received frames.
    pub fn decode<T: Message>(self) -> Result<T> {
        if self.type_name != T::TYPE_NAME {
            return Err(Error::TypeMismatch {
                expected: T::TYPE_NAME,
                got: self.type_name.into_owned(),
            });
        }
        match self.payload {
            Payload::Value(v) => v.downcast::<T>().map(|b| *b).map_err(|_| Error::TypeMismatch {
                expected: T::TYPE_NAME,
                got: format!("{} (a different Rust type registered under that name)", self.type_name),
            }),
            Payload::Failed(e) => Err(*e),
            Payload::Encoded { body, frames } => {
                let route = self.from.inbound_route();
                Ok(with_resources(&self.from, || {
                    handoff_wire::decode::<T>(T::TYPE_NAME, &body, &frames, Some(route))
                })?)
            }
        }
    }

    /// Decodes the value by the name in its header, through `registry`, as a boxed `Any`.
    pub fn decode_any(self, registry: &TypeRegistry) -> Result<Box<dyn Any + Send>> {
        let decoder = registry
            .check(&self.type_name)
            .map(|()| registry.decoder(&self.type_name));
        let decoder = decoder?.expect("checked above");
        match self.payload {
            Payload::Value(v) => Ok(v),
            Payload::Failed(e) => Err(*e),
            Payload::Encoded { body, frames } => Ok(with_resources(&self.from, || {
                decoder(&body, &frames, self.from.inbound_route())
            })?),
        }
    }
}

/// Runs `f` with the receiving node's resources current (the node `from` is a peer of), so
/// resource keys in the body bind to that node's objects.
fn with_resources<R>(from: &Peer, f: impl FnOnce() -> R) -> R {
    match from.0.local.upgrade() {
        Some(node) => Resources::with(&node.context().resources, f),
        None => f(),
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("from", &self.from.name())
            .field("type_name", &self.type_name)
            .field("encoded", &self.is_encoded())
            .finish()
    }
}

//! Messages: the types nodes exchange, named so a receiver can decode them by name.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use handoff_wire::{Buffer, Route, WireError};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A type that nodes can send to each other.
///
/// Derive serde's traits and give the type a stable name; the name travels in the
/// message header and the receiver decodes by it.
///
/// ```
/// use handoff::{Buffer, Message};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Chunk {
///     index: u32,
///     data: Buffer, // travels out of band, arrives as a zero-copy view
/// }
///
/// impl Message for Chunk {
///     const TYPE_NAME: &'static str = "example.Chunk";
/// }
/// ```
pub trait Message: Serialize + DeserializeOwned + Send + 'static {
    /// The name of the type on the wire; unique within a cluster.
    const TYPE_NAME: &'static str;
}

type DecodeFn = fn(&Bytes, &[Buffer], &Arc<Route>) -> Result<Box<dyn Any + Send>, WireError>;

fn decode_boxed<T: Message>(
    body: &Bytes,
    frames: &[Buffer],
    route: &Arc<Route>,
) -> Result<Box<dyn Any + Send>, WireError> {
    handoff_wire::decode::<T>(T::TYPE_NAME, body, frames, Some(route)).map(|v| Box::new(v) as Box<dyn Any + Send>)
}

/// The type names a node accepts, and how to decode each.
///
/// A message whose name is not registered is refused with `unknown-type`.
#[derive(Clone, Default)]
pub struct TypeRegistry {
    decoders: HashMap<&'static str, DecodeFn>,
}

impl TypeRegistry {
    /// An empty registry.
    pub fn new() -> TypeRegistry {
        TypeRegistry::default()
    }

    /// Registers `T` under its [`Message::TYPE_NAME`].
    pub fn register<T: Message>(&mut self) -> &mut Self {
        self.decoders.insert(T::TYPE_NAME, decode_boxed::<T>);
        self
    }

    /// Whether a name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.decoders.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.decoders.keys().copied().collect();
        names.sort_unstable();
        names
    }

    /// Fails with `unknown-type` (naming the known types) unless `name` is registered.
    pub fn check(&self, name: &str) -> Result<(), WireError> {
        if self.contains(name) {
            Ok(())
        } else {
            Err(handoff_proto::received::unknown_type(
                name,
                self.decoders.keys().copied(),
            ))
        }
    }

    pub(crate) fn decoder(&self, name: &str) -> Option<DecodeFn> {
        self.decoders.get(name).copied()
    }
}

impl std::fmt::Debug for TypeRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

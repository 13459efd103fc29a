//! Resources: local objects a node keeps under keys, which values refer to by key.
//!
//! Some values cannot travel: a storage driver, a cache, a connection pool. A type that
//! refers to one ([`Resource<T>`]) serializes as the resource's *key* — a msgpack extension
//! of type [`EXT_RESOURCE_KEY`] whose payload is the key in UTF-8 — and the receiver binds
//! the key to its *own* object of that name: from its registry ([`Resources`]), or through a
//! [`Resolver`] that opens it on demand. A key the receiver cannot resolve fails the decode
//! with [`WireError::UnknownResource`](crate::WireError::UnknownResource), which names the
//! key and the keys the receiver has.
//!
//! While the runtime decodes a message it makes the receiving node's registry current
//! ([`Resources::with`]); [`Resources::current`] is what `Deserialize` implementations use.

use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The msgpack extension type of a resource key in a body.
pub const EXT_RESOURCE_KEY: i8 = 2;

/// A shared, type-erased resource.
pub type AnyResource = Arc<dyn Any + Send + Sync>;

/// Opens resources on demand, for keys the registry does not hold.
///
/// A resolver answers for the keys it knows (`Some`) and leaves others (`None`) to the
/// next resolver; an `Err` is a key it knows but could not open, with the reason.
pub trait Resolver: Send + Sync {
    /// The resource for `key`, if this resolver knows the key.
    fn resolve(&self, key: &str) -> Option<Result<AnyResource, String>>;
    /// The keys this resolver can open (for error messages and listings).
    fn keys(&self) -> Vec<String>;
}

/// A node's registry of local resources, by key.
#[derive(Default)]
pub struct Resources {
    owner: String,
    entries: RwLock<BTreeMap<String, AnyResource>>,
    resolvers: RwLock<Vec<Arc<dyn Resolver>>>,
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resources")
            .field("owner", &self.owner)
            .field("keys", &self.keys())
            .finish()
    }
}

/// Why a resource key could not be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// Neither the registry nor a resolver knows the key.
    #[error("no resource {key:?} on node {node:?} (it has: {})", list(available))]
    Unknown {
        /// The key.
        key: String,
        /// The node that looked it up.
        node: String,
        /// The keys that node has.
        available: Vec<String>,
    },
    /// The key names a resource of another type.
    #[error("resource {key:?} on node {node:?} is not a {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The node that looked it up.
        node: String,
        /// The Rust type the value asked for.
        expected: &'static str,
    },
    /// A resolver knows the key but could not open it.
    #[error("resource {key:?} on node {node:?} could not be opened: {reason}")]
    Failed {
        /// The key.
        key: String,
        /// The node that looked it up.
        node: String,
        /// What went wrong.
        reason: String,
    },
}

fn list(keys: &[String]) -> String {
    if keys.is_empty() {
        "no resources".into()
    } else {
        keys.join(", ")
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Resources>>> = const { RefCell::new(None) };
    static FAILED: RefCell<Option<ResourceError>> = const { RefCell::new(None) };
}

impl Resources {
    /// An empty registry of the node named `owner` (the name appears in errors).
    pub fn new(owner: impl Into<String>) -> Resources {
        Resources {
            owner: owner.into(),
            ..Resources::default()
        }
    }

    /// The node whose registry this is.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Registers `value` under `key`, replacing what was there.
    pub fn insert<T: Any + Send + Sync>(&self, key: impl Into<String>, value: Arc<T>) {
        self.entries
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.into(), value);
    }

    /// Removes the resource under `key`; values already bound keep it alive.
    pub fn remove(&self, key: &str) -> bool {
        self.entries
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .is_some()
    }

    /// Adds a resolver, asked (in the order added) for keys the registry does not hold.
    pub fn add_resolver(&self, resolver: Arc<dyn Resolver>) {
        self.resolvers.write().unwrap_or_else(|e| e.into_inner()).push(resolver);
    }

    /// Every key: registered ones, then those the resolvers can open; sorted, no repeats.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for r in self.resolvers.read().unwrap_or_else(|e| e.into_inner()).iter() {
            keys.extend(r.keys());
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The resource under `key`, type-erased: from the registry, else the first resolver
    /// that knows the key.
    pub fn get_any(&self, key: &str) -> Result<AnyResource, ResourceError> {
        if let Some(v) = self.entries.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(v.clone());
        }
        let resolvers = self.resolvers.read().unwrap_or_else(|e| e.into_inner()).clone();
        for r in resolvers {
            match r.resolve(key) {
                Some(Ok(v)) => return Ok(v),
                Some(Err(reason)) => {
                    return Err(ResourceError::Failed {
                        key: key.to_string(),
                        node: self.owner.clone(),
                        reason,
                    })
                }
                None => {}
            }
        }
        Err(ResourceError::Unknown {
            key: key.to_string(),
            node: self.owner.clone(),
            available: self.keys(),
        })
    }

    /// The resource under `key` as a `T`.
    pub fn get<T: Any + Send + Sync>(&self, key: &str) -> Result<Arc<T>, ResourceError> {
        self.get_any(key)?
            .downcast::<T>()
            .map_err(|_| ResourceError::WrongType {
                key: key.to_string(),
                node: self.owner.clone(),
                expected: std::any::type_name::<T>(),
            })
    }

    /// The registry of the node decoding a value on this thread, if any.
    pub fn current() -> Option<Arc<Resources>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Runs `f` with `resources` current, restoring the previous registry afterwards (also
    /// when `f` panics).
    pub fn with<R>(resources: &Arc<Resources>, f: impl FnOnce() -> R) -> R {
        crate::scope::with_current(&CURRENT, resources, f)
    }

    /// Binds `key` in the current registry, for `Deserialize` implementations: the error is
    /// also recorded so the codec reports it as `unknown-resource` rather than `bad-body`.
    pub fn bind<T: Any + Send + Sync>(key: &str) -> Result<Arc<T>, ResourceError> {
        let result = match Resources::current() {
            Some(r) => r.get::<T>(key),
            None => Err(ResourceError::Unknown {
                key: key.to_string(),
                node: "(none: decoded outside a node)".into(),
                available: Vec::new(),
            }),
        };
        if let Err(e) = &result {
            FAILED.with(|f| *f.borrow_mut() = Some(e.clone()));
        }
        result
    }

    /// Takes the last binding failure recorded on this thread (used by the codec).
    pub(crate) fn take_failure() -> Option<ResourceError> {
        FAILED.with(|f| f.borrow_mut().take())
    }
}

/// A resource key as it travels: msgpack ext type [`EXT_RESOURCE_KEY`] with the key in UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey(pub String);

impl Serialize for ResourceKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_newtype_struct(
            rmp_serde::MSGPACK_EXT_STRUCT_NAME,
            &(EXT_RESOURCE_KEY, serde_bytes::Bytes::new(self.0.as_bytes())),
        )
    }
}

impl<'de> Deserialize<'de> for ResourceKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ResourceKey, D::Error> {
        let (tag, payload) = deserializer.deserialize_any(ExtVisitor)?;
        if tag != EXT_RESOURCE_KEY {
            return Err(D::Error::custom(format!(
                "msgpack extension type {tag} where a resource key was expected (type {EXT_RESOURCE_KEY})"
            )));
        }
        String::from_utf8(payload.into_vec())
            .map(ResourceKey)
            .map_err(|_| D::Error::custom("a resource key that is not UTF-8"))
    }
}

struct ExtVisitor;

impl<'de> serde::de::Visitor<'de> for ExtVisitor {
    type Value = (i8, serde_bytes::ByteBuf);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a msgpack extension (resource key)")
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Deserialize::deserialize(d)
    }
}

/// A reference to a node-local resource of type `T`: it travels as its key and is bound, on
/// receipt, to the receiver's own resource under that key.
///
/// ```
/// use std::sync::Arc;
/// use handoff_wire::resource::{Resource, Resources};
///
/// struct Pool { size: usize }
/// let mine = Arc::new(Resources::new("beta"));
/// mine.insert("db", Arc::new(Pool { size: 4 }));
/// let sent = Resource::new("db", Arc::new(Pool { size: 1 }));           // the sender's pool
/// let encoded = handoff_wire::encode(&sent, None).unwrap();
/// let got: Resource<Pool> = Resources::with(&mine, || handoff_wire::decode("x", &encoded.body, &[], None)).unwrap();
/// assert_eq!(got.size, 4);                                              // bound to the receiver's pool
/// ```
pub struct Resource<T: ?Sized> {
    key: String,
    value: Arc<T>,
}

impl<T: ?Sized> Clone for Resource<T> {
    fn clone(&self) -> Self {
        Resource {
            key: self.key.clone(),
            value: self.value.clone(),
        }
    }
}

impl<T: ?Sized> Resource<T> {
    /// A reference to `value`, known to receivers as `key`.
    pub fn new(key: impl Into<String>, value: Arc<T>) -> Resource<T> {
        Resource { key: key.into(), value }
    }

    /// The key it travels as.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The local object.
    pub fn value(&self) -> &Arc<T> {
        &self.value
    }
}

impl<T: Any + Send + Sync> Resource<T> {
    /// Binds `key` in `resources`.
    pub fn lookup(resources: &Resources, key: &str) -> Result<Resource<T>, ResourceError> {
        resources.get::<T>(key).map(|value| Resource {
            key: key.to_string(),
            value,
        })
    }
}

impl<T: ?Sized> Deref for Resource<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: ?Sized> fmt::Debug for Resource<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Resource({:?})", self.key)
    }
}

impl<T: ?Sized> Serialize for Resource<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ResourceKey(self.key.clone()).serialize(serializer)
    }
}

impl<'de, T: Any + Send + Sync> Deserialize<'de> for Resource<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Resource<T>, D::Error> {
        let ResourceKey(key) = ResourceKey::deserialize(deserializer)?;
        let value = Resources::bind::<T>(&key).map_err(D::Error::custom)?;
        Ok(Resource { key, value })
    }
}

//! The codec: a value plus its route in, a msgpack body plus out-of-band frames out.
//!
//! `Buffer`s inside a value are not copied into the body: while [`encode`] runs,
//! each one is collected as a frame and the body holds a msgpack extension value
//! of type [`EXT_FRAME_REF`] whose 4-byte big-endian payload is the frame's index.
//! [`decode`] resolves those references to zero-copy views of the received frames.

use std::cell::RefCell;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Buffer, Route, WireError};

/// The msgpack extension type of a frame reference in a body.
pub const EXT_FRAME_REF: i8 = 1;

/// Nesting limit of a body: msgpack arrays, maps and ext values deeper than
/// `MAX_BODY_DEPTH - 1` levels (`spec/WIRE.md`: 127) are `bad-body` instead of
/// overflowing the receiving thread's stack.
const MAX_BODY_DEPTH: usize = 128;

#[derive(Default)]
struct DecodeState {
    frames: Vec<Buffer>,
    bad_ref: Option<u64>,
}

thread_local! {
    static ENCODING: RefCell<Option<Vec<Buffer>>> = const { RefCell::new(None) };
    static DECODING: RefCell<Option<DecodeState>> = const { RefCell::new(None) };
}

/// A value encoded for one route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedBody {
    /// The msgpack body (structs as maps with field names).
    pub body: Vec<u8>,
    /// The buffers the body refers to, in index order.
    pub frames: Vec<Buffer>,
}

/// Encoding a value failed (its `Serialize` implementation returned an error).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode value: {0}")]
pub struct EncodeError(pub String);

/// Encodes `value` for `route`: a msgpack body and the buffers it carries out of band.
///
/// While it runs, [`Route::current`] returns `route`, so route-aware types can choose
/// their encoding.
pub fn encode<T: Serialize + ?Sized>(value: &T, route: Option<&Arc<Route>>) -> Result<EncodedBody, EncodeError> {
    let run = || {
        let previous = ENCODING.with(|e| e.borrow_mut().replace(Vec::new()));
        let mut body = Vec::with_capacity(64);
        let result = value.serialize(&mut rmp_serde::Serializer::new(&mut body).with_struct_map());
        let frames = ENCODING.with(|e| std::mem::replace(&mut *e.borrow_mut(), previous));
        result
            .map(|()| EncodedBody {
                body,
                frames: frames.unwrap_or_default(),
            })
            .map_err(|e| EncodeError(e.to_string()))
    };
    match route {
        Some(route) => Route::with(route, run),
        None => run(),
    }
}

/// Decodes a body of type `type_name` whose frame references point into `frames`.
pub fn decode<T: DeserializeOwned>(
    type_name: &str,
    body: &[u8],
    frames: &[Buffer],
    route: Option<&Arc<Route>>,
) -> Result<T, WireError> {
    let run = || {
        let state = DecodeState {
            frames: frames.to_vec(),
            bad_ref: None,
        };
        if body_depth_exceeds(body, MAX_BODY_DEPTH - 1) {
            return Err(WireError::BadBody {
                type_name: type_name.to_string(),
                reason: format!("nesting deeper than {} levels", MAX_BODY_DEPTH - 1),
            });
        }
        let _ = crate::resource::Resources::take_failure();
        let previous = DECODING.with(|d| d.borrow_mut().replace(state));
        let mut de = rmp_serde::Deserializer::from_read_ref(body);
        de.set_max_depth(MAX_BODY_DEPTH);
        let result = T::deserialize(&mut de);
        let state = DECODING.with(|d| std::mem::replace(&mut *d.borrow_mut(), previous));
        let unbound = crate::resource::Resources::take_failure();
        match (result, state.and_then(|s| s.bad_ref), unbound) {
            (Ok(v), _, _) => Ok(v),
            (Err(_), Some(index), _) => Err(WireError::BadFrameRef {
                index,
                count: frames.len(),
            }),
            (Err(_), None, Some(failure)) => Err(WireError::UnknownResource(failure)),
            (Err(e), None, None) => Err(WireError::BadBody {
                type_name: type_name.to_string(),
                reason: e.to_string(),
            }),
        }
    };
    match route {
        Some(route) => Route::with(route, run),
        None => run(),
    }
}

/// Whether the first msgpack value in `body` nests arrays, maps and ext values more than
/// `max` levels deep (the outermost counts).
///
/// rmp-serde's own depth limit does not count the one-entry map of an enum variant, so a
/// recursive enum could still overflow the stack; this scan is iterative and counts every
/// container. Malformed or truncated input ends the scan without a verdict: the
/// deserializer reports it.
fn body_depth_exceeds(body: &[u8], max: usize) -> bool {
    // handoff-wire's msgpack reader, with no limits of its own: the levels are counted here.
    let mut reader = crate::msgpack::Reader::new(body, u32::MAX, u32::MAX);
    // Items still to read in each open container, innermost last.
    let mut open: Vec<u64> = Vec::new();
    loop {
        use crate::msgpack::Any;
        // Containers have items; an ext is a leaf, but it counts one level.
        let items = match reader.read_any(0) {
            Ok(Any::Array(n)) => Some(n as u64),
            Ok(Any::Map(n)) => Some(2 * n as u64),
            Ok(Any::Ext(..)) => Some(0),
            Ok(_) => None,
            Err(_) => return false,
        };
        if let Some(items) = items {
            if open.len() + 1 > max {
                return true;
            }
            if items > 0 {
                open.push(items);
                continue;
            }
        }
        // A value is complete: count it in its container(s).
        loop {
            match open.last_mut() {
                None => return false,
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
}

/// Called by `Buffer::serialize`: inside [`encode`], records the bytes as a frame and
/// returns its index; outside, returns `None`.
pub(crate) fn push_frame(buffer: &Buffer) -> Option<u32> {
    ENCODING.with(|e| {
        e.borrow_mut().as_mut().map(|frames| {
            frames.push(buffer.clone());
            (frames.len() - 1) as u32
        })
    })
}

/// Writes a frame reference (msgpack ext type [`EXT_FRAME_REF`], u32 big-endian index).
pub(crate) fn serialize_frame_ref<S: Serializer>(index: u32, serializer: S) -> Result<S::Ok, S::Error> {
    let payload = index.to_be_bytes();
    serializer.serialize_newtype_struct(
        rmp_serde::MSGPACK_EXT_STRUCT_NAME,
        &(EXT_FRAME_REF, serde_bytes::Bytes::new(&payload)),
    )
}

/// Reads a frame reference (already known to be a msgpack extension) and returns the frame.
pub(crate) fn deserialize_frame_ref<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Buffer, D::Error> {
    use serde::de::Error;
    let (tag, payload): (i8, serde_bytes::ByteBuf) = Deserialize::deserialize(deserializer)?;
    if tag != EXT_FRAME_REF {
        return Err(D::Error::custom(format!(
            "msgpack extension type {tag} where a buffer was expected (frame references are type {EXT_FRAME_REF})"
        )));
    }
    let index = match <[u8; 4]>::try_from(payload.as_slice()) {
        Ok(b) => u32::from_be_bytes(b) as u64,
        Err(_) => {
            return Err(D::Error::custom(format!(
                "frame reference payload must be 4 bytes, got {}",
                payload.len()
            )))
        }
    };
    DECODING.with(|d| {
        let mut d = d.borrow_mut();
        let Some(state) = d.as_mut() else {
            return Err(D::Error::custom(
                "a frame reference outside a handoff message (decode it with handoff's codec)",
            ));
        };
        match state.frames.get(index as usize) {
            Some(frame) => Ok(frame.clone()),
            None => {
                state.bad_ref = Some(index);
                Err(D::Error::custom(format!(
                    "frame reference {index} out of range ({} frames)",
                    state.frames.len()
                )))
            }
        }
    })
}

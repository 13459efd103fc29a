//! The codec: a value plus its route in, a msgpack body plus out-of-band frames out.
//!
//! `Buffer`s inside a value are not copied into the body: while [`encode`] runs,
//! each one is collected as a frame and the body holds a msgpack extension value
//! of type [`EXT_FRAME_REF`] whose 4-byte big-endian payload is the frame's index.
//! [`decode`] resolves those references to zero-copy views of the received frames.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Route, WireError};

/// The msgpack extension type of a frame reference in a body.
pub const EXT_FRAME_REF: i8 = 1;

#[derive(Default)]
struct DecodeState {
    frames: Vec<Bytes>,
    bad_ref: Option<u64>,
}

thread_local! {
    static ENCODING: RefCell<Option<Vec<Bytes>>> = const { RefCell::new(None) };
    static DECODING: RefCell<Option<DecodeState>> = const { RefCell::new(None) };
}

/// A value encoded for one route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedBody {
    /// The msgpack body (structs as maps with field names).
    pub body: Vec<u8>,
    /// The buffers the body refers to, in index order.
    pub frames: Vec<Bytes>,
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
    frames: &[Bytes],
    route: Option<&Arc<Route>>,
) -> Result<T, WireError> {
    let run = || {
        let state = DecodeState {
            frames: frames.to_vec(),
            bad_ref: None,
        };
        let previous = DECODING.with(|d| d.borrow_mut().replace(state));
        let result = rmp_serde::from_slice::<T>(body);
        let state = DECODING.with(|d| std::mem::replace(&mut *d.borrow_mut(), previous));
        match result {
            Ok(v) => Ok(v),
            Err(e) => match state.and_then(|s| s.bad_ref) {
                Some(index) => Err(WireError::BadFrameRef {
                    index,
                    count: frames.len(),
                }),
                None => Err(WireError::BadBody {
                    type_name: type_name.to_string(),
                    reason: e.to_string(),
                }),
            },
        }
    };
    match route {
        Some(route) => Route::with(route, run),
        None => run(),
    }
}

/// Called by `Buffer::serialize`: inside [`encode`], records the bytes as a frame and
/// returns its index; outside, returns `None`.
pub(crate) fn push_frame(bytes: &Bytes) -> Option<u32> {
    ENCODING.with(|e| {
        e.borrow_mut().as_mut().map(|frames| {
            frames.push(bytes.clone());
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
pub(crate) fn deserialize_frame_ref<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
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

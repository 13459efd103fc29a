//! The wire-format test vectors: their definitions, the generator that writes
//! them to `spec/vectors/`, and the checker that decodes each one and compares
//! the result with its JSON description.
//!
//! Each vector is a pair of files: `NAME.bin` (the bytes) and `NAME.json` (what
//! they decode to, or the error code they must give). The format of the JSON is
//! documented in `spec/vectors/README.md`; any implementation of the wire format
//! must pass every vector.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};

use handoff_wire::framing::{TCP_KINDS, UNIX_KINDS, UNIX_KINDS_WITH_CUDA};
use handoff_wire::{Header, Limits, Preamble, WireError, EXT_RESOURCE_KEY};
use serde_json::{json, Value as Json};

mod cuda;
mod fixtures;
mod strict;
mod v1;
mod v2;
mod v3;

pub use fixtures::Vector;
pub use v1::{BLOB_DATASET, TREE_DATASET};

/// Every vector, in a stable order.
pub fn all() -> Vec<Vector> {
    let mut v = v1::vectors();
    v.extend(strict::vectors());
    v.extend(v2::vectors());
    v.extend(v3::vectors());
    v.extend(cuda::vectors());
    v
}

/// The descriptor kinds the receiver of a vector takes: its `channel` (`"shm"`: a Unix
/// socket, else TCP) and, on a Unix socket, `cuda` if its `caps` name it (§7.10).
pub fn receiver_kinds(description: &Json) -> &'static [&'static str] {
    let announced_cuda = description["caps"]
        .as_array()
        .is_some_and(|caps| caps.iter().any(|c| c == "cuda"));
    match (description["channel"] == "shm", announced_cuda) {
        (true, true) => UNIX_KINDS_WITH_CUDA,
        (true, false) => UNIX_KINDS,
        _ => TCP_KINDS,
    }
}

/// The folder the vectors live in: `spec/vectors` at the workspace root.
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors")
}

/// The description of a vector as written to disk, with its `name` and `file` keys.
pub fn description_on_disk(v: &Vector) -> Json {
    let mut d = v.description.clone();
    d["name"] = json!(v.name);
    d["file"] = json!(format!("{}.bin", v.name));
    d
}

/// Writes every vector to `dir` (the generator).
pub fn write_all(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let vectors = all();
    for v in &vectors {
        std::fs::write(dir.join(format!("{}.bin", v.name)), &v.bytes)?;
        let text = serde_json::to_string_pretty(&description_on_disk(v)).expect("JSON") + "\n";
        std::fs::write(dir.join(format!("{}.json", v.name)), text)?;
    }
    Ok(vectors.len())
}

/// Converts a decoded msgpack value into the JSON view the vectors use:
/// binary as `{"$bin": hex}`, a frame reference as `{"$frame": index}` (checked against
/// `frame_count`), a resource key as `{"$resource": key}` (checked to be UTF-8); with `None`,
/// as in a header, extensions are shown as `{"$ext", "data"}`.
pub fn json_view(value: &rmpv::Value, frame_count: Option<usize>) -> Result<Json, WireError> {
    use rmpv::Value as V;
    Ok(match value {
        V::Nil => Json::Null,
        V::Boolean(b) => json!(b),
        V::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => json!(u),
            (None, Some(s)) => json!(s),
            _ => unreachable!("msgpack integers fit u64 or i64"),
        },
        V::F32(f) => json!(f),
        V::F64(f) => json!(f),
        V::String(s) => json!(s.as_str().unwrap_or("")),
        V::Binary(b) => json!({"$bin": hex::encode(b)}),
        V::Array(items) => Json::Array(
            items
                .iter()
                .map(|i| json_view(i, frame_count))
                .collect::<Result<_, _>>()?,
        ),
        V::Map(pairs) => {
            let mut m = serde_json::Map::new();
            for (k, val) in pairs {
                let key = k.as_str().map(str::to_string).unwrap_or_else(|| k.to_string());
                m.insert(key, json_view(val, frame_count)?);
            }
            Json::Object(m)
        }
        V::Ext(1, payload) if let Some(count) = frame_count => {
            let idx: [u8; 4] = payload.as_slice().try_into().map_err(|_| WireError::BadBody {
                type_name: "?".into(),
                reason: format!("frame reference payload must be 4 bytes, got {}", payload.len()),
            })?;
            let index = u32::from_be_bytes(idx) as u64;
            if index as usize >= count {
                return Err(WireError::BadFrameRef { index, count });
            }
            json!({"$frame": index})
        }
        V::Ext(EXT_RESOURCE_KEY, payload) if frame_count.is_some() => {
            let key = std::str::from_utf8(payload).map_err(|_| WireError::BadBody {
                type_name: "?".into(),
                reason: format!("a resource key that is not UTF-8: {}", hex::encode(payload)),
            })?;
            json!({"$resource": key})
        }
        V::Ext(t, payload) => json!({"$ext": t, "data": hex::encode(payload)}),
    })
}

/// Decodes a vector's bytes the way a receiver would and returns its JSON view
/// (or the error), to compare with the description.
pub fn decode_to_json(v: &Vector) -> Result<Json, WireError> {
    // `"stage": "handshake"`: read as before the handshake completes, with its header limit.
    let limits = match v.description["stage"].as_str() {
        Some("handshake") => Limits::default().during_handshake(),
        _ => Limits::default(),
    };
    let kind = v.description["kind"].as_str().unwrap_or("");
    if kind == "preamble" {
        let p = Preamble::decode(&v.bytes)?;
        let against = &v.description["against"];
        let version = |key: &str| against[key].as_u64().and_then(|n| u16::try_from(n).ok());
        let (Some(min_version), Some(max_version)) = (version("min_version"), version("max_version")) else {
            panic!("a preamble vector says what it is negotiated against: {against}")
        };
        let against = Preamble {
            min_version,
            max_version,
            flags: 0,
        };
        let negotiated = against.negotiate(&p)?;
        return Ok(json!({
            "decoded": {"min_version": p.min_version, "max_version": p.max_version, "flags": p.flags},
            "negotiated": negotiated,
        }));
    }
    let supported = receiver_kinds(&v.description);
    let m = handoff_wire::framing::decode_message_on(&v.bytes, &limits, supported)?;
    let header_end = 4 + u32::from_be_bytes(v.bytes[..4].try_into().expect("4 bytes")) as usize;
    let header_value = rmpv::decode::read_value(&mut &v.bytes[4..header_end])
        .map_err(|e| WireError::MalformedHeader(e.to_string()))?;
    // Frame references mean nothing in a header: an ext there is shown as it is.
    let mut header_json = json_view(&header_value, None)?;
    // Keys a receiver ignores are not part of what the message decodes to, nor are known
    // keys whose value is nil (they count as absent), in the header and in its descriptors.
    if let Json::Object(map) = &mut header_json {
        map.retain(|k, value| !k.starts_with("x-") && !value.is_null());
        if let Some(Json::Array(descriptors)) = map.get_mut("f") {
            for d in descriptors {
                if let Json::Object(d) = d {
                    d.retain(|_, value| !value.is_null());
                }
            }
        }
    }
    // The inline frames' bytes, or the bytes that follow a `pulled`.
    let frames: Vec<Json> = m.frames.iter().map(|f| json!({"$bin": hex::encode(f)})).collect();
    let mut out = json!({"header": header_json, "frames": frames});
    if let Header::Msg { body, frames, .. } = &m.header {
        let value = rmpv::decode::read_value(&mut &body[..]).map_err(|e| WireError::BadBody {
            type_name: "?".into(),
            reason: e.to_string(),
        })?;
        // Frame references index all frames, inline or not.
        let view = json_view(&value, Some(frames.len()))?;
        if v.description.get("body").is_some() {
            out["body"] = view;
        }
    }
    Ok(out)
}

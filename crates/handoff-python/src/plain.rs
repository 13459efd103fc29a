//! Plain messages: the `msg` headers without frames that most small messages are, encoded
//! and recognized here in one call each instead of in Python.
//!
//! - [`PlainCodec::pack`] packs a body of plain Python values (what `handoff.codec`'s walk
//!   would leave as it is) into the canonical msgpack of spec §2, or says it is not plain.
//! - [`PlainCodec::message`] writes a whole framed `msg` header for such a body.
//!
//! Every answer is either exactly what `handoff.codec`'s walk gives or "not plain"
//! (`None`), in which case the caller walks the value in Python (route-aware types, frames,
//! ext values). The tests check both byte for byte (`python/tests/test_native_plain.py`).
//! Headers are read by the engine (`handoff_proto`), never here.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

/// The deepest nesting a codec may be made for: its recursion stays far inside any thread's
/// stack (spec §2 bounds bodies at 127 levels).
pub const MAX_DEPTH: usize = 1024;

/// Why a value is not packed here (the caller then walks it in Python).
struct NotPlain;

type Packed = Result<(), NotPlain>;

/// Packs plain bodies and frameless messages (see the module).
#[pyclass(module = "handoff._native", frozen)]
pub struct PlainCodec {
    /// `handoff.codec.Bin`: bytes that stay in the body whatever their size.
    bin_type: Py<PyType>,
    /// `handoff.buffers.Buffer`: a bytes-like value that travels as a frame whatever its
    /// size (only with [`PlainCodec::pack_framed`]; `None`: never packed here).
    buffer_type: Option<Py<PyType>>,
    /// `handoff.wire.MAX_BODY_DEPTH`: a value nested deeper is not plain.
    max_depth: usize,
    /// `handoff.wire.MAX_HASHED_KEYS`: a value with more map keys that are tuples or floats
    /// is not plain (the walk then says why it is not sent: a Python peer refuses it).
    max_hashed_keys: usize,
}

fn write_len(out: &mut Vec<u8>, n: usize, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8, m32: u8) -> Packed {
    match (fix, m8) {
        (Some((base, below)), _) if n < below => out.push(base | n as u8),
        (_, Some(tag)) if n < 1 << 8 => out.extend_from_slice(&[tag, n as u8]),
        _ if n < 1 << 16 => {
            out.push(m16);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ if n <= u32::MAX as usize => {
            out.push(m32);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => return Err(NotPlain), // msgpack has no length for it: Python raises
    }
    Ok(())
}

/// A frame reference (spec §8.2): ext type 1 holding the frame's index as a big-endian u32,
/// in msgpack's fixext 4 form.
fn write_frame_ref(out: &mut Vec<u8>, index: usize) -> Packed {
    let index = u32::try_from(index).map_err(|_| NotPlain)?;
    out.extend_from_slice(&[0xd6, 0x01]);
    out.extend_from_slice(&index.to_be_bytes());
    Ok(())
}

fn write_str(out: &mut Vec<u8>, s: &str) -> Packed {
    write_len(out, s.len(), Some((0xa0, 32)), Some(0xd9), 0xda, 0xdb)?;
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn write_bin(out: &mut Vec<u8>, b: &[u8]) -> Packed {
    write_len(out, b.len(), None, Some(0xc4), 0xc5, 0xc6)?;
    out.extend_from_slice(b);
    Ok(())
}

/// An integer in its shortest msgpack form (as msgpack-python's packer writes it).
fn write_int(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> Packed {
    if let Ok(i) = v.extract::<i64>() {
        if i >= 0 {
            return write_uint(out, i as u64);
        }
        if i >= -32 {
            out.push(i as i8 as u8);
        } else if i >= -(1 << 7) {
            out.extend_from_slice(&[0xd0, i as i8 as u8]);
        } else if i >= -(1 << 15) {
            out.push(0xd1);
            out.extend_from_slice(&(i as i16).to_be_bytes());
        } else if i >= -(1 << 31) {
            out.push(0xd2);
            out.extend_from_slice(&(i as i32).to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&i.to_be_bytes());
        }
        return Ok(());
    }
    match v.extract::<u64>() {
        Ok(u) => write_uint(out, u),
        Err(_) => Err(NotPlain), // outside msgpack's range
    }
}

fn write_uint(out: &mut Vec<u8>, u: u64) -> Packed {
    if u < 1 << 7 {
        out.push(u as u8);
    } else if u < 1 << 8 {
        out.extend_from_slice(&[0xcc, u as u8]);
    } else if u < 1 << 16 {
        out.push(0xcd);
        out.extend_from_slice(&(u as u16).to_be_bytes());
    } else if u < 1 << 32 {
        out.push(0xce);
        out.extend_from_slice(&(u as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&u.to_be_bytes());
    }
    Ok(())
}

impl PlainCodec {
    /// Whether `v` is exactly of `buffer_type`.
    fn is_buffer(&self, v: &Bound<'_, PyAny>) -> bool {
        self.buffer_type
            .as_ref()
            .is_some_and(|t| v.get_type().is(t.bind(v.py())))
    }

    /// Packs `v`; with `frames`, bytes over the threshold and `Buffer`s become frame
    /// references whose sources are appended to `frames`.
    fn pack_value(
        &self,
        out: &mut Vec<u8>,
        v: &Bound<'_, PyAny>,
        depth: usize,
        threshold: usize,
        frames: Option<&Bound<'_, PyList>>,
        hashed: &mut usize,
    ) -> Packed {
        if depth > self.max_depth {
            return Err(NotPlain);
        }
        if v.is_none() {
            out.push(0xc0);
        } else if v.is_exact_instance_of::<PyBool>() {
            out.push(if v.is_truthy().map_err(|_| NotPlain)? {
                0xc3
            } else {
                0xc2
            });
        } else if v.is_exact_instance_of::<PyInt>() {
            write_int(out, v)?;
        } else if v.is_exact_instance_of::<PyFloat>() {
            let f: f64 = v.extract().map_err(|_| NotPlain)?;
            out.push(0xcb);
            out.extend_from_slice(&f.to_be_bytes());
        } else if let Ok(s) = v.cast_exact::<PyString>() {
            // A str with lone surrogates has no UTF-8: msgpack raises, in Python.
            write_str(out, s.to_str().map_err(|_| NotPlain)?)?;
        } else if let Ok(b) = v.cast_exact::<PyBytes>() {
            let bytes = b.as_bytes();
            if bytes.len() >= threshold {
                let frames = frames.ok_or(NotPlain)?; // a frame
                write_frame_ref(out, frames.len())?;
                frames.append(v).map_err(|_| NotPlain)?;
            } else {
                write_bin(out, bytes)?;
            }
        } else if let (Some(frames), true) = (frames, self.is_buffer(v)) {
            write_frame_ref(out, frames.len())?;
            frames
                .append(v.getattr("data").map_err(|_| NotPlain)?)
                .map_err(|_| NotPlain)?;
        } else if v.get_type().is(self.bin_type.bind(v.py())) {
            write_bin(out, v.cast::<PyBytes>().map_err(|_| NotPlain)?.as_bytes())?;
        } else if let Ok(d) = v.cast_exact::<PyDict>() {
            write_len(out, d.len(), Some((0x80, 16)), None, 0xde, 0xdf)?;
            for (k, x) in d.iter() {
                if k.is_exact_instance_of::<PyTuple>() || k.is_exact_instance_of::<PyFloat>() {
                    *hashed += 1;
                    if *hashed > self.max_hashed_keys {
                        return Err(NotPlain);
                    }
                }
                self.pack_value(out, &k, depth + 1, threshold, frames, hashed)?;
                self.pack_value(out, &x, depth + 1, threshold, frames, hashed)?;
            }
        } else if let Ok(l) = v.cast_exact::<PyList>() {
            write_len(out, l.len(), Some((0x90, 16)), None, 0xdc, 0xdd)?;
            for x in l.iter() {
                self.pack_value(out, &x, depth + 1, threshold, frames, hashed)?;
            }
        } else if let Ok(t) = v.cast_exact::<PyTuple>() {
            write_len(out, t.len(), Some((0x90, 16)), None, 0xdc, 0xdd)?;
            for x in t.iter() {
                self.pack_value(out, &x, depth + 1, threshold, frames, hashed)?;
            }
        } else {
            return Err(NotPlain);
        }
        Ok(())
    }
}

#[pymethods]
impl PlainCodec {
    /// A codec for bodies whose `Bin` type is `bin_type`, nested at most `max_depth` deep
    /// (at most [`MAX_DEPTH`]: the packer recurses once per level), with at most
    /// `max_hashed_keys` map keys that are tuples or floats.
    #[new]
    #[pyo3(signature = (bin_type, max_depth, buffer_type=None, max_hashed_keys=1024))]
    fn new(
        bin_type: Py<PyType>,
        max_depth: usize,
        buffer_type: Option<Py<PyType>>,
        max_hashed_keys: usize,
    ) -> PyResult<Self> {
        if max_depth > MAX_DEPTH {
            return Err(PyValueError::new_err(format!(
                "max_depth {max_depth} is over {MAX_DEPTH}, the deepest this codec packs"
            )));
        }
        Ok(Self {
            bin_type,
            buffer_type,
            max_depth,
            max_hashed_keys,
        })
    }

    /// `(body, sources)` for a value that is plain but for frames: exact `bytes` of
    /// `frame_threshold` or more (the source: the bytes) and exact `buffer_type` values (the
    /// source: their `data`) become frame references (ext type 1, the frame's index as a
    /// big-endian u32), in the order met, as `handoff.codec`'s walk writes them; `None` for
    /// anything else.
    fn pack_framed<'py>(
        &self,
        py: Python<'py>,
        value: &Bound<'py, PyAny>,
        frame_threshold: usize,
    ) -> Option<(Bound<'py, PyBytes>, Bound<'py, PyList>)> {
        self.buffer_type.as_ref()?;
        let mut out = Vec::with_capacity(64);
        let sources = PyList::empty(py);
        self.pack_value(&mut out, value, 1, frame_threshold, Some(&sources), &mut 0)
            .ok()?;
        Some((PyBytes::new(py, &out), sources))
    }

    /// The canonical msgpack of `value` if it is plain (no bytes of `frame_threshold` or
    /// more, only exact dict, list, tuple, str, bytes, `Bin`, int, float, bool and None,
    /// nested at most `max_depth` deep), else `None`.
    fn pack<'py>(
        &self,
        py: Python<'py>,
        value: &Bound<'py, PyAny>,
        frame_threshold: usize,
    ) -> Option<Bound<'py, PyBytes>> {
        let mut out = Vec::with_capacity(64);
        self.pack_value(&mut out, value, 1, frame_threshold, None, &mut 0)
            .ok()?;
        Some(PyBytes::new(py, &out))
    }
}

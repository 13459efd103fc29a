//! Reading bodies (spec §2, §8) into Python values in one call: every body, not only plain
//! ones, with the checks and the words of the wire format's body errors.
//!
//! msgpack's values become Python's: str (a str that is not UTF-8 a `BadStr`, as the
//! reference's generic reader keeps it), bin `bytes`, integers `int`, floats `float`, arrays
//! `list`, maps `dict` (later duplicate keys win; an array key becomes a tuple; a map key is
//! an error; more than `max_hashed_keys` keys that are arrays or floats in one body are an
//! error too, spec §9: Python does not randomize their hashes, so a peer could choose keys
//! that all collide and make one body take hours to read). Ext values: a frame reference (type 1) becomes the message's frame, a resource
//! key (type 2) a `ResourceKey`, any other an `Ext`. Nesting counts as §9 counts it: every
//! array, map and ext value is a level, the outermost included. Bytes after the value are
//! not looked at (as the reference's reader).
//!
//! The first fault in document order is the error: `(code, detail)` in a `ValueError`, the
//! code `bad-body` or `bad-frame-ref`; `handoff.codec` words it with the message's type.
//! `handoff_pure`'s reader (Python) reads every body alike; `python/tests/test_codec.py`
//! runs the same bodies through both.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple};

/// The ext type of a frame reference (§8.2).
const EXT_FRAME_REF: i8 = 1;
/// The ext type of a resource key (§8.3).
const EXT_RESOURCE_KEY: i8 = 2;

/// A fault in a body: its error code and what was wrong.
struct Fault {
    code: &'static str,
    detail: String,
}

impl Fault {
    fn body(detail: String) -> Fault {
        Fault {
            code: "bad-body",
            detail,
        }
    }
}

/// What reading failed with: the body's fault, or Python's (a constructor that raised).
enum Failed {
    Fault(Fault),
    Python(PyErr),
}

impl From<PyErr> for Failed {
    fn from(e: PyErr) -> Failed {
        Failed::Python(e)
    }
}

impl From<Fault> for Failed {
    fn from(f: Fault) -> Failed {
        Failed::Fault(f)
    }
}

type Read<'py> = Result<Bound<'py, PyAny>, Failed>;

/// Reads bodies into Python values (see the module); made once per process by
/// `handoff.codec` with the Python types it makes.
#[pyclass(module = "handoff._native", frozen)]
pub struct BodyReader {
    max_depth: u32,
    /// Map keys that are arrays or floats, at most, in one body.
    max_hashed_keys: usize,
    marker: String,
    resource_key: Py<PyAny>,
    ext: Py<PyAny>,
    bad_str: Py<PyAny>,
}

#[pymethods]
impl BodyReader {
    /// A reader of bodies nested at most `max_depth` levels, with at most
    /// `max_hashed_keys` map keys that are arrays or floats, which notes maps with the key
    /// `marker` (route-aware values) and makes `resource_key(str)`, `ext(code, bytes)` and
    /// `bad_str(bytes)` of what msgpack's types do not say.
    #[new]
    #[pyo3(signature = (max_depth, marker, resource_key, ext, bad_str, max_hashed_keys=1024))]
    fn new(
        max_depth: u32,
        marker: String,
        resource_key: Py<PyAny>,
        ext: Py<PyAny>,
        bad_str: Py<PyAny>,
        max_hashed_keys: usize,
    ) -> BodyReader {
        BodyReader {
            max_depth,
            max_hashed_keys,
            marker,
            resource_key,
            ext,
            bad_str,
        }
    }

    /// `(value, marked, keys_seen)` of `body` (any buffer), its frame references resolved to
    /// `frames[index]`: `marked` when some map has the marker key, `keys_seen` when a
    /// resource key is in it. A fault raises `ValueError((code, detail))`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyAny>,
        frames: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, bool, bool)> {
        let bytes = crate::frames::bytes_of(body)?;
        let frame_count = frames.len()?;
        let mut cursor = Cursor {
            reader: self,
            buf: &bytes,
            pos: 0,
            frames,
            frame_count,
            marked: false,
            keys_seen: false,
            hashed_keys: 0,
        };
        match cursor.value(py, 0) {
            Ok(value) => Ok((value, cursor.marked, cursor.keys_seen)),
            Err(Failed::Fault(f)) => Err(PyValueError::new_err((f.code, f.detail))),
            Err(Failed::Python(e)) => Err(e),
        }
    }
}

/// One body being read.
struct Cursor<'a, 'py> {
    reader: &'a BodyReader,
    buf: &'a [u8],
    pos: usize,
    frames: &'a Bound<'py, PyAny>,
    frame_count: usize,
    marked: bool,
    keys_seen: bool,
    /// Map keys read so far that are arrays or floats.
    hashed_keys: usize,
}

impl<'a, 'py> Cursor<'a, 'py> {
    /// The fault of a value cut short: `n` bytes needed at `pos`.
    fn need(&self, pos: usize, n: usize) -> Result<(), Fault> {
        let left = self.buf.len() - pos;
        if n > left {
            return Err(Fault::body(format!(
                "msgpack value truncated: needs {n} bytes at offset {pos}, {left} left"
            )));
        }
        Ok(())
    }

    /// `n` bytes from the cursor, which moves past them.
    fn take(&mut self, n: usize) -> Result<&'a [u8], Fault> {
        self.need(self.pos, n)?;
        let at = self.pos;
        self.pos += n;
        let buf: &'a [u8] = self.buf;
        Ok(&buf[at..at + n])
    }

    /// A big-endian unsigned integer of `size` bytes (a length or a count).
    fn uint(&mut self, size: usize) -> Result<u64, Fault> {
        Ok(self.take(size)?.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b)))
    }

    /// One level deeper than `depth`, or the fault of nesting past the bound.
    fn enter(&self, depth: u32) -> Result<u32, Fault> {
        let depth = depth + 1;
        if depth > self.reader.max_depth {
            return Err(Fault::body(format!(
                "nesting deeper than {} levels",
                self.reader.max_depth
            )));
        }
        Ok(depth)
    }

    fn value(&mut self, py: Python<'py>, depth: u32) -> Read<'py> {
        let m = self.take(1)?[0];
        Ok(match m {
            0x00..=0x7f => PyInt::new(py, m).into_any(),
            0xe0..=0xff => PyInt::new(py, m as i8).into_any(),
            0xa0..=0xbf => self.text(py, usize::from(m & 0x1f))?,
            0x90..=0x9f => self.array(py, usize::from(m & 0x0f), depth)?,
            0x80..=0x8f => self.map(py, usize::from(m & 0x0f), depth)?,
            0xc0 => py.None().into_bound(py),
            0xc2 => PyBool::new(py, false).to_owned().into_any(),
            0xc3 => PyBool::new(py, true).to_owned().into_any(),
            0xc4..=0xc6 => {
                let n = self.uint(1 << (m - 0xc4))? as usize;
                PyBytes::new(py, self.take(n)?).into_any()
            }
            0xd9..=0xdb => {
                let n = self.uint(1 << (m - 0xd9))? as usize;
                self.text(py, n)?
            }
            0xcc..=0xcf => PyInt::new(py, self.uint(1 << (m - 0xcc))?).into_any(),
            0xd0..=0xd3 => {
                let size = 1usize << (m - 0xd0);
                let raw = self.uint(size)?;
                let shift = 64 - 8 * size as u32;
                PyInt::new(py, ((raw << shift) as i64) >> shift).into_any()
            }
            0xca => PyFloat::new(py, f64::from(f32::from_bits(self.uint(4)? as u32))).into_any(),
            0xcb => PyFloat::new(py, f64::from_bits(self.uint(8)?)).into_any(),
            0xdc | 0xdd => {
                let n = self.uint(if m == 0xdc { 2 } else { 4 })? as usize;
                self.array(py, n, depth)?
            }
            0xde | 0xdf => {
                let n = self.uint(if m == 0xde { 2 } else { 4 })? as usize;
                self.map(py, n, depth)?
            }
            0xd4..=0xd8 => self.ext(py, 1 << (m - 0xd4), depth)?,
            0xc7..=0xc9 => {
                let n = self.uint(1 << (m - 0xc7))? as usize;
                self.ext(py, n, depth)?
            }
            _ => {
                return Err(Fault::body(format!("invalid msgpack marker 0x{m:02x} at offset {}", self.pos - 1)).into())
            }
        })
    }

    fn text(&mut self, py: Python<'py>, n: usize) -> Read<'py> {
        let bytes = self.take(n)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(text) => PyString::new(py, text).into_any(),
            Err(_) => self.reader.bad_str.bind(py).call1((PyBytes::new(py, bytes),))?,
        })
    }

    fn array(&mut self, py: Python<'py>, n: usize, depth: u32) -> Read<'py> {
        let depth = self.enter(depth)?;
        let left = self.buf.len() - self.pos;
        if n > left {
            // Every element takes at least one byte.
            return Err(Fault::body(format!("array of {n} elements cannot fit in {left} bytes")).into());
        }
        let list = PyList::empty(py);
        for _ in 0..n {
            list.append(self.value(py, depth)?)?;
        }
        Ok(list.into_any())
    }

    fn map(&mut self, py: Python<'py>, n: usize, depth: u32) -> Read<'py> {
        let depth = self.enter(depth)?;
        let left = self.buf.len() - self.pos;
        if n.saturating_mul(2) > left {
            return Err(Fault::body(format!("map of {n} entries cannot fit in {left} bytes")).into());
        }
        let dict = PyDict::new(py);
        for _ in 0..n {
            let key = self.value(py, depth)?;
            if key.cast::<PyList>().is_ok() || key.cast::<PyFloat>().is_ok() {
                self.hashed_keys += 1;
                if self.hashed_keys > self.reader.max_hashed_keys {
                    return Err(Fault::body(format!(
                        "more than {} map keys are arrays or floats (keys whose hashes are not randomized)",
                        self.reader.max_hashed_keys
                    ))
                    .into());
                }
            }
            if !self.marked
                && key
                    .cast::<PyString>()
                    .is_ok_and(|k| k.to_str().is_ok_and(|k| k == self.reader.marker))
            {
                self.marked = true;
            }
            let value = self.value(py, depth)?;
            if let Err(e) = dict.set_item(&key, &value) {
                // (An unhashable key: TypeError; a writable buffer's: ValueError.)
                if !e.is_instance_of::<PyTypeError>(py) && !e.is_instance_of::<PyValueError>(py) {
                    return Err(e.into());
                }
                // An array as a key (it cannot be hashed): a tuple, as the reference reads it.
                dict.set_item(hashable(py, key)?, value)?;
            }
        }
        Ok(dict.into_any())
    }

    fn ext(&mut self, py: Python<'py>, n: usize, depth: u32) -> Read<'py> {
        self.enter(depth)?;
        self.need(self.pos, n.saturating_add(1))?;
        let code = self.take(1)?[0] as i8;
        let payload = self.take(n)?;
        Ok(match code {
            EXT_FRAME_REF => {
                let index: [u8; 4] = payload.try_into().map_err(|_| {
                    Fault::body(format!(
                        "frame reference payload must be 4 bytes, got {}",
                        payload.len()
                    ))
                })?;
                let index = u32::from_be_bytes(index) as usize;
                if index >= self.frame_count {
                    return Err(Fault {
                        code: "bad-frame-ref",
                        detail: format!(
                            "body refers to frame {index}, but the message has {} frames",
                            self.frame_count
                        ),
                    }
                    .into());
                }
                self.frames.get_item(index)?
            }
            EXT_RESOURCE_KEY => {
                let key = std::str::from_utf8(payload)
                    .map_err(|_| Fault::body(format!("a resource key that is not UTF-8 ({})", hex(payload))))?;
                self.keys_seen = true;
                self.reader.resource_key.bind(py).call1((key,))?
            }
            _ => self.reader.ext.bind(py).call1((code, PyBytes::new(py, payload)))?,
        })
    }
}

/// A map key Python cannot hash made one it can: an array a tuple (its arrays too), a
/// frame (a writable buffer, by a frame reference) its bytes; a map is a fault.
fn hashable<'py>(py: Python<'py>, key: Bound<'py, PyAny>) -> Read<'py> {
    if key.cast::<PyByteArray>().is_ok() || key.cast::<PyMemoryView>().is_ok() {
        return Ok(PyBytes::new(py, &crate::frames::bytes_of(&key)?).into_any());
    }
    if let Ok(list) = key.cast::<PyList>() {
        let items = list
            .iter()
            .map(|item| hashable(py, item))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(PyTuple::new(py, items)?.into_any());
    }
    if key.cast::<PyDict>().is_ok() {
        return Err(Fault::body("a map used as a map key".into()).into());
    }
    Ok(key)
}

/// `bytes` in lower-case hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

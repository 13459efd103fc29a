//! Reading plain bodies in one call: a msgpack body with no ext value into Python values,
//! exactly as `handoff.codec`'s fast path (`_plain_body`: the `msgpack` package, then a walk
//! that checks the nesting) reads it, or "not plain", and the caller takes that path.
//!
//! Plain means: no ext value (frame references, resource keys and the timestamp type are
//! the strict reader's), map keys str or bin, every str valid UTF-8, nothing after the
//! value, maps and arrays nested at most `max_depth` deep (the top level is 1). Later
//! duplicate keys win. The tests read every body both ways (`test_native_plain.py`).

use handoff_wire::msgpack::{Any, Reader};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};

/// Why a body is not read here.
pub(crate) struct NotPlain;

type Read<'py> = Result<Bound<'py, PyAny>, NotPlain>;

/// A reader over one body: handoff-wire's msgpack reader, its values made into Python's.
pub(crate) struct PlainReader<'a> {
    reader: Reader<'a>,
    /// Whether some map has the key `marker` (a route-aware value to decode after).
    pub(crate) marked: bool,
    marker: &'a [u8],
}

impl<'a> PlainReader<'a> {
    pub(crate) fn new(bytes: &'a [u8], max_depth: usize, marker: &'a [u8]) -> PlainReader<'a> {
        PlainReader {
            // No budget of values: a body's size bounds them, and nothing is made for a
            // count before its elements are read.
            reader: Reader::new(bytes, u32::MAX, max_depth.min(u32::MAX as usize) as u32),
            marked: false,
            marker,
        }
    }

    /// The whole body as one value (nothing may follow it).
    pub(crate) fn read_body<'py>(&mut self, py: Python<'py>) -> Read<'py> {
        let value = self.value(py, 1)?;
        if !self.reader.at_end() {
            return Err(NotPlain);
        }
        Ok(value)
    }

    fn value<'py>(&mut self, py: Python<'py>, depth: u32) -> Read<'py> {
        let any = self.reader.read_any(depth).map_err(|_| NotPlain)?;
        self.made(py, any, depth)
    }

    fn made<'py>(&mut self, py: Python<'py>, any: Any<'_>, depth: u32) -> Read<'py> {
        Ok(match any {
            Any::Nil => py.None().into_bound(py),
            Any::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Any::Uint(v) => PyInt::new(py, v).into_any(),
            Any::Int(v) => PyInt::new(py, v).into_any(),
            Any::Float(v) => PyFloat::new(py, v).into_any(),
            Any::Str(bytes) => PyString::new(py, std::str::from_utf8(bytes).map_err(|_| NotPlain)?).into_any(),
            Any::Bin(bytes) => PyBytes::new(py, bytes).into_any(),
            Any::Array(n) => {
                let list = PyList::empty(py);
                for _ in 0..n {
                    list.append(self.value(py, depth + 1)?).map_err(|_| NotPlain)?;
                }
                list.into_any()
            }
            Any::Map(n) => {
                let dict = PyDict::new(py);
                for _ in 0..n {
                    // Keys are str or bin (msgpack's strict_map_key).
                    let key = self.reader.read_any(depth + 1).map_err(|_| NotPlain)?;
                    match key {
                        Any::Str(text) if text == self.marker => self.marked = true,
                        Any::Str(_) | Any::Bin(_) => {}
                        _ => return Err(NotPlain),
                    }
                    let key = self.made(py, key, depth + 1)?;
                    let value = self.value(py, depth + 1)?;
                    dict.set_item(key, value).map_err(|_| NotPlain)?;
                }
                dict.into_any()
            }
            // Frame references, resource keys and timestamps are the strict reader's.
            Any::Ext(..) => return Err(NotPlain),
        })
    }
}

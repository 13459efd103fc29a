//! Reading plain bodies in one call: a msgpack body with no ext value into Python values,
//! exactly as `handoff.codec`'s fast path (`_plain_body`: the `msgpack` package, then a walk
//! that checks the nesting) reads it, or "not plain", and the caller takes that path.
//!
//! Plain means: no ext value (frame references, resource keys and the timestamp type are
//! the strict reader's), map keys str or bin, every str valid UTF-8, nothing after the
//! value, maps and arrays nested at most `max_depth` deep (the top level is 1). Later
//! duplicate keys win. The tests read every body both ways (`test_native_plain.py`).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};

/// Why a body is not read here.
pub(crate) struct NotPlain;

type Read<'py> = Result<Bound<'py, PyAny>, NotPlain>;

/// A reader over one body.
pub(crate) struct PlainReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
    /// Whether some map has the key `marker` (a route-aware value to decode after).
    pub(crate) marked: bool,
    marker: &'a [u8],
}

impl<'a> PlainReader<'a> {
    pub(crate) fn new(bytes: &'a [u8], max_depth: usize, marker: &'a [u8]) -> PlainReader<'a> {
        PlainReader {
            bytes,
            pos: 0,
            max_depth,
            marked: false,
            marker,
        }
    }

    /// The whole body as one value (nothing may follow it).
    pub(crate) fn read_body<'py>(&mut self, py: Python<'py>) -> Read<'py> {
        let value = self.value(py, 1)?;
        if self.pos != self.bytes.len() {
            return Err(NotPlain);
        }
        Ok(value)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], NotPlain> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or(NotPlain)?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn be(&mut self, n: usize) -> Result<u64, NotPlain> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A count of elements: each takes at least one byte, so more than remain is a lie
    /// caught before anything is made for it.
    fn count(&mut self, n: usize, per_element: usize) -> Result<usize, NotPlain> {
        let count = self.be(n)? as usize;
        if count.saturating_mul(per_element) > self.bytes.len() - self.pos {
            return Err(NotPlain);
        }
        Ok(count)
    }

    fn text(&mut self, n: usize) -> Result<&'a str, NotPlain> {
        std::str::from_utf8(self.take(n)?).map_err(|_| NotPlain)
    }

    fn value<'py>(&mut self, py: Python<'py>, depth: usize) -> Read<'py> {
        let marker = *self.bytes.get(self.pos).ok_or(NotPlain)?;
        self.pos += 1;
        Ok(match marker {
            0x00..=0x7f => PyInt::new(py, marker).into_any(),
            0x80..=0x8f => self.map(py, usize::from(marker & 0x0f), depth)?,
            0x90..=0x9f => self.array(py, usize::from(marker & 0x0f), depth)?,
            0xa0..=0xbf => PyString::new(py, self.text(usize::from(marker & 0x1f))?).into_any(),
            0xc0 => py.None().into_bound(py),
            0xc2 => PyBool::new(py, false).to_owned().into_any(),
            0xc3 => PyBool::new(py, true).to_owned().into_any(),
            0xc4..=0xc6 => {
                let n = self.be(1 << (marker - 0xc4))? as usize;
                PyBytes::new(py, self.take(n)?).into_any()
            }
            0xca => PyFloat::new(py, f64::from(f32::from_bits(self.be(4)? as u32))).into_any(),
            0xcb => PyFloat::new(py, f64::from_bits(self.be(8)?)).into_any(),
            0xcc..=0xcf => PyInt::new(py, self.be(1 << (marker - 0xcc))?).into_any(),
            0xd0 => PyInt::new(py, self.be(1)? as u8 as i8).into_any(),
            0xd1 => PyInt::new(py, self.be(2)? as u16 as i16).into_any(),
            0xd2 => PyInt::new(py, self.be(4)? as u32 as i32).into_any(),
            0xd3 => PyInt::new(py, self.be(8)? as i64).into_any(),
            0xd9..=0xdb => {
                let n = self.be(1 << (marker - 0xd9))? as usize;
                PyString::new(py, self.text(n)?).into_any()
            }
            0xdc => {
                let n = self.count(2, 1)?;
                self.array(py, n, depth)?
            }
            0xdd => {
                let n = self.count(4, 1)?;
                self.array(py, n, depth)?
            }
            0xde => {
                let n = self.count(2, 2)?;
                self.map(py, n, depth)?
            }
            0xdf => {
                let n = self.count(4, 2)?;
                self.map(py, n, depth)?
            }
            0xe0..=0xff => PyInt::new(py, marker as i8).into_any(),
            // ext and fixext (frame references, resource keys, timestamps), and 0xc1.
            _ => return Err(NotPlain),
        })
    }

    fn array<'py>(&mut self, py: Python<'py>, n: usize, depth: usize) -> Read<'py> {
        if depth > self.max_depth {
            return Err(NotPlain);
        }
        let list = PyList::empty(py);
        for _ in 0..n {
            list.append(self.value(py, depth + 1)?).map_err(|_| NotPlain)?;
        }
        Ok(list.into_any())
    }

    fn map<'py>(&mut self, py: Python<'py>, n: usize, depth: usize) -> Read<'py> {
        if depth > self.max_depth {
            return Err(NotPlain);
        }
        let dict = PyDict::new(py);
        for _ in 0..n {
            let marker = *self.bytes.get(self.pos).ok_or(NotPlain)?;
            // Keys are str or bin (msgpack's strict_map_key).
            if !matches!(marker, 0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6) {
                return Err(NotPlain);
            }
            let start = self.pos;
            let key = self.value(py, depth + 1)?;
            if matches!(marker, 0xa0..=0xbf | 0xd9..=0xdb) && self.key_is_marker(start) {
                self.marked = true;
            }
            let value = self.value(py, depth + 1)?;
            dict.set_item(key, value).map_err(|_| NotPlain)?;
        }
        Ok(dict.into_any())
    }

    /// Whether the str key read from `start` is the marker.
    fn key_is_marker(&self, start: usize) -> bool {
        let raw = &self.bytes[start..self.pos];
        let head = match raw[0] {
            0xa0..=0xbf => 1,
            0xd9 => 2,
            0xda => 3,
            _ => 5,
        };
        &raw[head..] == self.marker
    }
}

//! Just enough msgpack for headers: a strict reader and the canonical writer.
//!
//! [`Reader`] is a sans-IO cursor over a byte slice. Each typed read accepts exactly the
//! msgpack family of its type (`spec/WIRE.md` §6, the type table) and any valid encoding
//! within that family, canonical or not; [`Reader::skip`] passes over one value of any
//! type. Every value the reader meets counts against a value budget, and every array, map
//! and ext value against a nesting limit (§9), so that reading any input costs a bounded
//! number of steps and no allocation: nothing here allocates.
//!
//! The `write_*` functions append the canonical encoding of §2: the smallest format that
//! fits, bin for bytes, str for text.
//!
//! [`Reader`] and [`ReadError`] are public so that a crate that reads msgpack outside this
//! one (the Python extension, for its fast path over headers) uses this reader rather than
//! one of its own; the writers and the rest stay this crate's.

use std::fmt;

/// The msgpack marker of nil.
pub(crate) const NIL: u8 = 0xc0;

/// Why a read failed; [`ReadError`] adds where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The input ended inside a value.
    Truncated,
    /// The marker `c1`, which msgpack never uses.
    NeverUsed,
    /// A value of another msgpack type than the one expected.
    WrongType {
        /// The type expected.
        expected: Family,
        /// The marker found (see [`type_name`]).
        found: u8,
    },
    /// A str whose bytes are not valid UTF-8.
    NotUtf8,
    /// An integer below zero where an unsigned one is due.
    Negative,
    /// An integer larger than the type allows.
    TooLarge {
        /// The type's width: values below `2^bits` are allowed.
        bits: u8,
    },
    /// More values than the reader's budget.
    TooManyValues {
        /// The budget.
        max: u32,
    },
    /// An array, map or ext nested deeper than the reader's limit.
    TooDeep {
        /// The limit, in levels.
        max: u32,
    },
}

/// The msgpack families a typed read expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Nil,
    Bool,
    UnsignedInteger,
    Str,
    Bin,
    Array,
    Map,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Nil => "nil",
            Family::Bool => "a bool",
            Family::UnsignedInteger => "an unsigned integer",
            Family::Str => "a str",
            Family::Bin => "a bin",
            Family::Array => "an array",
            Family::Map => "a map",
        }
    }
}

/// A failed read: what went wrong, at which byte offset of the input (its `Display` says
/// both). (Small, so that the results of reads stay small.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadError {
    /// Offset of the value (or of the byte) that failed.
    pub(crate) offset: u32,
    /// What went wrong.
    pub(crate) problem: Problem,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            Problem::Truncated => write!(f, "a value cut short at byte {}", self.offset),
            Problem::NeverUsed => write!(f, "the never-used msgpack marker c1 at byte {}", self.offset),
            Problem::WrongType { expected, found } => write!(
                f,
                "expected {}, found {} at byte {}",
                expected.name(),
                type_name(found),
                self.offset
            ),
            Problem::NotUtf8 => write!(f, "a str that is not valid UTF-8 at byte {}", self.offset),
            Problem::Negative => write!(f, "a negative integer at byte {}", self.offset),
            Problem::TooLarge { bits } => write!(f, "an integer of 2^{bits} or more at byte {}", self.offset),
            Problem::TooManyValues { max } => {
                write!(
                    f,
                    "more than {max} msgpack values (the limit of a header) at byte {}",
                    self.offset
                )
            }
            Problem::TooDeep { max } => {
                write!(f, "nesting deeper than {max} levels at byte {}", self.offset)
            }
        }
    }
}

/// The msgpack type a marker starts, for messages.
pub(crate) fn type_name(marker: u8) -> &'static str {
    match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => "an integer",
        0x80..=0x8f | 0xde | 0xdf => "a map",
        0x90..=0x9f | 0xdc | 0xdd => "an array",
        0xa0..=0xbf | 0xd9..=0xdb => "a str",
        0xc0 => "nil",
        0xc1 => "the never-used marker c1",
        0xc2 | 0xc3 => "a bool",
        0xc4..=0xc6 => "a bin",
        0xc7..=0xc9 | 0xd4..=0xd8 => "an ext",
        0xca | 0xcb => "a float",
    }
}

/// The bytes of a str read at `offset`, as text: valid UTF-8, or [`Problem::NotUtf8`].
pub(crate) fn utf8(bytes: &[u8], offset: usize) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|_| ReadError {
        offset: offset.min(u32::MAX as usize) as u32,
        problem: Problem::NotUtf8,
    })
}

/// Checks that the bytes of a str read at `offset` are valid UTF-8, faster than [`utf8`]
/// for the ASCII text headers mostly hold.
pub(crate) fn check_utf8(bytes: &[u8], offset: usize) -> Result<()> {
    if bytes.is_ascii() {
        return Ok(());
    }
    utf8(bytes, offset).map(drop)
}

/// A strict msgpack reader over `bytes`: a cursor, a value budget and a nesting limit.
///
/// Each typed read accepts every encoding of its msgpack family, canonical or not: a caller
/// that wants one layout only checks the markers ([`Reader::peek`]) and the bytes a read
/// took ([`Reader::pos`]) itself.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    values: u32,
    max_values: u32,
    max_depth: u32,
}

type Result<T> = std::result::Result<T, ReadError>;

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes` that reads at most `max_values` values and nests at
    /// most `max_depth` levels (each array, map and ext is one level).
    pub fn new(bytes: &'a [u8], max_values: u32, max_depth: u32) -> Self {
        Reader {
            bytes,
            pos: 0,
            values: 0,
            max_values,
            max_depth,
        }
    }

    /// The offset of the next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Moves the cursor to `pos` (an offset an earlier read returned, to read a value again).
    pub fn seek(&mut self, pos: usize) {
        self.pos = pos.min(self.bytes.len());
    }

    /// Whether every byte has been read.
    pub fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    /// The bytes of the str whose marker is at `offset` (one read before), read again
    /// without counting it; empty if there is none.
    pub fn str_at(&self, offset: usize) -> &'a [u8] {
        let mut again = Reader::new(self.bytes, u32::MAX, self.max_depth);
        again.seek(offset);
        again.read_str_bytes().unwrap_or(&[])
    }

    /// The marker of the next value, without reading it.
    pub fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// How many values have been read so far.
    #[cfg(test)]
    pub fn values(&self) -> u32 {
        self.values
    }

    fn fail<T>(&self, offset: usize, problem: Problem) -> Result<T> {
        Err(ReadError {
            offset: offset.min(u32::MAX as usize) as u32,
            problem,
        })
    }

    /// Counts one value against the budget, then reads its marker.
    fn marker(&mut self) -> Result<u8> {
        if self.values >= self.max_values {
            return self.fail(self.pos, Problem::TooManyValues { max: self.max_values });
        }
        self.values += 1;
        let m = self.byte()?;
        if m == 0xc1 {
            return self.fail(self.pos - 1, Problem::NeverUsed);
        }
        Ok(m)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        match self.bytes.get(self.pos..).and_then(|rest| rest.get(..n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => self.fail(self.bytes.len(), Problem::Truncated),
        }
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | b as u64))
    }

    /// The length that follows a marker of the str, bin, array, map or ext families.
    fn len(&mut self, width: usize) -> Result<usize> {
        Ok(self.be(width)? as usize)
    }

    fn enter(&self, at: usize, level: u32) -> Result<()> {
        if level > self.max_depth {
            return self.fail(at, Problem::TooDeep { max: self.max_depth });
        }
        Ok(())
    }

    fn wrong<T>(&self, at: usize, found: u8, expected: Family) -> Result<T> {
        self.fail(at, Problem::WrongType { expected, found })
    }

    /// Reads nil.
    pub fn read_nil(&mut self) -> Result<()> {
        let at = self.pos;
        match self.marker()? {
            NIL => Ok(()),
            m => self.wrong(at, m, Family::Nil),
        }
    }

    /// Reads a bool: `c2` or `c3`, nothing else.
    pub fn read_bool(&mut self) -> Result<bool> {
        let at = self.pos;
        match self.marker()? {
            0xc2 => Ok(false),
            0xc3 => Ok(true),
            m => self.wrong(at, m, Family::Bool),
        }
    }

    /// Reads an integer in `0..2^bits` (`bits` at most 64), in any msgpack integer encoding
    /// (signed formats included); a negative value, a larger one, or any other type fails.
    pub fn read_uint(&mut self, bits: u8) -> Result<u64> {
        let max = if bits >= 64 { u64::MAX } else { (1 << bits) - 1 };
        let at = self.pos;
        let m = self.marker()?;
        let signed = |v: i64| if v < 0 { Err(Problem::Negative) } else { Ok(v as u64) };
        let value = match m {
            0x00..=0x7f => Ok(m as u64),
            0xe0..=0xff => Err(Problem::Negative),
            0xcc => Ok(self.be(1)?),
            0xcd => Ok(self.be(2)?),
            0xce => Ok(self.be(4)?),
            0xcf => Ok(self.be(8)?),
            0xd0 => signed(self.be(1)? as u8 as i8 as i64),
            0xd1 => signed(self.be(2)? as u16 as i16 as i64),
            0xd2 => signed(self.be(4)? as u32 as i32 as i64),
            0xd3 => signed(self.be(8)? as i64),
            m => return self.wrong(at, m, Family::UnsignedInteger),
        };
        match value {
            Ok(v) if v <= max => Ok(v),
            Ok(_) => self.fail(at, Problem::TooLarge { bits }),
            Err(problem) => self.fail(at, problem),
        }
    }

    /// Reads a str (`a0`–`bf`, `d9`, `da`, `db`) holding valid UTF-8.
    pub fn read_str(&mut self) -> Result<&'a str> {
        let at = self.pos;
        let bytes = self.read_str_bytes()?;
        utf8(bytes, at)
    }

    /// Reads a str holding valid UTF-8, as its bytes (for a reader that only checks it, or
    /// compares it with known names).
    pub fn read_text(&mut self) -> Result<&'a [u8]> {
        let at = self.pos;
        let bytes = self.read_str_bytes()?;
        check_utf8(bytes, at)?;
        Ok(bytes)
    }

    /// Reads a str's bytes without checking their UTF-8 yet (check them with [`check_utf8`]).
    pub fn read_str_bytes(&mut self) -> Result<&'a [u8]> {
        let at = self.pos;
        let len = match self.marker()? {
            m @ 0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.len(1)?,
            0xda => self.len(2)?,
            0xdb => self.len(4)?,
            m => return self.wrong(at, m, Family::Str),
        };
        self.take(len)
    }

    /// Reads a bin (`c4`, `c5`, `c6`): never a str, never an array of integers.
    pub fn read_bin(&mut self) -> Result<&'a [u8]> {
        let at = self.pos;
        let len = match self.marker()? {
            0xc4 => self.len(1)?,
            0xc5 => self.len(2)?,
            0xc6 => self.len(4)?,
            m => return self.wrong(at, m, Family::Bin),
        };
        self.take(len)
    }

    /// Reads the length of an array (`90`–`9f`, `dc`, `dd`) at nesting `level`; its elements follow.
    pub fn read_array_len(&mut self, level: u32) -> Result<u32> {
        let at = self.pos;
        let len = match self.marker()? {
            m @ 0x90..=0x9f => (m & 0x0f) as u32,
            0xdc => self.be(2)? as u32,
            0xdd => self.be(4)? as u32,
            m => return self.wrong(at, m, Family::Array),
        };
        self.enter(at, level)?;
        Ok(len)
    }

    /// Reads the number of entries of a map (`80`–`8f`, `de`, `df`) at nesting `level`; its
    /// keys and values follow.
    pub fn read_map_len(&mut self, level: u32) -> Result<u32> {
        let at = self.pos;
        let len = match self.marker()? {
            m @ 0x80..=0x8f => (m & 0x0f) as u32,
            0xde => self.be(2)? as u32,
            0xdf => self.be(4)? as u32,
            m => return self.wrong(at, m, Family::Map),
        };
        self.enter(at, level)?;
        Ok(len)
    }

    /// Reads the head of one value of any type: a scalar whole, an array's or a map's
    /// length (its elements follow, at `level + 1`), an ext's type and payload. A reader
    /// that builds values of its own (the Python extension's plain bodies) walks a body
    /// with this, so the encodings, the budget and the nesting limit are this reader's.
    /// A str's bytes are not checked for UTF-8 here ([`check_utf8`]).
    pub fn read_any(&mut self, level: u32) -> Result<Any<'a>> {
        let at = self.pos;
        let m = self.marker()?;
        let any = match m {
            0x00..=0x7f => Any::Uint(m as u64),
            0xe0..=0xff => Any::Int(m as i8 as i64),
            NIL => Any::Nil,
            0xc2 => Any::Bool(false),
            0xc3 => Any::Bool(true),
            0xcc..=0xcf => Any::Uint(self.be(1 << (m - 0xcc))?),
            0xd0 => Any::Int(self.be(1)? as u8 as i8 as i64),
            0xd1 => Any::Int(self.be(2)? as u16 as i16 as i64),
            0xd2 => Any::Int(self.be(4)? as u32 as i32 as i64),
            0xd3 => Any::Int(self.be(8)? as i64),
            0xca => Any::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Any::Float(f64::from_bits(self.be(8)?)),
            0xa0..=0xbf => Any::Str(self.take((m & 0x1f) as usize)?),
            0xd9..=0xdb => {
                let n = self.len(1 << (m - 0xd9))?;
                Any::Str(self.take(n)?)
            }
            0xc4..=0xc6 => {
                let n = self.len(1 << (m - 0xc4))?;
                Any::Bin(self.take(n)?)
            }
            0x90..=0x9f | 0xdc | 0xdd => {
                let len = match m {
                    0xdc => self.be(2)?,
                    0xdd => self.be(4)?,
                    _ => (m & 0x0f) as u64,
                };
                self.enter(at, level)?;
                Any::Array(len as u32)
            }
            0x80..=0x8f | 0xde | 0xdf => {
                let len = match m {
                    0xde => self.be(2)?,
                    0xdf => self.be(4)?,
                    _ => (m & 0x0f) as u64,
                };
                self.enter(at, level)?;
                Any::Map(len as u32)
            }
            0xd4..=0xd8 | 0xc7..=0xc9 => {
                let len = match m {
                    0xc7 => self.len(1)?,
                    0xc8 => self.len(2)?,
                    0xc9 => self.len(4)?,
                    _ => 1 << (m - 0xd4),
                };
                self.enter(at, level)?;
                let kind = self.byte()? as i8;
                Any::Ext(kind, self.take(len)?)
            }
            0xc1 => unreachable!("marker() refuses c1"),
        };
        Ok(any)
    }

    /// Passes over one value of any type, which would sit at nesting `level` if it were an
    /// array, map or ext. Its contents count against the budget and the nesting limit like
    /// any value; they are checked only for being valid msgpack (keys of any type, strs not
    /// checked for UTF-8) and build nothing.
    pub fn skip(&mut self, level: u32) -> Result<()> {
        let elements = match self.read_any(level)? {
            Any::Array(n) => n as u64,
            Any::Map(n) => 2 * n as u64,
            _ => 0,
        };
        for _ in 0..elements {
            self.skip(level + 1)?;
        }
        Ok(())
    }
}

/// The head of one msgpack value, as [`Reader::read_any`] reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Any<'a> {
    /// nil.
    Nil,
    /// A bool.
    Bool(bool),
    /// An integer of an unsigned format, or a positive fixint.
    Uint(u64),
    /// An integer of a signed format, or a negative fixint.
    Int(i64),
    /// A float (32-bit ones widened).
    Float(f64),
    /// A str's bytes, not yet checked for UTF-8.
    Str(&'a [u8]),
    /// A bin's bytes.
    Bin(&'a [u8]),
    /// An array of this many elements, which follow.
    Array(u32),
    /// A map of this many entries, whose keys and values follow.
    Map(u32),
    /// An ext value: its type and its payload.
    Ext(i8, &'a [u8]),
}

/// Appends the canonical encoding of the unsigned integer `v`.
pub(crate) fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v <= u8::MAX as u64 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= u16::MAX as u64 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u32::MAX as u64 {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// The length of a str, bin, array or map as msgpack's 32-bit length field.
fn length(len: usize) -> u32 {
    u32::try_from(len).expect("msgpack strs, bins, arrays and maps hold fewer than 2^32 items")
}

/// Appends a marker with an 8-, 16- or 32-bit length: `markers` are the three markers.
fn write_sized(out: &mut Vec<u8>, len: u32, markers: [u8; 3]) {
    if len <= u8::MAX as u32 {
        out.extend_from_slice(&[markers[0], len as u8]);
    } else if len <= u16::MAX as u32 {
        out.push(markers[1]);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(markers[2]);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Appends `s` as the smallest str that fits.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let len = length(s.len());
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else {
        write_sized(out, len, [0xd9, 0xda, 0xdb]);
    }
    out.extend_from_slice(s.as_bytes());
}

/// Appends `b` as the smallest bin that fits.
pub(crate) fn write_bin(out: &mut Vec<u8>, b: &[u8]) {
    write_sized(out, length(b.len()), [0xc4, 0xc5, 0xc6]);
    out.extend_from_slice(b);
}

/// Appends a bool.
pub(crate) fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.push(if b { 0xc3 } else { 0xc2 });
}

/// Appends the header of an array of `len` elements.
pub(crate) fn write_array_len(out: &mut Vec<u8>, len: usize) {
    let len = length(len);
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= u16::MAX as u32 {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Appends the header of a map of `len` entries.
pub(crate) fn write_map_len(out: &mut Vec<u8>, len: usize) {
    let len = length(len);
    if len < 16 {
        out.push(0x80 | len as u8);
    } else if len <= u16::MAX as u32 {
        out.push(0xde);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests;

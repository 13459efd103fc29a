//! The first pass of header decoding: the structure of the whole header, building nothing.
//!
//! It reads the header map and, inside `f`, every descriptor map, and checks the rules that
//! do not depend on the kind (`spec/WIRE.md` §6 rules 1–5, §11.2 step 2): one map that fills
//! the header exactly; str keys in valid UTF-8; no key twice in one map; at most
//! [`MAX_MAP_ENTRIES`] entries per map; every known key of the right type, whatever the kind,
//! nil counting as absent; the values of other keys valid msgpack. Throughout, the reader
//! holds the header to its value limit (`Limits::max_header_values`) and [`MAX_HEADER_DEPTH`] levels (§9).
//! Every failure is `malformed-header`.
//!
//! What it keeps is where each known key's value is: a scalar as the borrowed value it read,
//! an array as its offset and length, to be read again by the second pass only if the kind
//! needs it. So a header costs at most its own bytes to hold and a bounded number of steps
//! to read, however it is shaped.

use std::fmt;

use super::schema::{self, Type};
use super::{MAX_HEADER_DEPTH, MAX_MAP_ENTRIES};
use crate::msgpack::{check_utf8, ReadError, Reader, NIL};
use crate::WireError;

/// The value of a known key, as the first pass found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot<'a> {
    /// A str, as its bytes: valid UTF-8, checked.
    Str(&'a [u8]),
    /// A bin (of 32 bytes where the type says so).
    Bin(&'a [u8]),
    /// An integer within its type's range.
    Uint(u64),
    /// A bool.
    Bool(bool),
    /// An array, valid throughout: where its header starts, and how many elements it has.
    Array {
        /// Offset of the array's marker.
        at: usize,
        /// Number of elements.
        len: u32,
    },
}

/// The known keys of one map, by slot (see `schema`); an absent or nil key is `None`.
#[derive(Debug, Clone)]
pub(crate) struct Fields<'a, const N: usize> {
    slots: [Option<Slot<'a>>; N],
}

/// The known keys of the header map.
pub(crate) type HeaderFields<'a> = Fields<'a, { schema::header::COUNT }>;
/// The known keys of one descriptor map.
pub(crate) type DescriptorFields<'a> = Fields<'a, { schema::descriptor::COUNT }>;

impl<'a, const N: usize> Fields<'a, N> {
    /// No key present.
    pub fn new() -> Self {
        Fields { slots: [None; N] }
    }

    /// Forgets every key.
    pub fn clear(&mut self) {
        self.slots.fill(None);
    }

    /// A str key's value, as its bytes (valid UTF-8: for comparing with known names).
    pub fn text(&self, slot: usize) -> Option<&'a [u8]> {
        match self.slots[slot] {
            Some(Slot::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// A str key's value, as text.
    pub fn str(&self, slot: usize) -> Option<&'a str> {
        // Checked by the first pass already; a failure here would be a bug, and reads as absent.
        self.text(slot).and_then(|s| std::str::from_utf8(s).ok())
    }

    /// A bin key's value.
    pub fn bin(&self, slot: usize) -> Option<&'a [u8]> {
        match self.slots[slot] {
            Some(Slot::Bin(b)) => Some(b),
            _ => None,
        }
    }

    /// An integer key's value.
    pub fn uint(&self, slot: usize) -> Option<u64> {
        match self.slots[slot] {
            Some(Slot::Uint(v)) => Some(v),
            _ => None,
        }
    }

    /// A bool key's value.
    pub fn bool(&self, slot: usize) -> Option<bool> {
        match self.slots[slot] {
            Some(Slot::Bool(b)) => Some(b),
            _ => None,
        }
    }

    /// An array key's offset and length.
    pub fn array(&self, slot: usize) -> Option<(usize, u32)> {
        match self.slots[slot] {
            Some(Slot::Array { at, len }) => Some((at, len)),
            _ => None,
        }
    }
}

/// Which map a failure is in, for messages.
#[derive(Debug, Clone, Copy)]
enum Place {
    Header,
    Descriptor(u32),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Header => write!(f, "header"),
            Place::Descriptor(index) => write!(f, "frame {index}: descriptor"),
        }
    }
}

fn malformed(place: Place, key: Option<&[u8]>, what: impl fmt::Display) -> WireError {
    match key {
        Some(key) => WireError::MalformedHeader(format!("{place}: key {:?}: {what}", String::from_utf8_lossy(key))),
        None => WireError::MalformedHeader(format!("{place}: {what}")),
    }
}

/// A reader for the header `bytes` with the limits of §9 (`max_values` values).
pub(crate) fn reader(bytes: &[u8], max_values: u32) -> Reader<'_> {
    Reader::new(bytes, max_values, MAX_HEADER_DEPTH)
}

/// The first pass over a whole header (the bytes after the length prefix, exactly), noting
/// its known keys in `fields` (which start empty).
pub(crate) fn header<'a>(bytes: &'a [u8], fields: &mut HeaderFields<'a>, max_values: u32) -> Result<(), WireError> {
    let mut r = reader(bytes, max_values);
    map(&mut r, 1, Place::Header, fields, Mode::First)?;
    if !r.at_end() {
        return Err(malformed(
            Place::Header,
            None,
            format_args!(
                "{} bytes left over after the header map, which must fill the header length",
                bytes.len() - r.pos()
            ),
        ));
    }
    Ok(())
}

/// Reads descriptor `index` (a map at level 3, inside `f`) again, in the second pass, into
/// `fields`: the first pass checked it already.
pub(crate) fn descriptor<'a>(
    r: &mut Reader<'a>,
    index: u32,
    fields: &mut DescriptorFields<'a>,
) -> Result<(), WireError> {
    fields.clear();
    map(r, 3, Place::Descriptor(index), fields, Mode::Again)
}

/// How a map is read: checked in the first pass, read again (already checked) in the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    First,
    Again,
}

/// The known keys of a map of the header map's or of a descriptor's kind.
trait Known {
    /// The slot of a known key.
    fn lookup(name: &[u8]) -> Option<usize>;
    /// Name and type by slot.
    const KEYS: &'static [(&'static [u8], Type)];
}

impl Known for HeaderFields<'_> {
    fn lookup(name: &[u8]) -> Option<usize> {
        schema::header::lookup(name)
    }
    const KEYS: &'static [(&'static [u8], Type)] = schema::header::KEYS;
}

impl Known for DescriptorFields<'_> {
    fn lookup(name: &[u8]) -> Option<usize> {
        schema::descriptor::lookup(name)
    }
    const KEYS: &'static [(&'static [u8], Type)] = schema::descriptor::KEYS;
}

/// Reads a map at `level` into `fields`, checking rules 1–5 for it in the first pass.
fn map<'a, const N: usize>(
    r: &mut Reader<'a>,
    level: u32,
    place: Place,
    fields: &mut Fields<'a, N>,
    mode: Mode,
) -> Result<(), WireError>
where
    Fields<'a, N>: Known,
{
    let what = match place {
        Place::Header => "the header must be a msgpack map",
        Place::Descriptor(_) => "a descriptor must be a msgpack map",
    };
    let len = r
        .read_map_len(level)
        .map_err(|e| malformed(place, None, format_args!("{what}: {e}")))?;
    if len > MAX_MAP_ENTRIES {
        return Err(malformed(
            place,
            None,
            format_args!("a map of {len} entries; at most {MAX_MAP_ENTRIES} are allowed"),
        ));
    }
    // Keys seen so far: the known ones as a bit per slot, the others by the offsets of their
    // strs (a map has at most MAX_MAP_ENTRIES of them).
    let mut known: u64 = 0;
    let mut unknown = [0u32; MAX_MAP_ENTRIES as usize];
    let mut unknowns = 0;
    for _ in 0..len {
        let at = r.pos();
        let key = r
            .read_str_bytes()
            .map_err(|e| malformed(place, None, format_args!("every key must be a str: {e}")))?;
        match <Fields<'a, N>>::lookup(key) {
            // A known key is ASCII: its UTF-8 needs no check.
            Some(slot) => {
                if mode == Mode::First {
                    if known & (1 << slot) != 0 {
                        return Err(malformed(place, Some(key), "the key appears twice"));
                    }
                    known |= 1 << slot;
                }
                let ty = <Fields<'a, N>>::KEYS[slot].1;
                fields.slots[slot] = value(r, ty, level + 1, place, key)?;
            }
            None => {
                if mode == Mode::First {
                    check_utf8(key, at)
                        .map_err(|e| malformed(place, None, format_args!("every key must be UTF-8: {e}")))?;
                    if unknown[..unknowns].iter().any(|&other| r.str_at(other as usize) == key) {
                        return Err(malformed(place, Some(key), "the key appears twice"));
                    }
                    unknown[unknowns] = at as u32;
                    unknowns += 1;
                }
                r.skip(level + 1).map_err(|e| malformed(place, Some(key), e))?;
            }
        }
    }
    Ok(())
}

/// Reads the value of the known key `key`, of type `ty`, which sits at `level` if it is an
/// array; nil is absent. The elements of an array are checked (each descriptor of `f` as a
/// map of its own), and the array noted by its offset. (Only the header map has array keys,
/// and it is read once: the second pass reads descriptors, which have none.)
fn value<'a>(
    r: &mut Reader<'a>,
    ty: Type,
    level: u32,
    place: Place,
    key: &[u8],
) -> Result<Option<Slot<'a>>, WireError> {
    let fail = |e: ReadError| malformed(place, Some(key), format_args!("must be {}: {e}", ty.name()));
    if r.peek() == Some(NIL) {
        r.read_nil().map_err(fail)?;
        return Ok(None);
    }
    let slot = match ty {
        Type::Str => Slot::Str(r.read_text().map_err(fail)?),
        Type::ShortStr(most) => {
            let text = r.read_text().map_err(fail)?;
            check_length(text, most, place, key)?;
            Slot::Str(text)
        }
        Type::Bin => Slot::Bin(r.read_bin().map_err(fail)?),
        Type::Bin32 | Type::Bin16 | Type::Bin64 => {
            let want = match ty {
                Type::Bin32 => 32,
                Type::Bin16 => 16,
                _ => 64,
            };
            let b = r.read_bin().map_err(fail)?;
            if b.len() != want {
                return Err(malformed(
                    place,
                    Some(key),
                    format_args!("must be {want} bytes, got {}", b.len()),
                ));
            }
            Slot::Bin(b)
        }
        Type::U16 | Type::U32 | Type::U64 => Slot::Uint(r.read_uint(ty.bits()).map_err(fail)?),
        Type::Bool => Slot::Bool(r.read_bool().map_err(fail)?),
        Type::ShortStrArray { .. } | Type::U64Array | Type::Descriptors => {
            let at = r.pos();
            let len = r.read_array_len(level).map_err(fail)?;
            match ty {
                Type::ShortStrArray { entries, each } => {
                    if len > entries {
                        return Err(malformed(
                            place,
                            Some(key),
                            format_args!("{len} entries; at most {entries} are allowed (spec §5.2)"),
                        ));
                    }
                    for _ in 0..len {
                        let text = r.read_text().map_err(fail)?;
                        check_length(text, each, place, key)?;
                    }
                }
                Type::U64Array => (0..len).try_for_each(|_| r.read_uint(64).map(drop).map_err(fail))?,
                _ => {
                    // Each descriptor is checked as a map of its own; what it holds is read
                    // again by the second pass, for a `msg` only.
                    let mut scratch = DescriptorFields::new();
                    for index in 0..len {
                        map(r, level + 1, Place::Descriptor(index), &mut scratch, Mode::First)?;
                    }
                }
            }
            Slot::Array { at, len }
        }
    };
    Ok(Some(slot))
}

/// A bounded str (the identity fields, spec §5.2): at most `most` bytes of UTF-8.
fn check_length(text: &[u8], most: u32, place: Place, key: &[u8]) -> Result<(), WireError> {
    if text.len() > most as usize {
        return Err(malformed(
            place,
            Some(key),
            format_args!("{} bytes; at most {most} are allowed (spec §5.2)", text.len()),
        ));
    }
    Ok(())
}

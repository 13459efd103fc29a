//! The keys a receiver knows, and the type of each (`spec/WIRE.md` §6 rule 3, the type
//! table, §6.1–§6.9 and §7). Versions 1 and 2 know the same keys: v2's `challenge` and
//! `ident` use keys of v1's `hello`, with the same types.
//!
//! A receiver type-checks every known key present, whatever the kind of the header or of the
//! descriptor, and ignores the others. Header maps and descriptor maps have their own sets:
//! in a header, the keys of §6.1–§6.7; in a descriptor, the keys of §7 (as the Python peer
//! reads them too). Each set is one list below, from which the slot numbers, the table of
//! types and the lookup by name are generated, so they cannot disagree.

/// The type of a known key's value: which msgpack values are accepted (`spec/WIRE.md` §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    /// The str family, valid UTF-8.
    Str,
    /// The bin family, any length.
    Bin,
    /// The bin family, exactly 32 bytes: fixed lengths are part of a field's type (§6), so a
    /// `nonce`, `mac`, `token` or `digest` of another length is malformed wherever it appears.
    Bin32,
    /// An integer in `0..2^16`, in any msgpack integer encoding.
    U16,
    /// An integer in `0..2^32`, in any msgpack integer encoding.
    U32,
    /// An integer in `0..2^64`, in any msgpack integer encoding.
    U64,
    /// `c2` or `c3`.
    Bool,
    /// An array of [`Type::Str`].
    StrArray,
    /// An array of [`Type::U64`].
    U64Array,
    /// An array of descriptor maps (`f`), each checked against [`descriptor`]'s keys.
    Descriptors,
}

impl Type {
    /// The width of an integer type: its values lie in `0..2^bits`.
    pub(crate) fn bits(self) -> u8 {
        match self {
            Type::U16 => 16,
            Type::U32 => 32,
            _ => 64,
        }
    }

    /// The type as the spec writes it, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Type::Str => "str",
            Type::Bin => "bin",
            Type::Bin32 => "bin of 32 bytes",
            Type::U16 => "u16",
            Type::U32 => "u32",
            Type::U64 => "u64",
            Type::Bool => "bool",
            Type::StrArray => "[str]",
            Type::U64Array => "[u64]",
            Type::Descriptors => "[descriptor]",
        }
    }
}

/// Generates, from one list of `SLOT = b"name": Type`, a module with a constant per slot, the
/// table `KEYS` (slot → name and type), `COUNT` and `lookup` (name → slot). Names are bytes:
/// a key is looked up before its UTF-8 is checked, which a known key (ASCII) needs no more.
macro_rules! known_keys {
    ($(#[$doc:meta])* $module:ident { $($slot:ident = $name:literal: $ty:ident,)* }) => {
        $(#[$doc])*
        pub(crate) mod $module {
            use super::Type;

            /// Name and type of each known key, by slot.
            pub(crate) const KEYS: &[(&[u8], Type)] = &[$(($name, Type::$ty)),*];

            /// How many keys are known.
            pub(crate) const COUNT: usize = KEYS.len();

            known_keys!(@slots 0usize; $($slot $name)*);

            /// The slot of a known key, or `None` for a key to ignore.
            pub(crate) fn lookup(name: &[u8]) -> Option<usize> {
                match name {
                    $($name => Some($slot),)*
                    _ => None,
                }
            }
        }
    };
    (@slots $index:expr; $slot:ident $name:literal $($rest:tt)*) => {
        /// A slot: the index of one known key in `KEYS`.
        pub(crate) const $slot: usize = $index;
        known_keys!(@slots $index + 1; $($rest)*);
    };
    (@slots $index:expr;) => {};
}

known_keys! {
    /// The keys of the header map: every field of every kind (§6.1–§6.9).
    header {
        K = b"k": Str,
        T = b"t": Str,
        B = b"b": Bin,
        F = b"f": Descriptors,
        NODE = b"node": Str,
        NAME = b"name": Str,
        HOST = b"host": Str,
        PID = b"pid": U32,
        PROC = b"proc": Str,
        LANG = b"lang": Str,
        IMPL = b"impl": Str,
        V = b"v": U16,
        CAPS = b"caps": StrArray,
        NONCE = b"nonce": Bin32,
        LISTEN = b"listen": Str,
        UNIX = b"unix": Str,
        MAC = b"mac": Bin32,
        LEASES = b"leases": U64Array,
        CODE = b"code": Str,
        MSG = b"msg": Str,
        REQ = b"req": U64,
        LEASE = b"lease": U64,
        TOKEN = b"token": Bin32,
        OFF = b"off": U64,
        N = b"n": U64,
        TO = b"to": Str,
    }
}

known_keys! {
    /// The keys of a descriptor map: every field of every descriptor kind (§7).
    descriptor {
        K = b"k": Str,
        N = b"n": U64,
        OFF = b"off": U64,
        SIZE = b"size": U64,
        LEASE = b"lease": U64,
        SEALED = b"sealed": Bool,
        OWNER = b"owner": Str,
        ADDR = b"addr": Str,
        TOKEN = b"token": Bin32,
        DIGEST = b"digest": Bin32,
        TTL = b"ttl": U64,
        LAZY = b"lazy": Bool,
        KEY = b"key": Str,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_lookup_and_table_agree() {
        for (slot, (name, _)) in header::KEYS.iter().enumerate() {
            assert!(name.is_ascii());
            assert_eq!(header::lookup(name), Some(slot));
        }
        for (slot, (name, _)) in descriptor::KEYS.iter().enumerate() {
            assert_eq!(descriptor::lookup(name), Some(slot));
        }
        assert_eq!(header::KEYS[header::TOKEN], (&b"token"[..], Type::Bin32));
        assert_eq!(descriptor::KEYS[descriptor::KEY], (&b"key"[..], Type::Str));
        assert_eq!(header::COUNT, 26);
        assert_eq!(descriptor::COUNT, 13);
        assert_eq!(header::lookup(b"x-future"), None);
        assert_eq!(header::lookup(b"sealed"), None, "descriptor keys are not header keys");
        assert_eq!(descriptor::lookup(b"pid"), None, "header keys are not descriptor keys");
    }
}

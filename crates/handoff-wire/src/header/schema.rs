//! The keys a receiver knows, and the type of each (`spec/WIRE.md` §6 rule 3, the type
//! table, §6.1–§6.9 and §7). Versions 1, 2 and 3 know the same keys: the `challenge` and
//! `ident` of versions 2 and 3 use keys of v1's `hello`, with the same types. The identity
//! fields are bounded in length (§5.2), and the bound is part of their type, as a fixed
//! length is.
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
    /// The str family, valid UTF-8, of at most this many bytes (the identity fields, §5.2).
    ShortStr(u32),
    /// The bin family, any length.
    Bin,
    /// The bin family, exactly 32 bytes: fixed lengths are part of a field's type (§6), so a
    /// `nonce`, `mac`, `token` or `digest` of another length is malformed wherever it appears.
    Bin32,
    /// The bin family, exactly 16 bytes (a ticket's `xxh3`, §7.5; a `cuda` frame's `device`,
    /// §7.10).
    Bin16,
    /// The bin family, exactly 64 bytes (a `cuda` frame's `ipc`, §7.10).
    Bin64,
    /// An integer in `0..2^16`, in any msgpack integer encoding.
    U16,
    /// An integer in `0..2^32`, in any msgpack integer encoding.
    U32,
    /// An integer in `0..2^64`, in any msgpack integer encoding.
    U64,
    /// `c2` or `c3`.
    Bool,
    /// An array of at most `entries` strs of at most `each` bytes (`caps`, §5.2).
    ShortStrArray {
        /// Most elements.
        entries: u32,
        /// Most bytes of one element.
        each: u32,
    },
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
            Type::ShortStr(_) => "str",
            Type::Bin => "bin",
            Type::Bin32 => "bin of 32 bytes",
            Type::Bin16 => "bin of 16 bytes",
            Type::Bin64 => "bin of 64 bytes",
            Type::U16 => "u16",
            Type::U32 => "u32",
            Type::U64 => "u64",
            Type::Bool => "bool",
            Type::ShortStrArray { .. } => "[str]",
            Type::U64Array => "[u64]",
            Type::Descriptors => "[descriptor]",
        }
    }
}

/// The bounded identity fields of `spec/WIRE.md` §5.2, by the type each has.
pub(crate) mod bounded {
    use super::Type;
    use crate::limits::identity as at_most;

    /// `node` and `proc`.
    pub(crate) const ID_STR: Type = Type::ShortStr(at_most::ID_BYTES);
    /// `name`.
    pub(crate) const NAME_STR: Type = Type::ShortStr(at_most::NAME_BYTES);
    /// `host`.
    pub(crate) const HOST_STR: Type = Type::ShortStr(at_most::HOST_BYTES);
    /// `lang`.
    pub(crate) const LANG_STR: Type = Type::ShortStr(at_most::LANG_BYTES);
    /// `impl`.
    pub(crate) const IMPL_STR: Type = Type::ShortStr(at_most::IMPL_BYTES);
    /// `caps`.
    pub(crate) const CAPS_LIST: Type = Type::ShortStrArray {
        entries: at_most::CAPS,
        each: at_most::CAP_BYTES,
    };
    /// `listen` and `unix`.
    pub(crate) const ADDR_STR: Type = Type::ShortStr(at_most::ADDR_BYTES);
}

/// Generates, from one list of `SLOT = b"name": Type`, a module with a constant per slot, the
/// table `KEYS` (slot → name and type), `COUNT` and `lookup` (name → slot). Names are bytes:
/// a key is looked up before its UTF-8 is checked, which a known key (ASCII) needs no more.
macro_rules! known_keys {
    ($(#[$doc:meta])* $module:ident { $($slot:ident = $name:literal: $ty:ident,)* }) => {
        $(#[$doc])*
        pub(crate) mod $module {
            #[allow(unused_imports)]
            use super::bounded::*;
            #[allow(unused_imports)]
            use super::Type::{self, *};

            /// Name and type of each known key, by slot.
            pub(crate) const KEYS: &[(&[u8], Type)] = &[$(($name, $ty)),*];

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
        NODE = b"node": ID_STR,
        NAME = b"name": NAME_STR,
        HOST = b"host": HOST_STR,
        PID = b"pid": U32,
        PROC = b"proc": ID_STR,
        LANG = b"lang": LANG_STR,
        IMPL = b"impl": IMPL_STR,
        V = b"v": U16,
        CAPS = b"caps": CAPS_LIST,
        NONCE = b"nonce": Bin32,
        LISTEN = b"listen": ADDR_STR,
        UNIX = b"unix": ADDR_STR,
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
        XXH3 = b"xxh3": Bin16,
        TTL = b"ttl": U64,
        LAZY = b"lazy": Bool,
        KEY = b"key": Str,
        IPC = b"ipc": Bin64,
        DEVICE = b"device": Bin16,
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
        assert_eq!(descriptor::COUNT, 16);
        assert_eq!(header::lookup(b"x-future"), None);
        assert_eq!(header::lookup(b"sealed"), None, "descriptor keys are not header keys");
        assert_eq!(descriptor::lookup(b"pid"), None, "header keys are not descriptor keys");
    }
}

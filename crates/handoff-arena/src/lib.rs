//! Memory born shared (issue 41): allocations of at least a threshold come from memfd
//! *arenas*, segments that stay mapped and are reused, so that a same-host send of the
//! bytes is the arena's descriptor and a window (spec §7.2), and no byte is copied.
//!
//! - [`arenas()`] is the process's registry. [`Arenas::allocate`] serves a page-aligned
//!   range from an arena (or `None`: the caller uses its default allocator), and
//!   [`Arenas::free`] takes it back.
//! - [`Arenas::lend`] is what a send asks for a buffer. The first time a range is lent, the
//!   producer's mapping of it is remapped private from the same memfd (same address, same
//!   bytes): its later writes go to private pages, and what peers map never changes. A
//!   range written after that is lent again only once its bytes are back in the file
//!   (no loan is out) or, while loans are out, not at all: the caller copies.
//! - A range returns to its arena only when the application freed it *and* every loan on it
//!   ended ([`Loan`]'s drop). A loan that ends because its peer's connection closed, with
//!   the peer's process possibly still mapping it, retires the range for good.
//! - A forked child gets private copies of the ranges it inherits, so that nothing it writes
//!   reaches what a peer maps. They are made inside `fork` (`pthread_atfork`, with the
//!   registry taken across the fork, so the child always finds it consistent), and the
//!   parent's `fork` returns once they are.
//!
//! - [`ArenaBufMut`] is the same for Rust: bytes written in place, frozen into a
//!   `handoff_wire::Buffer` whose origin is the arena (the core's application segments),
//!   which the drivers pass by descriptor; [`lent_buffer`] makes one for any bytes that lie
//!   in an arena (the extension's send path).
//!
//! Nothing here waits on a peer; the extension's NumPy allocator and the drivers' send paths
//! call it. It depends on the core (`handoff-proto`), never the other way round.

mod arena;
mod buffer;
mod dirty;
mod error;
mod fork;
mod region;
mod registry;

pub use buffer::{lent_buffer, ArenaBufMut};
pub use error::ArenaError;
pub use registry::{arenas, Arenas, Lend, Loan, Located, Stats, ARENA_BYTES, DEFAULT_MIN_BYTES};

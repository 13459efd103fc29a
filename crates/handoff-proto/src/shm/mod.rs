//! Shared memory for same-host peers, the part with no waiting in it: the sender's leases
//! for each peer and how each frame travels ([`leases`]), the pool of memfd
//! segments a sender writes frames into, and the cache of a receiver's read-only mappings of
//! its peers' segments (keyed by the segment's device and inode), and the buffers that are
//! views of them ([`buffers`]).
//!
//! Creating, sealing and mapping a memfd are system calls, but none waits on a peer; both
//! drivers (tokio and asyncio) share this module.

pub mod buffers;
pub mod idle;
pub mod leases;
pub mod mapping;
pub mod segment;

pub use buffers::{
    copy_in, copy_with, origin_of, pool, segment_info, CopyInto, Held, PassFd, SegmentInfo, SharedBufMut, ShmOrigin,
};
pub use idle::IdleTimes;
pub use mapping::{MapError, Mapping, MappingCache};
pub use segment::{inode_of, sealed_copy, PoolStats, SealedSegment, Segment, SegmentPool, MIN_SEGMENT};

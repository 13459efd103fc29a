//! Shared memory for same-host peers: pooled memfd segments on the sending side, cached
//! read-only mappings on the receiving side, and buffers that are views of them. It all
//! lives in the engine (`handoff_proto::shm`), which both drivers share; this is the public
//! face of it.

/// Bytes written in place in an arena (reused memfd segments), sent to same-host peers by
/// descriptor: see `docs/shared-arrays.md`.
pub use handoff_arena::ArenaBufMut;
pub(crate) use handoff_proto::shm::buffers::{remote_buffer, Held, RemoteView};
pub use handoff_proto::shm::{
    copy_in, pool, segment_info, PoolStats, Segment, SegmentInfo, SegmentPool, SharedBufMut, MIN_SEGMENT,
};

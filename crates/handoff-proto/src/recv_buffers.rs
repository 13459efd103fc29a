//! A pool of receive buffers, so that large frames land in memory that is already
//! faulted in (fresh pages cost 0.5–1.6 GB/s on these machines; reused ones do not).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Smallest buffer the pool hands out; smaller frames are cut from the read buffer.
pub const MIN_POOLED: usize = 64 * 1024;

#[derive(Default)]
struct PoolState {
    /// Idle buffers by size class, each with when it came back.
    free: HashMap<usize, Vec<(Vec<u8>, Instant)>>,
    idle_bytes: usize,
}

/// Receive buffers in power-of-two size classes; a buffer returns here when the last
/// `Bytes` view of it is dropped, up to `max_idle_bytes` kept idle.
#[derive(Clone)]
pub struct RecvPool {
    state: Arc<Mutex<PoolState>>,
    max_idle_bytes: usize,
}

/// A buffer taken from the pool; fill it, then [`freeze`](PooledBuf::freeze) it.
pub struct PooledBuf {
    vec: Vec<u8>,
    len: usize,
    pool: Weak<Mutex<PoolState>>,
    max_idle_bytes: usize,
}

impl RecvPool {
    /// A pool that keeps at most `max_idle_bytes` of returned buffers for reuse.
    pub fn new(max_idle_bytes: usize) -> RecvPool {
        RecvPool {
            state: Arc::default(),
            max_idle_bytes,
        }
    }

    /// A buffer of exactly `len` usable bytes (contents unspecified).
    pub fn take(&self, len: usize) -> PooledBuf {
        let class = len.max(MIN_POOLED).next_power_of_two();
        let reused = {
            let mut state = self.state.lock().expect("pool lock");
            let v = state.free.get_mut(&class).and_then(Vec::pop).map(|(v, _)| v);
            if v.is_some() {
                state.idle_bytes -= class;
            }
            v
        };
        // `vec![0; n]` maps zeroed pages lazily: only the bytes we read into are faulted in.
        let vec = reused.unwrap_or_else(|| fresh(class));
        PooledBuf {
            vec,
            len,
            pool: Arc::downgrade(&self.state),
            max_idle_bytes: self.max_idle_bytes,
        }
    }

    /// Bytes held idle in the pool now.
    pub fn idle_bytes(&self) -> usize {
        self.state.lock().expect("pool lock").idle_bytes
    }

    /// Frees the buffers idle for `idle` or longer at `now` (all of them with
    /// `Duration::ZERO`); the bytes freed. A driver calls it from a timer, as the Python
    /// implementation's receive pool frees what was idle for its `IDLE_SECONDS`.
    pub fn free_idle(&self, now: Instant, idle: Duration) -> usize {
        let mut state = self.state.lock().expect("pool lock");
        let mut freed = 0;
        for (class, list) in state.free.iter_mut() {
            list.retain(|(_, since)| {
                let keep = now.saturating_duration_since(*since) < idle;
                if !keep {
                    freed += class;
                }
                keep
            });
        }
        state.free.retain(|_, list| !list.is_empty());
        state.idle_bytes -= freed;
        freed
    }
}

impl PooledBuf {
    /// The writable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[..self.len]
    }

    /// The usable length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no usable byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The writable bytes from `from` on, and no others: bytes before `from` may be read
    /// meanwhile through [`range`](Self::range) (by another thread, say), and this borrow
    /// covers none of them.
    pub fn tail_mut(&mut self, from: usize) -> &mut [u8] {
        assert!(from <= self.len, "a tail inside the buffer");
        // SAFETY: `from..len` lies inside the vector's initialised length; the pointer comes
        // from `as_mut_ptr`, which makes no reference to the whole buffer, so views of
        // `..from` taken from `as_ptr` stay valid.
        unsafe { std::slice::from_raw_parts_mut(self.vec.as_mut_ptr().add(from), self.len - from) }
    }

    /// The bytes `from..to`, taken without a reference to the whole buffer (see
    /// [`tail_mut`](Self::tail_mut)).
    pub fn range(&self, from: usize, to: usize) -> &[u8] {
        assert!(from <= to && to <= self.len, "a range inside the buffer");
        // SAFETY: inside the initialised length; `as_ptr` makes no reference to the rest.
        unsafe { std::slice::from_raw_parts(self.vec.as_ptr().add(from), to - from) }
    }

    /// An immutable zero-copy `Bytes` over the buffer; the buffer goes back to the pool
    /// when the last view is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.vec[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let class = self.vec.len();
        if class > self.max_idle_bytes {
            return;
        }
        let mut state = pool.lock().expect("pool lock");
        // Make room by dropping idle buffers of other sizes: the one just used is the
        // likeliest to be needed again.
        while state.idle_bytes + class > self.max_idle_bytes {
            let Some(victim) = state.free.keys().copied().find(|c| *c != class) else {
                break;
            };
            let list = state.free.get_mut(&victim).expect("present");
            list.pop();
            if list.is_empty() {
                state.free.remove(&victim);
            }
            state.idle_bytes -= victim;
        }
        if state.idle_bytes + class <= self.max_idle_bytes {
            state.idle_bytes += class;
            let buffer = std::mem::take(&mut self.vec);
            state.free.entry(class).or_default().push((buffer, Instant::now()));
        }
    }
}

/// Buffers at least this large ask the kernel for transparent huge pages.
const HUGE_PAGES_MIN: usize = 4 << 20;

/// A new zeroed buffer of `len` bytes; a large one is backed by huge pages where the kernel
/// allows (`madvise` mode): fewer page faults and TLB misses while frames are copied in and
/// hashed. The pages are only faulted in as bytes are read into them.
fn fresh(len: usize) -> Vec<u8> {
    let vec = vec![0u8; len];
    if len >= HUGE_PAGES_MIN {
        let start = vec.as_ptr() as usize;
        let aligned = (start + 4095) & !4095;
        let usable = (start + len).saturating_sub(aligned) & !4095;
        if usable > 0 {
            // SAFETY: the range lies inside `vec`'s allocation; the advice changes no contents.
            let _ = unsafe {
                rustix::mm::madvise(
                    aligned as *mut std::ffi::c_void,
                    usable,
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
    }
    vec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_return_when_the_last_view_drops() {
        let pool = RecvPool::new(1 << 30);
        let mut b = pool.take(100_000);
        b.as_mut_slice().fill(7);
        let bytes = b.freeze();
        let ptr = bytes.as_ptr();
        let view = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "a view is still alive");
        drop(view);
        assert_eq!(pool.idle_bytes(), 131072);
        let again = pool.take(120_000);
        assert_eq!(again.vec.as_ptr(), ptr, "the same memory is reused");
        assert_eq!(pool.idle_bytes(), 0);
    }

    #[test]
    fn idle_bytes_are_capped() {
        let pool = RecvPool::new(100_000);
        drop(pool.take(70_000).freeze());
        assert_eq!(pool.idle_bytes(), 0, "a 128 KiB class does not fit a 100 KB cap");
    }

    #[test]
    fn a_returning_buffer_evicts_idle_ones_of_other_sizes() {
        let pool = RecvPool::new(1 << 20);
        drop(pool.take(100_000).freeze()); // 128 KiB class
        drop(pool.take(300_000).freeze()); // 512 KiB class
        assert_eq!(pool.idle_bytes(), 640 << 10);
        drop(pool.take(1 << 20).freeze()); // 1 MiB: the others make room
        assert_eq!(pool.idle_bytes(), 1 << 20);
    }
}

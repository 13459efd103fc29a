//! The process's arenas and the ranges allocated from them: who holds each range (the
//! application, loans to peers), whether the producer's mapping of it is still shared, and
//! when it may be reused.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::arena::FreeList;
use crate::dirty::PageMap;
use crate::region::{self, Region};

/// Default smallest allocation served from an arena (smaller ones are not worth a
/// descriptor: below it a copy into a pooled segment costs less than a remap).
pub const DEFAULT_MIN_BYTES: usize = 1 << 20;
/// Size of an arena, unless one allocation needs more.
pub const ARENA_BYTES: usize = 64 << 20;
/// Default bound on arenas (each holds two descriptors: its memfd, and the read-only one
/// that sends pass).
pub const DEFAULT_MAX_ARENAS: usize = 256;
/// Default bound on the bytes of freed ranges kept populated for reuse; past it, freed
/// pages go back to the system.
pub const DEFAULT_IDLE_BYTES: usize = 64 << 20;

/// A range allocated from an arena.
#[derive(Debug)]
struct Record {
    arena: u64,
    off: usize,
    len: usize,
    /// The application still holds it (not freed).
    live: bool,
    /// The producer's mapping of it is private (it was lent): the file holds what was lent.
    private: bool,
    /// Loans to peers not yet ended.
    loans: u32,
    /// A peer that may still map it outlived its loan: its file pages never change again.
    retired: bool,
    /// A forked child's anonymous copy: in no arena, never lent.
    anonymous: bool,
}

struct Arena {
    region: Region,
    free: FreeList,
}

#[derive(Default)]
struct State {
    arenas: BTreeMap<u64, Arena>,
    records: BTreeMap<usize, Record>,
    next_id: u64,
    /// When a range was last allocated or freed (what [`Arenas::trim_if_idle`] waits out).
    last_activity: Option<std::time::Instant>,
    pagemap: Option<PageMap>,
    /// Ranges whose mapping is private now (each splits its arena's mapping in up to three).
    private_ranges: usize,
    lends: u64,
    copies: u64,
    write_backs: u64,
    refused: u64,
    last_refusal: Option<String>,
}

impl State {
    /// Freed bytes kept populated for reuse, in every arena.
    fn idle_populated(&self) -> usize {
        self.arenas.values().map(|a| a.free.populated_bytes()).sum()
    }
}

/// What a send gets for a buffer: not in an arena, in one but to be copied (and why), or a
/// loan of its range.
pub enum Lend {
    /// The bytes are not in an arena.
    NotOurs,
    /// The bytes are in an arena but must be copied: why.
    Copy(String),
    /// The bytes may be passed by descriptor: the loan, and a read-only descriptor of the
    /// arena to pass (one per arena, however many loans are out).
    Shared {
        /// The loan, which ends when the peer releases the window.
        loan: Loan,
        /// The arena's memfd, opened read-only.
        fd: Arc<OwnedFd>,
    },
}

/// A range lent to a peer: where this process maps the arena, and the window's offset in
/// it. The loan ends with [`Loan::end`] (or when dropped, as a release).
pub struct Loan {
    addr: usize,
    ended: bool,
    /// The process it was made in ([`Arenas::generation`]): a forked child's inherited
    /// loans are not its own, and end nothing there.
    generation: u64,
    /// This process's mapping of the whole arena (from the segment's first byte).
    pub segment: &'static [u8],
    /// The window's offset in the segment.
    pub offset: usize,
}

impl Loan {
    /// Ends the loan: `reusable` false when the peer may still map the range although its
    /// loan ended (its connection closed before it released): the range is then retired.
    pub fn end(mut self, reusable: bool) {
        self.ended = true;
        arenas().end_loan(self.addr, self.generation, reusable);
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if !self.ended {
            arenas().end_loan(self.addr, self.generation, true);
        }
    }
}

/// Where a buffer's bytes lie in an arena (for tests and statistics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The arena's (device, inode).
    pub inode: (u64, u64),
    /// The range's offset in the arena.
    pub offset: usize,
    /// The range's length (whole pages).
    pub len: usize,
    /// Whether the producer's mapping of it is private (it was lent).
    pub private: bool,
    /// Loans out on it.
    pub loans: u32,
}

/// Figures of the process's arenas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Arenas (each two descriptors).
    pub arenas: usize,
    /// Their total size.
    pub arena_bytes: usize,
    /// Bytes of ranges the application holds.
    pub live_bytes: usize,
    /// Ranges with loans out, and their bytes.
    pub lent_ranges: usize,
    pub lent_bytes: usize,
    /// Bytes of retired ranges (never reused).
    pub retired_bytes: usize,
    /// Ranges whose mapping is private now (at most [`Arenas::set_max_private_ranges`]).
    pub private_ranges: usize,
    /// Bytes of ranges the application freed while a peer still maps them (reused once
    /// released).
    pub freed_lent_bytes: usize,
    /// Freed bytes kept populated for reuse.
    pub idle_populated_bytes: usize,
    /// Free bytes in arenas.
    pub free_bytes: usize,
    /// Loans made, sends that had to copy, ranges written back before a loan.
    pub lends: u64,
    pub copies: u64,
    pub write_backs: u64,
    /// Allocations the arenas could not serve (the default allocator did), and the last why.
    pub refused: u64,
    pub last_refusal: Option<String>,
}

/// Most arenas a process may be configured to have.
pub const MAX_ARENAS: usize = 1024;

/// The process's arenas: see the crate's documentation.
pub struct Arenas {
    state: Mutex<State>,
    min_bytes: AtomicUsize,
    max_arenas: AtomicUsize,
    idle_bytes: AtomicUsize,
    /// Most ranges remapped private at once (see [`Arenas::set_max_private_ranges`]).
    max_private: AtomicUsize,
    /// Forks this process descends from since the arenas were made: a loan made in one
    /// generation ends nothing in the next.
    generation: AtomicU64,
}

/// The process's arenas.
pub fn arenas() -> &'static Arenas {
    static ARENAS: OnceLock<Arenas> = OnceLock::new();
    let mut made = false;
    let a = ARENAS.get_or_init(|| {
        made = true;
        Arenas {
            state: Mutex::new(State::default()),
            min_bytes: AtomicUsize::new(DEFAULT_MIN_BYTES),
            max_arenas: AtomicUsize::new(DEFAULT_MAX_ARENAS),
            idle_bytes: AtomicUsize::new(DEFAULT_IDLE_BYTES),
            max_private: AtomicUsize::new(default_max_private()),
            generation: AtomicU64::new(0),
        }
    });
    if made {
        crate::fork::around_forks(take_before_fork, let_go_in_parent, clean_up_in_child);
    }
    a
}

/// What the forking thread holds from the prepare handler of a fork to the parent's or the
/// child's handler: the registry, and a pipe the child closes once its copies are made.
/// Written and read only by the forking thread, between those calls (forks from two
/// threads at once take the registry in turn, and the C library serializes them too).
struct HeldAcrossFork(std::cell::UnsafeCell<Option<ForkHold>>);

/// The registry, and the pipe's two ends (none if it could not be made).
type ForkHold = (MutexGuard<'static, State>, Option<[OwnedFd; 2]>);

// SAFETY: see the type's text: one thread at a time, ordered by the registry's mutex.
unsafe impl Sync for HeldAcrossFork {}

static HELD_ACROSS_FORK: HeldAcrossFork = HeldAcrossFork(std::cell::UnsafeCell::new(None));

extern "C" fn take_before_fork() {
    let guard = arenas().lock();
    // Without the pipe (no descriptors left) the parent does not wait for the child's copies.
    let pipe = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .ok()
        .map(|(r, w)| [r, w]);
    // SAFETY: only the forking thread is here, and it holds the registry.
    unsafe { *HELD_ACROSS_FORK.0.get() = Some((guard, pipe)) };
}

/// In the parent: `fork` returns once the child made its copies of the arrays (it closes the
/// pipe then, or by exiting), so that nothing the parent writes after `fork` returned reaches
/// the child's copies; then the registry is let go.
extern "C" fn let_go_in_parent() {
    // SAFETY: as in `take_before_fork`.
    let Some((guard, pipe)) = (unsafe { (*HELD_ACROSS_FORK.0.get()).take() }) else {
        return;
    };
    if let Some([read, write]) = pipe {
        drop(write);
        let mut byte = [0u8; 1];
        // Until the end of the pipe (or the child's write): a signal only interrupts the wait.
        while let Err(rustix::io::Errno::INTR) = rustix::io::read(&read, &mut byte) {}
    }
    drop(guard);
}

extern "C" fn clean_up_in_child() {
    // SAFETY: as in `take_before_fork`: the child's only thread is the one that forked.
    let Some((mut guard, pipe)) = (unsafe { (*HELD_ACROSS_FORK.0.get()).take() }) else {
        return;
    };
    // A panic must not unwind into the C library's fork: the clean-up is let go instead.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        arenas().clean_up_in_child(&mut guard);
    }));
    // The parent's fork returns now.
    drop(pipe);
    drop(guard);
}

/// A quarter of `vm.max_map_count` (65 530 unless the host says otherwise): each private
/// range splits its arena's mapping in up to three, and the rest of the process (threads'
/// stacks, libraries, malloc) needs mappings too.
fn default_max_private() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(65_530)
        / 4
}

impl Arenas {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The smallest allocation served from an arena.
    pub fn min_bytes(&self) -> usize {
        self.min_bytes.load(Ordering::Relaxed)
    }

    /// Sets the smallest allocation served from an arena (at least one byte).
    pub fn set_min_bytes(&self, n: usize) {
        self.min_bytes.store(n.max(1), Ordering::Relaxed);
    }

    /// Sets the bound on arenas (descriptors), at most [`MAX_ARENAS`]; past it, allocations
    /// go to the default allocator.
    pub fn set_max_arenas(&self, n: usize) {
        self.max_arenas.store(n.min(MAX_ARENAS), Ordering::Relaxed);
    }

    /// Sets how many freed bytes stay populated for reuse.
    pub fn set_idle_bytes(&self, n: usize) {
        self.idle_bytes.store(n, Ordering::Relaxed);
    }

    /// Sets how many ranges may be remapped private at once (a range is remapped at its first
    /// loan, and shared again when it is reused). Each splits its arena's mapping, and a
    /// process has at most `vm.max_map_count` mappings: past this bound a send copies
    /// instead. The default is a quarter of `vm.max_map_count`.
    pub fn set_max_private_ranges(&self, n: usize) {
        self.max_private.store(n, Ordering::Relaxed);
    }

    /// `size` bytes from an arena, page-aligned, zeroed if `zeroed`; `None` when below the
    /// threshold or when no arena can serve it (then the caller's default allocator does).
    pub fn allocate(&self, size: usize, zeroed: bool) -> Option<*mut u8> {
        if size < self.min_bytes() {
            return None;
        }
        self.allocate_any(size, zeroed).ok()
    }

    /// `size` bytes from an arena whatever the threshold (an application that asks for
    /// shared memory by name), or why no arena can serve them.
    pub fn allocate_any(&self, size: usize, zeroed: bool) -> Result<*mut u8, String> {
        let len = region::round_up(size).ok_or_else(|| format!("{size} bytes is past the address space"))?;
        let mut state = self.lock();
        let found = state
            .arenas
            .iter_mut()
            .find_map(|(&id, arena)| arena.free.take(len).map(|(off, zero)| (id, off, zero)));
        let (id, off, zero) = match found {
            Some(got) => got,
            None => match self.grow(&mut state, len) {
                Ok(id) => {
                    let arena = state.arenas.get_mut(&id).expect("just made");
                    let (off, zero) = arena.free.take(len).expect("a fresh arena holds the range");
                    (id, off, zero)
                }
                Err(why) => {
                    state.refused += 1;
                    state.last_refusal = Some(why.clone());
                    return Err(why);
                }
            },
        };
        state.last_activity = Some(std::time::Instant::now());
        let addr = state.arenas[&id].region.base + off;
        state.records.insert(
            addr,
            Record {
                arena: id,
                off,
                len,
                live: true,
                private: false,
                loans: 0,
                retired: false,
                anonymous: false,
            },
        );
        drop(state);
        if zeroed && !zero {
            // SAFETY: the range is ours from now on, mapped and writable.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0, size) };
        }
        Ok(addr as *mut u8)
    }

    /// A new arena for at least `len` bytes, or why not.
    fn grow(&self, state: &mut State, len: usize) -> Result<u64, String> {
        let max = self.max_arenas.load(Ordering::Relaxed);
        if state.arenas.len() >= max {
            return Err(format!("{max} arenas exist already (their bound)"));
        }
        let size = len
            .max(ARENA_BYTES)
            .checked_next_multiple_of(2 << 20)
            .ok_or_else(|| format!("{len} bytes is past the address space"))?;
        let region = Region::create(size).map_err(|e| e.to_string())?;
        state.next_id += 1;
        let id = state.next_id;
        state.arenas.insert(
            id,
            Arena {
                region,
                free: FreeList::new(size),
            },
        );
        Ok(id)
    }

    /// The length of the range that starts at `ptr` (whole pages), a forked child's copies
    /// included; `None` when no range starts there.
    pub fn len_of(&self, ptr: *const u8) -> Option<usize> {
        self.lock().records.get(&(ptr as usize)).map(|r| r.len)
    }

    /// Takes back the range that starts at `ptr`: `false` if no range starts there (the
    /// caller's default allocator made it). The range is reused once every loan on it ended.
    pub fn free(&self, ptr: *mut u8) -> bool {
        let addr = ptr as usize;
        let mut state = self.lock();
        let Some(record) = state.records.get_mut(&addr) else {
            return false;
        };
        if record.anonymous {
            let len = record.len;
            state.records.remove(&addr);
            drop(state);
            region::unmap(addr, len);
            return true;
        }
        record.live = false;
        if record.loans == 0 && !record.retired {
            self.give_back(&mut state, addr);
        } else if record.private {
            // Peers still map the file's pages; this process's copies of them go now.
            let (arena, off, len) = (record.arena, record.off, record.len);
            let _ = state.arenas[&arena].region.drop_private(off, len);
            Self::settle_retired(&mut state, addr);
        }
        state.last_activity = Some(std::time::Instant::now());
        true
    }

    /// A retired range that nothing here holds any more (freed, every loan ended) is never
    /// used again: its mapping goes back to shared, so that it no longer splits its arena's
    /// mapping nor takes one of the private ranges' places (which would make every later
    /// send copy). Its file pages stay for the peer that may still map them.
    fn settle_retired(state: &mut State, addr: usize) {
        let Some(record) = state.records.get_mut(&addr) else {
            return;
        };
        if !(record.retired && record.private && !record.live && record.loans == 0) {
            return;
        }
        if state.arenas[&record.arena]
            .region
            .remap(record.off, record.len, false)
            .is_ok()
        {
            record.private = false;
            state.private_ranges = state.private_ranges.saturating_sub(1);
        }
    }

    /// The range at `addr` back to its arena's free space: shared again, and its pages
    /// punched out if more than the idle bound would stay populated.
    fn give_back(&self, state: &mut State, addr: usize) {
        let Some(record) = state.records.remove(&addr) else {
            return;
        };
        let idle_bound = self.idle_bytes.load(Ordering::Relaxed);
        let punch = state.idle_populated() + record.len > idle_bound;
        let Some(arena) = state.arenas.get_mut(&record.arena) else {
            return;
        };
        if record.private && arena.region.remap(record.off, record.len, false).is_err() {
            // It stays private, so it cannot be handed out as shared memory again: retired
            // (the statistics count it), its private pages dropped, its place kept.
            let _ = arena.region.drop_private(record.off, record.len);
            state.records.insert(
                addr,
                Record {
                    retired: true,
                    ..record
                },
            );
            return;
        }
        let zero = punch && arena.region.punch(record.off, record.len).is_ok();
        arena.free.give(record.off, record.len, zero);
        if record.private {
            state.private_ranges = state.private_ranges.saturating_sub(1);
        }
    }

    /// What a send may do with `len` bytes at `ptr`: see [`Lend`]. The first loan of a range
    /// remaps the producer's mapping of it private, so its later writes reach no peer.
    pub fn lend(&self, ptr: *const u8, len: usize) -> Lend {
        let start = ptr as usize;
        let Some(end) = start.checked_add(len) else {
            return Lend::NotOurs;
        };
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some((&addr, record)) = state.records.range_mut(..=start).next_back() else {
            return Lend::NotOurs;
        };
        if end > addr + record.len || record.anonymous {
            return Lend::NotOurs;
        }
        let arena = &state.arenas[&record.arena];
        if !record.private {
            let max = self.max_private.load(Ordering::Relaxed);
            if state.private_ranges >= max {
                state.copies += 1;
                return Lend::Copy(format!(
                    "{max} ranges are remapped already, their bound (each splits its arena's mapping, and \
                     vm.max_map_count bounds a process's mappings)"
                ));
            }
            if let Err(e) = arena.region.remap(record.off, record.len, true) {
                state.copies += 1;
                return Lend::Copy(e.to_string());
            }
            record.private = true;
            state.private_ranges += 1;
        } else {
            let p = region::page();
            let first = start / p * p;
            let pages = (end.max(start + 1) - first).div_ceil(p);
            if state.pagemap.is_none() {
                match PageMap::open() {
                    Ok(map) => state.pagemap = Some(map),
                    Err(e) => {
                        state.copies += 1;
                        return Lend::Copy(e.to_string());
                    }
                }
            }
            let written = match state.pagemap.as_ref().expect("opened").written(first, pages) {
                Ok(w) => w,
                Err(e) => {
                    state.copies += 1;
                    return Lend::Copy(e.to_string());
                }
            };
            if !written.is_empty() {
                if record.loans > 0 || record.retired {
                    state.copies += 1;
                    return Lend::Copy("written since it was lent, while a peer may still map it".into());
                }
                let base_page = (first - arena.region.base) / p;
                for (at, count) in &written {
                    if let Err(e) = arena.region.write_back(base_page + at, *count) {
                        state.copies += 1;
                        return Lend::Copy(e.to_string());
                    }
                }
                state.write_backs += 1;
            }
        }
        let fd = arena.region.lend_fd.clone();
        record.loans += 1;
        state.lends += 1;
        // SAFETY: arenas are never unmapped while the process runs; a forked child unmaps its
        // inherited ones but keeps copies, at the same addresses, of every range with a loan.
        let segment = unsafe { std::slice::from_raw_parts(arena.region.base as *const u8, arena.region.size) };
        let loan = Loan {
            addr,
            ended: false,
            generation: self.generation.load(Ordering::Acquire),
            segment,
            offset: start - arena.region.base,
        };
        Lend::Shared { loan, fd }
    }

    fn end_loan(&self, addr: usize, generation: u64, reusable: bool) {
        if generation != self.generation.load(Ordering::Acquire) {
            // Inherited from the parent: its range here is this child's own copy.
            return;
        }
        let mut state = self.lock();
        let Some(record) = state.records.get_mut(&addr) else {
            return;
        };
        record.loans = record.loans.saturating_sub(1);
        if !reusable {
            record.retired = true;
        }
        if record.loans == 0 && !record.live && !record.retired {
            self.give_back(&mut state, addr);
        } else {
            Self::settle_retired(&mut state, addr);
        }
    }

    /// Gives the pages of every freed range back to the system now (memory pressure): the
    /// ranges stay free and mapped, reading as zeros. Returns the bytes punched out.
    pub fn trim(&self) -> usize {
        let mut state = self.lock();
        let mut punched = 0;
        for arena in state.arenas.values_mut() {
            for (off, len) in arena.free.take_populated() {
                let zero = arena.region.punch(off, len).is_ok();
                arena.free.give(off, len, zero);
                punched += if zero { len } else { 0 };
            }
        }
        punched
    }

    /// As [`Arenas::trim`], once no range was allocated or freed for `idle`: freed pages
    /// kept for reuse go back to the system when no one reuses them. Returns the bytes.
    pub fn trim_if_idle(&self, idle: std::time::Duration) -> usize {
        {
            let state = self.lock();
            let quiet = state.last_activity.is_none_or(|t| t.elapsed() >= idle);
            if state.idle_populated() == 0 || !quiet {
                return 0;
            }
        }
        self.trim()
    }

    /// Where `ptr` lies in an arena, if it does.
    pub fn locate(&self, ptr: *const u8) -> Option<Located> {
        let state = self.lock();
        let start = ptr as usize;
        let (&addr, record) = state.records.range(..=start).next_back()?;
        if start >= addr + record.len || record.anonymous {
            return None;
        }
        let arena = &state.arenas[&record.arena];
        Some(Located {
            inode: arena.region.inode,
            offset: start - arena.region.base,
            len: record.len,
            private: record.private,
            loans: record.loans,
        })
    }

    /// The figures now.
    pub fn stats(&self) -> Stats {
        let state = self.lock();
        let mut stats = Stats {
            arenas: state.arenas.len(),
            arena_bytes: state.arenas.values().map(|a| a.region.size).sum(),
            free_bytes: state.arenas.values().map(|a| a.free.free_bytes()).sum(),
            lends: state.lends,
            copies: state.copies,
            write_backs: state.write_backs,
            refused: state.refused,
            last_refusal: state.last_refusal.clone(),
            idle_populated_bytes: state.idle_populated(),
            private_ranges: state.private_ranges,
            ..Stats::default()
        };
        for r in state.records.values() {
            if r.live {
                stats.live_bytes += r.len;
            }
            if r.loans > 0 {
                stats.lent_ranges += 1;
                stats.lent_bytes += r.len;
            }
            if r.retired {
                stats.retired_bytes += r.len;
            }
            if !r.live && r.loans > 0 && !r.retired {
                stats.freed_lent_bytes += r.len;
            }
        }
        stats
    }

    /// In a forked child, run by the child's `fork` handler with the registry held: every
    /// live range becomes an anonymous private copy at the same address (one anonymous
    /// mapping per arena, so the child's mappings stay as few as its arenas), and the
    /// inherited arenas' descriptors go. Nothing the child writes reaches what a peer maps,
    /// and nothing the parent writes after its `fork` returned reaches the child (the
    /// parent's handler waits for this). New allocations make new arenas.
    fn clean_up_in_child(&self, state: &mut State) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let arenas = std::mem::take(&mut state.arenas);
        for (id, arena) in arenas {
            let (base, size) = (arena.region.base, arena.region.size);
            let live = state
                .records
                .iter()
                .filter(|(_, r)| r.arena == id && (r.live || r.loans > 0) && !r.anonymous)
                .map(|(&addr, r)| (addr - base, r.len));
            if region::copy_into_anonymous(base, size, live).is_err() {
                // No memory (or no mapping) for the copy: the arena is made unreadable here
                // rather than left shared with the parent and its peers.
                region::seal_off(base, size);
            }
            drop(arena.region);
        }
        // Ranges freed while lent are copied too: a buffer the child inherited may still be
        // reading them. The child never frees those copies (its application let them go).
        state.records.retain(|_, r| r.live || r.loans > 0 || r.anonymous);
        for record in state.records.values_mut() {
            record.anonymous = true;
            record.private = false;
            record.loans = 0;
            record.retired = false;
        }
        state.private_ranges = 0;
        state.pagemap = None;
    }
}

//! Forks, and the bounds a process's mappings set: a child forked while another thread
//! uses the registry still gets its own copies and a registry that answers; loans it
//! inherited end nothing in it; the ranges remapped private stay within their bound.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use handoff_arena::{arenas, Lend};

const MIB: usize = 1 << 20;
const ARENA: usize = handoff_arena::ARENA_BYTES;

/// Forks; the child runs `child` under a 10 s alarm (a registry it waits on forever fails
/// the test) and exits with its code. Returns the child's exit code (or 128 + its signal).
fn in_child(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only runs `child`, then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: plain libc calls in the child.
        unsafe { libc::alarm(10) };
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

fn peer_reads(fd: &std::os::fd::OwnedFd, offset: usize) -> u8 {
    let mut b = [0u8; 1];
    rustix::io::pread(fd.as_fd(), &mut b, offset as u64).unwrap();
    b[0]
}

#[test]
fn a_child_forked_while_another_thread_holds_the_registry_gets_its_own_copies() {
    let p = arenas().allocate(2 * MIB, false).unwrap();
    // SAFETY: our fresh range.
    unsafe { std::ptr::write_bytes(p, 0x11, 2 * MIB) };
    // A thread that takes the registry again and again (as trims and ending loans do).
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                arenas().trim();
                let _ = arenas().stats();
            }
        })
    };
    for _ in 0..200 {
        let code = in_child(|| {
            // Its copy: writing it changes nothing in the parent, and the registry answers.
            // SAFETY: the child's own copy of the range.
            unsafe { std::ptr::write_bytes(p, 0xEE, 2 * MIB) };
            let _ = arenas().stats();
            let fresh = arenas()
                .allocate(2 * MIB, true)
                .expect("a child serves from arenas of its own");
            if arenas().locate(p).is_some() || arenas().locate(fresh).is_none() {
                return 2;
            }
            if !arenas().free(p) || !arenas().free(fresh) {
                return 3;
            }
            0
        });
        assert_eq!(
            code, 0,
            "the child's exit code (142: it waited on the registry forever)"
        );
        // SAFETY: our range, alive.
        assert_eq!(unsafe { *p }, 0x11, "a child's write reached the parent's array");
    }
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    assert!(arenas().free(p));
}

#[test]
fn a_loan_inherited_on_a_range_freed_while_lent_ends_without_a_panic_in_the_child() {
    let p = arenas().allocate(2 * MIB, false).unwrap();
    let Lend::Shared { loan: inherited, .. } = arenas().lend(p, 2 * MIB) else {
        panic!("lent")
    };
    // Freed while lent: the parent keeps the range for the peer.
    assert!(arenas().free(p));
    let code = in_child(move || {
        // A range of the child's own, lent to its peer, then freed while lent.
        let q = arenas().allocate(2 * MIB, false).unwrap();
        // SAFETY: the child's fresh range.
        unsafe { std::ptr::write_bytes(q, 0x11, 2 * MIB) };
        let Lend::Shared { loan: peer, fd } = arenas().lend(q, 2 * MIB) else {
            return 2;
        };
        let offset = peer.offset;
        assert!(arenas().free(q));
        // The parent's loan, dropped here: it must neither panic nor end the peer's.
        drop(inherited);
        let r = arenas().allocate(2 * MIB, false).unwrap();
        // SAFETY: the child's fresh range.
        unsafe { std::ptr::write_bytes(r, 0x22, 2 * MIB) };
        if peer_reads(&fd, offset) != 0x11 {
            return 3;
        }
        peer.end(true);
        0
    });
    assert_eq!(code, 0, "the child's exit code");
}

#[test]
fn a_loan_inherited_by_a_child_does_not_end_the_loan_of_a_new_range_at_its_address() {
    // A whole arena's worth: the child's copy is the whole of its inherited arena, so once the
    // child frees it, the hole is large enough for the child's next arena.
    let p = arenas().allocate(ARENA, false).unwrap();
    let Lend::Shared { loan: inherited, .. } = arenas().lend(p, ARENA) else {
        panic!("lent")
    };
    let code = in_child(move || {
        // The child lets its copy go, and its next arena lands where the parent's was.
        assert!(arenas().free(p));
        let q = arenas().allocate(ARENA, false).unwrap();
        if q != p {
            return 4; // not the layout this test needs (see below)
        }
        // SAFETY: the child's fresh range.
        unsafe { std::ptr::write_bytes(q, 0x11, ARENA) };
        let Lend::Shared { loan: peer, fd } = arenas().lend(q, ARENA) else {
            return 2;
        };
        let offset = peer.offset;
        assert!(arenas().free(q));
        // The parent's loan names the same address: dropped here, it must not end the
        // peer's, or the range would be reused under the peer.
        drop(inherited);
        let r = arenas().allocate(ARENA, false).unwrap();
        // SAFETY: the child's fresh range.
        unsafe { std::ptr::write_bytes(r, 0x22, ARENA) };
        if peer_reads(&fd, offset) != 0x11 {
            return 3;
        }
        peer.end(true);
        0
    });
    assert_ne!(
        code, 4,
        "the child's new arena did not land at the inherited one's address"
    );
    assert_eq!(code, 0, "the child's exit code (3: the peer's window was reused)");
}

#[test]
fn the_ranges_remapped_private_stay_within_their_bound() {
    arenas().set_max_private_ranges(4);
    let ranges: Vec<*mut u8> = (0..5).map(|_| arenas().allocate(MIB, false).unwrap()).collect();
    let mut loans = Vec::new();
    for &p in &ranges[..4] {
        match arenas().lend(p, MIB) {
            Lend::Shared { loan, .. } => loans.push(loan),
            _ => panic!("within the bound: lent"),
        }
    }
    match arenas().lend(ranges[4], MIB) {
        Lend::Copy(why) => assert!(why.contains("vm.max_map_count"), "{why}"),
        _ => panic!("past the bound: copied"),
    }
    // A range reused is shared again: the next one may be lent.
    let first = loans.remove(0);
    assert!(arenas().free(ranges[0]));
    first.end(true);
    assert!(matches!(arenas().lend(ranges[4], MIB), Lend::Shared { .. }));
    arenas().set_max_private_ranges(usize::MAX);
    drop(loans);
}

#[test]
fn a_size_near_the_end_of_the_address_space_is_refused_not_a_panic() {
    for size in [usize::MAX, usize::MAX - 4096, usize::MAX - (2 << 20)] {
        assert!(arenas().allocate_any(size, false).is_err());
    }
}

#[test]
fn what_the_parent_writes_after_fork_returned_never_reaches_the_childs_copy() {
    let len = 128 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    // SAFETY: our fresh range.
    unsafe { std::ptr::write_bytes(p, 0x11, len) };
    // SAFETY: the child only reads its copy, then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own copy of the range.
        let copy = unsafe { std::slice::from_raw_parts(p, len) };
        let changed = copy.iter().filter(|&&b| b != 0x11).count();
        unsafe { libc::_exit(if changed == 0 { 0 } else { 3 }) };
    }
    // The parent writes at once, from the end back (the child's copy runs front to back).
    for page in (0..len / 4096).rev() {
        // SAFETY: our range.
        unsafe { std::ptr::write_bytes(p.add(page * 4096), 0x22, 4096) };
    }
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "the child died: {status}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's copy holds bytes the parent wrote after its fork returned"
    );
    assert!(arenas().free(p));
}

#[test]
fn a_child_of_a_process_with_many_small_arrays_keeps_few_mappings() {
    arenas().set_min_bytes(1);
    let ranges: Vec<*mut u8> = (0..20_000u32)
        .map(|i| {
            let p = arenas().allocate(4096, false).unwrap();
            // SAFETY: our fresh page.
            unsafe { std::ptr::write_bytes(p, (i % 251) as u8, 4096) };
            p
        })
        .collect();
    let arenas_made = arenas().stats().arenas;
    let code = in_child(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        let intact = ranges
            .iter()
            .enumerate()
            // SAFETY: the child's copies of our pages.
            .all(|(i, &p)| {
                unsafe { std::slice::from_raw_parts(p, 4096) }
                    .iter()
                    .all(|&b| b == (i % 251) as u8)
            });
        if !intact {
            return 3;
        }
        // One mapping per arena for the copies, not one per array.
        if maps > 500 + arenas_made {
            eprintln!("{maps} mappings in the child");
            return 4;
        }
        0
    });
    assert_eq!(
        code, 0,
        "the child's exit code (3: a copy is wrong; 4: too many mappings)"
    );
    for p in ranges {
        assert!(arenas().free(p));
    }
}

//! The arenas as a sender and a receiver see them: a loan's descriptor mapped as a peer
//! maps it, the producer's later writes, reuse only after every loan ended.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use handoff_arena::{arenas, Lend, Loan};

const MIB: usize = 1 << 20;

/// What a peer sees: the loan's window, mapped shared and read-only from its descriptor.
fn peer_view(lent: &(Loan, Arc<OwnedFd>), len: usize) -> Vec<u8> {
    let page = rustix::param::page_size();
    let (loan, fd) = lent;
    let start = loan.offset / page * page;
    let skip = loan.offset - start;
    // SAFETY: a fresh read-only mapping of the lent memfd, unmapped below.
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            skip + len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::SHARED,
            fd.as_fd(),
            start as u64,
        )
        .unwrap();
        let bytes = std::slice::from_raw_parts((p as *const u8).add(skip), len).to_vec();
        rustix::mm::munmap(p, skip + len).unwrap();
        bytes
    }
}

fn lend(ptr: *const u8, len: usize) -> (Loan, Arc<OwnedFd>) {
    match arenas().lend(ptr, len) {
        Lend::Shared { loan, fd } => (loan, fd),
        Lend::Copy(why) => panic!("copy: {why}"),
        Lend::NotOurs => panic!("not in an arena"),
    }
}

fn fill(ptr: *mut u8, len: usize, byte: u8) {
    // SAFETY: the test's own allocation of at least `len` bytes.
    unsafe { std::ptr::write_bytes(ptr, byte, len) };
}

#[test]
fn small_allocations_are_not_served_and_large_ones_are_page_aligned() {
    assert!(arenas().allocate(MIB - 1, false).is_none(), "below the threshold");
    let p = arenas().allocate(3 * MIB + 5, true).expect("an arena serves it");
    assert_eq!(p as usize % rustix::param::page_size(), 0);
    // SAFETY: just allocated, zeroed.
    let all_zero = unsafe { std::slice::from_raw_parts(p, 3 * MIB + 5) }
        .iter()
        .all(|&b| b == 0);
    assert!(all_zero);
    let at = arenas().locate(p).expect("located");
    assert!(!at.private && at.loans == 0);
    assert!(arenas().free(p));
    let mut local = 0u8;
    assert!(!arenas().free(&mut local), "not ours: the caller's allocator frees it");
}

#[test]
fn a_peer_never_sees_what_the_producer_writes_after_the_loan() {
    let len = 2 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 1);
    let loan = lend(p, len);
    assert!(
        arenas().locate(p).unwrap().private,
        "remapped private at the first loan"
    );
    // SAFETY: the producer still reads its own bytes at the same address.
    assert_eq!(unsafe { *p.add(len - 1) }, 1);
    fill(p, len, 2);
    assert!(
        peer_view(&loan, len).iter().all(|&b| b == 1),
        "the peer keeps what was lent"
    );
    // SAFETY: the producer sees its own write.
    assert_eq!(unsafe { *p }, 2);
    match arenas().lend(p, len) {
        Lend::Copy(why) => assert!(why.contains("written since it was lent"), "{why}"),
        _ => panic!("a written range with a loan out must be copied"),
    }
    loan.0.end(true);
    let again = lend(p, len);
    assert!(
        peer_view(&again, len).iter().all(|&b| b == 2),
        "written back, then lent: no stale bytes"
    );
    assert!(arenas().stats().write_backs >= 1);
    again.0.end(true);
    assert!(arenas().free(p));
}

#[test]
fn a_peer_cannot_write_punch_or_seal_the_arena_it_is_lent() {
    let len = 2 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 6);
    let (loan, fd) = lend(p, len);
    // SAFETY: an attempt to map the lent descriptor shared and writable, which must fail.
    let writable = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::SHARED,
            fd.as_fd(),
            0,
        )
    };
    assert!(writable.is_err(), "a shared writable mapping of a lent arena");
    assert!(rustix::io::pwrite(fd.as_fd(), b"x", 0).is_err());
    let punch = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
    assert!(rustix::fs::fallocate(fd.as_fd(), punch, 0, 4096).is_err());
    assert!(rustix::fs::fcntl_add_seals(fd.as_fd(), rustix::fs::SealFlags::WRITE).is_err());
    assert!(
        peer_view(&(loan, fd), len).iter().all(|&b| b == 6),
        "but it maps it read-only"
    );
    assert!(arenas().free(p));
}

#[test]
fn a_window_inside_a_range_is_lent_at_its_offset() {
    let len = 4 * MIB;
    let p = arenas().allocate(len, true).unwrap();
    // SAFETY: inside the allocation.
    let mid = unsafe { p.add(MIB + 100) };
    fill(mid, 10, 7);
    let loan = lend(mid, 10);
    assert_eq!(peer_view(&loan, 10), vec![7; 10]);
    assert!(matches!(arenas().lend(p, len + 1), Lend::NotOurs), "past the range");
    drop(loan);
    assert!(arenas().free(p));
}

#[test]
fn a_range_is_reused_only_after_it_is_freed_and_every_loan_ended() {
    let len = 32 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 9);
    let loan = lend(p, len);
    assert!(arenas().free(p));
    let q = arenas().allocate(len, false).unwrap();
    assert_ne!(p, q, "the lent range stays out of use");
    fill(q, len, 3);
    assert!(peer_view(&loan, len).iter().all(|&b| b == 9));
    loan.0.end(true);
    assert!(arenas().locate(p).is_none(), "back in the arena's free space");
    let r = arenas().allocate(len, true).unwrap();
    // SAFETY: just allocated, zeroed.
    assert!(unsafe { std::slice::from_raw_parts(r, len) }.iter().all(|&b| b == 0));
    assert!(arenas().free(q) && arenas().free(r));
}

#[test]
fn a_loan_that_outlives_its_connection_retires_the_range() {
    let len = 8 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 5);
    let loan = lend(p, len);
    loan.0.end(false);
    assert!(arenas().free(p));
    let s = arenas().stats();
    assert!(s.retired_bytes >= len, "{s:?}");
    for _ in 0..4 {
        let q = arenas().allocate(len, false).unwrap();
        assert_ne!(p, q, "a retired range is never handed out again");
        assert!(arenas().free(q));
    }
}

#[test]
fn trim_gives_freed_pages_back_and_keeps_the_ranges_usable() {
    let len = 4 * MIB;
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 8);
    assert!(arenas().free(p));
    assert!(arenas().stats().idle_populated_bytes >= len);
    assert_eq!(
        arenas().trim_if_idle(std::time::Duration::from_secs(3600)),
        0,
        "a range was freed just now"
    );
    assert!(arenas().trim_if_idle(std::time::Duration::ZERO) >= len);
    assert_eq!(arenas().stats().idle_populated_bytes, 0);
    let q = arenas().allocate(len, true).unwrap();
    // SAFETY: just allocated, zeroed.
    assert!(unsafe { std::slice::from_raw_parts(q, len) }.iter().all(|&b| b == 0));
    assert!(arenas().free(q));
}

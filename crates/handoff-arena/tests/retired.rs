//! Retired ranges give their place among the private ranges back, alone in their process:
//! the test lowers a process-wide bound.

use handoff_arena::{arenas, Lend};

const MIB: usize = 1 << 20;

fn fill(ptr: *mut u8, len: usize, byte: u8) {
    // SAFETY: the test's own allocation of at least `len` bytes.
    unsafe { std::ptr::write_bytes(ptr, byte, len) };
}

#[test]
fn ranges_retired_by_lost_connections_do_not_make_every_later_send_copy() {
    let len = 2 * MIB;
    arenas().set_max_private_ranges(2);
    // Two ranges lent to peers whose connections closed before they released: retired.
    for byte in [1, 2] {
        let p = arenas().allocate(len, false).unwrap();
        fill(p, len, byte);
        let Lend::Shared { loan, .. } = arenas().lend(p, len) else {
            panic!("a fresh range is lent by descriptor")
        };
        assert_eq!(arenas().stats().private_ranges, 1);
        loan.end(false);
        assert!(arenas().free(p));
        let s = arenas().stats();
        assert_eq!(s.private_ranges, 0, "a freed retired range is no longer private: {s:?}");
    }
    assert!(arenas().stats().retired_bytes >= 2 * len);
    // The bound is 2: had the retired ranges kept their places, this one would be copied.
    let p = arenas().allocate(len, false).unwrap();
    fill(p, len, 3);
    match arenas().lend(p, len) {
        Lend::Shared { loan, .. } => loan.end(true),
        Lend::Copy(why) => panic!("copied: {why}"),
        Lend::NotOurs => panic!("not in an arena"),
    }
    assert!(arenas().free(p));
    // A retired range freed before its loan ended settles when the loan ends.
    let q = arenas().allocate(len, false).unwrap();
    fill(q, len, 4);
    let Lend::Shared { loan, .. } = arenas().lend(q, len) else {
        panic!("lent by descriptor")
    };
    assert!(arenas().free(q));
    assert_eq!(arenas().stats().private_ranges, 1, "still lent");
    loan.end(false);
    assert_eq!(arenas().stats().private_ranges, 0);
}

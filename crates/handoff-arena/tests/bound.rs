//! The bound on arenas, alone in its process: it changes a process-wide setting.

use handoff_arena::arenas;

#[test]
fn past_the_bound_on_arenas_the_default_allocator_serves() {
    let before = arenas().stats().arenas;
    arenas().set_max_arenas(before);
    let huge = arenas().allocate(ARENA_PLUS, false);
    arenas().set_max_arenas(256);
    assert!(huge.is_none());
    let s = arenas().stats();
    assert!(s.refused >= 1);
    assert!(s.last_refusal.unwrap().contains("arenas exist already"));
}

const ARENA_PLUS: usize = handoff_arena::ARENA_BYTES + 1;

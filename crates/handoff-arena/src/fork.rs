//! Forks: handlers the C library runs around every `fork` of the process
//! (`pthread_atfork`), as it does for `malloc`'s locks. The registry uses them to hold its
//! lock across the fork, so that a child never finds it held by a thread it does not have.

use std::sync::Once;

/// Registers `prepare` (in the forking thread, before the fork), `in_parent` and `in_child`
/// (after it, on each side), once per process; children inherit them.
pub(crate) fn around_forks(prepare: extern "C" fn(), in_parent: extern "C" fn(), in_child: extern "C" fn()) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: handlers that never fork themselves.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
        if rc != 0 {
            // Only an exhausted process gets here; its children must then leave arrays alone.
            eprintln!("handoff-arena: pthread_atfork failed ({rc}); a forked child must not touch its arrays");
        }
    });
}

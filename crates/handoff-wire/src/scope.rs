//! Thread-local "current value" scopes, as the codec uses for the route and the resources.

use std::cell::RefCell;
use std::sync::Arc;
use std::thread::LocalKey;

/// A thread-local slot holding the current value of some kind, if any.
pub(crate) type Slot<T> = LocalKey<RefCell<Option<Arc<T>>>>;

/// Runs `f` with `value` in `slot`, restoring the previous value afterwards (also when `f`
/// panics).
pub(crate) fn with_current<T: 'static, R>(slot: &'static Slot<T>, value: &Arc<T>, f: impl FnOnce() -> R) -> R {
    struct Restore<T: 'static> {
        slot: &'static Slot<T>,
        previous: Option<Arc<T>>,
    }
    impl<T: 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            let previous = self.previous.take();
            self.slot.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = slot.with(|c| c.borrow_mut().replace(value.clone()));
    let _restore = Restore { slot, previous };
    f()
}

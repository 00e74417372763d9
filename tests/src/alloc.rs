//! The system allocator, counting the bytes held and the most held at once: for tests of what
//! code holds (a test binary installs it: `#[global_allocator] static A: Counting = Counting;`,
//! and is best one test alone, since every thread's allocations count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(held, Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Starts a measurement: the peak is reset to what is held now, which is returned.
pub fn start() -> usize {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    before
}

/// The most bytes held at once since [`start`] returned `before`, over `before`.
pub fn peak_since(before: usize) -> usize {
    PEAK.load(Ordering::Relaxed).saturating_sub(before)
}

/// The most bytes held at once while `f` ran, over what was held before it.
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = start();
    let out = f();
    (out, peak_since(before))
}

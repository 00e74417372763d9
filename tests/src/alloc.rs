//! The system allocator, counting the bytes held and the most held at once: for tests of what
//! code holds (a test binary installs it: `#[global_allocator] static A: Counting = Counting;`,
//! and is best one test alone, since every thread's allocations count).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
        if layout.size() >= LARGE {
            // SAFETY: gettid takes no arguments and allocates nothing.
            let tid = unsafe { libc::gettid() } as u32;
            let at = LARGE_NEXT.fetch_add(1, Ordering::Relaxed) % LARGE_FREES.len();
            LARGE_FREES[at].store(
                (u64::from(tid) << 32) | (layout.size() >> 20) as u64,
                Ordering::Relaxed,
            );
        }
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

/// Frees of at least this many bytes are recorded with the thread that made them.
pub const LARGE: usize = 8 << 20;
static LARGE_FREES: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static LARGE_NEXT: AtomicUsize = AtomicUsize::new(0);

/// The last 64 frees of at least [`LARGE`] bytes: (kernel thread id, MiB), oldest first while
/// fewer than 64; forgotten by [`forget_large_frees`].
pub fn large_frees() -> Vec<(u32, u64)> {
    LARGE_FREES
        .iter()
        .map(|f| f.load(Ordering::Relaxed))
        .filter(|&v| v != 0)
        .map(|v| ((v >> 32) as u32, v & 0xffff_ffff))
        .collect()
}

pub fn forget_large_frees() {
    for f in &LARGE_FREES {
        f.store(0, Ordering::Relaxed);
    }
}

/// The kernel thread id of this process's thread named `name` (as `/proc` shows it: at most 15
/// bytes), if there is one.
pub fn thread_named(name: &str) -> Option<u32> {
    threads_named(name).into_iter().next()
}

/// The kernel thread ids of all of this process's threads named `name`.
pub fn threads_named(name: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| t.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

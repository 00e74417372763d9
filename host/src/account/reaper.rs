//! Large buffers freed on a thread of their own. Freeing a large buffer unmaps it (tens of ms
//! for hundreds of MiB), and the threads that let go of a tenant's buffers serve every tenant:
//! the device's dispatcher (a call's input, an output nobody took), the HTTP runtime (an
//! invocation's output, once written to its client). There, that time held up every tenant's
//! next batch or request, charged to nobody. What holds the memory (its charge, its tenant's
//! slot) goes with it, so that the tenant has it back once the memory is gone.

use std::sync::mpsc::{Sender, channel};

/// Buffers smaller than this are freed where they are let go (a few µs: the allocator keeps
/// them, or unmaps one small mapping).
pub const FREE_HERE: usize = 1 << 20;

/// A thread that frees what it is handed, in the order it was handed.
#[derive(Debug, Clone)]
pub struct Reaper(Option<Sender<Box<dyn Send>>>);

impl Reaper {
    /// Starts a reaper on a thread named `name`.
    pub fn start(name: &str) -> Self {
        let (tx, rx) = channel::<Box<dyn Send>>();
        let started = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || rx.into_iter().for_each(drop));
        // Without its thread, things are freed where they are let go.
        Self(started.ok().map(|_| tx))
    }

    /// Frees `what` on the reaper's thread.
    pub fn free(&self, what: impl Send + 'static) {
        if let Some(tx) = &self.0 {
            let _ = tx.send(Box::new(what));
        }
    }

    /// Frees `what`, which holds `bytes` of buffers: here if they are small (below
    /// [`FREE_HERE`]), which costs less than the hand-over; else on the reaper. Everything went
    /// to the device's reaper, in one queue: a light tenant's finished call gave its slot back
    /// only after every large buffer a heavy tenant's calls had queued before it was unmapped,
    /// and its next call found its own slot still held.
    pub fn free_sized(&self, bytes: usize, what: impl Send + 'static) {
        if bytes < FREE_HERE {
            drop(what);
        } else {
            self.free(what);
        }
    }
}

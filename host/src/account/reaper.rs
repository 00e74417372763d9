//! Large buffers freed on a thread of their own. Freeing a large buffer unmaps it (tens of ms
//! for hundreds of MiB), and the threads that let go of a tenant's buffers serve every tenant:
//! the device's dispatcher (a call's input, an output nobody took), the HTTP runtime (an
//! invocation's output, once written to its client). There, that time held up every tenant's
//! next batch or request, charged to nobody. The device's reaper takes what holds the memory
//! with it (its charge, its tenant's slot), so that the tenant has those back once the memory
//! is gone; the outputs' reaper takes the bytes alone, and holds at most a bound of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};

/// Buffers smaller than this are freed where they are let go (a few µs: the allocator keeps
/// them, or unmaps one small mapping).
pub const FREE_HERE: usize = 1 << 20;

/// A thread that frees what it is handed, in the order it was handed.
#[derive(Debug, Clone)]
pub struct Reaper {
    tx: Option<Sender<(usize, Box<dyn Send>)>>,
    /// Bytes handed to it and not yet freed.
    queued: Arc<AtomicUsize>,
    /// The most bytes it holds: past them, [`Reaper::free_sized`] frees where it is called.
    most: usize,
}

impl Reaper {
    /// Starts a reaper on a thread named `name`, with no bound on what it holds (what it is
    /// handed holds its tenants' slots, which bound it).
    pub fn start(name: &str) -> Self {
        Self::bounded(name, usize::MAX)
    }

    /// Starts a reaper on a thread named `name` that holds at most `most` bytes at once.
    pub fn bounded(name: &str, most: usize) -> Self {
        let (tx, rx) = channel::<(usize, Box<dyn Send>)>();
        let queued = Arc::new(AtomicUsize::new(0));
        let freed = Arc::clone(&queued);
        let started = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for (bytes, what) in rx {
                    drop(what);
                    freed.fetch_sub(bytes, Ordering::Relaxed);
                }
            });
        // Without its thread, things are freed where they are let go.
        Self {
            tx: started.ok().map(|_| tx),
            queued,
            most,
        }
    }

    /// Frees `what` on the reaper's thread, whatever the reaper holds already (what only the
    /// unbounded device reaper is handed: an output nobody took).
    pub fn free(&self, what: impl Send + 'static) {
        self.hand(0, Box::new(what));
    }

    /// Frees `what`, which holds `bytes` of buffers: here if they are small (below
    /// [`FREE_HERE`]), which costs less than the hand-over, or if it would take the reaper past
    /// its most while it holds anything (one larger than the bound goes to an idle reaper: the
    /// reaper holds at most its bound and one more); else on the reaper. Everything went to
    /// the device's reaper, in one queue: a light tenant's finished call gave its slot back
    /// only after every large buffer a heavy tenant's calls had queued before it was
    /// unmapped, and its next call found its own slot still held.
    pub fn free_sized(&self, bytes: usize, what: impl Send + 'static) {
        if bytes < FREE_HERE {
            return drop(what);
        }
        let before = self.queued.fetch_add(bytes, Ordering::Relaxed);
        if before > 0 && before.saturating_add(bytes) > self.most {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            return drop(what);
        }
        self.hand(bytes, Box::new(what));
    }

    /// Hands `what` (counted as `bytes` in `queued`) to the thread, or frees it here.
    fn hand(&self, bytes: usize, what: Box<dyn Send>) {
        let sent = match &self.tx {
            Some(tx) => tx.send((bytes, what)).map_err(|e| e.0),
            None => Err((bytes, what)),
        };
        if let Err((bytes, what)) = sent {
            drop(what);
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::mpsc::Receiver;

    /// Says on which thread it was dropped; the first waits for a word before it goes.
    struct Freed {
        on: Arc<Mutex<Vec<(u32, String)>>>,
        id: u32,
        hold: Option<Receiver<()>>,
    }

    impl Drop for Freed {
        fn drop(&mut self) {
            if let Some(hold) = self.hold.take() {
                let _ = hold.recv();
            }
            let here = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            self.on.lock().expect("record").push((self.id, here));
        }
    }

    #[test]
    fn a_bounded_reaper_frees_past_its_bound_where_it_is_let_go() {
        let reaper = Reaper::bounded("test-reaper", 3 * FREE_HERE);
        let on = Arc::new(Mutex::new(Vec::new()));
        let (go, hold) = channel();
        let freed = |id, hold| Freed {
            on: Arc::clone(&on),
            id,
            hold,
        };
        // The first holds the reaper's thread until told; the second waits behind it; the
        // third would take it past its bound.
        reaper.free_sized(2 * FREE_HERE, freed(1, Some(hold)));
        reaper.free_sized(FREE_HERE, freed(2, None));
        reaper.free_sized(FREE_HERE, freed(3, None));
        reaper.free_sized(FREE_HERE - 1, freed(4, None));
        let here = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        assert_eq!(
            *on.lock().expect("record"),
            [(3, here.clone()), (4, here)],
            "past the bound, and small: freed here at once"
        );
        go.send(()).expect("go");
        let idle = || {
            for _ in 0..500 {
                if reaper.queued.load(Ordering::Relaxed) == 0 {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            false
        };
        assert!(idle(), "all freed");
        assert_eq!(
            on.lock().expect("record")[2..],
            [(1, "test-reaper".into()), (2, "test-reaper".into())]
        );
        // One larger than the bound goes to an idle reaper all the same.
        reaper.free_sized(4 * FREE_HERE, freed(5, None));
        assert!(idle(), "freed");
        assert_eq!(on.lock().expect("record")[4..], [(5, "test-reaper".into())]);
    }
}

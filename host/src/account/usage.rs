//! What an invocation has used so far, readable while it runs and after it is dropped: the
//! object bytes charged to its read cap and its time on the device. An invocation whose client
//! goes away is dropped where it is; what it used is still charged (in the metrics) from here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Usage {
    read_bytes: AtomicU64,
    compute_nanos: AtomicU64,
}

impl Usage {
    /// Object bytes charged to the read cap so far.
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes.load(Ordering::Relaxed)
    }

    /// Records the read cap's total so far.
    pub fn set_read_bytes(&self, total: u64) {
        self.read_bytes.store(total, Ordering::Relaxed);
    }

    /// Time on the device so far.
    pub fn compute(&self) -> Duration {
        Duration::from_nanos(self.compute_nanos.load(Ordering::Relaxed))
    }

    /// Adds time on the device.
    pub fn add_compute(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.compute_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_a_running_total_and_compute_adds_up() {
        let u = Usage::default();
        u.set_read_bytes(10);
        u.set_read_bytes(25);
        u.add_compute(Duration::from_millis(3));
        u.add_compute(Duration::from_millis(4));
        assert_eq!(u.read_bytes(), 25);
        assert_eq!(u.compute(), Duration::from_millis(7));
    }
}

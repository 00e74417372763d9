//! The device's settings and how it refuses work.

use crate::account::OverLimit;
use std::time::Duration;

/// How the device shares its memory and time.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Bytes of device memory all work together may use (weights included).
    pub budget: u64,
    /// Split calls into sub-batches that fit (storage batch adaptation).
    pub adapt: bool,
    /// Merge calls for the same segment across tenants into one device batch.
    pub pool: bool,
    /// How long a pooled batch waits for batch mates.
    pub window: Duration,
    /// Largest device batch, in samples.
    pub max_batch: i64,
    /// Longest a batch of one tenant's work may run (estimated) while other tenants are
    /// active, so that calls interleave and deadlines hold.
    pub slice: Duration,
    /// Longest a pooled batch (several tenants' work) may run (estimated).
    pub batch_time: Duration,
    /// Pooled batches that run at once. On a CPU, as many as there are cores: a batch of one
    /// sample leaves cores idle that another batch can use, as unpooled calls running side by
    /// side do; each batch's operators then use the cores divided among the workers
    /// ([`share_cores`]). On a GPU, one: batches queue on the device anyway.
    pub workers: usize,
    /// How long a model a tenant used stays its own: a load for another tenant unloads it
    /// within this only while its tenant holds more than its share of the budget.
    pub resident_for: Duration,
}

/// Device batches that run at once when the policy sets no `device_workers`: on a CPU one per
/// core, on a GPU one.
pub fn default_workers(device: tch::Device) -> usize {
    match device {
        tch::Device::Cpu => cores(),
        _ => 1,
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// libtorch's threads for each batch on a CPU: the `cores` divided among the `workers` that
/// run batches side by side, at least one.
pub fn threads_per_worker(cores: usize, workers: usize) -> usize {
    (cores / workers.max(1)).max(1)
}

/// On a CPU, gives libtorch [`threads_per_worker`] threads for each operator, `side_by_side`
/// being the batches (pooled) or calls (unpooled) that run at once, unless the operator set
/// `OMP_NUM_THREADS` (then libtorch's own reading of it stands). Left alone, every batch's
/// operators start a team of as many threads as the machine has cores: two workers on two
/// cores ran four threads, which spun at OpenMP's barriers waiting for each other, and a light
/// tenant's batch beside a heavy tenant's took 1.6x its time alone. To be called before any
/// libtorch operator runs: each thread takes the count when it first runs one (or calls
/// [`tch::get_num_threads`], as the device's threads do when they start). The setting is the
/// process's, so hosts started in one process share the last one.
pub fn share_cores(device: tch::Device, side_by_side: usize) {
    let set_by_operator = std::env::var_os("OMP_NUM_THREADS").is_some_and(|v| !v.is_empty());
    if device == tch::Device::Cpu && !set_by_operator {
        let n = threads_per_worker(cores(), side_by_side);
        tch::set_num_threads(i32::try_from(n).unwrap_or(1));
    }
}

/// Why the device did not run a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// No room now (adaptation off, or other tenants' models hold the memory): retry later.
    #[error("{0}")]
    Busy(String),
    /// Can never fit the budget.
    #[error("{0}")]
    TooLarge(String),
    /// The caller's deadline passed.
    #[error("time limit of {0:?} exceeded while waiting for or running on the device")]
    Expired(Duration),
    /// Work that ran past its tenant's time limit lately is not started again yet.
    #[error("{0}")]
    Stopped(String),
    /// The caller's memory account cannot hold the output.
    #[error("{0}")]
    Memory(OverLimit),
    /// The host is shutting down.
    #[error("the host is shutting down")]
    ShuttingDown,
    /// A fault of the host's own (a libtorch error, a panic): details for the log only.
    #[error("device fault: {0}")]
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::threads_per_worker;

    #[test]
    fn workers_side_by_side_share_the_cores_without_oversubscribing_them() {
        assert_eq!(threads_per_worker(2, 2), 1);
        assert_eq!(threads_per_worker(16, 2), 8);
        assert_eq!(threads_per_worker(16, 1), 16);
        assert_eq!(threads_per_worker(16, 3), 5);
        // More workers than cores, or none configured: one thread each.
        assert_eq!(threads_per_worker(2, 4), 1);
        assert_eq!(threads_per_worker(4, 0), 4);
    }
}

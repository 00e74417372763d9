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
    /// side do. On a GPU, one: batches queue on the device anyway.
    pub workers: usize,
    /// How long a model a tenant used stays its own: a load for another tenant unloads it
    /// within this only while its tenant holds more than its share of the budget.
    pub resident_for: Duration,
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

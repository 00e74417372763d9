//! The device: one memory budget shared by loaded models and running batches, storage batch
//! adaptation, and compute calls pooled across tenants and shared by device time.
//!
//! - [`budget`]: weights are charged when a model is loaded and released when an idle model is
//!   unloaded to make room (least recently used); every batch reserves
//!   `workspace + b * per_sample` bytes before it runs. Admitted work never exceeds the budget.
//! - [`schedule`]: who runs next and how big a batch is: the tenant with the least device time
//!   per unit of weight leads; a batch is as large as memory, `max_batch`, the fastest batch
//!   size and a time slice allow; a large call is cut into slices that interleave with other
//!   tenants' work.
//! - [`dispatcher`]: the thread that runs pooled batches, survives a panic or a libtorch error
//!   in one (failing only that batch's calls), and drops calls whose caller gave up.
//! - [`executor`]: [`Device`], what the wasi-nn capability calls.
//!
//! A call that can never fit is refused ([`DeviceError::TooLarge`]) under every setting; a
//! call whose deadline passes while it waits or runs is abandoned, its late result dropped and
//! its memory released.

pub mod batch;
pub mod budget;
pub mod dispatcher;
pub mod executor;
pub mod job;
pub mod schedule;
pub mod stats;
pub mod types;

pub use executor::Device;
pub use job::{Input, Job, Ran, WireDtype, torch_kind};
pub use types::{DeviceConfig, DeviceError};

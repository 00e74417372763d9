//! A transfer-learning job: list the data, choose the split, train epochs through the
//! pipeline, evaluate, checkpoint, and write the results.

mod cache;
mod checkpoint;
mod config;
mod dtype;
mod plan;
mod report;
mod sweep;
mod train;

pub use config::{EpochResult, JobConfig, PlanReport, Results, SplitArg};
pub use report::{print_plan, write_json};
pub use sweep::{SweepCase, SweepResults};
pub use train::Job;

//! What a job is given (`JobConfig`, `--split`) and what it reports (epochs, plan, results).

use crate::head::OptimizerKind;
use crate::plan::{Costs, Estimate, Split};
use hapi_client::WireDtype;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `--split`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitArg {
    Auto,
    None,
    Freeze,
    Min,
    At(usize),
}

impl std::str::FromStr for SplitArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => Self::Auto,
            "none" => Self::None,
            "freeze" => Self::Freeze,
            "min" => Self::Min,
            n => Self::At(n.parse().map_err(|_| {
                format!("`{n}`: expected auto, none, freeze, min or a layer index")
            })?),
        })
    }
}

/// Everything a job needs (the CLI's flags).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobConfig {
    pub hosts: Vec<String>,
    #[serde(skip)]
    pub token: String,
    pub function: String,
    /// Object store root: a directory (each subdirectory a bucket) or `s3://` (buckets are S3
    /// buckets; endpoint and credentials from `AWS_*`).
    pub store: String,
    pub bucket: String,
    pub prefix: String,
    pub models: PathBuf,
    pub model: String,
    pub freeze: Option<usize>,
    pub batch: usize,
    pub epochs: usize,
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub seed: u64,
    pub split: SplitArg,
    pub prefetch: usize,
    pub request_size: usize,
    pub in_flight: usize,
    pub train_limit: Option<usize>,
    pub test_limit: Option<usize>,
    pub max_iters: Option<usize>,
    pub test: bool,
    pub skip_bad: bool,
    pub retry_secs: f64,
    pub device: String,
    pub memory_limit: Option<u64>,
    pub replan_threshold: f64,
    pub cache_features: bool,
    /// The feature store's directory ([`crate::features`]); implies `cache_features`.
    #[serde(default)]
    pub feature_store: Option<PathBuf>,
    /// Element type of pushed-down features on the network (splits >= 1).
    #[serde(default)]
    pub wire_dtype: WireDtype,
    pub checkpoint: Option<PathBuf>,
    pub resume: bool,
    pub out: Option<PathBuf>,
    pub progress: bool,
}

/// One epoch's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EpochResult {
    pub epoch: usize,
    pub split: Split,
    pub iterations: usize,
    pub samples: usize,
    pub wall_s: f64,
    /// Mean per iteration, measured.
    pub storage_stage_s: f64,
    pub compute_stage_s: f64,
    /// The compute tier waiting for batches, whole epoch.
    pub starved_s: f64,
    /// The plan's estimate for this epoch's split, when there is a plan.
    pub predicted: Option<Estimate>,
    pub bytes_received: u64,
    pub requests: usize,
    pub retries: usize,
    pub server: hapi_client::ServerTiming,
    pub train_loss: f64,
    pub step_losses: Vec<f64>,
    pub test_accuracy: Option<f64>,
    pub test_s: Option<f64>,
    pub skipped: Vec<String>,
    pub from_cache: bool,
    pub replanned: Option<String>,
}

/// The plan: what was measured and what each split was estimated to cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanReport {
    pub chosen: Split,
    pub probe_s: f64,
    pub costs: Costs,
    pub estimates: Vec<Estimate>,
    /// The model's best candidates, each run for real (without training) before choosing.
    #[serde(default)]
    pub probes: Vec<Probe>,
}

/// A candidate split run for [`PROBE_ITERATIONS`] iterations without training.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Probe {
    pub split: Split,
    /// Measured per iteration (compute: the frozen layers run here, plus the head's step).
    pub storage_s: f64,
    pub compute_s: f64,
    /// The epoch these stage times give (the planner's pipeline formula).
    pub epoch_s: f64,
    pub predicted: Estimate,
}

/// What a job writes to `--out`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub config: JobConfig,
    pub device: String,
    pub classes: Vec<String>,
    pub train_samples: usize,
    pub test_samples: usize,
    pub freeze: usize,
    pub trainable_params: i64,
    pub plan: Option<PlanReport>,
    pub epochs: Vec<EpochResult>,
    pub skipped_total: usize,
}

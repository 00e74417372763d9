//! What a job is given (`JobConfig`, `--split`) and what it reports (epochs, plan, results).

use crate::adapt::Move;
use crate::head::OptimizerKind;
use crate::pipeline::Iteration;
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

impl SplitArg {
    /// The split this names (`auto` before a plan: freeze); `bytes_at` from
    /// [`crate::plan::bytes_at`].
    pub fn named(self, freeze: usize, bytes_at: &[u64]) -> Split {
        match self {
            Self::None => Split::None,
            Self::Freeze | Self::Auto => Split::At(freeze),
            Self::Min => Split::At(crate::plan::min_output_split(bytes_at, freeze)),
            Self::At(s) => Split::At(s),
        }
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
    /// `--candidates`: with `--split auto`, the splits explored (instead of the model's best).
    #[serde(default)]
    pub candidates: Option<Vec<SplitArg>>,
    pub prefetch: usize,
    pub request_size: usize,
    /// Send each key to a host beside a replica of it (hosts with
    /// `host.s3.local_volume_server`).
    pub locality: bool,
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
    /// Bytes the feature store's shards may take, over every identity in its directory.
    #[serde(default)]
    pub feature_store_cap: Option<u64>,
    /// Element type of pushed-down features on the network (splits >= 1); with
    /// `wire_dtype_auto`, what [`Job::open`](super::Job::open) chose.
    #[serde(default)]
    pub wire_dtype: WireDtype,
    /// `--wire-dtype auto`: chosen from the features' values (see `job/dtype.rs`).
    #[serde(default)]
    pub wire_dtype_auto: bool,
    /// Why `auto` chose what it did.
    #[serde(default)]
    pub wire_dtype_reason: Option<String>,
    pub checkpoint: Option<PathBuf>,
    pub resume: bool,
    pub out: Option<PathBuf>,
    /// `--trace`: a JSON line per training iteration (split, stage times, end time).
    #[serde(default)]
    pub trace: Option<PathBuf>,
    pub progress: bool,
}

/// One epoch's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EpochResult {
    pub epoch: usize,
    /// The split most of its iterations ran at (every iteration's is in `trace`).
    pub split: Split,
    pub iterations: usize,
    /// The job's iteration count (over all epochs) at the epoch's first iteration.
    #[serde(default)]
    pub first_iteration: usize,
    pub samples: usize,
    pub wall_s: f64,
    /// Mean per iteration, measured.
    pub storage_stage_s: f64,
    pub compute_stage_s: f64,
    /// The compute tier waiting for batches, whole epoch.
    pub starved_s: f64,
    /// The model's estimate for this epoch's split, as calibrated by then, when there is a plan.
    pub predicted: Option<Estimate>,
    pub bytes_received: u64,
    pub requests: usize,
    pub retries: usize,
    /// Requests also sent to a second host because the first was slow to answer.
    #[serde(default)]
    pub hedges: u64,
    pub server: hapi_client::ServerTiming,
    pub train_loss: f64,
    pub step_losses: Vec<f64>,
    pub test_accuracy: Option<f64>,
    pub test_s: Option<f64>,
    pub skipped: Vec<String>,
    pub from_cache: bool,
    /// With `--split auto`: where the trainer settled or started exploring again, and why.
    #[serde(default)]
    pub moves: Vec<Move>,
    /// Every iteration's split and stage times (empty when the features came from the cache).
    #[serde(default)]
    pub trace: Vec<Iteration>,
}

/// The plan: what was measured and what each split was estimated to cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanReport {
    /// The model's best split, where exploration starts.
    pub chosen: Split,
    /// The splits explored first (the model's best few; see [`crate::adapt::candidates`]).
    pub candidates: Vec<Split>,
    /// Seconds spent measuring.
    pub plan_s: f64,
    pub costs: Costs,
    pub estimates: Vec<Estimate>,
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

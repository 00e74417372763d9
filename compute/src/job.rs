//! A transfer-learning job: list the data, choose the split, train epochs through the
//! pipeline, evaluate, checkpoint, and write the results.

use crate::client::{RetryPolicy, StorageClient, WireDtype};
use crate::dataset::{Dataset, Limits, Sample, epoch_order};
use crate::features::{self, FeatureStore, Identity};
use crate::head::{Head, OptimizerKind};
use crate::pipeline::{self, StageTimes};
use crate::plan::{Costs, Drift, Estimate, Split, min_output_split};
use crate::source::{Fetched, Source};
use anyhow::{Context, bail};
use futures::StreamExt;
use hapi_model::ModelPackage;
use indicatif::{ProgressBar, ProgressStyle};
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Tensor};
use tokio::runtime::Runtime;

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
    pub server: crate::client::ServerTiming,
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

/// Candidates the planner runs for real before choosing.
pub const PROBE_CANDIDATES: usize = 4;
/// Splits whose estimate is within this factor of the best are plausible winners: the model's
/// stage estimates are off by up to about 25% here.
pub const PLAUSIBLE: f64 = 1.3;

/// The splits to run for real: the model's best, then others among the plausible ones spread
/// evenly over the layers (neighbouring splits often cost the same, and probing three of them
/// would tell nothing new), `none` included when plausible.
pub fn probe_candidates(estimates: &[Estimate]) -> Vec<Estimate> {
    let fits: Vec<Estimate> = estimates.iter().filter(|e| e.fits).copied().collect();
    let Some(best) = fits
        .iter()
        .min_by(|a, b| a.epoch.total_cmp(&b.epoch))
        .copied()
    else {
        return Vec::new();
    };
    let mut plausible: Vec<Estimate> = fits
        .into_iter()
        .filter(|e| e.epoch <= best.epoch * PLAUSIBLE && e.split != best.split)
        .collect();
    plausible.sort_by_key(|e| e.split);
    let mut out = vec![best];
    let k = (PROBE_CANDIDATES - 1).min(plausible.len());
    for j in 0..k {
        // Evenly spaced positions over the plausible splits, in layer order.
        let i = if k == 1 {
            0
        } else {
            j * (plausible.len() - 1) / (k - 1)
        };
        let e = plausible[i];
        if !out.iter().any(|o| o.split == e.split) {
            out.push(e);
        }
    }
    out
}
/// Iterations per probed candidate (the second overlaps the first, as in training).
pub const PROBE_ITERATIONS: usize = 2;

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

/// What the checkpoint directory's `state.json` holds.
#[derive(Serialize, Deserialize)]
struct CheckpointState {
    fingerprint: String,
    epochs_done: usize,
    results: Results,
    split: Split,
}

/// A job ready to run.
pub struct Job {
    cfg: JobConfig,
    rt: Arc<Runtime>,
    pkg: Arc<ModelPackage>,
    freeze: usize,
    device: Device,
    data: Dataset,
    store: Arc<dyn ObjectStore>,
    client: Option<Arc<StorageClient>>,
    head: Head,
    /// Frozen features (the head's input) by key, with --cache-features or --feature-store.
    cache: HashMap<String, Vec<f32>>,
    /// With --feature-store: where features persist across jobs.
    features: Option<FeatureStore>,
    /// Keys whose features were computed since they were last written to the feature store.
    unsaved: Vec<String>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A line above the progress bar, or on stderr when there is no bar to print above.
fn log(pb: &ProgressBar, line: &str) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// What a pass over batches received from the storage tier or the store.
#[derive(Debug, Default)]
struct Traffic {
    bytes: u64,
    requests: usize,
    server: crate::client::ServerTiming,
    /// Keys left out as bad (`--skip-bad`).
    skipped: Vec<String>,
}

impl Job {
    /// Loads the model, lists the data and reaches the storage hosts.
    pub fn open(cfg: JobConfig) -> anyhow::Result<Self> {
        let device = hapi_model::device::parse(&cfg.device)?;
        let pkg_dir = cfg.models.join(&cfg.model);
        let pkg = Arc::new(
            ModelPackage::load(&pkg_dir, device)
                .with_context(|| format!("model `{}` in {}", cfg.model, cfg.models.display()))?,
        );
        let n = pkg.num_layers();
        let freeze = cfg.freeze.unwrap_or(pkg.freeze_index());
        if freeze == 0 || freeze >= n {
            bail!(
                "--freeze {freeze}: `{}` has {n} layers; the freeze index must be in 1..{n}",
                cfg.model
            );
        }
        if let SplitArg::At(s) = cfg.split
            && s > freeze
        {
            bail!(
                "--split {s} is past the freeze index {freeze}: only frozen layers can be pushed down"
            );
        }
        anyhow::ensure!(cfg.batch > 0, "--batch must be at least 1");
        let rt = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
        );
        let store = hapi_data::open_bucket(&cfg.store, &cfg.bucket, false)?;
        let limits = Limits {
            train: cfg.train_limit,
            test: cfg.test_limit,
            seed: cfg.seed,
        };
        let data = rt.block_on(Dataset::list(store.as_ref(), &cfg.prefix, limits))?;
        let (features, cache) = match &cfg.feature_store {
            Some(root) => {
                let (fs, cache) = open_feature_store(root, &cfg, &pkg, freeze, &data)?;
                (Some(fs), cache)
            }
            None => (None, HashMap::new()),
        };
        // Every sample stored: the job needs no storage host (it may be down).
        let all_stored = features.is_some()
            && data
                .train
                .iter()
                .chain(&data.test)
                .all(|s| cache.contains_key(&s.key));
        let client = if cfg.split == SplitArg::None {
            None
        } else {
            let retry = RetryPolicy {
                give_up_after: std::time::Duration::from_secs_f64(cfg.retry_secs),
                ..RetryPolicy::default()
            };
            let c = StorageClient::new(
                cfg.hosts.clone(),
                cfg.token.clone(),
                cfg.function.clone(),
                retry,
            )?
            .with_dtype(cfg.wire_dtype);
            if !all_stored {
                rt.block_on(c.check_reachable())?;
            }
            Some(Arc::new(c))
        };
        let head = Head::new(
            &pkg,
            freeze,
            data.classes.len(),
            device,
            cfg.seed,
            cfg.optimizer,
            cfg.lr,
        )?;
        Ok(Self {
            cfg,
            rt,
            pkg,
            freeze,
            device,
            data,
            store,
            client,
            head,
            cache,
            features,
            unsaved: Vec::new(),
        })
    }

    /// Whether the feature store gave the features of every sample (nothing to extract).
    fn all_stored(&self) -> bool {
        self.features.is_some()
            && self
                .data
                .train
                .iter()
                .chain(&self.data.test)
                .all(|s| self.cache.contains_key(&s.key))
    }

    pub fn dataset(&self) -> &Dataset {
        &self.data
    }

    pub fn freeze(&self) -> usize {
        self.freeze
    }

    fn source(&self, split: Split) -> anyhow::Result<Source> {
        Ok(match split {
            Split::None => Source::Local {
                store: Arc::clone(&self.store),
                transform: self.pkg.manifest().input.transform(),
                in_flight: self.cfg.in_flight * self.cfg.request_size,
                skip_bad: self.cfg.skip_bad,
            },
            Split::At(s) => Source::Pushdown {
                client: Arc::clone(
                    self.client
                        .as_ref()
                        .context("a pushdown split needs --host")?,
                ),
                bucket: self.cfg.bucket.clone(),
                model: self.cfg.model.clone(),
                split: s,
                request_size: self.cfg.request_size,
                in_flight: self.cfg.in_flight,
                skip_bad: self.cfg.skip_bad,
            },
        })
    }

    fn iterations(&self) -> usize {
        let n = self.data.train.len().div_ceil(self.cfg.batch);
        self.cfg.max_iters.map_or(n, |m| m.min(n))
    }

    /// Bytes per sample sent at each split 0..=freeze (split 0 in f32, the others in the
    /// wire dtype).
    fn bytes_at(&self) -> Vec<u64> {
        let m = self.pkg.manifest();
        let input: i64 = m.input.shape.iter().product();
        let wire = self.cfg.wire_dtype.size();
        std::iter::once(input as u64 * 4)
            .chain(
                m.layers[..self.freeze]
                    .iter()
                    .map(|l| l.output_bytes_per_sample() / 4 * wire),
            )
            .collect()
    }

    /// Measures both tiers and the network, and estimates every split.
    pub fn plan(&mut self) -> anyhow::Result<PlanReport> {
        let started = Instant::now();
        let client = Arc::clone(self.client.as_ref().context("--split auto needs --host")?);
        let cfg = &self.cfg;
        let r = cfg.request_size.max(1);
        let probe_keys: Vec<String> = self
            .data
            .train
            .iter()
            .take(r)
            .map(|s| s.key.clone())
            .collect();
        let freeze = self.freeze;
        let (host_profile, big, small) = self.rt.block_on(async {
            let profile = client.profile(&cfg.model).await?;
            // Warm-up, then one large (split 0) and one small (split freeze) transfer.
            client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, 0)
                .await?;
            let big = client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, 0)
                .await?;
            client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, freeze)
                .await?;
            let small = client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, freeze)
                .await?;
            anyhow::Ok((profile, big, small))
        })?;
        let n = probe_keys.len() as f64;
        let t_big = (big.wall.as_secs_f64() - big.server.total).max(1e-6);
        let t_small = (small.wall.as_secs_f64() - small.server.total).max(0.0);
        let (bandwidth, latency) = if big.bytes > small.bytes && t_big > t_small {
            let bw = (big.bytes - small.bytes) as f64 / (t_big - t_small);
            (bw, (t_small - small.bytes as f64 / bw).max(0.0))
        } else {
            (big.bytes as f64 / t_big, t_small)
        };
        // No pushdown: read the same objects from the store, decode them here.
        let store = Arc::clone(&self.store);
        let paths: Vec<object_store::path::Path> = probe_keys
            .iter()
            .map(|k| object_store::path::Path::from(k.as_str()))
            .collect();
        let read_started = Instant::now();
        let objects: Vec<_> = self.rt.block_on(async {
            futures::stream::iter(paths)
                .map(|p| {
                    let store = Arc::clone(&store);
                    async move { store.get(&p).await?.bytes().await }
                })
                .buffered(cfg.in_flight.max(1) * r)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        })?;
        let read_s = read_started.elapsed().as_secs_f64().max(1e-6);
        let object_total: usize = objects.iter().map(|o| o.len()).sum();
        let transform = self.pkg.manifest().input.transform();
        let decode_started = Instant::now();
        for o in &objects {
            hapi_preprocess::preprocess(o, &transform)?;
        }
        let local_decode = decode_started.elapsed().as_secs_f64() / n;
        // The compute tier's layers at the training batch size, and the head's step.
        let b = cfg.batch.min(64) as i64;
        let local = hapi_model::profile::profile_layers(&self.pkg, b, 1)?;
        let head_step = self.time_head_step()?;
        let m = self.pkg.manifest();
        let weights: Vec<u64> = (0..=freeze)
            .map(|s| 4 * m.layers[s..].iter().map(|l| l.params).sum::<u64>())
            .collect();
        let costs = Costs {
            batch: cfg.batch,
            iterations: self.iterations(),
            freeze,
            request_size: r,
            in_flight: cfg.in_flight,
            host_decode: (big.server.read + big.server.decode) / n,
            host_layer: host_profile
                .layers
                .iter()
                .map(|l| l.seconds_per_sample)
                .collect(),
            host_curve: {
                let m = &host_profile.memory;
                m.time_batches
                    .iter()
                    .enumerate()
                    .map(|(k, &b)| {
                        let t = m
                            .layers
                            .iter()
                            .map(|l| l.seconds_per_sample.get(k).copied().unwrap_or(f64::NAN))
                            .collect();
                        (b, t)
                    })
                    .filter(|(_, t): &(i64, Vec<f64>)| t.iter().all(|v| v.is_finite()))
                    .collect()
            },
            latency,
            bandwidth,
            bytes_at: self.bytes_at(),
            parse_per_byte: big.deserialize.as_secs_f64() / big.bytes.max(1) as f64,
            local_layer: local.iter().map(|l| l.seconds_per_sample).collect(),
            head_step,
            object_bytes: object_total as f64 / n,
            store_bandwidth: object_total as f64 / read_s,
            local_decode,
            local_cores: std::thread::available_parallelism().map_or(1, usize::from),
            weight_bytes: weights,
            layer_in_bytes: m
                .layers
                .iter()
                .map(|l| 4 * l.input_shape.iter().product::<i64>() as u64)
                .collect(),
            layer_out_bytes: m
                .layers
                .iter()
                .map(|l| l.output_bytes_per_sample())
                .collect(),
            prefetch: cfg.prefetch,
            memory_limit: cfg.memory_limit.unwrap_or_else(available_memory),
            storage_scale: 1.0,
            compute_scale: 1.0,
        };
        let mut costs = costs;
        let probes = self.probe(&costs)?;
        let chosen = match probes.iter().min_by(|a, b| a.epoch_s.total_cmp(&b.epoch_s)) {
            Some(best) => {
                // Calibrate the model on the chosen split, so that re-planning starts from what
                // was measured there.
                // (Within bounds: a stage predicted at almost nothing gives no scale.)
                let scale = |measured: f64, predicted: f64| {
                    if predicted > 1e-3 {
                        (measured / predicted).clamp(0.2, 5.0)
                    } else {
                        1.0
                    }
                };
                costs.storage_scale = scale(best.storage_s, best.predicted.storage);
                costs.compute_scale = scale(best.compute_s, best.predicted.compute);
                best.split
            }
            None => costs.choose().split,
        };
        Ok(PlanReport {
            chosen,
            probe_s: started.elapsed().as_secs_f64(),
            estimates: costs.estimates(),
            costs,
            probes,
        })
    }

    /// Runs the model's best few splits for real, without training: the same first batches
    /// through the real pipeline (requests in flight, prefetching), so that the choice among
    /// close candidates rests on measurements rather than on the model's error, which can
    /// exceed their differences.
    fn probe(&mut self, costs: &Costs) -> anyhow::Result<Vec<Probe>> {
        let ranked = probe_candidates(&costs.estimates());
        let batch: Vec<Sample> = self
            .data
            .train
            .iter()
            .take(self.cfg.batch)
            .cloned()
            .collect();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let n = costs.iterations.max(1) as f64;
        let pb = ProgressBar::hidden();
        let mut probes = Vec::new();
        for e in ranked {
            let (times, _, _) = self.feed(
                e.split,
                vec![batch.clone(); PROBE_ITERATIONS],
                &pb,
                false,
                |_, _, _| Ok(()),
            )?;
            let storage = times.mean_storage();
            let compute = times.mean_compute() + costs.head_step;
            probes.push(Probe {
                split: e.split,
                storage_s: storage,
                compute_s: compute,
                epoch_s: storage + storage.max(compute) * (n - 1.0) + compute,
                predicted: e,
            });
        }
        Ok(probes)
    }

    /// One training step of a throw-away copy of the head on random features.
    fn time_head_step(&self) -> anyhow::Result<f64> {
        let mut probe = Head::new(
            &self.pkg,
            self.freeze,
            self.data.classes.len(),
            self.device,
            self.cfg.seed,
            self.cfg.optimizer,
            self.cfg.lr,
        )?;
        let shape: Vec<i64> = std::iter::once(self.cfg.batch as i64)
            .chain(
                self.pkg.manifest().layers[self.freeze]
                    .input_shape
                    .iter()
                    .copied(),
            )
            .collect();
        let x = Tensor::randn(shape.as_slice(), (tch::Kind::Float, self.device));
        let y = Tensor::zeros([self.cfg.batch as i64], (tch::Kind::Int64, self.device));
        probe.train_step(&x, &y);
        let t = Instant::now();
        probe.train_step(&x, &y);
        hapi_model::device::synchronize(self.device);
        Ok(t.elapsed().as_secs_f64())
    }

    /// The split a fixed `--split` names.
    pub fn fixed_split(&self, arg: SplitArg) -> Split {
        match arg {
            SplitArg::None => Split::None,
            SplitArg::Freeze => Split::At(self.freeze),
            SplitArg::Min => Split::At(min_output_split(&self.bytes_at(), self.freeze)),
            SplitArg::At(s) => Split::At(s),
            SplitArg::Auto => Split::At(self.freeze),
        }
    }

    fn to_tensor(&self, f: &Fetched) -> anyhow::Result<Tensor> {
        let shape: Vec<i64> = std::iter::once(f.labels.len() as i64)
            .chain(f.sample_shape.iter().copied())
            .collect();
        Ok(Tensor::from_slice(&f.data)
            .f_view(shape.as_slice())
            .context("batch tensor")?
            .to_device(self.device))
    }

    /// Layers [s, freeze) on this tier: the head's input.
    fn frozen_rest(&self, split: Split, x: &Tensor) -> anyhow::Result<Tensor> {
        let start = match split {
            Split::None => 0,
            Split::At(s) => s,
        };
        Ok(self.pkg.run(start..self.freeze, x)?)
    }

    fn cache_batch(&mut self, keys: &[String], feats: &Tensor) -> anyhow::Result<()> {
        let flat = feats.to_device(Device::Cpu).contiguous().view([-1]);
        let all: Vec<f32> = Vec::<f32>::try_from(&flat)?;
        let per = all.len() / keys.len().max(1);
        for (k, row) in keys.iter().zip(all.chunks_exact(per.max(1))) {
            if self.cache.insert(k.clone(), row.to_vec()).is_none() && self.features.is_some() {
                self.unsaved.push(k.clone());
            }
        }
        Ok(())
    }

    /// Writes the features computed since the last call to the feature store. A failure (a
    /// full disk, say) is reported and the job goes on: it holds them in memory, and a later
    /// job extracts them again.
    fn save_features(&mut self, pb: &ProgressBar) {
        let Some(fs) = &self.features else {
            return;
        };
        if self.unsaved.is_empty() {
            return;
        }
        let keys: HashSet<String> = std::mem::take(&mut self.unsaved).into_iter().collect();
        let samples: Vec<&Sample> = self
            .data
            .train
            .iter()
            .chain(&self.data.test)
            .filter(|s| keys.contains(&s.key))
            .collect();
        match fs.add(&samples, &self.cache) {
            Ok(Some(path)) => log(
                pb,
                &format!(
                    "feature store: {} samples added ({})",
                    samples.len(),
                    path.display()
                ),
            ),
            Ok(None) => {}
            Err(e) => log(pb, &format!("feature store: not written: {e:#}")),
        }
    }

    fn cached_tensor(&self, samples: &[Sample]) -> Option<(Tensor, Tensor)> {
        let mut data = Vec::new();
        for s in samples {
            data.extend_from_slice(self.cache.get(&s.key)?);
        }
        let shape: Vec<i64> = std::iter::once(samples.len() as i64)
            .chain(
                self.pkg.manifest().layers[self.freeze]
                    .input_shape
                    .iter()
                    .copied(),
            )
            .collect();
        let x = Tensor::from_slice(&data)
            .view(shape.as_slice())
            .to_device(self.device);
        let y = Tensor::from_slice(&samples.iter().map(|s| s.label).collect::<Vec<_>>())
            .to_device(self.device);
        Some((x, y))
    }

    fn progress(&self, len: usize, prefix: String) -> ProgressBar {
        let pb = if self.cfg.progress {
            ProgressBar::new(len as u64)
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template(
                "{prefix:>12} [{bar:30}] {pos}/{len} it  {msg}  ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_prefix(prefix);
        pb
    }

    /// Feeds `batches` to `step(head, features, labels)`, where the features are the head's
    /// input: from the feature cache when it holds every sample, else through the pipeline at
    /// `split` (layers [s, freeze) run here, and fill the cache with `--cache-features`).
    /// Returns the stage times, what came over the network, and whether the cache served.
    /// With `use_cache` false (the planner's probes) the cache is neither read nor filled.
    fn feed(
        &mut self,
        split: Split,
        batches: Vec<Vec<Sample>>,
        pb: &ProgressBar,
        use_cache: bool,
        mut step: impl FnMut(&mut Head, &Tensor, &Tensor) -> anyhow::Result<()>,
    ) -> anyhow::Result<(StageTimes, Traffic, bool)> {
        let mut traffic = Traffic::default();
        let use_cache = use_cache && (self.cfg.cache_features || self.features.is_some());
        let cached = use_cache
            && batches
                .iter()
                .flatten()
                .all(|s| self.cache.contains_key(&s.key));
        if cached {
            let mut times = StageTimes::default();
            for batch in &batches {
                let started = Instant::now();
                let (x, y) = self
                    .cached_tensor(batch)
                    .context("feature cache incomplete")?;
                step(&mut self.head, &x, &y)?;
                times.compute.push(started.elapsed().as_secs_f64());
                pb.inc(1);
            }
            return Ok((times, traffic, true));
        }
        let source = self.source(split)?;
        let rt = Arc::clone(&self.rt);
        let times = pipeline::run(&rt, &source, batches, self.cfg.prefetch, |mut f| {
            traffic.bytes += f.bytes;
            traffic.requests += f.requests;
            traffic.server.add(&f.server);
            for (key, message) in std::mem::take(&mut f.skipped) {
                log(pb, &format!("skipped bad object `{key}`: {message}"));
                traffic.skipped.push(key);
            }
            if !f.labels.is_empty() {
                let x = self.to_tensor(&f)?;
                let feats = self.frozen_rest(split, &x)?;
                if use_cache {
                    self.cache_batch(&f.keys, &feats)?;
                }
                let y = Tensor::from_slice(&f.labels).to_device(self.device);
                step(&mut self.head, &feats, &y)?;
            }
            pb.inc(1);
            Ok(())
        })?;
        self.save_features(pb);
        Ok((times, traffic, false))
    }

    /// Trains one epoch at `split`; `iters` batches of the epoch's order.
    pub fn train_epoch(
        &mut self,
        epoch: usize,
        split: Split,
        iters: usize,
    ) -> anyhow::Result<EpochResult> {
        let order = epoch_order(self.data.train.len(), self.cfg.seed, epoch);
        let batches: Vec<Vec<Sample>> = order
            .chunks(self.cfg.batch)
            .take(iters)
            .map(|c| c.iter().map(|&i| self.data.train[i].clone()).collect())
            .collect();
        let pb = self.progress(batches.len(), format!("epoch {}", epoch + 1));
        let started = Instant::now();
        let mut losses = Vec::with_capacity(batches.len());
        let mut samples = 0usize;
        let retries_before = self.client.as_ref().map_or(0, |c| c.retries());
        let (times, traffic, cached) = self.feed(split, batches, &pb, true, |head, x, y| {
            let loss = head.train_step(x, y);
            samples += x.size()[0] as usize;
            losses.push(loss);
            let el = started.elapsed().as_secs_f64();
            pb.set_message(format!(
                "{:.0} samples/s  loss {loss:.4}",
                samples as f64 / el.max(1e-9)
            ));
            Ok(())
        })?;
        pb.finish_and_clear();
        let wall = started.elapsed().as_secs_f64();
        Ok(EpochResult {
            epoch,
            split,
            iterations: losses.len(),
            samples,
            wall_s: wall,
            storage_stage_s: times.mean_storage(),
            compute_stage_s: times.mean_compute(),
            starved_s: times.starved,
            predicted: None,
            bytes_received: traffic.bytes,
            requests: traffic.requests,
            retries: self.client.as_ref().map_or(0, |c| c.retries()) - retries_before,
            server: traffic.server,
            train_loss: if losses.is_empty() {
                f64::NAN
            } else {
                losses.iter().sum::<f64>() / losses.len() as f64
            },
            step_losses: losses,
            test_accuracy: None,
            test_s: None,
            skipped: traffic.skipped,
            from_cache: cached,
            replanned: None,
        })
    }

    /// Test accuracy at `split`, and the test objects skipped as bad.
    pub fn evaluate(&mut self, split: Split) -> anyhow::Result<(f64, Vec<String>)> {
        let batches: Vec<Vec<Sample>> = self
            .data
            .test
            .chunks(self.cfg.batch)
            .map(<[Sample]>::to_vec)
            .collect();
        let pb = self.progress(batches.len(), "test".into());
        let mut correct = 0i64;
        let mut total = 0i64;
        let (_, traffic, _) = self.feed(split, batches, &pb, true, |head, x, y| {
            correct += head.correct(x, y);
            total += x.size()[0];
            Ok(())
        })?;
        pb.finish_and_clear();
        Ok((correct as f64 / total.max(1) as f64, traffic.skipped))
    }

    fn fingerprint(&self) -> String {
        let c = &self.cfg;
        format!(
            "model={} freeze={} classes={:?} train={} test={} seed={} batch={} opt={:?} lr={} first={:?}",
            c.model,
            self.freeze,
            self.data.classes,
            self.data.train.len(),
            self.data.test.len(),
            c.seed,
            c.batch,
            c.optimizer,
            c.lr,
            self.data.train.first().map(|s| &s.key),
        ) + &match c.wire_dtype {
            WireDtype::F32 => String::new(),
            other => format!(" wire={other}"),
        }
    }

    /// Runs the whole job.
    pub fn run(mut self) -> anyhow::Result<Results> {
        let device = format!("{:?}", self.device);
        let mut results = Results {
            config: self.cfg.clone(),
            device,
            classes: self.data.classes.clone(),
            train_samples: self.data.train.len(),
            test_samples: self.data.test.len(),
            freeze: self.freeze,
            trainable_params: self.head.num_params(),
            plan: None,
            epochs: Vec::new(),
            skipped_total: 0,
        };
        let mut split = self.fixed_split(self.cfg.split);
        let mut start_epoch = 0;
        if self.cfg.resume {
            if let Some((dir, state)) = self.latest_checkpoint()? {
                self.head.load(&dir)?;
                start_epoch = state.epochs_done;
                split = state.split;
                results.epochs = state.results.epochs;
                results.plan = state.results.plan;
                eprintln!(
                    "resuming after epoch {start_epoch} from {} (split {split})",
                    dir.display()
                );
            } else {
                eprintln!("--resume: no checkpoint yet; starting from the beginning");
            }
        }
        let mut costs = None;
        if self.cfg.split == SplitArg::Auto && results.plan.is_none() && self.all_stored() {
            eprintln!(
                "every sample's features are in the feature store: nothing to extract, no split to choose"
            );
        } else if self.cfg.split == SplitArg::Auto {
            let report = match results.plan.clone() {
                Some(p) => p,
                None => {
                    eprintln!("profiling both tiers and the network to choose the split...");
                    let p = self.plan()?;
                    split = p.chosen;
                    p
                }
            };
            print_plan(&report);
            costs = Some(report.costs.clone());
            results.plan = Some(report);
        }
        let iters = self.iterations();
        for epoch in start_epoch..self.cfg.epochs {
            let mut r = self.train_epoch(epoch, split, iters)?;
            r.predicted = costs.as_ref().map(|c| c.estimate(split));
            if self.cfg.test && !self.data.test.is_empty() {
                let t = Instant::now();
                let (acc, skipped) = self.evaluate(split)?;
                r.test_accuracy = Some(acc);
                r.test_s = Some(t.elapsed().as_secs_f64());
                r.skipped.extend(skipped);
            }
            print_epoch(&r, self.cfg.epochs);
            if let (Some(c), Some(pred)) = (costs.as_mut(), r.predicted)
                && !r.from_cache
            {
                let drift = Drift::of(&pred, r.storage_stage_s, r.compute_stage_s);
                if drift.exceeds(self.cfg.replan_threshold) {
                    c.storage_scale *= 1.0 + drift.storage;
                    c.compute_scale *= 1.0 + drift.compute;
                    let next = c.choose();
                    let note = format!(
                        "re-plan: storage stage {:+.0}%, compute stage {:+.0}% against the plan; split {split} -> {}",
                        drift.storage * 100.0,
                        drift.compute * 100.0,
                        next.split
                    );
                    eprintln!("{note}");
                    r.replanned = Some(note);
                    split = next.split;
                    if let Some(p) = results.plan.as_mut() {
                        p.costs = c.clone();
                    }
                }
            }
            results.skipped_total += r.skipped.len();
            results.epochs.push(r);
            self.write_checkpoint(epoch + 1, split, &results)?;
            if let Some(out) = &self.cfg.out {
                write_json(out, &results)?;
            }
        }
        Ok(results)
    }

    fn latest_checkpoint(&self) -> anyhow::Result<Option<(PathBuf, CheckpointState)>> {
        let Some(dir) = &self.cfg.checkpoint else {
            bail!("--resume needs --checkpoint DIR");
        };
        let mut best: Option<(usize, PathBuf)> = None;
        if dir.is_dir() {
            for e in std::fs::read_dir(dir)? {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(n) = name
                    .strip_prefix("epoch-")
                    .and_then(|n| n.parse::<usize>().ok())
                    && best.as_ref().is_none_or(|(b, _)| n > *b)
                {
                    best = Some((n, e.path()));
                }
            }
        }
        let Some((_, path)) = best else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path.join("state.json"))
            .with_context(|| format!("reading {}", path.join("state.json").display()))?;
        let state: CheckpointState = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", path.join("state.json").display()))?;
        let mine = self.fingerprint();
        if state.fingerprint != mine {
            bail!(
                "the checkpoint in {} is from a different job:\n  it has: {}\n  this job: {mine}",
                path.display(),
                state.fingerprint
            );
        }
        Ok(Some((path, state)))
    }

    /// Writes `epoch-NNNN/` atomically (a temporary directory renamed into place) and removes
    /// older epochs.
    fn write_checkpoint(
        &self,
        epochs_done: usize,
        split: Split,
        results: &Results,
    ) -> anyhow::Result<()> {
        let Some(dir) = &self.cfg.checkpoint else {
            return Ok(());
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".epoch-{epochs_done:04}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        self.head.save(&tmp)?;
        let state = CheckpointState {
            fingerprint: self.fingerprint(),
            epochs_done,
            results: results.clone(),
            split,
        };
        std::fs::write(tmp.join("state.json"), serde_json::to_vec_pretty(&state)?)?;
        let final_dir = dir.join(format!("epoch-{epochs_done:04}"));
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&tmp, &final_dir)
            .with_context(|| format!("moving the checkpoint into {}", final_dir.display()))?;
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("epoch-")
                .and_then(|n| n.parse::<usize>().ok())
                && n < epochs_done
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(())
    }
}

/// Opens the job's folder of the feature store under `root` and reads what it holds of the data
/// set (the features of samples whose object has not changed since).
fn open_feature_store(
    root: &Path,
    cfg: &JobConfig,
    pkg: &ModelPackage,
    freeze: usize,
    data: &Dataset,
) -> anyhow::Result<(FeatureStore, HashMap<String, Vec<f32>>)> {
    let store = if cfg.store.contains("://") {
        format!(
            "{} (endpoint {})",
            cfg.store,
            std::env::var("AWS_ENDPOINT").unwrap_or_default()
        )
    } else {
        std::fs::canonicalize(&cfg.store)
            .map_or_else(|_| cfg.store.clone(), |p| p.display().to_string())
    };
    let identity = Identity {
        store,
        bucket: cfg.bucket.clone(),
        function: cfg.function.clone(),
        model: cfg.model.clone(),
        package_digest: features::package_digest(pkg, freeze)?,
        freeze,
        dtype: cfg.wire_dtype.name().into(),
        sample_shape: pkg.manifest().layers[freeze].input_shape.clone(),
    };
    let fs = FeatureStore::open(root, identity)?;
    let all: Vec<Sample> = data.train.iter().chain(&data.test).cloned().collect();
    let loaded = fs.load(&all);
    for w in &loaded.warnings {
        eprintln!("feature store: {w}");
    }
    eprintln!(
        "feature store {}: {} of {} samples stored{}",
        fs.dir().display(),
        loaded.features.len(),
        all.len(),
        if loaded.stale > 0 {
            format!(" ({} objects changed since: extracted again)", loaded.stale)
        } else {
            String::new()
        }
    );
    Ok((fs, loaded.features))
}

/// Writes `value` as pretty JSON, atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `MemAvailable` from /proc/meminfo (the compute tier's memory limit unless given).
fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb * 1024)
}

fn ms(s: f64) -> String {
    format!("{:.1}", s * 1e3)
}

/// Prints the plan: measured inputs and every split's estimate.
pub fn print_plan(p: &PlanReport) {
    let c = &p.costs;
    eprintln!(
        "plan ({:.1} s of probing): bandwidth {:.1} MB/s, request latency {} ms, host decode {} ms/sample, local decode {} ms/sample, store read {:.1} MB/s, head step {} ms",
        p.probe_s,
        c.bandwidth / 1e6,
        ms(c.latency),
        ms(c.host_decode),
        ms(c.local_decode),
        c.store_bandwidth / 1e6,
        ms(c.head_step),
    );
    eprintln!("  split  storage ms/it  compute ms/it  epoch s  MB/it   fits");
    for e in &p.estimates {
        let mb = match e.split {
            Split::None => c.object_bytes * c.batch as f64 / 1e6,
            Split::At(s) => (c.bytes_at[s] * c.batch as u64) as f64 / 1e6,
        };
        eprintln!(
            "  {:>5}  {:>13}  {:>13}  {:>7.2}  {:>6.2}  {}{}",
            e.split.to_string(),
            ms(e.storage),
            ms(e.compute),
            e.epoch,
            mb,
            if e.fits { "yes" } else { "no" },
            if e.split == p.chosen {
                "  <- chosen"
            } else {
                ""
            },
        );
    }
    print_probes(p);
}

fn print_probes(p: &PlanReport) {
    for probe in &p.probes {
        eprintln!(
            "  probe {:>5}: storage {} ms/it, compute {} ms/it (predicted {} / {}), epoch {:.2} s{}",
            probe.split.to_string(),
            ms(probe.storage_s),
            ms(probe.compute_s),
            ms(probe.predicted.storage),
            ms(probe.predicted.compute),
            probe.epoch_s,
            if probe.split == p.chosen {
                "  <- chosen"
            } else {
                ""
            },
        );
    }
}

fn print_epoch(r: &EpochResult, epochs: usize) {
    let pred = r.predicted.map_or_else(String::new, |p| {
        format!(" (predicted {} / {} ms)", ms(p.storage), ms(p.compute))
    });
    eprintln!(
        "epoch {}/{epochs}: split {}, {} it, {:.1} s, {:.0} samples/s, storage stage {} ms/it, compute stage {} ms/it{pred}, {:.1} MB received, loss {:.4}{}{}{}",
        r.epoch + 1,
        r.split,
        r.iterations,
        r.wall_s,
        r.samples as f64 / r.wall_s.max(1e-9),
        ms(r.storage_stage_s),
        ms(r.compute_stage_s),
        r.bytes_received as f64 / 1e6,
        r.train_loss,
        r.test_accuracy.map_or_else(String::new, |a| format!(
            ", test accuracy {:.2}%",
            a * 100.0
        )),
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", {} bad objects skipped", r.skipped.len())
        },
        if r.from_cache {
            ", features from memory or the feature store"
        } else {
            ""
        },
    );
}

/// One split's measured time in a sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepCase {
    pub split: Split,
    pub seconds: f64,
    pub storage_stage_s: f64,
    pub compute_stage_s: f64,
    pub bytes_received: u64,
    pub predicted: Estimate,
}

/// Every split measured for a fixed number of iterations, and the planner's choice.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepResults {
    pub model: String,
    pub batch: usize,
    pub iterations: usize,
    pub freeze: usize,
    pub cases: Vec<SweepCase>,
    pub best: Split,
    pub best_s: f64,
    /// The planner's choice and its own run's time (profiling not included; see `plan.probe_s`).
    pub auto: Split,
    pub auto_s: f64,
    pub none_s: f64,
    pub plan: PlanReport,
}

impl Job {
    /// `--sweep`: plans as `auto` would, then runs `none` and every split 0..=freeze for the
    /// job's iteration count (`--max-iters`), then the planner's choice again as `auto`'s run.
    pub fn sweep(mut self) -> anyhow::Result<SweepResults> {
        let iters = self.iterations();
        eprintln!("sweep: planning as --split auto would");
        let plan = self.plan()?;
        print_plan(&plan);
        let mut cases = Vec::new();
        let candidates: Vec<Split> = std::iter::once(Split::None)
            .chain((0..=self.freeze).map(Split::At))
            .collect();
        for split in candidates {
            let r = self.train_epoch(0, split, iters)?;
            let predicted = plan.costs.estimate(split);
            eprintln!(
                "sweep: split {split:>4}: {:.2} s for {iters} it (predicted {:.2} s), storage {} / compute {} ms/it, {:.1} MB",
                r.wall_s,
                predicted.epoch,
                ms(r.storage_stage_s),
                ms(r.compute_stage_s),
                r.bytes_received as f64 / 1e6
            );
            cases.push(SweepCase {
                split,
                seconds: r.wall_s,
                storage_stage_s: r.storage_stage_s,
                compute_stage_s: r.compute_stage_s,
                bytes_received: r.bytes_received,
                predicted,
            });
        }
        let auto = self.train_epoch(0, plan.chosen, iters)?;
        let best = cases
            .iter()
            .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .context("no cases")?;
        let none_s = cases.first().map_or(f64::NAN, |c| c.seconds);
        Ok(SweepResults {
            model: self.cfg.model.clone(),
            batch: self.cfg.batch,
            iterations: iters,
            freeze: self.freeze,
            best: best.split,
            best_s: best.seconds,
            auto: plan.chosen,
            auto_s: auto.wall_s,
            none_s,
            cases,
            plan,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{PLAUSIBLE, probe_candidates};
    use crate::plan::{Estimate, Split};

    fn est(split: Split, epoch: f64) -> Estimate {
        Estimate {
            split,
            storage: epoch,
            compute: 0.0,
            epoch,
            memory: 0,
            fits: true,
        }
    }

    #[test]
    fn probes_spread_over_the_plausible_splits_and_start_with_the_best() {
        // Splits 9..=25: the model likes 25 best; 9..=19 and 22..=24 are plausible.
        let mut all = vec![est(Split::None, 10.0)];
        for s in 0..=25 {
            let e = match s {
                25 => 3.88,
                22..=24 => 3.9,
                9..=19 => 4.4,
                _ => 9.0,
            };
            all.push(est(Split::At(s), e));
        }
        let c = probe_candidates(&all);
        let splits: Vec<Split> = c.iter().map(|e| e.split).collect();
        assert_eq!(splits[0], Split::At(25));
        assert_eq!(splits.len(), 4, "{splits:?}");
        assert!(splits.contains(&Split::At(9)), "{splits:?}");
        assert!(c.iter().all(|e| e.epoch <= 3.88 * PLAUSIBLE));
        // Nothing else plausible: only the best.
        let c = probe_candidates(&[est(Split::None, 10.0), est(Split::At(3), 2.0)]);
        assert_eq!(c.len(), 1);
    }
}

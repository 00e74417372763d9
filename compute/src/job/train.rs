//! The job itself: opening it (model, data, hosts, feature store), feeding batches through the
//! pipeline, training epochs, evaluating, and the whole run.

use crate::adapt::{AdaptConfig, Adaptive, Choice};
use crate::dataset::{Dataset, Limits, Sample, epoch_order};
use crate::features::{self, FeatureStore, Identity};
use crate::head::Head;
use crate::pipeline::{self, Iteration, StageTimes, Until};
use crate::plan::Split;
use crate::source::{Fetched, Source};
use anyhow::{Context, bail};
use hapi_client::{RetryPolicy, StorageClient};
use hapi_model::ModelPackage;
use indicatif::{ProgressBar, ProgressStyle};
use object_store::ObjectStore;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tch::{Device, Tensor};
use tokio::runtime::Runtime;

use super::config::{EpochResult, JobConfig, Results, SplitArg};
use super::report::{print_epoch, print_plan, write_json};

/// A job ready to run.
pub struct Job {
    pub(super) cfg: JobConfig,
    pub(super) rt: Arc<Runtime>,
    pub(super) pkg: Arc<ModelPackage>,
    pub(super) freeze: usize,
    pub(super) device: Device,
    pub(super) data: Dataset,
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) client: Option<Arc<StorageClient>>,
    /// With `--locality`, where the hosts' volumes are.
    pub(super) placement: Option<Arc<crate::source::Placement>>,
    pub(super) head: Head,
    /// Frozen features (the head's input) by key, with --cache-features or --feature-store.
    pub(super) cache: HashMap<String, Vec<f32>>,
    /// With --feature-store: where features persist across jobs.
    pub(super) features: Option<FeatureStore>,
    /// Keys whose features were computed since they were last written to the feature store.
    pub(super) unsaved: Vec<String>,
    /// `--trace`: a JSON line per training iteration, written as it ends.
    pub(super) trace: Option<std::fs::File>,
    /// Training iterations so far, over all epochs.
    pub(super) iteration: usize,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A line above the progress bar, or on stderr when there is no bar to print above.
pub(super) fn log(pb: &ProgressBar, line: &str) {
    if pb.is_hidden() {
        eprintln!("{line}");
    } else {
        pb.println(line);
    }
}

/// What a pass over batches received from the storage tier or the store.
#[derive(Debug, Default)]
pub(super) struct Traffic {
    pub(super) bytes: u64,
    pub(super) requests: usize,
    pub(super) server: hapi_client::ServerTiming,
    /// Keys left out as bad (`--skip-bad`).
    pub(super) skipped: Vec<String>,
}

impl Job {
    /// Loads the model, lists the data and reaches the storage hosts.
    pub fn open(mut cfg: JobConfig) -> anyhow::Result<Self> {
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
        for c in cfg.candidates.iter().flatten() {
            if let SplitArg::At(s) = c
                && *s > freeze
            {
                bail!(
                    "--candidates: split {s} is past the freeze index {freeze}: only frozen layers can be pushed down"
                );
            }
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
        let retry = RetryPolicy {
            give_up_after: std::time::Duration::from_secs_f64(cfg.retry_secs),
            ..RetryPolicy::default()
        };
        if cfg.wire_dtype_auto {
            // Chosen before the feature store opens: the stored features depend on it.
            let bytes = crate::plan::bytes_at(&pkg, freeze, hapi_client::WireDtype::F32);
            let splits: Vec<usize> = match cfg.split {
                SplitArg::Auto => (1..=freeze).collect(),
                fixed => match fixed.named(freeze, &bytes) {
                    Split::At(s) if s > 0 => vec![s],
                    _ => Vec::new(),
                },
            };
            let (dtype, why) = if splits.is_empty() {
                (
                    hapi_client::WireDtype::F32,
                    "--wire-dtype auto: nothing pushed down is narrowed (split 0 and none send the input in f32)".to_string(),
                )
            } else {
                anyhow::ensure!(
                    !cfg.hosts.is_empty(),
                    "--wire-dtype auto looks at features on the storage tier: give --host, or a dtype (f32, f16, bf16, int8)"
                );
                let probe = StorageClient::new(
                    cfg.hosts.clone(),
                    cfg.token.clone(),
                    cfg.function.clone(),
                    retry,
                )?;
                reach(&rt, &probe)?;
                super::dtype::choose(&rt, &probe, &cfg, &data.train, &splits)?
            };
            eprintln!("{why}");
            cfg.wire_dtype = dtype;
            cfg.wire_dtype_reason = Some(why);
        }
        let (features, cache) = match &cfg.feature_store {
            Some(root) => {
                let (fs, cache) = open_feature_store(root, &cfg, &pkg, freeze, &data)?;
                (Some(fs), cache)
            }
            None => (None, HashMap::new()),
        };
        // Every sample stored: the job needs no storage host (it may be down).
        let all_stored = features.is_some() && holds_every_sample(&cache, &data);
        let client = if cfg.split == SplitArg::None {
            None
        } else {
            let c = StorageClient::new(
                cfg.hosts.clone(),
                cfg.token.clone(),
                cfg.function.clone(),
                retry,
            )?
            .with_dtype(cfg.wire_dtype);
            if !all_stored {
                reach(&rt, &c)?;
            }
            Some(Arc::new(c))
        };
        let placement = match &client {
            Some(c) if cfg.locality => {
                let volumes = rt.block_on(c.host_volumes());
                let near = volumes.iter().filter(|v| v.is_some()).count();
                let total = volumes.len();
                let p = crate::source::Placement::new(volumes);
                match &p {
                    Some(_) => eprintln!(
                        "locality: {near} of {total} hosts read from a local volume server; each key goes to one beside a replica"
                    ),
                    None => eprintln!(
                        "warning: --locality: no host reads from a local volume server (host.s3.local_volume_server); requests go by load alone"
                    ),
                }
                p.map(Arc::new)
            }
            _ => None,
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
            placement,
            head,
            cache,
            features,
            unsaved: Vec::new(),
            trace: None,
            iteration: 0,
        })
    }

    /// The head's input shape for `n` samples (the frozen layers' output, batch first).
    pub(super) fn head_input_shape(&self, n: usize) -> Vec<i64> {
        std::iter::once(n as i64)
            .chain(
                self.pkg.manifest().layers[self.freeze]
                    .input_shape
                    .iter()
                    .copied(),
            )
            .collect()
    }

    pub fn dataset(&self) -> &Dataset {
        &self.data
    }

    pub fn freeze(&self) -> usize {
        self.freeze
    }

    /// A source for each split `choice` may give (pushdown splits only with a host).
    pub(super) fn sources(&self, choice: &Choice) -> anyhow::Result<HashMap<Split, Source>> {
        let mut out = HashMap::new();
        for split in choice.splits(self.freeze) {
            match self.source(split) {
                Ok(source) => {
                    out.insert(split, source);
                }
                Err(e) if matches!(choice, Choice::Fixed(_)) => return Err(e),
                Err(_) => {}
            }
        }
        Ok(out)
    }

    pub(super) fn source(&self, split: Split) -> anyhow::Result<Source> {
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
                placement: self.placement.clone(),
            },
        })
    }

    pub(super) fn iterations(&self) -> usize {
        let n = self.data.train.len().div_ceil(self.cfg.batch);
        self.cfg.max_iters.map_or(n, |m| m.min(n))
    }

    pub(super) fn to_tensor(&self, f: &Fetched) -> anyhow::Result<Tensor> {
        let shape: Vec<i64> = std::iter::once(f.labels.len() as i64)
            .chain(f.sample_shape.iter().copied())
            .collect();
        Ok(Tensor::from_slice(&f.data)
            .f_view(shape.as_slice())
            .context("batch tensor")?
            .to_device(self.device))
    }

    /// Layers [s, freeze) on this tier: the head's input.
    pub(super) fn frozen_rest(&self, split: Split, x: &Tensor) -> anyhow::Result<Tensor> {
        let start = match split {
            Split::None => 0,
            Split::At(s) => s,
        };
        Ok(self.pkg.run(start..self.freeze, x)?)
    }

    pub(super) fn progress(&self, len: usize, prefix: String) -> ProgressBar {
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
    /// the split `choice` gives each batch (layers [s, freeze) run here, and fill the cache
    /// with `--cache-features`). Returns the stage times, what came over the network, and
    /// whether the cache served. With `training` the iterations are counted and traced.
    pub(super) fn feed(
        &mut self,
        choice: &Choice,
        batches: Vec<Vec<Sample>>,
        pb: &ProgressBar,
        training: bool,
        until: Until,
        mut step: impl FnMut(&mut Head, &Tensor, &Tensor) -> anyhow::Result<()>,
    ) -> anyhow::Result<(StageTimes, Traffic, bool)> {
        let mut traffic = Traffic::default();
        let use_cache = self.cfg.cache_features || self.features.is_some();
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
                let end_unix = pipeline::now_unix();
                times.iterations.push(Iteration {
                    split: choice.current(),
                    storage_s: 0.0,
                    compute_s: started.elapsed().as_secs_f64(),
                    end_unix,
                    link_bps: None,
                });
                pb.inc(1);
                if until.reached(times.iterations.len(), end_unix) {
                    break;
                }
            }
            return Ok((times, traffic, true));
        }
        let sources = self.sources(choice)?;
        let rt = Arc::clone(&self.rt);
        let mut trace = if training { self.trace.take() } else { None };
        let mut iteration = self.iteration;
        let mut trace_error = None;
        let times = pipeline::run(
            &rt,
            sources,
            choice,
            batches,
            pipeline::Ahead {
                until,
                prefetch: self.cfg.prefetch,
                // With several hosts, the batches ahead are fetched at once, so that every
                // host has requests and none idles while another finishes a batch; with one,
                // one at a time (its storage stage is the host, its times each batch's own).
                fetch_ahead: if self.cfg.hosts.len() > 1 {
                    self.cfg.prefetch + 1
                } else {
                    1
                },
            },
            |mut f, split| {
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
            },
            |it| {
                if let Some(file) = trace.as_mut()
                    && trace_error.is_none()
                {
                    let line = serde_json::json!({
                        "iteration": iteration,
                        "split": it.split,
                        "storage_s": it.storage_s,
                        "compute_s": it.compute_s,
                        "end_unix": it.end_unix,
                        "link_bps": it.link_bps,
                    });
                    if let Err(e) = writeln!(file, "{line}").and_then(|()| file.flush()) {
                        trace_error = Some(e);
                    }
                }
                if training {
                    iteration += 1;
                }
            },
        );
        if training {
            self.trace = trace;
            self.iteration = iteration;
        }
        let times = times?;
        if let Some(e) = trace_error {
            bail!("writing --trace: {e}");
        }
        self.save_features(pb);
        Ok((times, traffic, false))
    }

    /// Trains one epoch, each batch at the split `choice` gives; `iters` batches of the
    /// epoch's order.
    pub fn train_epoch(
        &mut self,
        epoch: usize,
        choice: &Choice,
        iters: usize,
    ) -> anyhow::Result<EpochResult> {
        let batches = self.epoch_batches(epoch, iters);
        self.train_batches(epoch, choice, batches)
    }

    /// The first `iters` batches of epoch `epoch`'s order.
    pub(super) fn epoch_batches(&self, epoch: usize, iters: usize) -> Vec<Vec<Sample>> {
        epoch_order(self.data.train.len(), self.cfg.seed, epoch)
            .chunks(self.cfg.batch)
            .take(iters)
            .map(|c| c.iter().map(|&i| self.data.train[i].clone()).collect())
            .collect()
    }

    /// Trains on `batches` as epoch `epoch`, each at the split `choice` gives.
    pub(super) fn train_batches(
        &mut self,
        epoch: usize,
        choice: &Choice,
        batches: Vec<Vec<Sample>>,
    ) -> anyhow::Result<EpochResult> {
        self.train_until(epoch, choice, batches, Until::END)
    }

    /// [`Self::train_batches`], ending early at `until` (the sweep's measuring runs).
    pub(super) fn train_until(
        &mut self,
        epoch: usize,
        choice: &Choice,
        batches: Vec<Vec<Sample>>,
        until: Until,
    ) -> anyhow::Result<EpochResult> {
        let pb = self.progress(batches.len(), format!("epoch {}", epoch + 1));
        let started = Instant::now();
        let first_iteration = self.iteration;
        let moves_before = choice.moves().len();
        let mut losses = Vec::with_capacity(batches.len());
        let mut samples = 0usize;
        let retries_before = self.client.as_ref().map_or(0, |c| c.retries());
        let hedges_before = self.client.as_ref().map_or(0, |c| c.hedges());
        let (times, traffic, cached) =
            self.feed(choice, batches, &pb, true, until, |head, x, y| {
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
        let moves = choice.moves().split_off(moves_before);
        for m in &moves {
            log(
                &pb,
                &format!("split: iteration {}: {}", m.iteration, m.reason),
            );
        }
        Ok(EpochResult {
            epoch,
            split: times.main_split().unwrap_or_else(|| choice.current()),
            iterations: losses.len(),
            first_iteration,
            samples,
            wall_s: wall,
            storage_stage_s: times.mean_storage(),
            compute_stage_s: times.mean_compute(),
            starved_s: times.starved,
            predicted: None,
            bytes_received: traffic.bytes,
            requests: traffic.requests,
            retries: self.client.as_ref().map_or(0, |c| c.retries()) - retries_before,
            hedges: self.client.as_ref().map_or(0, |c| c.hedges()) - hedges_before,
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
            moves,
            trace: if cached { Vec::new() } else { times.iterations },
        })
    }

    /// Test accuracy at `split`, and the test objects skipped as bad.
    pub fn evaluate(&mut self, split: Split) -> anyhow::Result<(f64, Vec<String>)> {
        let choice = Choice::Fixed(split);
        let batches: Vec<Vec<Sample>> = self
            .data
            .test
            .chunks(self.cfg.batch)
            .map(<[Sample]>::to_vec)
            .collect();
        let pb = self.progress(batches.len(), "test".into());
        let mut correct = 0i64;
        let mut total = 0i64;
        let (_, traffic, _) =
            self.feed(&choice, batches, &pb, false, Until::END, |head, x, y| {
                correct += head.correct(x, y);
                total += x.size()[0];
                Ok(())
            })?;
        pb.finish_and_clear();
        Ok((correct as f64 / total.max(1) as f64, traffic.skipped))
    }

    /// The chooser for `--split auto`: online adaptation seeded by the plan's model.
    pub(super) fn adaptive(&self, costs: &crate::plan::Costs) -> Choice {
        let only: Option<Vec<Split>> = self
            .cfg
            .candidates
            .as_ref()
            .map(|c| c.iter().map(|&a| self.fixed_split(a)).collect());
        Choice::Adaptive(Arc::new(Mutex::new(Adaptive::new(
            costs.clone(),
            AdaptConfig::new(self.cfg.replan_threshold),
            only.as_deref(),
        ))))
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
        if let Some(path) = &self.cfg.trace {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--trace {}", path.display()))?;
            self.trace = Some(file);
        }
        let mut split = self.fixed_split(self.cfg.split);
        let mut start_epoch = 0;
        if self.cfg.resume {
            if let Some((dir, state)) = self.latest_checkpoint()? {
                self.head.load(&dir)?;
                start_epoch = state.epochs_done;
                split = state.split;
                results.epochs = state.results.epochs;
                results.plan = state.results.plan;
                self.iteration = results.epochs.iter().map(|e| e.iterations).sum();
                eprintln!(
                    "resuming after epoch {start_epoch} from {} (split {split})",
                    dir.display()
                );
            } else {
                eprintln!("--resume: no checkpoint yet; starting from the beginning");
            }
        }
        let mut choice = Choice::Fixed(split);
        if self.cfg.split == SplitArg::Auto && results.plan.is_none() && self.all_stored() {
            eprintln!(
                "every sample's features are in the feature store: nothing to extract, no split to choose"
            );
        } else if self.cfg.split == SplitArg::Auto {
            let report = match results.plan.clone() {
                Some(p) => p,
                None => {
                    eprintln!("profiling both tiers and the network to rank the splits...");
                    self.plan()?
                }
            };
            print_plan(&report);
            choice = self.adaptive(&report.costs);
            results.plan = Some(report);
        }
        let iters = self.iterations();
        for epoch in start_epoch..self.cfg.epochs {
            let mut r = self.train_epoch(epoch, &choice, iters)?;
            if let (Some(p), Some(a)) = (results.plan.as_mut(), choice.adaptive()) {
                r.predicted = Some(a.costs().estimate(r.split));
                // Resuming starts from the model as calibrated so far.
                p.costs = a.costs().clone();
            }
            let current = choice.current();
            if self.cfg.test && !self.data.test.is_empty() {
                let t = Instant::now();
                let (acc, skipped) = self.evaluate(current)?;
                r.test_accuracy = Some(acc);
                r.test_s = Some(t.elapsed().as_secs_f64());
                r.skipped.extend(skipped);
            }
            print_epoch(&r, self.cfg.epochs);
            if let Some(c) = self.client.as_ref().filter(|c| c.hosts().len() > 1) {
                super::report::print_hosts(&c.host_stats(), r.hedges);
            }
            results.skipped_total += r.skipped.len();
            results.epochs.push(r);
            self.write_checkpoint(epoch + 1, current, &results)?;
            if let Some(out) = &self.cfg.out {
                write_json(out, &results)?;
            }
        }
        Ok(results)
    }
}

/// `MemAvailable` from /proc/meminfo (the compute tier's memory limit unless given).
pub(super) fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb * 1024)
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
    let loaded = fs.load(data.train.iter().chain(&data.test));
    for w in &loaded.warnings {
        eprintln!("feature store: {w}");
    }
    eprintln!(
        "feature store {}: {} of {} samples stored{}",
        fs.dir().display(),
        loaded.features.len(),
        data.train.len() + data.test.len(),
        if loaded.stale > 0 {
            format!(" ({} objects changed since: extracted again)", loaded.stale)
        } else {
            String::new()
        }
    );
    Ok((fs, loaded.features))
}

/// Whether `cache` holds the features of every training and test sample.
pub(super) fn holds_every_sample(cache: &HashMap<String, Vec<f32>>, data: &Dataset) -> bool {
    data.train
        .iter()
        .chain(&data.test)
        .all(|s| cache.contains_key(&s.key))
}

/// Checks that the storage hosts answer; one that does not is left out (and probed) with a
/// warning while another does; none answering is the error.
fn reach(rt: &Runtime, client: &StorageClient) -> anyhow::Result<()> {
    for down in rt.block_on(client.check_reachable())? {
        eprintln!("warning: {down}; going on without it until it answers /healthz");
    }
    Ok(())
}

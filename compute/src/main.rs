//! `hapi-train`: run a transfer-learning job against one or more `hapi-host` storage tiers.

use clap::{Parser, ValueEnum};
use hapi_train::head::OptimizerKind;
use hapi_train::job::{Job, JobConfig, SplitArg, write_json};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Opt {
    Sgd,
    Adam,
}

/// Transfer learning with near-data feature extraction: layers [0, s) run as a pushdown
/// function on the storage tier (`hapi-host`), layers [s, freeze) and the new head
/// [freeze, end) run here.
///
/// Exit codes: 0 done; 1 other error; 2 usage; 3 a storage host is not reachable at start;
/// 4 a stored object is missing or corrupt (without --skip-bad); 5 the storage tier kept
/// failing past --retry-for, or answered a time or memory limit; 6 the storage tier refused a
/// request (a wrong token, a function or model the tenant lacks, a body over a limit, a
/// segment that never fits its device).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Storage host URL; repeat for several hosts (each request goes to the least loaded for
    /// its speed; a failing host is left out and probed until it answers). Default, when
    /// neither this nor --hosts-file is given: http://127.0.0.1:8080.
    #[arg(long = "host", env = "HAPI_HOSTS", value_delimiter = ',')]
    hosts: Vec<String>,
    /// A file of storage host URLs, one per line (blank lines and `#` comments ignored), added
    /// to --host.
    #[arg(long, value_name = "FILE")]
    hosts_file: Option<PathBuf>,
    /// Bearer token of this tenant on the storage hosts.
    #[arg(long, env = "HAPI_TOKEN", default_value = "", hide_env_values = true)]
    token: String,
    /// The tenant's pushdown function on the hosts.
    #[arg(long, default_value = "feature-extract")]
    function: String,
    /// Object store root as this machine reaches it: a directory whose subdirectories are
    /// buckets, or `s3://` (endpoint and credentials from AWS_* variables). Used for listing
    /// the data set and by `--split none`.
    #[arg(long, default_value = "data/store")]
    store: String,
    #[arg(long, default_value = "datasets")]
    bucket: String,
    /// Data set prefix in the bucket: `<prefix>/{train,test}/<class>/<object>`.
    #[arg(long, default_value = "fashion-mnist")]
    prefix: String,
    /// Model packages directory (default: $HAPI_MODELS, else .hapi/models).
    #[arg(long)]
    models: Option<PathBuf>,
    #[arg(long, default_value = "efficientnet_lite0")]
    model: String,
    /// Freeze index: layers [0, freeze) stay frozen (default: the package's).
    #[arg(long)]
    freeze: Option<usize>,
    /// Training batch size.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    #[arg(long, value_enum, default_value = "adam")]
    optimizer: Opt,
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to cut: auto (measure and choose), none (no pushdown), freeze (push every frozen
    /// layer), min (push to the smallest output), or a layer index s (layers [0, s) on storage).
    #[arg(long, default_value = "auto")]
    split: SplitArg,
    /// Batches fetched ahead of the one being trained. With several hosts, these and the next
    /// are fetched at once, so that no host's link idles while another finishes a batch.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Object keys per storage request.
    #[arg(long, default_value_t = 8)]
    request_size: usize,
    /// Storage requests in flight per batch.
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Send each key to a host beside a replica of it: the hosts whose policy names their
    /// SeaweedFS volume server (`host.s3.local_volume_server`) say which volumes they hold, and
    /// one of them tells each batch's keys' volumes. Without it, requests go by load alone.
    #[arg(long)]
    locality: bool,
    /// Use at most this many training samples (a seeded subset).
    #[arg(long)]
    train_limit: Option<usize>,
    #[arg(long)]
    test_limit: Option<usize>,
    /// Stop each epoch after this many iterations.
    #[arg(long)]
    max_iters: Option<usize>,
    /// Skip the test-set evaluation after each epoch.
    #[arg(long)]
    no_test: bool,
    /// Leave missing or corrupt objects out (counted in the results) instead of failing.
    #[arg(long)]
    skip_bad: bool,
    /// Keep retrying a failing storage request this long (seconds) before giving up.
    #[arg(long, default_value_t = 120.0)]
    retry_for: f64,
    /// Compute-tier device: auto, cpu, cuda or cuda:N.
    #[arg(long, env = "HAPI_DEVICE", default_value = "auto")]
    device: String,
    /// Compute-tier memory available to the job, bytes (default: MemAvailable).
    #[arg(long)]
    memory_limit: Option<u64>,
    /// With --split auto: explore the splits again when the median cost of recent iterations
    /// at the split in use moves more than this fraction from what it was when chosen.
    #[arg(long, default_value_t = 0.2)]
    replan_threshold: f64,
    /// With --split auto: explore these splits (comma-separated: none, freeze, min or layer
    /// indices) instead of the model's best few.
    #[arg(long, value_delimiter = ',')]
    candidates: Option<Vec<SplitArg>>,
    /// Append a JSON line per training iteration to FILE as it ends (split, storage and
    /// compute stage seconds, end time).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Keep the frozen features of every sample after the first epoch and train later epochs
    /// from them (no storage traffic; the frozen layers are deterministic).
    #[arg(long)]
    cache_features: bool,
    /// Keep the frozen features in DIR and reuse them in any later job on the same objects,
    /// model, freeze index and function, so that a sweep of heads or learning rates extracts
    /// once (implies --cache-features; an object changed since is extracted again).
    #[arg(long, value_name = "DIR")]
    feature_store: Option<PathBuf>,
    /// Keep the feature store's shards (every model and data set in DIR) within SIZE (e.g.
    /// 20GiB, 500MB): after a job adds features, the least recently used shards go.
    #[arg(long, value_name = "SIZE", value_parser = hapi_wire::units::parse_size, requires = "feature_store")]
    feature_store_cap: Option<u64>,
    /// Element type of pushed-down features on the network: f32, f16 or bf16 (half the bytes;
    /// narrowed on the storage tier's device, widened here), int8 (about a quarter: the storage
    /// host quantizes the f32 output with per-channel scales), or auto (f16 where a few
    /// objects' features fit its range with 16x to spare, else bf16). Split 0 and `none` stay
    /// f32.
    #[arg(long, default_value = "f32", value_parser = parse_wire_dtype)]
    wire_dtype: DtypeArg,
    /// Directory for per-epoch checkpoints.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Continue from the newest checkpoint in --checkpoint.
    #[arg(long)]
    resume: bool,
    /// Results JSON (per-epoch times, stage times, bytes, split, loss, accuracy).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Measure `none` and every split for --max-iters iterations, then --split auto's online
    /// adaptation for --adaptive-iters (the split-choice evaluation); writes the sweep to --out.
    #[arg(long)]
    sweep: bool,
    /// With --sweep: iterations of the adaptive run (default: 10 times --max-iters).
    #[arg(long)]
    adaptive_iters: Option<usize>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

/// `--wire-dtype`.
#[derive(Clone, Copy, Debug)]
enum DtypeArg {
    Auto,
    Fixed(hapi_train::client::WireDtype),
}

fn parse_wire_dtype(s: &str) -> Result<DtypeArg, String> {
    if s == "auto" {
        Ok(DtypeArg::Auto)
    } else {
        s.parse()
            .map(DtypeArg::Fixed)
            .map_err(|e: String| format!("{e}, or auto"))
    }
}

/// The storage host when none is given.
const DEFAULT_HOST: &str = "http://127.0.0.1:8080";

/// Host URLs from `path`: one per line, blank lines and `#` comments ignored; each must be an
/// http(s) URL.
fn read_hosts_file(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--hosts-file {}: {e}", path.display()))?;
    let mut hosts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        anyhow::ensure!(
            line.starts_with("http://") || line.starts_with("https://"),
            "--hosts-file {} line {}: `{line}` is not an http:// or https:// URL",
            path.display(),
            n + 1
        );
        hosts.push(line.to_string());
    }
    anyhow::ensure!(
        !hosts.is_empty(),
        "--hosts-file {}: no host URL in it",
        path.display()
    );
    Ok(hosts)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hapi-train: error: {e:#}");
            ExitCode::from(hapi_train::exit_code(&e))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let optimizer = match cli.optimizer {
        Opt::Sgd => OptimizerKind::Sgd {
            momentum: cli.momentum,
            weight_decay: cli.weight_decay,
        },
        Opt::Adam => OptimizerKind::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: cli.weight_decay,
        },
    };
    if cli.sweep && cli.max_iters.is_none() {
        anyhow::bail!("--sweep needs --max-iters N (iterations per split)");
    }
    if cli.candidates.is_some() && cli.split != SplitArg::Auto {
        anyhow::bail!("--candidates is for --split auto (it lists the splits to explore)");
    }
    if cli.candidates.as_ref().is_some_and(Vec::is_empty) {
        anyhow::bail!("--candidates: give at least one split");
    }
    if cli
        .candidates
        .as_ref()
        .is_some_and(|c| c.contains(&SplitArg::Auto))
    {
        anyhow::bail!("--candidates: `auto` is not a split");
    }
    let mut hosts = cli.hosts;
    if let Some(file) = &cli.hosts_file {
        hosts.extend(read_hosts_file(file)?);
    }
    if hosts.is_empty() {
        hosts.push(DEFAULT_HOST.into());
    }
    let cfg = JobConfig {
        hosts,
        token: cli.token,
        function: cli.function,
        store: cli.store,
        bucket: cli.bucket,
        prefix: cli.prefix,
        models: cli.models.unwrap_or_else(hapi_model::models_dir),
        model: cli.model,
        freeze: cli.freeze,
        batch: cli.batch,
        epochs: cli.epochs,
        optimizer,
        lr: cli.lr,
        seed: cli.seed,
        split: cli.split,
        candidates: cli.candidates.clone(),
        prefetch: cli.prefetch,
        request_size: cli.request_size,
        in_flight: cli.in_flight,
        locality: cli.locality,
        train_limit: cli.train_limit,
        test_limit: cli.test_limit,
        max_iters: cli.max_iters,
        test: !cli.no_test && !cli.sweep,
        skip_bad: cli.skip_bad,
        retry_secs: cli.retry_for,
        device: cli.device,
        memory_limit: cli.memory_limit,
        replan_threshold: cli.replan_threshold,
        cache_features: cli.cache_features,
        feature_store: cli.feature_store,
        feature_store_cap: cli.feature_store_cap,
        wire_dtype: match cli.wire_dtype {
            DtypeArg::Auto => Default::default(),
            DtypeArg::Fixed(d) => d,
        },
        wire_dtype_auto: matches!(cli.wire_dtype, DtypeArg::Auto),
        wire_dtype_reason: None,
        checkpoint: cli.checkpoint,
        resume: cli.resume,
        out: cli.out.clone(),
        trace: cli.trace.clone(),
        progress: !cli.quiet && std::io::stderr().is_terminal(),
    };
    let job = Job::open(cfg)?;
    eprintln!(
        "{} train / {} test samples, {} classes; freeze index {}",
        job.dataset().train.len(),
        job.dataset().test.len(),
        job.dataset().classes.len(),
        job.freeze()
    );
    if cli.sweep {
        let n = cli
            .adaptive_iters
            .unwrap_or(10 * cli.max_iters.unwrap_or(1));
        let sweep = job.sweep(n)?;
        eprintln!(
            "sweep: best fixed split {} ({:.2} s for {n} it), auto settled on {} ({:.2} s, {:.3}x best, {} it exploring), none {:.2} s",
            sweep.best,
            sweep.best_s,
            sweep.auto,
            sweep.auto_s,
            sweep.auto_s / sweep.best_s,
            sweep.explored,
            sweep.none_s
        );
        if let Some(out) = &cli.out {
            write_json(out, &sweep)?;
        }
    } else {
        let results = job.run()?;
        if let Some(out) = &cli.out {
            write_json(out, &results)?;
            eprintln!("results: {}", out.display());
        }
    }
    Ok(())
}

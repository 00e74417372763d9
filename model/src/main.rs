//! `hapi-model`: inspect, check and benchmark model packages.

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hapi_model::{ModelPackage, device, list_packages, models_dir, profile};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Device: auto (CUDA when present), cpu, cuda or cuda:N.
    #[arg(long, global = true, env = "HAPI_DEVICE", default_value = "auto")]
    device: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once per process; `import` has many flags
enum Command {
    /// Print a package's manifest as a table of layers.
    Info {
        /// Package directory.
        package: PathBuf,
    },
    /// Check packages: chaining every segment reproduces the whole model's reference output.
    Check {
        /// Package directories (default: every package in --models).
        packages: Vec<PathBuf>,
        /// Packages directory (default: $HAPI_MODELS or the checkout's .hapi/models).
        #[arg(long)]
        models: Option<PathBuf>,
        /// Only these models of --models (default: all).
        #[arg(long = "model")]
        only: Vec<String>,
    },
    /// Turn your model into a package: a TorchScript file (.pt), an ONNX file (.onnx) or a
    /// Python `module:function` returning an nn.Module, cut into layers automatically
    /// (torch.fx: wherever one tensor is live, so a residual, dense or transformer block is one
    /// layer), with its preprocessing declared; then the chained-vs-whole check. Runs the
    /// importer with $HAPI_PYTHON (`cargo xtask env` sets it), else python3.
    Import {
        /// A .pt/.pth TorchScript file, an .onnx file, or module:function.
        source: String,
        /// Package name: lowercase letters, digits, `_` (graph names are `<name>[a..b]`).
        #[arg(long)]
        name: String,
        /// Models directory to write the package into (default: $HAPI_MODELS or .hapi/models).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The model's channel order: rgb or bgr.
        #[arg(long, default_value = "rgb")]
        channel_order: String,
        /// The model's input layout: nchw or nhwc.
        #[arg(long, default_value = "nchw")]
        layout: String,
        /// Pixel unit before normalisation: 1 ([0, 1]) or 255 ([0, 255]).
        #[arg(long, default_value = "1")]
        scale: String,
        /// Per-channel mean, in the model's channel order and pixel unit.
        #[arg(long, default_value = "0.485,0.456,0.406")]
        mean: String,
        /// Per-channel standard deviation, likewise.
        #[arg(long, default_value = "0.229,0.224,0.225")]
        std: String,
        /// shorter (keep the aspect ratio, then centre-crop) or squash (to size x size).
        #[arg(long, default_value = "shorter")]
        resize: String,
        /// Resize target in pixels.
        #[arg(long, default_value_t = 256)]
        size: u32,
        /// Centre crop: the model's input height and width.
        #[arg(long, default_value_t = 224)]
        crop: u32,
        /// bilinear or bicubic (antialiased, as Pillow and torchvision compute them).
        #[arg(long, default_value = "bilinear")]
        interpolation: String,
        /// Cut only after these torch.fx nodes (comma-separated).
        #[arg(long)]
        cut_at: Option<String>,
        /// Merge neighbouring layers down to this many.
        #[arg(long)]
        max_layers: Option<u32>,
        /// Layers [0, k) are frozen (default: all but the last, the classifier).
        #[arg(long)]
        freeze_index: Option<u32>,
        /// Shown in listings (default: the name).
        #[arg(long)]
        display_name: Option<String>,
        /// A file with one class label per line.
        #[arg(long)]
        labels: Option<PathBuf>,
        /// Replace an existing package of that name.
        #[arg(long)]
        force: bool,
    },
    /// Per-layer forward time per sample and output bytes per sample, for each model.
    Bench {
        #[arg(long)]
        models: Option<PathBuf>,
        #[arg(long = "model")]
        only: Vec<String>,
        /// Batch sizes to time (repeatable).
        #[arg(long = "batch", default_values_t = [1, 32])]
        batches: Vec<i64>,
        /// Timed repetitions per layer and batch (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// The chained-vs-whole check of each package: running every layer in turn on the package's
/// reference input gives the whole model's reference output (within 1e-5 of its magnitude).
fn check(dirs: &[PathBuf], device: tch::Device) -> anyhow::Result<()> {
    let mut failed = 0;
    for dir in dirs {
        let pkg = ModelPackage::load(dir, device)?;
        let (input, expected) = pkg.reference()?;
        let got = pkg
            .run(0..pkg.num_layers(), &input)?
            .to_device(tch::Device::Cpu);
        let scale = expected.abs().max().double_value(&[]).max(1.0);
        let diff = (got - expected).abs().max().double_value(&[]);
        let ok = diff <= 1e-5 * scale;
        failed += usize::from(!ok);
        println!(
            "{:<20} {:>3} layers  max |chain - whole| = {diff:.2e}  {}",
            pkg.name(),
            pkg.num_layers(),
            if ok { "ok" } else { "FAILED" }
        );
    }
    if failed > 0 {
        bail!("{failed} package(s) failed the check");
    }
    Ok(())
}

/// The importer (`model/export/import_model.py` and the exporter it builds on), carried in the
/// binary and run from a temporary directory, so `hapi-model import` works outside a checkout.
mod import {
    use anyhow::{Context, bail};
    use std::process::Command;

    const IMPORTER: &str = include_str!("../export/import_model.py");
    const EXPORTER: &str = include_str!("../export/export_models.py");
    const SCHEMA: &str = include_str!("../manifest.schema.json");

    pub fn run(args: &[String]) -> anyhow::Result<()> {
        let dir = tempfile::tempdir().context("a temporary directory for the importer")?;
        std::fs::write(dir.path().join("import_model.py"), IMPORTER)?;
        std::fs::write(dir.path().join("export_models.py"), EXPORTER)?;
        std::fs::write(dir.path().join("manifest.schema.json"), SCHEMA)?;
        let python = std::env::var("HAPI_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(&python)
            .arg(dir.path().join("import_model.py"))
            .args(args)
            .status()
            .with_context(|| {
                format!("running {python} (set HAPI_PYTHON to a Python with torch: `source <(cargo xtask env)`)")
            })?;
        if !status.success() {
            bail!("the importer failed ({status})");
        }
        Ok(())
    }
}

fn packages(models: Option<PathBuf>, only: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let root = models.unwrap_or_else(models_dir);
    let all = list_packages(&root)
        .with_context(|| "listing model packages (run `cargo xtask setup`?)".to_string())?;
    let names = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
    for want in only {
        if !all
            .iter()
            .any(|p| names(p).as_deref() == Some(want.as_str()))
        {
            bail!("no package `{want}` in {}", root.display());
        }
    }
    Ok(all
        .into_iter()
        .filter(|p| only.is_empty() || names(p).is_some_and(|n| only.contains(&n)))
        .collect())
}

#[derive(Serialize)]
struct BenchLayer {
    index: usize,
    name: String,
    output_bytes_per_sample: u64,
    /// Batch size -> seconds per sample.
    seconds_per_sample: Vec<(i64, f64)>,
}

#[derive(Serialize)]
struct BenchModel {
    name: String,
    freeze_index: usize,
    input_bytes_per_sample: u64,
    layers: Vec<BenchLayer>,
}

#[derive(Serialize)]
struct BenchReport {
    device: String,
    threads: i32,
    reps: usize,
    batches: Vec<i64>,
    models: Vec<BenchModel>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let device = device::parse(&cli.device)?;
    match cli.command {
        Command::Info { package } => {
            let m = hapi_model::Manifest::load(&package)?;
            println!(
                "{} ({}), {} layers, freeze index {}",
                m.display_name,
                m.name,
                m.layers.len(),
                m.freeze_index
            );
            println!(
                "source:  {}\nlicence: {}\nweights: {}",
                m.source, m.license, m.weights
            );
            let i = &m.input;
            println!(
                "input:   {:?} ({}), resize {} ({}, {}) crop {}, {} pixels in [0, {}], mean {:?} std {:?}",
                i.shape,
                i.layout,
                i.resize,
                i.resize_mode,
                i.interpolation,
                i.crop,
                i.channel_order,
                i.scale,
                i.mean,
                i.std
            );
            println!(
                "{:>3}  {:<20} {:>20} {:>12} {:>12}",
                "#", "layer", "output", "KB/sample", "params"
            );
            for (i, l) in m.layers.iter().enumerate() {
                println!(
                    "{i:>3}  {:<20} {:>20} {:>12.1} {:>12}",
                    l.name,
                    format!("{:?}", l.output_shape),
                    l.output_bytes_per_sample() as f64 / 1024.0,
                    l.params
                );
            }
        }
        Command::Check {
            packages: dirs,
            models,
            only,
        } => {
            let dirs = if dirs.is_empty() {
                packages(models, &only)?
            } else {
                dirs
            };
            check(&dirs, device)?;
        }
        Command::Import {
            source,
            name,
            out,
            channel_order,
            layout,
            scale,
            mean,
            std,
            resize,
            size,
            crop,
            interpolation,
            cut_at,
            max_layers,
            freeze_index,
            display_name,
            labels,
            force,
        } => {
            let out = out.unwrap_or_else(models_dir);
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let mut args: Vec<String> = vec![
                source,
                "--name".into(),
                name.clone(),
                "--out".into(),
                out.display().to_string(),
            ];
            for (flag, value) in [
                ("--channel-order", channel_order),
                ("--layout", layout),
                ("--scale", scale),
                ("--mean", mean),
                ("--std", std),
                ("--resize", resize),
                ("--size", size.to_string()),
                ("--crop", crop.to_string()),
                ("--interpolation", interpolation),
            ] {
                args.extend([flag.to_string(), value]);
            }
            let optional = [
                ("--cut-at", cut_at),
                ("--max-layers", max_layers.map(|v| v.to_string())),
                ("--freeze-index", freeze_index.map(|v| v.to_string())),
                ("--display-name", display_name),
                ("--labels", labels.map(|p| p.display().to_string())),
            ];
            for (flag, value) in optional {
                if let Some(v) = value {
                    args.extend([flag.to_string(), v]);
                }
            }
            if force {
                args.push("--force".into());
            }
            import::run(&args)?;
            check(&[out.join(&name)], device)?;
        }
        Command::Bench {
            models,
            only,
            batches,
            reps,
            json,
        } => {
            if batches.iter().any(|&b| b < 1) {
                bail!("batch sizes must be at least 1");
            }
            let mut report = BenchReport {
                device: format!("{device:?}"),
                threads: tch::get_num_threads(),
                reps,
                batches: batches.clone(),
                models: Vec::new(),
            };
            for dir in packages(models, &only)? {
                let started = Instant::now();
                let pkg = ModelPackage::load(&dir, device)?;
                let m = pkg.manifest();
                let mut layers: Vec<BenchLayer> = m
                    .layers
                    .iter()
                    .enumerate()
                    .map(|(index, l)| BenchLayer {
                        index,
                        name: l.name.clone(),
                        output_bytes_per_sample: l.output_bytes_per_sample(),
                        seconds_per_sample: Vec::new(),
                    })
                    .collect();
                for &b in &batches {
                    for p in profile::profile_layers(&pkg, b, reps)? {
                        layers[p.index]
                            .seconds_per_sample
                            .push((b, p.seconds_per_sample));
                    }
                }
                let input_bytes = 4 * m.input.shape.iter().map(|&d| d as u64).product::<u64>();
                println!(
                    "\n{} ({} layers, freeze {}, input {:.0} KB/sample, {:.1}s)",
                    m.display_name,
                    m.layers.len(),
                    m.freeze_index,
                    input_bytes as f64 / 1024.0,
                    started.elapsed().as_secs_f64()
                );
                let heads: Vec<String> = batches.iter().map(|b| format!("ms/smp b={b}")).collect();
                println!(
                    "{:>3}  {:<18} {:>11}  {}",
                    "#",
                    "layer",
                    "out KB/smp",
                    heads.iter().map(|h| format!("{h:>12}")).collect::<String>()
                );
                for l in &layers {
                    let times: String = l
                        .seconds_per_sample
                        .iter()
                        .map(|(_, s)| format!("{:>12.3}", s * 1e3))
                        .collect();
                    println!(
                        "{:>3}  {:<18} {:>11.1}  {times}",
                        l.index,
                        l.name,
                        l.output_bytes_per_sample as f64 / 1024.0
                    );
                }
                let totals: String = batches
                    .iter()
                    .enumerate()
                    .map(|(k, _)| {
                        format!(
                            "{:>12.3}",
                            layers
                                .iter()
                                .map(|l| l.seconds_per_sample[k].1)
                                .sum::<f64>()
                                * 1e3
                        )
                    })
                    .collect();
                println!("{:>3}  {:<18} {:>11}  {totals}", "", "total", "");
                report.models.push(BenchModel {
                    name: m.name.clone(),
                    freeze_index: m.freeze_index,
                    input_bytes_per_sample: input_bytes,
                    layers,
                });
            }
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("\nJSON: {}", path.display());
            }
        }
    }
    Ok(())
}

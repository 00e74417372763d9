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
enum Command {
    /// Print a package's manifest as a table of layers.
    Info {
        /// Package directory.
        package: PathBuf,
    },
    /// Check packages: chaining every segment reproduces the whole model's reference output.
    Check {
        /// Packages directory (default: $HAPI_MODELS or the checkout's .hapi/models).
        #[arg(long)]
        models: Option<PathBuf>,
        /// Only these models (default: all).
        #[arg(long = "model")]
        only: Vec<String>,
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
            println!(
                "input:   {:?}, resize {} crop {}, mean {:?} std {:?}",
                m.input.shape, m.input.resize, m.input.crop, m.input.mean, m.input.std
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
        Command::Check { models, only } => {
            let mut failed = 0;
            for dir in packages(models, &only)? {
                let pkg = ModelPackage::load(&dir, device)?;
                let (input, expected) = pkg.reference()?;
                let got = pkg
                    .run(0..pkg.num_layers(), &input)?
                    .to_device(tch::Device::Cpu);
                let diff = (got - expected).abs().max().double_value(&[]);
                let ok = diff <= 1e-5;
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

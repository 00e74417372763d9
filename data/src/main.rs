//! `hapi-data`: load data sets into an object store.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hapi_data::{fashion_mnist, import, open_bucket, photos};
use object_store::path::Path;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Object store root, as `hapi-host` and `hapi-train` take it: a directory whose
    /// subdirectories are buckets (or a file:// URL of one), or `s3://` (endpoint and
    /// credentials from AWS_* environment variables).
    #[arg(long, global = true, default_value = "data/store")]
    store: String,
    /// Bucket in the store (a local bucket directory is created if missing).
    #[arg(long, global = true, default_value = "datasets")]
    bucket: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fashion-MNIST (70,000 grayscale PNGs) as <prefix>/{train,test}/<class>/<id>.png.
    FashionMnist {
        #[arg(long, default_value = "fashion-mnist")]
        prefix: String,
        /// Directory with the gzipped IDX files (Debian package dataset-fashion-mnist).
        #[arg(long, default_value = fashion_mnist::DEFAULT_SOURCE)]
        source: PathBuf,
    },
    /// Your own images: an ImageFolder directory (<class>/<image>, or already split as
    /// {train,test,val}/<class>/<image>) or WebDataset .tar shards (image + .cls per sample),
    /// as <prefix>/{train,test}/<class>/<name>. JPEG, PNG and WebP are stored as they are;
    /// other files are left out and listed. Objects already there are skipped (resume).
    Import {
        /// Directories or .tar shards.
        #[arg(required = true)]
        sources: Vec<PathBuf>,
        /// Key prefix of the data set in the bucket (default: the first source's name).
        #[arg(long)]
        prefix: Option<String>,
        /// For an unsplit source: the share of each class that goes to `test` (by a hash of
        /// the file name, stable across runs).
        #[arg(long, default_value_t = 0.2)]
        test_fraction: f64,
        /// Objects written at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// ImageNet-like JPEG objects cut from real photos, labelled by source photo.
    Photos {
        #[arg(long, default_value = "photos")]
        prefix: String,
        /// Directory with scikit-image's sample photos (`cargo xtask env` prints HAPI_PHOTOS).
        #[arg(long, env = "HAPI_PHOTOS")]
        photos: PathBuf,
        #[arg(long, default_value_t = photos::Options::default().count)]
        count: usize,
        #[arg(long, default_value_t = photos::Options::default().seed)]
        seed: u64,
        #[arg(long, default_value_t = photos::Options::default().quality)]
        quality: u8,
    },
}

fn parse_prefix(prefix: &str) -> anyhow::Result<Path> {
    Path::parse(prefix).with_context(|| format!("prefix `{prefix}`"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let store = open_bucket(&cli.store, &cli.bucket, true)?;
    let started = Instant::now();
    let report = match cli.command {
        Command::Import {
            sources,
            prefix,
            test_fraction,
            concurrency,
        } => {
            let prefix = match prefix {
                Some(p) => p,
                None => sources[0]
                    .canonicalize()
                    .ok()
                    .and_then(|p| p.file_stem().map(|n| n.to_string_lossy().into_owned()))
                    .context("name the data set with --prefix")?,
            };
            let opts = import::Options {
                sources,
                prefix: prefix.clone(),
                test_fraction,
                concurrency,
            };
            let r = import::import(&store, &opts).await?;
            let splits: Vec<String> = r.splits.iter().map(|(k, v)| format!("{v} {k}")).collect();
            println!(
                "{}/{prefix}: {} images ({}), {} classes",
                cli.bucket,
                r.splits.values().sum::<usize>(),
                splits.join(", "),
                r.classes.len()
            );
            if !r.skipped.is_empty() {
                println!(
                    "{} files left out (listed in {prefix}/manifest.json):",
                    r.skipped.len()
                );
                for s in r.skipped.iter().take(10) {
                    println!("  {}: {}", s.path, s.reason);
                }
                if r.skipped.len() > 10 {
                    println!("  ...");
                }
            }
            r.load
        }
        Command::FashionMnist { prefix, source } => {
            fashion_mnist::load(&store, &parse_prefix(&prefix)?, &source).await?
        }
        Command::Photos {
            prefix,
            photos: dir,
            count,
            seed,
            quality,
        } => {
            let opts = photos::Options {
                count,
                seed,
                quality,
            };
            photos::load(&store, &parse_prefix(&prefix)?, &dir, opts).await?
        }
    };
    println!(
        "{} objects written ({:.1} MB), {} already present, {:.1}s",
        report.written,
        report.bytes_written as f64 / 1e6,
        report.skipped,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

//! `hapi-data`: load data sets into an object store.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hapi_data::{fashion_mnist, open_store, photos};
use object_store::path::Path;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Object store: a local directory or file:// URL (created if missing), or s3://bucket
    /// (endpoint and credentials from AWS_* environment variables).
    #[arg(long, default_value = "data/store")]
    store: String,
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
    let store = open_store(&cli.store)?;
    let started = Instant::now();
    let report = match cli.command {
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

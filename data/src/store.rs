use crate::LoadReport;
use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::HashSet;
use std::sync::Arc;

/// Opens the store at `location`: a directory path or `file://` URL (created if missing), or
/// `s3://bucket` (endpoint and credentials from the usual `AWS_*` environment variables, e.g.
/// `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`).
pub fn open_store(location: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    let dir = if let Some(rest) = location.strip_prefix("file://") {
        std::path::PathBuf::from(rest)
    } else if location.starts_with("s3://") {
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_url(location)
            .build()
            .with_context(|| format!("opening {location}"))?;
        return Ok(Arc::new(s3));
    } else if location.contains("://") {
        bail!("`{location}`: expected a directory, a file:// URL or s3://bucket");
    } else {
        std::path::PathBuf::from(location)
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    Ok(Arc::new(
        LocalFileSystem::new_with_prefix(&dir)
            .with_context(|| format!("opening {} as an object store", dir.display()))?,
    ))
}

/// Opens bucket `bucket` of the store `store`, as every tool names them: `store` is a
/// directory whose subdirectories are buckets (or a `file://` URL of one), or `s3://` for S3
/// (endpoint and credentials from the usual `AWS_*` environment variables). With `create`, a
/// local bucket directory is made if missing; without, a missing one is an error.
pub fn open_bucket(
    store: &str,
    bucket: &str,
    create: bool,
) -> anyhow::Result<Arc<dyn ObjectStore>> {
    if bucket.is_empty() || bucket.contains('/') || bucket == "." || bucket == ".." {
        bail!("bucket `{bucket}`: a bucket is one non-empty name without `/`");
    }
    if let Some(rest) = store.strip_prefix("s3://") {
        if !rest.is_empty() {
            bail!(
                "store `{store}`: the S3 store is `s3://` (endpoint from AWS_ENDPOINT); name the \
                 bucket with --bucket"
            );
        }
        return open_store(&format!("s3://{bucket}"));
    }
    let root = store.strip_prefix("file://").unwrap_or(store);
    if root.contains("://") {
        bail!("store `{store}`: expected a directory, a file:// URL or s3://");
    }
    let dir = std::path::Path::new(root).join(bucket);
    if !create && !dir.is_dir() {
        bail!(
            "bucket `{bucket}` not found: {} is not a directory",
            dir.display()
        );
    }
    open_store(&dir.to_string_lossy())
}

/// Keys already under `prefix`, so a re-run writes only what is missing.
pub async fn existing_keys(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> anyhow::Result<HashSet<Path>> {
    store
        .list(Some(prefix))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
        .with_context(|| format!("listing {prefix}"))
}

/// Writes `<prefix>/manifest.json`, last: its presence means the data set is complete.
pub async fn put_manifest(
    store: &dyn ObjectStore,
    prefix: &Path,
    manifest: &crate::DatasetManifest,
) -> anyhow::Result<()> {
    store
        .put(
            &prefix.clone().join("manifest.json"),
            PutPayload::from(serde_json::to_vec_pretty(manifest)?),
        )
        .await
        .context("writing manifest.json")?;
    Ok(())
}

/// An object to write: its key and a function that encodes its bytes (run off the async
/// threads, since encoding images is CPU work).
pub type Item = (Path, Box<dyn FnOnce() -> anyhow::Result<Vec<u8>> + Send>);

/// Writes every item whose key is not in `existing`, `concurrency` at a time, with a progress
/// bar labelled `label`.
pub async fn put_all(
    store: &Arc<dyn ObjectStore>,
    items: Vec<Item>,
    existing: &HashSet<Path>,
    concurrency: usize,
    label: &str,
) -> anyhow::Result<LoadReport> {
    let total = items.len();
    let todo: Vec<Item> = items
        .into_iter()
        .filter(|(key, _)| !existing.contains(key))
        .collect();
    let skipped = total - todo.len();
    let bar = ProgressBar::new(total as u64).with_message(label.to_string());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {pos}/{len} objects, {per_sec}, eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_position(skipped as u64);
    let results: Vec<u64> = futures::stream::iter(todo)
        .map(|(key, encode)| {
            let store = Arc::clone(store);
            let bar = bar.clone();
            async move {
                let bytes = tokio::task::spawn_blocking(encode)
                    .await
                    .context("encoder task panicked")?
                    .with_context(|| format!("encoding {key}"))?;
                let len = bytes.len() as u64;
                store
                    .put(&key, PutPayload::from(bytes))
                    .await
                    .with_context(|| format!("writing {key}"))?;
                bar.inc(1);
                anyhow::Ok(len)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await?;
    bar.finish();
    Ok(LoadReport {
        written: results.len(),
        skipped,
        bytes_written: results.iter().sum(),
    })
}

//! Where a batch's input to the compute tier comes from: the storage tier's pushdown function
//! (layers [0, s) already applied there), or the stored objects themselves (no pushdown: the
//! trainer reads, decodes and preprocesses them with the same code the guest uses).

use crate::dataset::Sample;
use futures::{StreamExt, TryStreamExt};
use hapi_client::{InvokeError, ServerTiming, StorageClient};
use hapi_preprocess::Transform;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A batch as it arrives on the compute tier.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Row-major, batch first; `labels.len()` samples.
    pub data: Vec<f32>,
    /// The shape of one sample.
    pub sample_shape: Vec<i64>,
    pub labels: Vec<i64>,
    pub keys: Vec<String>,
    /// Keys left out because they were bad (`--skip-bad`).
    pub skipped: Vec<(String, String)>,
    /// Bytes received over the network (response bodies, or stored objects).
    pub bytes: u64,
    pub server: ServerTiming,
    pub requests: usize,
    /// Sum over requests of (wall - server total): network and HTTP time.
    pub transfer: Duration,
    /// Parsing responses / decoding images on the compute tier.
    pub deserialize: Duration,
}

/// A fatal error for the batch.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("object `{key}`: {message} (pass --skip-bad to leave bad objects out)")]
    BadObject { key: String, message: String },
    #[error(transparent)]
    Invoke(#[from] InvokeError),
    #[error("{0}")]
    Other(String),
}

/// Features through the storage host's pushdown function, or stored objects read directly.
#[derive(Clone, Debug)]
pub enum Source {
    Pushdown {
        client: Arc<StorageClient>,
        bucket: String,
        model: String,
        split: usize,
        /// Keys per invocation.
        request_size: usize,
        /// Invocations in flight at once for this batch.
        in_flight: usize,
        skip_bad: bool,
    },
    Local {
        store: Arc<dyn ObjectStore>,
        transform: Transform,
        /// Object reads in flight at once.
        in_flight: usize,
        skip_bad: bool,
    },
}

impl Source {
    pub async fn fetch(&self, samples: &[Sample]) -> Result<Fetched, FetchError> {
        match self {
            Self::Pushdown {
                client,
                bucket,
                model,
                split,
                request_size,
                in_flight,
                skip_bad,
            } => {
                let chunks: Vec<Vec<Sample>> = samples
                    .chunks((*request_size).max(1))
                    .map(<[Sample]>::to_vec)
                    .collect();
                let parts: Vec<Fetched> = futures::stream::iter(chunks)
                    .map(|chunk| {
                        pushdown_chunk(
                            Arc::clone(client),
                            bucket.clone(),
                            model.clone(),
                            *split,
                            chunk,
                            *skip_bad,
                        )
                    })
                    .buffered((*in_flight).max(1))
                    .try_collect()
                    .await?;
                Ok(concat(parts))
            }
            Self::Local {
                store,
                transform,
                in_flight,
                skip_bad,
            } => {
                let owned: Vec<Sample> = samples.to_vec();
                let parts: Vec<Fetched> = futures::stream::iter(owned)
                    .map(|s| local_one(Arc::clone(store), *transform, s, *skip_bad))
                    .buffered((*in_flight).max(1))
                    .try_collect()
                    .await?;
                Ok(concat(parts))
            }
        }
    }
}

async fn pushdown_chunk(
    client: Arc<StorageClient>,
    bucket: String,
    model: String,
    split: usize,
    mut samples: Vec<Sample>,
    skip_bad: bool,
) -> Result<Fetched, FetchError> {
    let mut skipped = Vec::new();
    loop {
        if samples.is_empty() {
            return Ok(Fetched {
                skipped,
                ..Fetched::default()
            });
        }
        let keys: Vec<String> = samples.iter().map(|s| s.key.clone()).collect();
        match client.invoke(&bucket, &keys, &model, split).await {
            Ok(f) => {
                let n = f.shape.first().copied().unwrap_or(0) as usize;
                if n != samples.len() {
                    return Err(FetchError::Other(format!(
                        "the host returned {n} samples for {} keys",
                        samples.len()
                    )));
                }
                let transfer = f
                    .wall
                    .saturating_sub(Duration::from_secs_f64(f.server.total));
                return Ok(Fetched {
                    data: f.data,
                    sample_shape: f.shape[1..].to_vec(),
                    labels: samples.iter().map(|s| s.label).collect(),
                    keys,
                    skipped,
                    bytes: f.bytes,
                    server: f.server,
                    requests: 1,
                    transfer,
                    deserialize: f.deserialize,
                });
            }
            Err(InvokeError::BadObject { key, message }) if skip_bad => {
                samples.retain(|s| s.key != key);
                skipped.push((key, message));
            }
            Err(InvokeError::BadObject { key, message }) => {
                return Err(FetchError::BadObject { key, message });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn local_one(
    store: Arc<dyn ObjectStore>,
    transform: Transform,
    sample: Sample,
    skip_bad: bool,
) -> Result<Fetched, FetchError> {
    let path = object_store::path::Path::parse(&sample.key)
        .map_err(|e| FetchError::Other(format!("key `{}`: {e}", sample.key)))?;
    let fetched = Instant::now();
    let bytes = match store.get(&path).await {
        Ok(r) => r.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(object_store::Error::NotFound { .. }) if !skip_bad => {
            return Err(FetchError::BadObject {
                key: sample.key,
                message: "object_not_found".into(),
            });
        }
        Err(object_store::Error::NotFound { .. }) => {
            return Ok(Fetched {
                skipped: vec![(sample.key, "object_not_found".into())],
                ..Fetched::default()
            });
        }
        Err(e) => return Err(FetchError::Other(format!("reading `{}`: {e}", sample.key))),
    };
    let transfer = fetched.elapsed();
    let n = bytes.len() as u64;
    let started = Instant::now();
    let decoded =
        tokio::task::spawn_blocking(move || hapi_preprocess::preprocess(&bytes, &transform))
            .await
            .map_err(|e| FetchError::Other(format!("decoder thread: {e}")))?;
    let data = match decoded {
        Ok(d) => d,
        Err(e) if skip_bad => {
            return Ok(Fetched {
                skipped: vec![(sample.key, e.to_string())],
                bytes: n,
                ..Fetched::default()
            });
        }
        Err(e) => {
            return Err(FetchError::BadObject {
                key: sample.key,
                message: e.to_string(),
            });
        }
    };
    Ok(Fetched {
        data,
        sample_shape: transform.sample_shape().map(i64::from).to_vec(),
        labels: vec![sample.label],
        keys: vec![sample.key],
        skipped: Vec::new(),
        bytes: n,
        server: ServerTiming::default(),
        requests: 1,
        transfer,
        deserialize: started.elapsed(),
    })
}

fn concat(parts: Vec<Fetched>) -> Fetched {
    let mut out = Fetched::default();
    for p in parts {
        if out.sample_shape.is_empty() {
            out.sample_shape = p.sample_shape;
        }
        out.data.extend(p.data);
        out.labels.extend(p.labels);
        out.keys.extend(p.keys);
        out.skipped.extend(p.skipped);
        out.bytes += p.bytes;
        out.server.add(&p.server);
        out.requests += p.requests;
        out.transfer += p.transfer;
        out.deserialize += p.deserialize;
    }
    out
}

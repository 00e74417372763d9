//! The two-stage pipeline: a producer on the async runtime fetches the batches of the coming
//! iterations (storage requests in flight) while the calling thread trains on the current one.

use crate::dataset::Sample;
use crate::source::{FetchError, Fetched, Source};
use std::time::Instant;
use tokio::runtime::Runtime;

/// Per-iteration stage times, measured.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    /// Producer busy time per iteration (fetching a batch; not counting waits for buffer room).
    pub storage: Vec<f64>,
    /// Consumer busy time per iteration (not counting waits for a batch).
    pub compute: Vec<f64>,
    /// Consumer waiting for a batch.
    pub starved: f64,
}

impl StageTimes {
    pub fn mean_storage(&self) -> f64 {
        mean(&self.storage)
    }
    pub fn mean_compute(&self) -> f64 {
        mean(&self.compute)
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Fetches `batches` in order through `source` with up to `prefetch` batches buffered ahead of
/// the consumer, and calls `consume` on each in order on this thread.
pub fn run<F>(
    rt: &Runtime,
    source: &Source,
    batches: Vec<Vec<Sample>>,
    prefetch: usize,
    mut consume: F,
) -> anyhow::Result<StageTimes>
where
    F: FnMut(Fetched) -> anyhow::Result<()>,
{
    let (tx, mut rx) =
        tokio::sync::mpsc::channel::<(Result<Fetched, FetchError>, f64)>(prefetch.max(1));
    let producer_source = source.clone();
    let producer = rt.spawn(async move {
        for batch in batches {
            let started = Instant::now();
            let r = producer_source.fetch(&batch).await;
            let busy = started.elapsed().as_secs_f64();
            let failed = r.is_err();
            if tx.send((r, busy)).await.is_err() || failed {
                return;
            }
        }
    });
    let mut times = StageTimes::default();
    let result = (|| {
        loop {
            let waited = Instant::now();
            let Some((fetched, busy)) = rx.blocking_recv() else {
                return Ok(());
            };
            times.starved += waited.elapsed().as_secs_f64();
            let fetched = fetched?;
            times.storage.push(busy);
            let started = Instant::now();
            consume(fetched)?;
            times.compute.push(started.elapsed().as_secs_f64());
        }
    })();
    producer.abort();
    result.map(|()| times)
}

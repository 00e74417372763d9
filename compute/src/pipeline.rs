//! The two-stage pipeline: a producer on the async runtime fetches the batches of the coming
//! iterations (storage requests in flight) while the calling thread trains on the current one.
//! Each batch's split is asked of a [`Choice`] when its fetch starts, and the choice is told
//! how the batch went when it has been trained on.

use crate::adapt::Choice;
use crate::dataset::Sample;
use crate::plan::Split;
use crate::source::{FetchError, Fetched, Source};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::runtime::Runtime;

/// One iteration, measured.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Iteration {
    pub split: Split,
    /// Producer busy time (fetching the batch; not counting waits for buffer room).
    pub storage_s: f64,
    /// Consumer busy time (not counting waits for the batch).
    pub compute_s: f64,
    /// When the consumer was done with it (seconds since the Unix epoch).
    pub end_unix: f64,
    /// Bytes received per second of the batch's transfers (network and HTTP time), for
    /// pushdown splits.
    pub link_bps: Option<f64>,
}

/// Per-iteration stage times, measured.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    pub iterations: Vec<Iteration>,
    /// Consumer waiting for a batch.
    pub starved: f64,
}

impl StageTimes {
    pub fn mean_storage(&self) -> f64 {
        mean(self.iterations.iter().map(|i| i.storage_s))
    }
    pub fn mean_compute(&self) -> f64 {
        mean(self.iterations.iter().map(|i| i.compute_s))
    }
    /// The split most iterations ran at (`None` when there were none).
    pub fn main_split(&self) -> Option<Split> {
        split_counts(self.iterations.iter().map(|i| i.split))
            .into_iter()
            .max_by_key(|&(s, n)| (n, std::cmp::Reverse(s)))
            .map(|(s, _)| s)
    }
}

/// The mean interval between the ends of consecutive iterations (`None` under two).
pub fn mean_interval(trace: &[Iteration]) -> Option<f64> {
    match trace {
        [first, .., last] => Some((last.end_unix - first.end_unix) / (trace.len() - 1) as f64),
        _ => None,
    }
}

/// The mean storage and compute stages (seconds per iteration) of `trace` (`None` if empty).
pub fn mean_stages(trace: &[Iteration]) -> Option<(f64, f64)> {
    (!trace.is_empty()).then(|| {
        (
            mean(trace.iter().map(|it| it.storage_s)),
            mean(trace.iter().map(|it| it.compute_s)),
        )
    })
}

/// How many of `splits` are each split, in the order they first appear.
pub fn split_counts(splits: impl IntoIterator<Item = Split>) -> Vec<(Split, usize)> {
    let mut counts: Vec<(Split, usize)> = Vec::new();
    for split in splits {
        match counts.iter_mut().find(|(s, _)| *s == split) {
            Some((_, n)) => *n += 1,
            None => counts.push((split, 1)),
        }
    }
    counts
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// The middle value (the upper of the two middle ones for an even count); NaN for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When a run ends before its last batch: once `iterations` have ended, or at the end of the
/// first iteration after `past_unix` (seconds since the Unix epoch). The fetches still in
/// flight then are dropped: their connections close, so the link carries nothing more for them
/// and a storage host stops the invocations (it stops one whose client went away); the
/// batches after them are not fetched.
#[derive(Clone, Copy, Debug)]
pub struct Until {
    pub iterations: usize,
    pub past_unix: f64,
}

impl Until {
    /// Every batch.
    pub const END: Self = Self {
        iterations: usize::MAX,
        past_unix: f64::INFINITY,
    };

    /// Whether a run stops once `ended` iterations have ended, the last at `now_unix`.
    pub fn reached(&self, ended: usize, now_unix: f64) -> bool {
        ended >= self.iterations || now_unix > self.past_unix
    }
}

/// How far the producer runs ahead of the consumer, and where the run ends.
#[derive(Clone, Copy, Debug)]
pub struct Ahead {
    /// Where the run ends ([`Until::END`]: after the last batch).
    pub until: Until,
    /// Batches fetched and waiting for the consumer, at most.
    pub prefetch: usize,
    /// Batches being fetched at once.
    pub fetch_ahead: usize,
}

/// Fetches `batches` in order, each at the split `choice` gives when its fetch starts, through
/// that split's source, `fetch_ahead` batches at a time (each a task of its own, so one that is
/// done waits for the one before it without holding the others up), with up to `prefetch`
/// batches buffered ahead of the consumer; calls `consume(batch, split)` on each in order on
/// this thread, then `after` with its times; stops early at `until`.
///
/// A batch's storage time is the time from its fetch's start, or the previous batch's arrival
/// if later, to its own arrival: with one fetch at a time, the fetch's duration; with several,
/// the interval at which batches arrive, what the storage stage costs an iteration.
///
/// The run's first batch is traced but is no sample for `choice` ([`Choice::cold`]): its fetch
/// overlapped no step, so its storage stage ran alone, and its step pays first-use costs (the
/// head's optimiser state, for one). On AlexNet at batch 64 that step took 1.27 s against
/// 0.65-0.80 s for the next seven, and the chooser, given it as its best split's only sample,
/// dropped that split.
pub fn run<F, A>(
    rt: &Runtime,
    sources: HashMap<Split, Source>,
    choice: &Choice,
    batches: Vec<Vec<Sample>>,
    Ahead {
        until,
        prefetch,
        fetch_ahead,
    }: Ahead,
    mut consume: F,
    mut after: A,
) -> anyhow::Result<StageTimes>
where
    F: FnMut(Fetched, Split) -> anyhow::Result<()>,
    A: FnMut(&Iteration),
{
    type Message = (Result<Fetched, FetchError>, Split, f64);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(prefetch.max(1));
    let sources = Arc::new(sources);
    let producer_choice = choice.clone();
    // Fetch tasks not yet dropped (ended, or aborted and gone).
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&live);
    let producer = rt.spawn(async move {
        use futures::StreamExt;
        let mut fetches = futures::stream::iter(batches)
            .map(|batch| {
                let split = producer_choice.next_split();
                let sources = Arc::clone(&sources);
                let alive = Alive::new(&counted);
                AbortOnDrop(tokio::spawn(async move {
                    let _alive = alive;
                    let started = Instant::now();
                    let r = match sources.get(&split) {
                        Some(source) => source.fetch(&batch).await,
                        None => Err(FetchError::Other(format!(
                            "split {split}: no source for it (a pushdown split needs --host)"
                        ))),
                    };
                    (r, split, started, Instant::now())
                }))
            })
            .buffered(fetch_ahead.max(1));
        let mut previous: Option<Instant> = None;
        while let Some(joined) = fetches.next().await {
            let (r, split, started, done) = match joined {
                Ok(fetched) => fetched,
                Err(e) => {
                    let now = Instant::now();
                    let r = Err(FetchError::Other(format!(
                        "a batch's fetch task failed: {e}"
                    )));
                    (r, producer_choice.current(), now, now)
                }
            };
            let from = previous.map_or(started, |p| p.max(started));
            let busy = done.saturating_duration_since(from).as_secs_f64();
            previous = Some(previous.map_or(done, |p| p.max(done)));
            let failed = r.is_err();
            if tx.send((r, split, busy)).await.is_err() || failed {
                return;
            }
        }
    });
    let mut times = StageTimes::default();
    let result = (|| {
        loop {
            let waited = Instant::now();
            let Some((fetched, split, busy)) = rx.blocking_recv() else {
                return Ok(());
            };
            times.starved += waited.elapsed().as_secs_f64();
            let fetched = fetched.with_context(|| format!("a batch at split {split}"))?;
            // The link's rate: bytes over the requests' network and HTTP time (features from
            // storage hosts; reads of stored objects for `none` are not timed apart).
            let link =
                (matches!(split, Split::At(_)) && fetched.bytes > 0 && !fetched.transfer.is_zero())
                    .then(|| fetched.bytes as f64 / fetched.transfer.as_secs_f64());
            let started = Instant::now();
            consume(fetched, split)?;
            let it = Iteration {
                split,
                storage_s: busy,
                compute_s: started.elapsed().as_secs_f64(),
                end_unix: now_unix(),
                link_bps: link,
            };
            if times.iterations.is_empty() {
                choice.cold(split);
            } else {
                choice.observe(split, it.storage_s, it.compute_s, it.link_bps);
            }
            after(&it);
            times.iterations.push(it);
            if until.reached(times.iterations.len(), it.end_unix) {
                return Ok(());
            }
        }
    })();
    // Done, stopped early or failed: the producer and the fetches it has in flight are dropped
    // (each fetch is aborted with it), and waited for until every fetch task is gone, so that
    // their connections are closed when this returns.
    drop(rx);
    producer.abort();
    let _ = rt.block_on(producer);
    let until = Instant::now() + std::time::Duration::from_secs(10);
    while live.load(std::sync::atomic::Ordering::SeqCst) > 0 && Instant::now() < until {
        // Built inside the runtime (a timer needs its context), which runs the tasks meanwhile.
        rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(1)).await });
    }
    result.map(|()| times)
}

/// Counts a fetch task as alive until it is dropped (ended, or aborted).
struct Alive(Arc<std::sync::atomic::AtomicUsize>);

impl Alive {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(Arc::clone(count))
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A spawned fetch, aborted when dropped: when the job stops (an error, or the consumer gone),
/// the fetches still in flight stop with it.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// `n` batches of 2 small PNGs in an in-memory store, read as `none` reads them.
    fn local(n: usize) -> (Runtime, HashMap<Split, Source>, Vec<Vec<Sample>>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let store = Arc::new(object_store::memory::InMemory::new());
        let png = hapi_data::fashion_mnist::encode_png(&[128; 28 * 28], 28, 28).expect("png");
        let samples: Vec<Sample> = (0..2 * n)
            .map(|i| Sample {
                key: format!("o/{i}.png"),
                label: 0,
                version: String::new(),
            })
            .collect();
        rt.block_on(async {
            for s in &samples {
                store
                    .put(&s.key.as_str().into(), png.clone().into())
                    .await
                    .expect("put");
            }
        });
        let source = Source::Local {
            store,
            transform: hapi_preprocess::Transform::new(32, 28, [0.5; 3], [0.5; 3]),
            in_flight: 2,
            skip_bad: false,
        };
        let batches = samples.chunks(2).map(<[Sample]>::to_vec).collect();
        (rt, [(Split::None, source)].into(), batches)
    }

    fn consumed(until: Until) -> (usize, usize) {
        let (rt, sources, batches) = local(6);
        let mut consumed = 0;
        let times = run(
            &rt,
            sources,
            &Choice::Fixed(Split::None),
            batches,
            Ahead {
                until,
                prefetch: 2,
                fetch_ahead: 1,
            },
            |f, _| {
                assert_eq!(f.keys.len(), 2);
                consumed += 1;
                Ok(())
            },
            |_| {},
        )
        .expect("run");
        (consumed, times.iterations.len())
    }

    #[test]
    fn a_run_ends_at_its_iterations_or_its_time() {
        assert_eq!(consumed(Until::END), (6, 6));
        let two = Until {
            iterations: 2,
            past_unix: f64::INFINITY,
        };
        assert_eq!(consumed(two), (2, 2));
        // Past its time already: the first iteration ends it.
        let late = Until {
            iterations: usize::MAX,
            past_unix: now_unix() - 1.0,
        };
        assert_eq!(consumed(late), (1, 1));
    }

    /// A storage host on a real socket that answers the first invocation with two samples of
    /// one feature and never answers the others; it reports each unanswered request's
    /// connection closing on `closed`.
    fn answers_once(closed: std::sync::mpsc::Sender<()>) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (answered, closed) = (Arc::clone(&answered), closed.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                    let mut writer = conn;
                    loop {
                        let mut length = 0;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                let _ = closed.send(());
                                return;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(v) = lower.strip_prefix("content-length:") {
                                length = v.trim().parse().expect("length");
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).expect("body");
                        if answered.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            // Never answered: wait for the client to go away.
                            let mut rest = Vec::new();
                            let _ = reader.read_to_end(&mut rest);
                            let _ = closed.send(());
                            return;
                        }
                        let data = [0u8; 8];
                        let mut out = hapi_wire::tensor::header(
                            hapi_wire::tensor::Dtype::F32,
                            &[2, 1],
                            8,
                            &Default::default(),
                        )
                        .expect("header");
                        out.extend_from_slice(&data);
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/vnd.safetensors\r\ncontent-length: {}\r\n\r\n",
                            out.len()
                        );
                        writer.write_all(head.as_bytes()).expect("head");
                        writer.write_all(&out).expect("body");
                    }
                });
            }
        });
        url
    }

    #[test]
    fn a_run_that_stops_drops_the_fetches_in_flight() {
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let url = answers_once(closed_tx);
        let (rt, _, batches) = local(4);
        let client = hapi_client::StorageClient::new(
            vec![url],
            "token".into(),
            "feature-extract".into(),
            hapi_client::RetryPolicy::default(),
        )
        .expect("client");
        let source = Source::Pushdown {
            client: Arc::new(client),
            bucket: "b".into(),
            model: "m".into(),
            split: 1,
            request_size: 2,
            in_flight: 1,
            skip_bad: false,
            placement: None,
        };
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let one = Until {
                iterations: 1,
                past_unix: f64::INFINITY,
            };
            let times = run(
                &rt,
                [(Split::At(1), source)].into(),
                &Choice::Fixed(Split::At(1)),
                batches,
                Ahead {
                    until: one,
                    prefetch: 2,
                    fetch_ahead: 1,
                },
                |_, _| Ok(()),
                |_| {},
            )
            .map(|t| t.iterations.len());
            let _ = done_tx.send(times.map_err(|e| e.to_string()));
        });
        // The first batch is answered and trained on; the run stops there, without waiting for
        // the second batch's request, which the host never answers.
        let ran = done
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the run ended without the unanswered fetch");
        assert_eq!(ran, Ok(1));
        // And that request's connection was closed: the host knows the client left.
        closed
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the unanswered request's connection closed");
    }
}

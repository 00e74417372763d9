//! Where a batch's input to the compute tier comes from: the storage tier's pushdown function
//! (layers [0, s) already applied there), or the stored objects themselves (no pushdown: the
//! trainer reads, decodes and preprocesses them with the same code the guest uses).

use crate::dataset::Sample;
use futures::{StreamExt, TryStreamExt};
use hapi_client::{InvokeError, ServerTiming, StorageClient};
use hapi_preprocess::Transform;
use object_store::{ObjectStore, ObjectStoreExt};
use std::collections::HashMap;
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
        /// With `--locality`: which hosts hold which volumes; each key's request goes to a
        /// host beside a replica of it.
        placement: Option<Arc<Placement>>,
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
                placement,
            } => {
                let size = (*request_size).max(1);
                let chunks: Vec<(Vec<Sample>, Vec<usize>)> = match placement {
                    Some(p) => p.requests(client, bucket, samples, size).await,
                    None => plain(samples, size),
                };
                let parts: Vec<Fetched> = futures::stream::iter(chunks)
                    .map(|(chunk, prefer)| {
                        pushdown_chunk(
                            Arc::clone(client),
                            bucket.clone(),
                            model.clone(),
                            *split,
                            chunk,
                            prefer,
                            *skip_bad,
                        )
                    })
                    .buffered((*in_flight).max(1))
                    .try_collect()
                    .await?;
                let fetched = concat(parts);
                Ok(if placement.is_some() {
                    in_order(fetched, samples)
                } else {
                    fetched
                })
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

/// Which storage hosts hold which volumes (each host's `GET /v1/placement`), asked again
/// every [`Placement::FRESH_FOR`] (a volume server restarted, a volume moved); a host that does
/// not answer keeps what it said last.
#[derive(Debug)]
pub struct Placement {
    hosts: std::sync::Mutex<(Instant, Vec<Option<Vec<u32>>>)>,
    /// Keys' volumes as told, kept for the job (later epochs ask nothing).
    keys: std::sync::Mutex<HashMap<String, Vec<u32>>>,
    /// Batches assigned so far: whose turn it is to take one key more ([`assign`]).
    turns: std::sync::atomic::AtomicUsize,
}

impl Placement {
    const FRESH_FOR: Duration = Duration::from_secs(10);

    /// From each host's volumes (by host index; `None`: the host reads through S3 only).
    /// `None` when no host holds any.
    pub fn new(host_volumes: Vec<Option<Vec<u32>>>) -> Option<Self> {
        host_volumes.iter().any(Option::is_some).then(|| Self {
            hosts: std::sync::Mutex::new((Instant::now(), host_volumes)),
            keys: std::sync::Mutex::default(),
            turns: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Hosts by volume, asked again first if stale.
    async fn by_volume(&self, client: &StorageClient) -> HashMap<u32, Vec<usize>> {
        let stale = {
            let h = lock(&self.hosts);
            h.0.elapsed() > Self::FRESH_FOR
        };
        if stale {
            let fresh = client.host_volumes().await;
            let mut h = lock(&self.hosts);
            for (old, new) in h.1.iter_mut().zip(fresh) {
                if new.is_some() {
                    *old = new;
                }
            }
            h.0 = Instant::now();
        }
        let h = lock(&self.hosts);
        let mut by_volume: HashMap<u32, Vec<usize>> = HashMap::new();
        for (host, volumes) in h.1.iter().enumerate() {
            for &v in volumes.iter().flatten() {
                by_volume.entry(v).or_default().push(host);
            }
        }
        by_volume
    }

    /// The batch's requests: its keys grouped by host ([`assign`]), in requests of at most
    /// `size` keys, each with its preferred host. If the placement cannot be asked, plain
    /// requests.
    async fn requests(
        &self,
        client: &StorageClient,
        bucket: &str,
        samples: &[Sample],
        size: usize,
    ) -> Vec<(Vec<Sample>, Vec<usize>)> {
        let unknown: Vec<String> = {
            let known = lock(&self.keys);
            samples
                .iter()
                .filter(|s| !known.contains_key(&s.key))
                .map(|s| s.key.clone())
                .collect()
        };
        for part in unknown.chunks(1024) {
            match client.placement(bucket, part).await {
                Ok(v) => {
                    let mut known = lock(&self.keys);
                    known.extend(part.iter().cloned().zip(v));
                }
                Err(_) => {
                    return plain(samples, size);
                }
            }
        }
        let volumes: Vec<Vec<u32>> = {
            let known = lock(&self.keys);
            samples
                .iter()
                .map(|s| known.get(&s.key).cloned().unwrap_or_default())
                .collect()
        };
        let by_volume = self.by_volume(client).await;
        let n = client.hosts().len();
        let turn = self
            .turns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut groups: Vec<Vec<Sample>> = vec![Vec::new(); n + 1];
        for (sample, host) in samples.iter().zip(assign(&volumes, &by_volume, n, turn)) {
            groups[host].push(sample.clone());
        }
        spread_requests(groups, size)
    }
}

/// Each host's keys (`groups[host]`; the last group: any host) in requests of at most `size`
/// keys, as even in size as that allows (6 keys at 4: 3 and 3, not 4 and 2: a request's time is
/// mostly its wait behind the others on its host), taking the hosts in turn (requests go out a
/// few at a time in this order, so no host waits for another's requests to go first).
fn spread_requests(groups: Vec<Vec<Sample>>, size: usize) -> Vec<(Vec<Sample>, Vec<usize>)> {
    let any = groups.len().saturating_sub(1);
    let mut per_host: Vec<std::collections::VecDeque<(Vec<Sample>, Vec<usize>)>> = groups
        .into_iter()
        .enumerate()
        .map(|(host, group)| {
            let prefer = if host < any { vec![host] } else { Vec::new() };
            let parts = group.len().div_ceil(size.max(1));
            let mut rest = group.as_slice();
            (0..parts)
                .map(|p| {
                    let take = rest.len().div_ceil(parts - p);
                    let (now, later) = rest.split_at(take);
                    rest = later;
                    (now.to_vec(), prefer.clone())
                })
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    while per_host.iter().any(|q| !q.is_empty()) {
        for q in &mut per_host {
            out.extend(q.pop_front());
        }
    }
    out
}

/// `m`'s guard; a panic elsewhere while it was held leaves data that is still whole here (a
/// map or a list replaced in one step), so a poisoned lock is taken as it is.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Requests of at most `size` keys, to any host.
fn plain(samples: &[Sample], size: usize) -> Vec<(Vec<Sample>, Vec<usize>)> {
    samples
        .chunks(size)
        .map(|c| (c.to_vec(), Vec::new()))
        .collect()
}

/// The host (index < `n`) each key goes to, or `n` for any host. Each host takes at most an
/// even share of the batch (a host's link carries its keys' features, several times an
/// object's bytes at the splits worth pushing down, so an idle link costs more than a read
/// through the gateway); where the batch does not divide evenly, the hosts from `turn` on (mod
/// `n`) take one more, so that batches taking turns give every host the same. Within those
/// shares, as many keys as can be go to a host beside one of their replicas (`volumes`,
/// `by_volume`): a maximum matching of keys to replica hosts by augmenting paths (a greedy
/// pass strands keys whose replica hosts filled up with keys that had other choices). A key
/// that cannot be placed beside a replica goes to the host with the most of its share left,
/// which reads it through the gateway; a key whose placement is unknown, or whose volumes no
/// host holds, to any host.
fn assign(
    volumes: &[Vec<u32>],
    by_volume: &HashMap<u32, Vec<usize>>,
    n: usize,
    turn: usize,
) -> Vec<usize> {
    let (base, extra) = (volumes.len() / n.max(1), volumes.len() % n.max(1));
    let share: Vec<usize> = (0..n)
        .map(|h| base + usize::from((h + n - turn % n.max(1)) % n < extra))
        .collect();
    let near: Vec<Vec<usize>> = volumes
        .iter()
        .map(|vols| {
            let mut hosts: Vec<usize> = vols
                .iter()
                .filter_map(|v| by_volume.get(v))
                .flatten()
                .copied()
                .filter(|&h| h < n)
                .collect();
            hosts.sort_unstable();
            hosts.dedup();
            hosts
        })
        .collect();
    let mut m = Matching {
        near: &near,
        held: vec![Vec::new(); n],
        share: &share,
    };
    let mut out: Vec<Option<usize>> = vec![None; volumes.len()];
    for key in 0..volumes.len() {
        let mut seen = vec![false; n];
        m.place(key, &mut seen, &mut out);
    }
    let mut given: Vec<usize> = m.held.iter().map(Vec::len).collect();
    out.iter()
        .enumerate()
        .map(|(key, host)| match host {
            Some(h) => *h,
            None if near[key].is_empty() => n,
            None => {
                // The host with the most of its share left.
                let h = (0..n)
                    .min_by_key(|&h| (given[h] as isize - share[h] as isize, h))
                    .unwrap_or(n);
                if h < n {
                    given[h] += 1;
                }
                h
            }
        })
        .collect()
}

/// Keys matched to replica hosts, at most `share[host]` each ([`assign`]).
struct Matching<'a> {
    near: &'a [Vec<usize>],
    held: Vec<Vec<usize>>,
    share: &'a [usize],
}

impl Matching<'_> {
    /// Places `key` beside a replica: on such a host with room (the least held first), else on
    /// one whose keys can move to another of their replica hosts (an augmenting path; `seen`
    /// keeps each host to one visit per key, so a key costs at most one pass over the edges).
    fn place(&mut self, key: usize, seen: &mut [bool], out: &mut [Option<usize>]) -> bool {
        let mut hosts = self.near[key].clone();
        hosts.sort_by_key(|&h| (self.held[h].len() as isize - self.share[h] as isize, h));
        if let Some(&h) = hosts
            .iter()
            .find(|&&h| !seen[h] && self.held[h].len() < self.share[h])
        {
            seen[h] = true;
            self.held[h].push(key);
            out[key] = Some(h);
            return true;
        }
        for h in hosts {
            if seen[h] {
                continue;
            }
            seen[h] = true;
            for i in 0..self.held[h].len() {
                let other = self.held[h][i];
                if self.place(other, seen, out) {
                    self.held[h][i] = key;
                    out[key] = Some(h);
                    return true;
                }
            }
        }
        false
    }
}

/// `fetched`'s samples back in the order of `samples` (requests grouped by host return them
/// grouped): the same batch, row for row, as without locality.
fn in_order(mut fetched: Fetched, samples: &[Sample]) -> Fetched {
    let position: HashMap<&str, usize> = samples
        .iter()
        .enumerate()
        .rev()
        .map(|(i, s)| (s.key.as_str(), i))
        .collect();
    let mut rows: Vec<usize> = (0..fetched.keys.len()).collect();
    rows.sort_by_key(|&r| {
        position
            .get(fetched.keys[r].as_str())
            .copied()
            .unwrap_or(usize::MAX)
    });
    let width = fetched.sample_shape.iter().product::<i64>().max(0) as usize;
    let mut data = Vec::with_capacity(fetched.data.len());
    for &r in &rows {
        data.extend_from_slice(&fetched.data[r * width..(r + 1) * width]);
    }
    fetched.data = data;
    fetched.labels = rows.iter().map(|&r| fetched.labels[r]).collect();
    fetched.keys = rows.iter().map(|&r| fetched.keys[r].clone()).collect();
    fetched
}

async fn pushdown_chunk(
    client: Arc<StorageClient>,
    bucket: String,
    model: String,
    split: usize,
    mut samples: Vec<Sample>,
    prefer: Vec<usize>,
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
        match client
            .invoke_preferring(&bucket, &keys, &model, split, &prefer)
            .await
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key: &str) -> Sample {
        Sample {
            key: key.into(),
            label: 0,
            version: Default::default(),
        }
    }

    #[test]
    fn keys_go_beside_a_replica_until_those_hosts_have_their_share_then_anywhere() {
        // Volume 1 on hosts 0 and 1, volume 2 on host 1; hosts 2 and 3 hold nothing.
        let by_volume: HashMap<u32, Vec<usize>> = [(1, vec![0, 1]), (2, vec![1])].into();
        let spread = assign(&vec![vec![1]; 2], &by_volume, 2, 0);
        assert_eq!(spread, [0, 1], "over the replicas");
        assert_eq!(
            assign(&vec![vec![2]; 2], &by_volume, 2, 0),
            [1, 0],
            "past the share"
        );
        // 16 keys on volume 1: 4 each for hosts 0 and 1, the rest to the idle hosts.
        let many = assign(&vec![vec![1]; 16], &by_volume, 4, 0);
        let count = |h: usize| many.iter().filter(|&&x| x == h).count();
        assert_eq!([count(0), count(1), count(2), count(3)], [4; 4], "{many:?}");
        // Unknown placement, or volumes no host holds: any host.
        assert_eq!(assign(&[vec![], vec![9]], &by_volume, 4, 0), [4, 4]);
    }

    #[test]
    fn as_many_keys_as_the_shares_allow_go_beside_a_replica() {
        // Volume 1 on hosts 0 and 1, volume 2 on host 0 only; shares of 2. A greedy pass puts
        // the volume-1 keys on hosts 0, 1, 0, and the volume-2 key finds host 0 full; moving
        // one of host 0's volume-1 keys to host 1 leaves room for it.
        let by_volume: HashMap<u32, Vec<usize>> = [(1, vec![0, 1]), (2, vec![0])].into();
        let keys = [vec![1], vec![1], vec![1], vec![2]];
        let got = assign(&keys, &by_volume, 2, 0);
        assert_eq!(
            got[3], 0,
            "the volume-2 key beside its only replica: {got:?}"
        );
        assert_eq!(got.iter().filter(|&&h| h == 0).count(), 2, "{got:?}");
        assert_eq!(got.iter().filter(|&&h| h == 1).count(), 2, "{got:?}");
        // Every key local whenever a matching exists, on a random layout: 3 hosts, 6 volumes
        // on two hosts each, 16 keys.
        let layout: HashMap<u32, Vec<usize>> = [
            (1, vec![0, 1]),
            (2, vec![0, 2]),
            (3, vec![0, 2]),
            (4, vec![1, 2]),
            (5, vec![0, 1]),
            (6, vec![0, 2]),
        ]
        .into();
        let keys: Vec<Vec<u32>> = [2, 3, 6, 2, 3, 6, 1, 5, 4, 1, 5, 4, 2, 3, 6, 1]
            .iter()
            .map(|&v| vec![v])
            .collect();
        let got = assign(&keys, &layout, 3, 0);
        for (k, h) in keys.iter().zip(&got) {
            assert!(
                layout[&k[0]].contains(h),
                "key on volume {} sent to host {h}: {got:?}",
                k[0]
            );
        }
        for h in 0..3 {
            assert!(got.iter().filter(|&&x| x == h).count() <= 6, "{got:?}");
        }
    }

    #[test]
    fn requests_are_even_in_size_and_take_the_hosts_in_turn() {
        let keys = |n: usize, tag: &str| -> Vec<Sample> {
            (0..n).map(|i| sample(&format!("{tag}{i}"))).collect()
        };
        // Host 0: 6 keys, host 1: 5, host 2: 1, any host: 2; at most 4 keys a request.
        let groups = vec![keys(6, "a"), keys(5, "b"), keys(1, "c"), keys(2, "d")];
        let got = spread_requests(groups, 4);
        let shape: Vec<(usize, Vec<usize>)> =
            got.iter().map(|(s, p)| (s.len(), p.clone())).collect();
        assert_eq!(
            shape,
            [
                (3, vec![0]),
                (3, vec![1]),
                (1, vec![2]),
                (2, vec![]),
                (3, vec![0]),
                (2, vec![1]),
            ]
        );
        let all: Vec<&str> = got
            .iter()
            .flat_map(|(s, _)| s.iter().map(|s| s.key.as_str()))
            .collect();
        assert_eq!(all.len(), 14, "every key once: {all:?}");
    }

    #[test]
    fn the_hosts_take_turns_at_the_key_a_batch_does_not_divide_evenly() {
        // 16 keys on every one of 3 hosts: 6, 5, 5, and the 6 moves on each batch.
        let by_volume: HashMap<u32, Vec<usize>> = [(1, vec![0, 1, 2])].into();
        for turn in 0..6 {
            let got = assign(&vec![vec![1]; 16], &by_volume, 3, turn);
            let counts: Vec<usize> = (0..3)
                .map(|h| got.iter().filter(|&&x| x == h).count())
                .collect();
            let mut want = vec![5; 3];
            want[turn % 3] = 6;
            assert_eq!(counts, want, "turn {turn}");
        }
    }

    #[test]
    fn a_batch_fetched_in_groups_comes_back_in_its_own_order() {
        let samples: Vec<Sample> = ["a", "b", "c"].into_iter().map(sample).collect();
        let grouped = Fetched {
            data: vec![3.0, 3.5, 1.0, 1.5, 2.0, 2.5],
            sample_shape: vec![2],
            labels: vec![30, 10, 20],
            keys: vec!["c".into(), "a".into(), "b".into()],
            ..Fetched::default()
        };
        let f = in_order(grouped, &samples);
        assert_eq!(f.keys, ["a", "b", "c"]);
        assert_eq!(f.labels, [10, 20, 30]);
        assert_eq!(f.data, [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    }
}

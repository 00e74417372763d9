//! Choosing the split: a two-stage pipeline model fed only with measurements from this job's
//! machines (no constants fitted elsewhere).
//!
//! For split `s` (layers [0, s) on storage) and a training batch of `B` samples:
//!
//! - storage stage `srv(s)`: the host reads and decodes `B` objects and runs layers [0, s),
//!   and the features cross the network (`net = B * bytes(s) / bandwidth`). A batch goes out
//!   in `W` waves of `--in-flight` requests, `k` side by side; a wave's transfer overlaps the
//!   next wave's work: `(W - 1) * max(w, n) + last`, with `w` a wave's work and `n = net / W`.
//!   Within a wave, the guests read and decode side by side (one request's reads overlap the
//!   others' decoding: `d = max(decode, reads / k) + one read`; a request alone waits on every
//!   read), then the layers (`l`) run on the device in call order, in device batches of the
//!   host's fastest batch size, so the requests finish in `g` groups and each group's
//!   responses cross the network while the next computes:
//!   `last = max(d + l + n / g, d + l / g + n)`. Plus one request latency per wave, plus
//!   parsing the responses on the compute tier (checked against the sweeps' measured storage
//!   stages of EfficientNet-Lite0 at 50 and 1000 Mbit/s: see the README, *Split-choice
//!   evaluation*);
//! - compute stage `cli(s)`: layers [s, freeze) forward plus the head's forward, backward and
//!   update;
//! - an epoch of `N` iterations takes `srv + max(srv, cli) * (N - 1) + cli` (the pipeline fills,
//!   runs at the slower stage's pace, drains): the paper's formula with our glue folded into
//!   the stages where it runs.
//!
//! No pushdown (`none`) reads the stored objects (`B * object_bytes / store_bandwidth`) while
//! the compute tier decodes them and runs every frozen layer; decoding joins the compute stage
//! when the trainer has a single core.
//!
//! Splits whose compute-tier memory does not fit are dropped. The model only ranks splits:
//! [`crate::adapt`] measures the best few on training iterations, calibrates the model where it
//! settles and recalibrates it when the stages drift.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where to cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// No pushdown: stored objects are read and everything runs on the compute tier.
    None,
    /// Layers [0, s) on the storage tier.
    At(usize),
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::At(s) => write!(f, "{s}"),
        }
    }
}

/// Everything measured for the plan. Times are seconds, sizes bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Costs {
    pub batch: usize,
    pub iterations: usize,
    pub freeze: usize,
    /// Keys per storage request, and requests in flight.
    pub request_size: usize,
    pub in_flight: usize,
    /// Storage tier, per sample: reading the object (the guest's `objects::get`, one request
    /// alone on the host), decoding and preprocessing it in the guest, and each layer (host
    /// profile). Plans recorded before `host_read` existed counted the read in `host_decode`.
    #[serde(default)]
    pub host_read: f64,
    pub host_decode: f64,
    pub host_layer: Vec<f64>,
    /// The host's per-layer time per sample at other batch sizes: (batch, per layer). The host
    /// runs a segment in sub-batches of the size that is fastest for it, up to what the
    /// requests in flight bring, so the storage work is the cheapest of these.
    #[serde(default)]
    pub host_curve: Vec<(i64, Vec<f64>)>,
    /// Per request: HTTP round trip beyond transfer and server time.
    pub latency: f64,
    /// Storage -> compute bytes per second, measured from real transfers.
    pub bandwidth: f64,
    /// Bytes per sample sent at split s, for s in 0..=freeze (s = 0: the preprocessed input).
    pub bytes_at: Vec<u64>,
    /// Compute tier: parsing a response, per byte.
    pub parse_per_byte: f64,
    /// Compute tier, per sample: each layer (local profile at the training batch size).
    pub local_layer: Vec<f64>,
    /// Compute tier, per iteration: the head's forward, backward and update.
    pub head_step: f64,
    /// No pushdown: mean stored object size, read bandwidth, native decode per sample.
    pub object_bytes: f64,
    pub store_bandwidth: f64,
    pub local_decode: f64,
    /// Cores the trainer may use (decoding overlaps compute only with more than one).
    pub local_cores: usize,
    /// Compute-tier memory: fixed bytes (weights of [s, end)) per split, and the limit.
    pub weight_bytes: Vec<u64>,
    pub layer_in_bytes: Vec<u64>,
    pub layer_out_bytes: Vec<u64>,
    pub prefetch: usize,
    pub memory_limit: u64,
    /// Correction factors from what was measured at the split in use (1.0 before).
    pub storage_scale: f64,
    pub compute_scale: f64,
}

/// One split's estimate.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Estimate {
    pub split: Split,
    /// Per iteration.
    pub storage: f64,
    pub compute: f64,
    /// Whole epoch.
    pub epoch: f64,
    pub memory: u64,
    pub fits: bool,
}

impl Estimate {
    /// An iteration's cost once the pipeline is full: the slower stage.
    pub fn pace(&self) -> f64 {
        self.storage.max(self.compute)
    }
}

impl Costs {
    fn requests(&self) -> usize {
        self.batch.div_ceil(self.request_size.max(1))
    }

    /// The host's time per sample for layers [0, s), and the device batch it runs them at:
    /// the fastest of its measured batch sizes within what the requests in flight bring (one
    /// sample at a time when it has no curve).
    fn host_work(&self, s: usize) -> (f64, i64) {
        let most = (self.request_size * self.in_flight).max(1) as i64;
        self.host_curve
            .iter()
            .filter(|(b, t)| *b <= most && t.len() >= s)
            .map(|(b, t)| (t[..s].iter().sum::<f64>(), *b))
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .unwrap_or_else(|| (self.host_layer[..s].iter().sum(), 1))
    }

    /// One wave on the host: its reading and decoding, its layers [0, s), and in how many
    /// groups its requests finish.
    ///
    /// A guest reads its objects one at a time, decoding each before the next read, so a
    /// request alone waits on every read; with several side by side, one request's reads
    /// overlap the others' decoding, and the host waits only for the first read (nothing is
    /// decoded yet) or when the reads are the longer part (each request's reads one after
    /// another, the requests' side by side). The guests decode side by side, then their
    /// layers run on the device in the order the calls came (one tenant's calls are served
    /// in order), in device batches of the host's batch size: the requests a batch holds
    /// finish together, one batch's after another.
    fn wave_work(&self, s: usize, waves: f64) -> (f64, f64, f64) {
        let per_wave = self.batch as f64 / waves;
        let (per_sample, device_batch) = self.host_work(s);
        let decode = per_wave * self.host_decode;
        let read = per_wave * self.host_read;
        let side_by_side = self.requests().min(self.in_flight.max(1));
        let decode = if side_by_side > 1 {
            decode.max(read / side_by_side as f64) + self.host_read
        } else {
            decode + read
        };
        let per_group = usize::try_from(device_batch)
            .unwrap_or(1)
            .div_ceil(self.request_size.max(1))
            .max(1);
        let groups = side_by_side.div_ceil(per_group).max(1) as f64;
        (decode, per_wave * per_sample, groups)
    }

    pub fn estimate(&self, split: Split) -> Estimate {
        let b = self.batch as f64;
        let (storage, compute, memory) = match split {
            Split::At(s) => {
                let bytes = b * self.bytes_at[s] as f64;
                let net = bytes / self.bandwidth.max(1.0);
                // Requests go out in waves of `in_flight`; a wave's transfer overlaps the next
                // wave's work. Within a wave, a group's responses cross the network while the
                // next groups compute: the wave ends one group's transfer after its work, or,
                // when the link is the longer part, a whole wave's transfer after the first
                // group's layers.
                let waves = self.requests().div_ceil(self.in_flight.max(1)).max(1) as f64;
                let n = net / waves;
                let (decode, layers, groups) = self.wave_work(s, waves);
                let w = decode + layers;
                let last = (w + n / groups).max(decode + layers / groups + n);
                let storage = ((waves - 1.0) * w.max(n)
                    + last
                    + waves * self.latency
                    + bytes * self.parse_per_byte)
                    * self.storage_scale;
                let compute = (b * self.local_layer[s..self.freeze].iter().sum::<f64>()
                    + self.head_step)
                    * self.compute_scale;
                (storage, compute, self.memory(s))
            }
            Split::None => {
                let read = b * self.object_bytes / self.store_bandwidth.max(1.0);
                let decode = b * self.local_decode;
                let layers =
                    b * self.local_layer[..self.freeze].iter().sum::<f64>() + self.head_step;
                let (storage, compute) = if self.local_cores > 1 {
                    (read.max(decode), layers)
                } else {
                    (read, layers + decode)
                };
                (
                    storage * self.storage_scale,
                    compute * self.compute_scale,
                    self.memory(0),
                )
            }
        };
        let n = self.iterations.max(1) as f64;
        let epoch = storage + storage.max(compute) * (n - 1.0) + compute;
        Estimate {
            split,
            storage,
            compute,
            epoch,
            memory,
            fits: memory <= self.memory_limit,
        }
    }

    /// Compute-tier memory at split s: weights of [s, end), the largest activation pair of the
    /// frozen layers it runs, twice the head's activations (forward and gradients), and the
    /// prefetched batches.
    fn memory(&self, s: usize) -> u64 {
        let b = self.batch as u64;
        let pair = (s..self.freeze)
            .map(|i| self.layer_in_bytes[i] + self.layer_out_bytes[i])
            .max()
            .unwrap_or(0);
        let head: u64 = self.layer_out_bytes[self.freeze..].iter().sum();
        self.weight_bytes[s] + b * pair + 2 * b * head + self.prefetch as u64 * b * self.bytes_at[s]
    }

    /// Every candidate's estimate: `none` and splits 0..=freeze.
    pub fn estimates(&self) -> Vec<Estimate> {
        std::iter::once(Split::None)
            .chain((0..=self.freeze).map(Split::At))
            .map(|s| self.estimate(s))
            .collect()
    }

    /// The cheapest split that fits; `none` if nothing else fits.
    pub fn choose(&self) -> Estimate {
        let all = self.estimates();
        all.iter()
            .filter(|e| e.fits)
            .min_by(|a, b| a.epoch.total_cmp(&b.epoch))
            .copied()
            .unwrap_or(all[0])
    }
}

/// Bytes per sample sent at each split 0..=freeze of `pkg` (split 0 in f32, the others in
/// `wire`, int8's scales included).
pub fn bytes_at(
    pkg: &hapi_model::ModelPackage,
    freeze: usize,
    wire: hapi_wire::tensor::WireDtype,
) -> Vec<u64> {
    let m = pkg.manifest();
    let input: i64 = m.input.shape.iter().product();
    std::iter::once(input as u64 * 4)
        .chain(m.layers[..freeze].iter().map(|l| {
            let shape: Vec<u64> = l
                .output_shape
                .iter()
                .map(|&d| u64::try_from(d).unwrap_or(0))
                .collect();
            wire.sample_bytes(&shape)
        }))
        .collect()
}

/// The split with the smallest output among 1..=freeze (ties: the earliest).
pub fn min_output_split(bytes_at: &[u64], freeze: usize) -> usize {
    (1..=freeze)
        .min_by_key(|&s| (bytes_at[s], s))
        .unwrap_or(freeze)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn costs(bandwidth: f64) -> Costs {
        // A 4-layer model whose layer 2 output is tiny; storage is as fast as compute.
        Costs {
            batch: 32,
            iterations: 10,
            freeze: 3,
            request_size: 8,
            in_flight: 4,
            host_read: 0.0,
            host_decode: 0.002,
            host_layer: vec![0.01, 0.01, 0.01, 0.001],
            host_curve: Vec::new(),
            latency: 0.001,
            bandwidth,
            bytes_at: vec![600_000, 800_000, 4_000, 50_000],
            parse_per_byte: 1e-10,
            local_layer: vec![0.01, 0.01, 0.01, 0.001],
            head_step: 0.01,
            object_bytes: 100_000.0,
            store_bandwidth: bandwidth,
            local_decode: 0.002,
            local_cores: 1,
            weight_bytes: vec![4_000_000, 3_000_000, 2_000_000, 1_000_000],
            layer_in_bytes: vec![600_000, 600_000, 800_000, 4_000],
            layer_out_bytes: vec![600_000, 800_000, 4_000, 40],
            prefetch: 2,
            memory_limit: u64::MAX,
            storage_scale: 1.0,
            compute_scale: 1.0,
        }
    }

    #[test]
    fn a_slow_network_favours_the_small_output_and_a_fast_one_balances_the_tiers() {
        let slow = costs(1e6).choose();
        assert_eq!(slow.split, Split::At(2), "{slow:?}");
        // With a fast network, splitting at 1 or 2 balances the two tiers; 2 keeps more work
        // on storage but the compute stage then only has layer 2 and the head.
        let fast = costs(1e10).choose();
        assert!(matches!(fast.split, Split::At(1 | 2)), "{fast:?}");
    }

    #[test]
    fn a_waves_requests_finish_in_turn_and_each_ones_transfer_overlaps_the_next_ones_work() {
        let mut c = costs(1e6);
        c.latency = 0.0;
        c.parse_per_byte = 0.0;
        let b = c.batch as f64;
        let decode = b * c.host_decode;
        let layers = b * c.host_layer[..1].iter().sum::<f64>();
        let net = b * c.bytes_at[1] as f64 / c.bandwidth;
        assert!(net > decode + layers, "the link is the longer part here");
        // 32 samples in requests of 8 with 4 in flight: one wave. The device runs one sample
        // at a time (no curve), so the four requests finish one after another and the link is
        // busy from the first one's end.
        let one = c.estimate(Split::At(1)).storage;
        let expect = decode + layers / 4.0 + net;
        assert!((one - expect).abs() < 1e-9, "{one} vs {expect}");
        // A device batch of 32 holds all four: they finish together, then cross the link.
        c.host_curve = vec![(32, c.host_layer.clone())];
        let together = c.estimate(Split::At(1)).storage;
        assert!(
            (together - (decode + layers + net)).abs() < 1e-9,
            "{together}"
        );
        // A fast link: the work is the longer part; one request's transfer follows it.
        c.host_curve.clear();
        c.bandwidth = 1e9;
        let fast_net = b * c.bytes_at[1] as f64 / c.bandwidth;
        let fast = c.estimate(Split::At(1)).storage;
        assert!(
            (fast - (decode + layers + fast_net / 4.0)).abs() < 1e-9,
            "{fast}"
        );
        // One request in flight: four waves, each wave's transfer hides the next one's work.
        c.bandwidth = 1e6;
        c.in_flight = 1;
        let four = c.estimate(Split::At(1)).storage;
        let (w, n) = ((decode + layers) / 4.0, net / 4.0);
        assert!((four - (w + 3.0 * w.max(n) + n)).abs() < 1e-9, "{four}");
    }

    #[test]
    fn reads_overlap_the_other_requests_decoding_but_not_a_lone_requests() {
        let mut c = costs(1e12);
        c.latency = 0.0;
        c.parse_per_byte = 0.0;
        c.host_read = 0.012;
        // All four requests in one device batch, so that only the reads differ below.
        c.host_curve = vec![(32, c.host_layer.clone())];
        let b = c.batch as f64;
        let decode = b * c.host_decode;
        let layers = b * c.host_layer[..3].iter().sum::<f64>();
        let net = b * c.bytes_at[3] as f64 / c.bandwidth;
        // Four requests of 8 side by side: the reads (32 x 12 ms / 4 requests) are longer than
        // the decoding (32 x 2 ms), so the host waits on them, plus the first read.
        let four = c.estimate(Split::At(3)).storage;
        let reads = b * c.host_read / 4.0;
        assert!(reads > decode);
        assert!(
            (four - (reads + c.host_read + layers + net)).abs() < 1e-9,
            "{four}"
        );
        // Fast reads hide behind the others' decoding but for the first.
        c.host_read = 0.001;
        let hidden = c.estimate(Split::At(3)).storage;
        assert!(
            (hidden - (decode + c.host_read + layers + net)).abs() < 1e-9,
            "{hidden}"
        );
        // One request in flight: nothing to overlap with; four waves of 8 reads and work each.
        c.in_flight = 1;
        c.host_curve.clear();
        let alone = c.estimate(Split::At(3)).storage;
        let w = (b * c.host_read + decode + layers) / 4.0;
        assert!((alone - (4.0 * w + net / 4.0)).abs() < 1e-9, "{alone}");
    }

    #[test]
    fn the_host_work_is_its_fastest_batch_within_what_is_in_flight() {
        let mut c = costs(1e9);
        let flat = c.estimate(Split::At(3)).storage;
        // Batch 4 is the host's fastest, batch 64 would be faster still but never happens
        // with 8 keys x 4 requests in flight.
        c.host_curve = vec![
            (1, vec![0.01, 0.01, 0.01, 0.001]),
            (4, vec![0.005, 0.005, 0.005, 0.001]),
            (64, vec![0.001, 0.001, 0.001, 0.001]),
        ];
        let curved = c.estimate(Split::At(3)).storage;
        let b = c.batch as f64;
        assert!((flat - curved - b * 0.015).abs() < 1e-9, "{flat} {curved}");
    }

    #[test]
    fn splits_that_do_not_fit_are_dropped() {
        let mut c = costs(1e6);
        c.memory_limit = c.estimate(Split::At(2)).memory - 1;
        let e = c.choose();
        assert_ne!(e.split, Split::At(2));
        assert!(e.fits);
    }

    #[test]
    fn min_output_split_is_the_smallest_bytes() {
        assert_eq!(min_output_split(&[600_000, 800_000, 4_000, 50_000], 3), 2);
    }
}

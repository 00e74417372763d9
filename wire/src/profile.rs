//! A model on the host's device, as `GET /v1/models/{name}/profile` describes it: per-layer
//! time and output size, and the memory model that storage batch adaptation runs on.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One layer's cost at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    pub index: usize,
    pub name: String,
    pub batch: i64,
    /// Median over the repetitions of the batch's forward time, divided by the batch size.
    pub seconds_per_sample: f64,
    pub output_bytes_per_sample: u64,
}

/// A batch size within this fraction of the fastest per sample counts as fast.
pub const EFFICIENT_WITHIN: f64 = 0.05;

/// One layer's memory (and time) on the host's device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerMemory {
    pub index: usize,
    pub name: String,
    pub weights_bytes: u64,
    pub input_bytes_per_sample: u64,
    pub output_bytes_per_sample: u64,
    /// Peak growth per sample while the layer runs (input excluded): what the model uses.
    pub per_sample_bytes: u64,
    /// Peak growth independent of the batch size.
    pub workspace_bytes: u64,
    /// The measured slope before the bound was applied (0 when not measured).
    pub measured_per_sample_bytes: u64,
    /// Forward time per sample at each of [`ModelMemory::time_batches`] (median of the runs).
    pub seconds_per_sample: Vec<f64>,
}

/// A model's memory, per layer: running layers [a, b) on `n` samples takes
/// `weights + workspace + n * per_sample` bytes ([`ModelMemory::segment`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelMemory {
    pub model: String,
    /// `rss-peak` (measured on CPU) or `activation-bound` (CUDA).
    pub method: String,
    pub batches: [i64; 2],
    /// Batch sizes of the per-sample times.
    pub time_batches: Vec<i64>,
    /// How long the measurement took.
    pub seconds: f64,
    pub layers: Vec<LayerMemory>,
}

/// What running a segment takes: `weights` while loaded, `workspace + n * per_sample` per run,
/// and about `seconds(n)` of device time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentCost {
    pub weights: u64,
    pub workspace: u64,
    pub per_sample: u64,
    /// Output bytes per sample (f32).
    pub output_per_sample: u64,
    /// The batch size that runs fastest per sample, when smaller batches beat large ones
    /// ([`ModelMemory::efficient_batch`]).
    pub efficient_batch: Option<i64>,
    /// (batch size, seconds per sample) as measured, in increasing batch size.
    pub times: Vec<(i64, f64)>,
}

impl SegmentCost {
    /// Bytes a run of `n` samples reserves.
    pub fn run_bytes(&self, n: u64) -> u64 {
        self.workspace
            .saturating_add(self.per_sample.saturating_mul(n))
    }

    /// Estimated device seconds of a batch of `n` samples: per-sample time interpolated
    /// linearly between the measured batch sizes, flat beyond them.
    pub fn seconds(&self, n: i64) -> f64 {
        let n = n.max(1);
        let per_sample = match self.times.as_slice() {
            [] => 0.0,
            [(_, t)] => *t,
            times => {
                let (first, last) = (times[0], times[times.len() - 1]);
                if n <= first.0 {
                    first.1
                } else if n >= last.0 {
                    last.1
                } else {
                    let k = times.iter().position(|&(b, _)| b >= n).unwrap_or(0);
                    let ((b0, t0), (b1, t1)) = (times[k.saturating_sub(1)], times[k]);
                    if b1 == b0 {
                        t1
                    } else {
                        t0 + (t1 - t0) * (n - b0) as f64 / (b1 - b0) as f64
                    }
                }
            }
        };
        per_sample * n as f64
    }

    /// The largest batch whose estimated time stays within `seconds` (at least 1).
    pub fn batch_within(&self, seconds: f64, at_most: i64) -> i64 {
        let at_most = at_most.max(1);
        if self.seconds(at_most) <= seconds {
            return at_most;
        }
        // `seconds(n)` grows with n wherever per-sample times are positive: bisect.
        let (mut lo, mut hi) = (1i64, at_most);
        while lo < hi {
            let mid = lo + (hi - lo + 1) / 2;
            if self.seconds(mid) <= seconds {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

impl ModelMemory {
    /// Per-sample seconds of layers `range` at each measured batch size (NaN where a layer has
    /// no measurement).
    fn range_times(&self, range: Range<usize>) -> Vec<(i64, f64)> {
        let layers = self.layers.get(range).unwrap_or_default();
        self.time_batches
            .iter()
            .enumerate()
            .map(|(k, &b)| {
                let t = layers
                    .iter()
                    .map(|l| l.seconds_per_sample.get(k).copied().unwrap_or(f64::NAN))
                    .sum();
                (b, t)
            })
            .collect()
    }

    /// The batch size at which layers `range` cost the least time per sample on this device,
    /// among those measured. Larger batches are not always cheaper: on a CPU, the early layers
    /// of a network with large activations run slower per sample once a batch's activations
    /// outgrow the caches. `None` when the largest measured batch is the cheapest (bigger is
    /// presumably as good).
    pub fn efficient_batch(&self, range: Range<usize>) -> Option<i64> {
        let times = self.range_times(range);
        let cheapest = times
            .iter()
            .map(|&(_, t)| t)
            .filter(|t| t.is_finite())
            .min_by(f64::total_cmp)?;
        // The largest batch within 5% of the cheapest: measurements of close sizes differ by
        // about that much from run to run, and larger batches pool better.
        let best = (0..times.len())
            .rev()
            .find(|&k| times[k].1 <= cheapest * (1.0 + EFFICIENT_WITHIN))?;
        (best + 1 < times.len()).then(|| times[best].0)
    }

    /// The most any one layer needs to run a single sample (input, growth and workspace).
    pub fn one_sample_peak(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.workspace_bytes + l.input_bytes_per_sample + l.per_sample_bytes)
            .max()
            .unwrap_or(0)
    }

    pub fn weights(&self) -> u64 {
        self.layers.iter().map(|l| l.weights_bytes).sum()
    }

    /// The cost of layers `range` (empty if the range is outside the model).
    pub fn segment(&self, range: Range<usize>) -> SegmentCost {
        let layers = self.layers.get(range.clone()).unwrap_or_default();
        let input = layers.first().map_or(0, |l| l.input_bytes_per_sample);
        let output = layers.last().map_or(0, |l| l.output_bytes_per_sample);
        let working = layers
            .iter()
            .enumerate()
            .map(|(k, l)| {
                // The first layer's input is the caller's, already counted.
                let own_input = if k == 0 { 0 } else { l.input_bytes_per_sample };
                own_input + l.per_sample_bytes
            })
            .max()
            .unwrap_or(0);
        SegmentCost {
            weights: layers.iter().map(|l| l.weights_bytes).sum(),
            workspace: layers.iter().map(|l| l.workspace_bytes).max().unwrap_or(0),
            per_sample: input + working + output,
            output_per_sample: output,
            efficient_batch: self.efficient_batch(range.clone()),
            times: self
                .range_times(range)
                .into_iter()
                .filter(|(_, t)| t.is_finite())
                .collect(),
        }
    }
}

/// The device's memory budget and what holds it now (in a tenant's model profile, the budget
/// only, the rest zero: what holds the device is every tenant's activity).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    pub budget: u64,
    pub reserved: u64,
    pub weights: u64,
    pub peak_bytes: u64,
    /// Models whose weights are loaded now.
    pub loaded_models: u64,
    /// Models unloaded to make room for others since start.
    pub evictions: u64,
    pub in_progress: u64,
    pub peak_in_progress: u64,
    pub batches: u64,
    pub batch_samples: u64,
    pub largest_batch: i64,
    /// Pooled batches running now, and the most that ran at once.
    #[serde(default)]
    pub running_batches: u64,
    #[serde(default)]
    pub peak_running_batches: u64,
    /// Model loads started since start.
    #[serde(default)]
    pub loads: u64,
    /// Times a load waited because other tenants' models, each tenant within its share of the
    /// budget, held the room it needed.
    #[serde(default)]
    pub deferred_loads: u64,
}

/// The answer of `GET /v1/models/{name}/profile`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelProfile {
    pub model: String,
    pub device: String,
    /// Batch size of `layers`' measurements.
    pub batch: i64,
    pub layers: Vec<LayerProfile>,
    /// Per-layer memory and time on this device.
    pub memory: ModelMemory,
    /// The device's budget (the rest zero: what holds the device is every tenant's activity,
    /// the operator's to see in `/metrics`).
    pub device_memory: DeviceMemory,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(i: usize, inp: u64, out: u64, per: u64, ws: u64, w: u64) -> LayerMemory {
        LayerMemory {
            index: i,
            name: format!("l{i}"),
            weights_bytes: w,
            input_bytes_per_sample: inp,
            output_bytes_per_sample: out,
            per_sample_bytes: per,
            workspace_bytes: ws,
            measured_per_sample_bytes: per,
            seconds_per_sample: vec![1.0, 0.5, 0.6],
        }
    }

    fn model() -> ModelMemory {
        ModelMemory {
            model: "m".into(),
            method: "rss-peak".into(),
            batches: [4, 16],
            time_batches: vec![1, 4, 16],
            seconds: 0.0,
            layers: vec![
                layer(0, 100, 400, 500, 10, 1000),
                layer(1, 400, 50, 60, 30, 2000),
                layer(2, 50, 20, 20, 0, 4000),
            ],
        }
    }

    #[test]
    fn segment_cost_holds_input_largest_working_set_and_output() {
        let m = model();
        // [0, 3): input 100 + max(500, 400 + 60, 50 + 20) + output 20.
        let c = m.segment(0..3);
        assert_eq!(
            (c.weights, c.workspace, c.per_sample, c.output_per_sample),
            (7000, 30, 620, 20)
        );
        assert_eq!(c.efficient_batch, Some(4));
        // [1, 3): input 400 + max(60, 50 + 20) + output 20.
        assert_eq!(m.segment(1..3).per_sample, 490);
        assert_eq!(m.segment(1..3).run_bytes(10), 30 + 4900);
        assert_eq!(m.weights(), 7000);
        // A range outside the model costs nothing rather than panicking.
        assert_eq!(m.segment(2..9).per_sample, 0);
        let mut m = m;
        for l in &mut m.layers {
            l.seconds_per_sample = vec![1.0, 0.5, 0.4];
        }
        assert_eq!(
            m.efficient_batch(0..3),
            None,
            "the largest measured batch is best"
        );
    }

    #[test]
    fn segment_time_is_interpolated_and_bounds_the_batch() {
        let c = model().segment(0..3);
        // 3 layers: 3.0 s per sample at 1, 1.5 at 4, 1.8 at 16.
        assert!((c.seconds(1) - 3.0).abs() < 1e-9);
        assert!((c.seconds(4) - 6.0).abs() < 1e-9);
        assert!((c.seconds(10) - 10.0 * 1.65).abs() < 1e-9);
        assert!((c.seconds(32) - 32.0 * 1.8).abs() < 1e-9);
        assert_eq!(c.batch_within(6.0, 100), 4);
        assert_eq!(c.batch_within(0.1, 100), 1, "at least one sample");
        assert_eq!(c.batch_within(1e9, 7), 7);
    }
}

//! Choosing the split: measuring both tiers and the network, estimating every split, and
//! running the best candidates for real.

use crate::dataset::Sample;
use crate::head::Head;
use crate::plan::{Costs, Estimate, Split, min_output_split};
use anyhow::Context;
use futures::StreamExt;
use indicatif::ProgressBar;
use object_store::ObjectStoreExt;
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;

use super::config::{PlanReport, Probe, SplitArg};
use super::train::{Job, available_memory};

/// Candidates the planner runs for real before choosing.
pub const PROBE_CANDIDATES: usize = 4;
/// Splits whose estimate is within this factor of the best are plausible winners: the model's
/// stage estimates are off by up to about 25% here.
pub const PLAUSIBLE: f64 = 1.3;

/// The splits to run for real: the model's best, then others among the plausible ones spread
/// evenly over the layers (neighbouring splits often cost the same, and probing three of them
/// would tell nothing new), `none` included when plausible.
pub fn probe_candidates(estimates: &[Estimate]) -> Vec<Estimate> {
    let fits: Vec<Estimate> = estimates.iter().filter(|e| e.fits).copied().collect();
    let Some(best) = fits
        .iter()
        .min_by(|a, b| a.epoch.total_cmp(&b.epoch))
        .copied()
    else {
        return Vec::new();
    };
    let mut plausible: Vec<Estimate> = fits
        .into_iter()
        .filter(|e| e.epoch <= best.epoch * PLAUSIBLE && e.split != best.split)
        .collect();
    plausible.sort_by_key(|e| e.split);
    let mut out = vec![best];
    let k = (PROBE_CANDIDATES - 1).min(plausible.len());
    for j in 0..k {
        // Evenly spaced positions over the plausible splits, in layer order.
        let i = if k == 1 {
            0
        } else {
            j * (plausible.len() - 1) / (k - 1)
        };
        let e = plausible[i];
        if !out.iter().any(|o| o.split == e.split) {
            out.push(e);
        }
    }
    out
}
/// Iterations per probed candidate (the second overlaps the first, as in training).
pub const PROBE_ITERATIONS: usize = 2;

impl Job {
    /// Bytes per sample sent at each split 0..=freeze (split 0 in f32, the others in the
    /// wire dtype).
    pub(super) fn bytes_at(&self) -> Vec<u64> {
        let m = self.pkg.manifest();
        let input: i64 = m.input.shape.iter().product();
        let wire = self.cfg.wire_dtype.size();
        std::iter::once(input as u64 * 4)
            .chain(
                m.layers[..self.freeze]
                    .iter()
                    .map(|l| l.output_bytes_per_sample() / 4 * wire),
            )
            .collect()
    }

    /// Measures both tiers and the network, and estimates every split.
    pub fn plan(&mut self) -> anyhow::Result<PlanReport> {
        let started = Instant::now();
        let client = Arc::clone(self.client.as_ref().context("--split auto needs --host")?);
        let cfg = &self.cfg;
        let r = cfg.request_size.max(1);
        let probe_keys: Vec<String> = self
            .data
            .train
            .iter()
            .take(r)
            .map(|s| s.key.clone())
            .collect();
        let freeze = self.freeze;
        let (host_profile, big, small) = self.rt.block_on(async {
            let profile = client.profile(&cfg.model).await?;
            // Warm-up, then one large (split 0) and one small (split freeze) transfer.
            client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, 0)
                .await?;
            let big = client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, 0)
                .await?;
            client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, freeze)
                .await?;
            let small = client
                .invoke(&cfg.bucket, &probe_keys, &cfg.model, freeze)
                .await?;
            anyhow::Ok((profile, big, small))
        })?;
        let n = probe_keys.len() as f64;
        let t_big = (big.wall.as_secs_f64() - big.server.total).max(1e-6);
        let t_small = (small.wall.as_secs_f64() - small.server.total).max(0.0);
        let (bandwidth, latency) = if big.bytes > small.bytes && t_big > t_small {
            let bw = (big.bytes - small.bytes) as f64 / (t_big - t_small);
            (bw, (t_small - small.bytes as f64 / bw).max(0.0))
        } else {
            (big.bytes as f64 / t_big, t_small)
        };
        // No pushdown: read the same objects from the store, decode them here.
        let store = Arc::clone(&self.store);
        let paths: Vec<object_store::path::Path> = probe_keys
            .iter()
            .map(|k| object_store::path::Path::from(k.as_str()))
            .collect();
        let read_started = Instant::now();
        let objects: Vec<_> = self.rt.block_on(async {
            futures::stream::iter(paths)
                .map(|p| {
                    let store = Arc::clone(&store);
                    async move { store.get(&p).await?.bytes().await }
                })
                .buffered(cfg.in_flight.max(1) * r)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
        })?;
        let read_s = read_started.elapsed().as_secs_f64().max(1e-6);
        let object_total: usize = objects.iter().map(|o| o.len()).sum();
        let transform = self.pkg.manifest().input.transform();
        let decode_started = Instant::now();
        for o in &objects {
            hapi_preprocess::preprocess(o, &transform)?;
        }
        let local_decode = decode_started.elapsed().as_secs_f64() / n;
        // The compute tier's layers at the training batch size, and the head's step.
        let b = cfg.batch.min(64) as i64;
        let local = hapi_model::profile::profile_layers(&self.pkg, b, 1)?;
        let head_step = self.time_head_step()?;
        let m = self.pkg.manifest();
        let weights: Vec<u64> = (0..=freeze)
            .map(|s| 4 * m.layers[s..].iter().map(|l| l.params).sum::<u64>())
            .collect();
        let costs = Costs {
            batch: cfg.batch,
            iterations: self.iterations(),
            freeze,
            request_size: r,
            in_flight: cfg.in_flight,
            host_decode: (big.server.read + big.server.decode) / n,
            host_layer: host_profile
                .layers
                .iter()
                .map(|l| l.seconds_per_sample)
                .collect(),
            host_curve: {
                let m = &host_profile.memory;
                m.time_batches
                    .iter()
                    .enumerate()
                    .map(|(k, &b)| {
                        let t = m
                            .layers
                            .iter()
                            .map(|l| l.seconds_per_sample.get(k).copied().unwrap_or(f64::NAN))
                            .collect();
                        (b, t)
                    })
                    .filter(|(_, t): &(i64, Vec<f64>)| t.iter().all(|v| v.is_finite()))
                    .collect()
            },
            latency,
            bandwidth,
            bytes_at: self.bytes_at(),
            parse_per_byte: big.deserialize.as_secs_f64() / big.bytes.max(1) as f64,
            local_layer: local.iter().map(|l| l.seconds_per_sample).collect(),
            head_step,
            object_bytes: object_total as f64 / n,
            store_bandwidth: object_total as f64 / read_s,
            local_decode,
            local_cores: std::thread::available_parallelism().map_or(1, usize::from),
            weight_bytes: weights,
            layer_in_bytes: m
                .layers
                .iter()
                .map(|l| 4 * l.input_shape.iter().product::<i64>() as u64)
                .collect(),
            layer_out_bytes: m
                .layers
                .iter()
                .map(|l| l.output_bytes_per_sample())
                .collect(),
            prefetch: cfg.prefetch,
            memory_limit: cfg.memory_limit.unwrap_or_else(available_memory),
            storage_scale: 1.0,
            compute_scale: 1.0,
        };
        let mut costs = costs;
        let probes = self.probe(&costs)?;
        let chosen = match probes.iter().min_by(|a, b| a.epoch_s.total_cmp(&b.epoch_s)) {
            Some(best) => {
                // Calibrate the model on the chosen split, so that re-planning starts from what
                // was measured there.
                // (Within bounds: a stage predicted at almost nothing gives no scale.)
                let scale = |measured: f64, predicted: f64| {
                    if predicted > 1e-3 {
                        (measured / predicted).clamp(0.2, 5.0)
                    } else {
                        1.0
                    }
                };
                costs.storage_scale = scale(best.storage_s, best.predicted.storage);
                costs.compute_scale = scale(best.compute_s, best.predicted.compute);
                best.split
            }
            None => costs.choose().split,
        };
        Ok(PlanReport {
            chosen,
            probe_s: started.elapsed().as_secs_f64(),
            estimates: costs.estimates(),
            costs,
            probes,
        })
    }

    /// Runs the model's best few splits for real, without training: the same first batches
    /// through the real pipeline (requests in flight, prefetching), so that the choice among
    /// close candidates rests on measurements rather than on the model's error, which can
    /// exceed their differences.
    pub(super) fn probe(&mut self, costs: &Costs) -> anyhow::Result<Vec<Probe>> {
        let ranked = probe_candidates(&costs.estimates());
        let batch: Vec<Sample> = self
            .data
            .train
            .iter()
            .take(self.cfg.batch)
            .cloned()
            .collect();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let n = costs.iterations.max(1) as f64;
        let pb = ProgressBar::hidden();
        let mut probes = Vec::new();
        for e in ranked {
            let (times, _, _) = self.feed(
                e.split,
                vec![batch.clone(); PROBE_ITERATIONS],
                &pb,
                false,
                |_, _, _| Ok(()),
            )?;
            let storage = times.mean_storage();
            let compute = times.mean_compute() + costs.head_step;
            probes.push(Probe {
                split: e.split,
                storage_s: storage,
                compute_s: compute,
                epoch_s: storage + storage.max(compute) * (n - 1.0) + compute,
                predicted: e,
            });
        }
        Ok(probes)
    }

    /// One training step of a throw-away copy of the head on random features.
    pub(super) fn time_head_step(&self) -> anyhow::Result<f64> {
        let mut probe = Head::new(
            &self.pkg,
            self.freeze,
            self.data.classes.len(),
            self.device,
            self.cfg.seed,
            self.cfg.optimizer,
            self.cfg.lr,
        )?;
        let shape = self.head_input_shape(self.cfg.batch);
        let x = Tensor::randn(shape.as_slice(), (tch::Kind::Float, self.device));
        let y = Tensor::zeros([self.cfg.batch as i64], (tch::Kind::Int64, self.device));
        probe.train_step(&x, &y);
        let t = Instant::now();
        probe.train_step(&x, &y);
        hapi_model::device::synchronize(self.device);
        Ok(t.elapsed().as_secs_f64())
    }

    /// The split a fixed `--split` names.
    pub fn fixed_split(&self, arg: SplitArg) -> Split {
        match arg {
            SplitArg::None => Split::None,
            SplitArg::Freeze => Split::At(self.freeze),
            SplitArg::Min => Split::At(min_output_split(&self.bytes_at(), self.freeze)),
            SplitArg::At(s) => Split::At(s),
            SplitArg::Auto => Split::At(self.freeze),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PLAUSIBLE, probe_candidates};
    use crate::plan::{Estimate, Split};

    fn est(split: Split, epoch: f64) -> Estimate {
        Estimate {
            split,
            storage: epoch,
            compute: 0.0,
            epoch,
            memory: 0,
            fits: true,
        }
    }

    #[test]
    fn probes_spread_over_the_plausible_splits_and_start_with_the_best() {
        // Splits 9..=25: the model likes 25 best; 9..=19 and 22..=24 are plausible.
        let mut all = vec![est(Split::None, 10.0)];
        for s in 0..=25 {
            let e = match s {
                25 => 3.88,
                22..=24 => 3.9,
                9..=19 => 4.4,
                _ => 9.0,
            };
            all.push(est(Split::At(s), e));
        }
        let c = probe_candidates(&all);
        let splits: Vec<Split> = c.iter().map(|e| e.split).collect();
        assert_eq!(splits[0], Split::At(25));
        assert_eq!(splits.len(), 4, "{splits:?}");
        assert!(splits.contains(&Split::At(9)), "{splits:?}");
        assert!(c.iter().all(|e| e.epoch <= 3.88 * PLAUSIBLE));
        // Nothing else plausible: only the best.
        let c = probe_candidates(&[est(Split::None, 10.0), est(Split::At(3), 2.0)]);
        assert_eq!(c.len(), 1);
    }
}

//! Ranking the splits: measuring both tiers and the network and estimating every split. The
//! choice itself is made on training iterations ([`crate::adapt`]).

use crate::adapt::candidates;
use crate::head::Head;
use crate::plan::{Costs, Split};
use anyhow::Context;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use std::sync::Arc;
use std::time::Instant;
use tch::Tensor;

use super::config::{PlanReport, SplitArg};
use super::train::{Job, available_memory};

impl Job {
    /// Bytes per sample sent at each split 0..=freeze (split 0 in f32, the others in the
    /// wire dtype).
    pub(super) fn bytes_at(&self) -> Vec<u64> {
        crate::plan::bytes_at(&self.pkg, self.freeze, self.cfg.wire_dtype)
    }

    /// Measures both tiers and the network, estimates every split, and loads the candidates'
    /// segments on the host (one sample each), so that no training iteration pays for that.
    pub fn plan(&mut self) -> anyhow::Result<PlanReport> {
        self.plan_over(self.iterations())
    }

    /// [`Self::plan`] for a run of `iterations` (the pipeline's filling and draining weigh more
    /// in a short run, so the ranking depends on it).
    pub(super) fn plan_over(&mut self, iterations: usize) -> anyhow::Result<PlanReport> {
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
            iterations,
            freeze,
            request_size: r,
            in_flight: cfg.in_flight,
            host_read: big.server.read / n,
            host_decode: big.server.decode / n,
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
        let estimates = costs.estimates();
        let candidates: Vec<Split> = candidates(&estimates).iter().map(|e| e.split).collect();
        let warm: Vec<usize> = candidates
            .iter()
            .filter_map(|s| match s {
                Split::At(s) if *s != 0 && *s != freeze => Some(*s),
                _ => None,
            })
            .collect();
        let one = &probe_keys[..1.min(probe_keys.len())];
        self.rt.block_on(async {
            for s in warm {
                client.invoke(&cfg.bucket, one, &cfg.model, s).await?;
            }
            anyhow::Ok(())
        })?;
        Ok(PlanReport {
            chosen: costs.choose().split,
            candidates,
            plan_s: started.elapsed().as_secs_f64(),
            estimates,
            costs,
        })
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
        arg.named(self.freeze, &self.bytes_at())
    }
}

//! Frozen features kept in memory (`--cache-features`) and across jobs (`--feature-store`).

use crate::dataset::Sample;
use indicatif::ProgressBar;
use std::collections::HashSet;
use tch::{Device, Tensor};

use super::train::{Job, holds_every_sample, log};

impl Job {
    /// Whether the feature store gave the features of every sample (nothing to extract).
    pub(super) fn all_stored(&self) -> bool {
        self.features.is_some() && holds_every_sample(&self.cache, &self.data)
    }

    pub(super) fn cache_batch(&mut self, keys: &[String], feats: &Tensor) -> anyhow::Result<()> {
        let flat = feats.to_device(Device::Cpu).contiguous().view([-1]);
        let all: Vec<f32> = Vec::<f32>::try_from(&flat)?;
        let per = all.len() / keys.len().max(1);
        for (k, row) in keys.iter().zip(all.chunks_exact(per.max(1))) {
            if self.cache.insert(k.clone(), row.to_vec()).is_none() && self.features.is_some() {
                self.unsaved.push(k.clone());
            }
        }
        Ok(())
    }

    /// Writes the features computed since the last call to the feature store. A failure (a
    /// full disk, say) is reported and the job goes on: it holds them in memory, and a later
    /// job extracts them again.
    pub(super) fn save_features(&mut self, pb: &ProgressBar) {
        let Some(fs) = &self.features else {
            return;
        };
        if self.unsaved.is_empty() {
            return;
        }
        let keys: HashSet<String> = std::mem::take(&mut self.unsaved).into_iter().collect();
        let samples: Vec<&Sample> = self
            .data
            .train
            .iter()
            .chain(&self.data.test)
            .filter(|s| keys.contains(&s.key))
            .collect();
        match fs.add(&samples, &self.cache) {
            Ok(Some(path)) => log(
                pb,
                &format!(
                    "feature store: {} samples added ({})",
                    samples.len(),
                    path.display()
                ),
            ),
            Ok(None) => {}
            Err(e) => log(pb, &format!("feature store: not written: {e:#}")),
        }
        self.enforce_feature_cap(pb);
    }

    /// Keeps the feature store within `--feature-store-cap`; a failure is reported and the job
    /// goes on.
    pub(super) fn enforce_feature_cap(&self, pb: &ProgressBar) {
        let (Some(root), Some(cap)) = (&self.cfg.feature_store, self.cfg.feature_store_cap) else {
            return;
        };
        match crate::features::enforce_cap(root, cap) {
            Ok(e) if e.garbage + e.evicted > 0 => log(
                pb,
                &format!(
                    "feature store: {} shards evicted ({} samples, least recently used first), {} superseded shards deleted; {} of {} used",
                    e.evicted,
                    e.evicted_samples,
                    e.garbage,
                    hapi_wire::units::format_size(e.bytes),
                    hapi_wire::units::format_size(cap)
                ),
            ),
            Ok(_) => {}
            Err(e) => log(pb, &format!("feature store: cap not enforced: {e:#}")),
        }
    }

    pub(super) fn cached_tensor(&self, samples: &[Sample]) -> Option<(Tensor, Tensor)> {
        let mut data = Vec::new();
        for s in samples {
            data.extend_from_slice(self.cache.get(&s.key)?);
        }
        let shape = self.head_input_shape(samples.len());
        let x = Tensor::from_slice(&data)
            .view(shape.as_slice())
            .to_device(self.device);
        let y = Tensor::from_slice(&samples.iter().map(|s| s.label).collect::<Vec<_>>())
            .to_device(self.device);
        Some((x, y))
    }
}

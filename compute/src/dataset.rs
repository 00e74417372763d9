//! The training data: an ImageFolder layout in an object store,
//! `<prefix>/{train,test}/<class>/<object>`, listed once at start.

use anyhow::{Context, bail};
use futures::TryStreamExt;
use hapi_data::SplitMix64;
use object_store::ObjectStore;
use object_store::path::Path;
use std::collections::BTreeMap;

/// One labelled object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The object key inside the bucket.
    pub key: String,
    /// Index into [`Dataset::classes`].
    pub label: i64,
    /// The object's version as listed: entity tag, size and modification time. The feature
    /// store serves a sample only at the version it was extracted from.
    pub version: String,
}

/// The listed data set.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Class names, sorted; a label is an index into this list.
    pub classes: Vec<String>,
    pub train: Vec<Sample>,
    pub test: Vec<Sample>,
}

/// How much of the data set a job uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Use at most this many training samples (a seeded, class-balanced-in-expectation subset).
    pub train: Option<usize>,
    /// Use at most this many test samples.
    pub test: Option<usize>,
    pub seed: u64,
}

impl Dataset {
    /// Lists `<prefix>/train/` and `<prefix>/test/` in `store`. Classes are the first path
    /// segments under `train/`; every test class must also have training samples.
    pub async fn list(
        store: &dyn ObjectStore,
        prefix: &str,
        limits: Limits,
    ) -> anyhow::Result<Self> {
        let prefix = prefix.trim_matches('/');
        let mut per_split = Vec::new();
        for split in ["train", "test"] {
            let root = format!("{prefix}/{split}");
            let root_path = Path::parse(&root).with_context(|| format!("prefix `{root}`"))?;
            let metas: Vec<_> = store
                .list(Some(&root_path))
                .try_collect()
                .await
                .with_context(|| format!("listing `{root}/`"))?;
            let mut by_class: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
            for meta in metas {
                let key = meta.location.to_string();
                let rest = key
                    .strip_prefix(&root)
                    .and_then(|r| r.strip_prefix('/'))
                    .with_context(|| format!("listed key `{key}` is outside `{root}/`"))?;
                let Some((class, name)) = rest.split_once('/') else {
                    continue; // a file directly under the split (e.g. a manifest): not a sample
                };
                if name.is_empty() || name.contains('/') {
                    bail!("`{key}`: expected `{root}/<class>/<object>` (ImageFolder layout)");
                }
                let version = format!(
                    "{}/{}/{}",
                    meta.e_tag.as_deref().unwrap_or("-"),
                    meta.size,
                    meta.last_modified.timestamp_millis()
                );
                by_class
                    .entry(class.to_string())
                    .or_default()
                    .push((key, version));
            }
            if by_class.is_empty() {
                bail!(
                    "no objects under `{root}/<class>/`: is the data set loaded and the prefix right?"
                );
            }
            per_split.push(by_class);
        }
        let test_map = per_split.pop().unwrap_or_default();
        let train_map = per_split.pop().unwrap_or_default();
        let classes: Vec<String> = train_map.keys().cloned().collect();
        if let Some(extra) = test_map.keys().find(|c| !train_map.contains_key(*c)) {
            bail!("test class `{extra}` has no training samples (train classes: {classes:?})");
        }
        let flatten = |map: BTreeMap<String, Vec<(String, String)>>| -> Vec<Sample> {
            let mut out = Vec::new();
            for (class, mut keys) in map {
                let label = classes.iter().position(|c| *c == class).unwrap_or(0) as i64;
                keys.sort();
                out.extend(keys.into_iter().map(|(key, version)| Sample {
                    key,
                    label,
                    version,
                }));
            }
            out
        };
        let mut train = flatten(train_map);
        let mut test = flatten(test_map);
        subset(&mut train, limits.train, limits.seed);
        subset(&mut test, limits.test, limits.seed ^ 0x7e57);
        Ok(Self {
            classes,
            train,
            test,
        })
    }
}

/// Keeps a seeded random subset of `limit` samples, in the original (sorted) order.
fn subset(samples: &mut Vec<Sample>, limit: Option<usize>, seed: u64) {
    let Some(limit) = limit else { return };
    if limit >= samples.len() {
        return;
    }
    let mut idx: Vec<usize> = (0..samples.len()).collect();
    shuffle(&mut idx, seed);
    let mut keep: Vec<usize> = idx.into_iter().take(limit).collect();
    keep.sort_unstable();
    *samples = keep.into_iter().map(|i| samples[i].clone()).collect();
}

/// Fisher-Yates with SplitMix64: the same order on every machine.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for i in (1..items.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The order of training samples in `epoch` (0-based): a fresh shuffle per epoch, derived from
/// the seed, so a resumed job sees the same order as an uninterrupted one.
pub fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    shuffle(
        &mut idx,
        seed.wrapping_mul(0x9e37_79b9)
            .wrapping_add(epoch as u64 + 1),
    );
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_orders_are_permutations_that_differ_between_epochs() {
        let a = epoch_order(100, 7, 0);
        let b = epoch_order(100, 7, 1);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(a, b);
        assert_eq!(a, epoch_order(100, 7, 0));
    }
}

//! Loads data sets into an object store, in the layouts the pushdown functions read.
//!
//! - Fashion-MNIST (accuracy experiments): one PNG object per sample,
//!   `<prefix>/{train,test}/<class>/<id>.png` (ImageFolder layout; class directories sort in
//!   label order), plus `<prefix>/manifest.json`.
//! - Photos (performance experiments): ImageNet-like JPEG objects (about 500x375, about
//!   100 KB) cut from real photos, labelled by source photo, same layout.
//!
//! Loading is resumable: keys already in the store are skipped, and the manifest is written
//! last, so its presence means the set is complete.

pub mod fashion_mnist;
pub mod import;
pub mod photos;
mod store;

pub use store::{open_bucket, open_store, put_all};

use serde::{Deserialize, Serialize};

/// `<prefix>/manifest.json`: what a loaded data set holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetManifest {
    pub dataset: String,
    pub source: String,
    pub layout: String,
    /// Class directory names, in label order.
    pub classes: Vec<String>,
    /// Split name -> number of objects.
    pub splits: Vec<(String, usize)>,
    pub extension: String,
    /// Files of the source that were left out, and why (`hapi-data import`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<import::Skipped>,
}

/// What one load did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub written: usize,
    pub skipped: usize,
    pub bytes_written: u64,
}

/// A small deterministic generator (SplitMix64): the data sets are the same on every machine
/// and every version, which a seeded `rand` would not promise.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
}

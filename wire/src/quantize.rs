//! int8 features with per-channel scales: on request (`"quantize": "int8"` in an invocation),
//! the host sends an f32 output as int8 values and f32 scales, a quarter of the bytes and a
//! little more; the client widens them back to f32 ([`dequantize`]).
//!
//! Each sample is quantized apart, so its values never depend on the other samples of its call
//! (a pooled batch, a cached feature). A sample is cut into groups: its channels (dimension 1 of
//! the batch-first tensor) when each channel holds at least [`MIN_GROUP`] values, else the whole
//! sample (a pooled `[n, c]` or `[n, c, 1, 1]` output, whose channels are single values). Per
//! group, `scale = max |x| / 127` and `q = round(x / scale)` in -127..=127 (0 for a group of
//! zeros), so `q * scale` is within `scale / 2` of `x`.
//!
//! The response is a safetensors file with two tensors: [`crate::tensor::FEATURES`] (`I8`, the
//! output's shape) and [`SCALES`] (`F32`, `[n, groups]`), the scales first in the data.

use crate::tensor::{Dtype, FEATURES, MAX_RANK, write_header};
use std::collections::BTreeMap;

/// Fewest values per channel for a sample to be quantized per channel.
pub const MIN_GROUP: u64 = 64;
/// Name of the scales tensor in a quantized response.
pub const SCALES: &str = "features_scale";
/// The largest magnitude of an int8 value.
const LEVELS: f32 = 127.0;

/// How a batch-first `shape` is cut: `(samples, groups per sample, values per group)`.
pub fn groups(shape: &[u64]) -> Result<(u64, u64, u64), String> {
    if shape.len() < 2 || shape.len() > MAX_RANK {
        return Err(format!(
            "int8 needs a batch-first tensor of rank 2..={MAX_RANK}; this one has rank {}",
            shape.len()
        ));
    }
    let per_sample = shape[1..]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("dimensions {shape:?} overflow"))?;
    let channels = shape[1];
    if shape.len() >= 3 && channels > 0 && per_sample / channels >= MIN_GROUP {
        Ok((shape[0], channels, per_sample / channels))
    } else {
        Ok((shape[0], 1, per_sample))
    }
}

/// Bytes one sample of `per_sample` shape (no batch dimension) takes on the wire in int8:
/// its values and its scales.
pub fn sample_bytes(per_sample: &[u64]) -> u64 {
    let shape: Vec<u64> = std::iter::once(1)
        .chain(per_sample.iter().copied())
        .collect();
    match groups(&shape) {
        Ok((_, g, v)) => g.saturating_mul(v.saturating_add(4)),
        // Rank 0 (a scalar per sample): one value and its scale.
        Err(_) => per_sample
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
            .saturating_add(4),
    }
}

/// Quantizes `data` (little-endian f32 of batch-first `shape`): the response's data, the
/// scales (little-endian f32) then the values, and its safetensors header with `metadata`.
pub fn quantize(
    shape: &[u64],
    data: &[u8],
    metadata: &BTreeMap<String, String>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let plan = Plan::new(shape, data.len() as u64, metadata)?;
    let mut out = vec![0u8; plan.data_len()];
    let mut at = Cursor::default();
    while !plan.fill(data, &mut out, &mut at, u64::MAX)? {}
    Ok((plan.header, out))
}

/// A quantization checked and sized before any value is converted: its header and the size of
/// its data are known, and [`Plan::fill`] converts a bounded number of values per call, so that
/// a host can charge the memory first, then yield and watch its deadline between slices (a
/// single group may hold every value of the output).
#[derive(Debug)]
pub struct Plan {
    /// Groups (samples x groups per sample) and values per group.
    groups: u64,
    per_group: u64,
    /// Groups per sample.
    per_sample: u64,
    /// Bytes of the scales, which come first in the data.
    scale_bytes: usize,
    /// Bytes of the data: scales, then one byte per value.
    data_len: usize,
    header: Vec<u8>,
}

/// Where a [`Plan::fill`] stopped: the group, and within it the pass (finding its largest
/// magnitude, then writing its values) and the value.
#[derive(Debug, Default, Clone)]
pub struct Cursor {
    group: u64,
    value: u64,
    writing: bool,
    most: f32,
}

impl Plan {
    /// Checks `shape` against `data_len` bytes of f32 and lays the response out.
    pub fn new(
        shape: &[u64],
        data_len: u64,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let (n, g, v) = groups(shape)?;
        let count = n
            .checked_mul(g)
            .and_then(|x| x.checked_mul(v))
            .ok_or_else(|| format!("dimensions {shape:?} overflow"))?;
        if count.checked_mul(4) != Some(data_len) {
            return Err(format!(
                "dimensions {shape:?} of F32 need {} bytes; the data has {data_len}",
                count.saturating_mul(4),
            ));
        }
        // No more than the data's bytes unless a dimension is 0 (then `n` may be anything).
        let scale_bytes = n
            .checked_mul(g)
            .and_then(|x| x.checked_mul(4))
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| format!("dimensions {shape:?}: their scales overflow"))?;
        let data_len = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_add(scale_bytes))
            .ok_or_else(|| format!("dimensions {shape:?} overflow"))?;
        let header = header(shape, (n, g), scale_bytes as u64, data_len as u64, metadata)?;
        Ok(Self {
            groups: n * g,
            per_group: v,
            per_sample: g,
            scale_bytes,
            data_len,
            header,
        })
    }

    /// The response's safetensors header.
    pub fn header(&self) -> &[u8] {
        &self.header
    }

    pub fn into_header(self) -> Vec<u8> {
        self.header
    }

    /// Bytes of the response's data (what [`Plan::fill`] writes into).
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// Converts values of `data` into `out` (of [`Plan::data_len`] bytes, zeroed before the
    /// first call: a group of zeros, and its scale, stay as they are) from `at`, reading
    /// each value once to find its group's scale and once to write it, about `budget` reads in
    /// all (at least one), and moves `at` on. True when every group is written.
    pub fn fill(
        &self,
        data: &[u8],
        out: &mut [u8],
        at: &mut Cursor,
        budget: u64,
    ) -> Result<bool, String> {
        assert_eq!(out.len(), self.data_len, "the plan's data size");
        assert_eq!(
            data.len() as u64,
            self.groups * self.per_group * 4,
            "the plan's input"
        );
        let (scales, values) = out.split_at_mut(self.scale_bytes);
        let v = self.per_group;
        let f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let mut left = budget.max(1);
        while at.group < self.groups && v > 0 {
            let base = at.group * v;
            let end = v.min(at.value.saturating_add(left));
            left -= end - at.value;
            let (from, to) = ((base + at.value) as usize, (base + end) as usize);
            let xs = data[from * 4..to * 4].chunks_exact(4);
            if !at.writing {
                for c in xs {
                    let a = f(c).abs();
                    if !a.is_finite() {
                        return Err(format!(
                            "sample {}: the output holds {}, which int8 cannot carry",
                            at.group / self.per_sample,
                            f(c)
                        ));
                    }
                    at.most = at.most.max(a);
                }
            } else {
                let scale = at.most / LEVELS;
                if scale > 0.0 {
                    for (c, q) in xs.zip(&mut values[from..to]) {
                        *q = (f(c) / scale).round().clamp(-LEVELS, LEVELS) as i8 as u8;
                    }
                }
            }
            at.value = end;
            if end == v {
                if at.writing {
                    at.group += 1;
                    at.most = 0.0;
                    at.writing = false;
                } else {
                    let s = (at.group * 4) as usize;
                    scales[s..s + 4].copy_from_slice(&(at.most / LEVELS).to_le_bytes());
                    at.writing = true;
                }
                at.value = 0;
            }
            if left == 0 {
                break;
            }
        }
        Ok(at.group >= self.groups || v == 0)
    }
}

/// The header of a quantized response: [`SCALES`] then [`FEATURES`].
fn header(
    shape: &[u64],
    (n, g): (u64, u64),
    scales: u64,
    data_len: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    write_header(
        metadata,
        &[
            (SCALES, Dtype::F32, &[n, g], [0, scales]),
            (FEATURES, Dtype::I8, shape, [scales, data_len]),
        ],
    )
}

/// Widens int8 `values` of batch-first `shape` with their `scales` (`[n, groups]`, as
/// [`groups`] cuts the shape) back to f32.
pub fn dequantize(shape: &[u64], scales: &[f32], values: &[i8]) -> Result<Vec<f32>, String> {
    let (n, g, v) = groups(shape)?;
    let want = n.checked_mul(g).and_then(|s| Some((s, s.checked_mul(v)?)));
    if want != Some((scales.len() as u64, values.len() as u64)) {
        return Err(format!(
            "int8 features of shape {shape:?} need {} scales of {} values; the response has {} and {}",
            n.saturating_mul(g),
            v,
            scales.len(),
            values.len()
        ));
    }
    if v == 0 {
        return Ok(Vec::new());
    }
    Ok(values
        .chunks_exact(v as usize)
        .zip(scales)
        .flat_map(|(q, &s)| q.iter().map(move |&q| f32::from(q) * s))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn le(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn read(header: &[u8], data: &[u8]) -> (Vec<f32>, Vec<usize>, Vec<i8>, Vec<usize>) {
        let mut file = header.to_vec();
        file.extend_from_slice(data);
        let st = safetensors::SafeTensors::deserialize(&file).expect("readable safetensors");
        let s = st.tensor(SCALES).expect("scales");
        let f = st.tensor(FEATURES).expect("features");
        assert_eq!(s.dtype(), safetensors::Dtype::F32);
        assert_eq!(f.dtype(), safetensors::Dtype::I8);
        let scales = s
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let values = f.data().iter().map(|&b| b as i8).collect();
        (scales, s.shape().to_vec(), values, f.shape().to_vec())
    }

    #[test]
    fn channels_of_enough_values_get_their_own_scale() {
        assert_eq!(groups(&[2, 16, 8, 8]), Ok((2, 16, 64)));
        // Channels of fewer values than MIN_GROUP share the sample's scale.
        assert_eq!(groups(&[2, 16, 7, 7]), Ok((2, 1, 16 * 49)));
        assert_eq!(groups(&[2, 1280, 1, 1]), Ok((2, 1, 1280)));
        assert_eq!(groups(&[3, 1280]), Ok((3, 1, 1280)));
        assert!(groups(&[5]).is_err());
        assert_eq!(sample_bytes(&[1280]), 1284);
        assert_eq!(sample_bytes(&[16, 8, 8]), 16 * (4 + 64));
    }

    #[test]
    fn a_sample_reads_back_within_half_a_step_and_apart_from_the_others() {
        // Two samples of two channels of 64 values; the second sample is 1000x larger.
        let x: Vec<f32> = (0..256)
            .map(|i| {
                let v = ((i * 37) % 101) as f32 / 50.0 - 1.0;
                if i >= 128 { v * 1000.0 } else { v }
            })
            .collect();
        let shape = [2, 2, 8, 8];
        let (h, data) = quantize(&shape, &le(&x), &BTreeMap::new()).expect("quantized");
        assert_eq!(
            data.len(),
            4 * 4 + 256,
            "a quarter of the bytes, and 4 scales"
        );
        let (scales, s_shape, q, q_shape) = read(&h, &data);
        assert_eq!(s_shape, [2, 2]);
        assert_eq!(q_shape, [2, 2, 8, 8]);
        let back = dequantize(&shape, &scales, &q).expect("widened");
        for (k, (a, b)) in x.iter().zip(&back).enumerate() {
            let step = scales[k / 64];
            assert!((a - b).abs() <= step * 0.5001, "{k}: {a} {b} step {step}");
        }
        // The first sample's scale is its own, not the larger sample's.
        assert!(scales[0] < 0.01 && scales[2] > 5.0, "{scales:?}");
        // Alone, the first sample quantizes to the same bytes.
        let (_, alone) = quantize(&[1, 2, 8, 8], &le(&x[..128]), &BTreeMap::new()).expect("q");
        assert_eq!(&alone[..8], &data[..8]);
        assert_eq!(&alone[8..], &data[16..16 + 128]);
    }

    #[test]
    fn zeros_and_bad_outputs() {
        let (_, data) = quantize(&[1, 3], &le(&[0.0; 3]), &BTreeMap::new()).expect("zeros");
        assert_eq!(data, [0u8; 7]);
        let e = quantize(&[1, 2], &le(&[1.0, f32::NAN]), &BTreeMap::new()).expect_err("NaN");
        assert!(e.contains("NaN"), "{e}");
        let e = quantize(&[1, 3], &le(&[1.0]), &BTreeMap::new()).expect_err("short");
        assert!(e.contains("need 12 bytes"), "{e}");
        assert!(dequantize(&[1, 3], &[1.0], &[1, 2]).is_err());
        // No values, but scales for 2^62 samples: refused, not overflowed.
        let e = quantize(&[1 << 62, 4, 0], &[], &BTreeMap::new()).expect_err("overflow");
        assert!(e.contains("scales overflow"), "{e}");
        assert_eq!(sample_bytes(&[u64::MAX, 2]), u64::MAX);
    }

    #[test]
    fn a_quantization_in_slices_is_the_same_as_in_one() {
        let x: Vec<f32> = (0..3 * 2 * 64)
            .map(|i| ((i * 7919) % 211) as f32 - 105.0)
            .collect();
        let (shape, bytes) = ([3, 2, 8, 8], le(&x));
        let (header, whole) = quantize(&shape, &bytes, &BTreeMap::new()).expect("quantized");
        for budget in [1, 7, 64, 65, 128, 1000] {
            let plan = Plan::new(&shape, bytes.len() as u64, &BTreeMap::new()).expect("plan");
            assert_eq!(plan.header(), &header[..]);
            let (mut out, mut at, mut calls) = (vec![0; plan.data_len()], Cursor::default(), 1);
            while !plan.fill(&bytes, &mut out, &mut at, budget).expect("fill") {
                calls += 1;
            }
            assert_eq!(out, whole, "budget {budget}");
            // Every value is read twice (its group's scale, then itself), `budget` per call.
            let reads = 2 * x.len() as u64;
            assert!(
                calls >= reads.div_ceil(budget) && calls <= reads.div_ceil(budget) + 6,
                "budget {budget}: {calls} calls"
            );
        }
        // A value int8 cannot carry is reported with its sample, whatever the slicing.
        let mut bad = x.clone();
        bad[2 * 128 + 70] = f32::INFINITY;
        let plan = Plan::new(&shape, bytes.len() as u64, &BTreeMap::new()).expect("plan");
        let (mut out, mut at) = (vec![0; plan.data_len()], Cursor::default());
        let e = loop {
            match plan.fill(&le(&bad), &mut out, &mut at, 5) {
                Ok(true) => panic!("an infinite value was quantized"),
                Ok(false) => {}
                Err(e) => break e,
            }
        };
        assert!(e.starts_with("sample 2: ") && e.contains("inf"), "{e}");
    }

    proptest! {
        #[test]
        fn any_output_reads_back_within_half_a_step(
            n in 1u64..4,
            c in 1u64..5,
            hw in 1u64..12,
            seed in 0u32..1000,
            magnitude in -20i32..20,
        ) {
            let shape = [n, c, hw, hw];
            let count = (n * c * hw * hw) as usize;
            let m = 2f32.powi(magnitude);
            let x: Vec<f32> = (0..count)
                .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
                .map(|v| v * m)
                .collect();
            let (h, data) = quantize(&shape, &le(&x), &BTreeMap::new()).expect("quantized");
            let (scales, _, q, _) = read(&h, &data);
            let back = dequantize(&shape, &scales, &q).expect("widened");
            let (_, g, v) = groups(&shape).expect("groups");
            prop_assert_eq!(scales.len() as u64, n * g);
            for (k, group) in x.chunks(v as usize).enumerate() {
                let most = group.iter().fold(0.0f32, |m, a| m.max(a.abs()));
                prop_assert_eq!(scales[k], most / 127.0);
            }
            for (k, (a, b)) in x.iter().zip(&back).enumerate() {
                let step = scales[k / v as usize];
                prop_assert!((a - b).abs() <= step * 0.5001, "{}: {} {} step {}", k, a, b, step);
            }
        }
    }
}

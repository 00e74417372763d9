//! `--wire-dtype auto`: the element type of pushed-down features, chosen from their values.
//!
//! The rule: f16 when the features of a few training objects, at every split the job may use,
//! stay within f16's finite range with 16x to spare (f16 keeps 10 bits of mantissa: relative
//! rounding at most 2^-11); else bf16, whose exponent is f32's, so nothing can overflow (7 bits
//! of mantissa: at most 2^-8). Split 0 (and `none`) send the preprocessed input in f32 whatever
//! the choice. Both halve the bytes; `cargo xtask eval-dtype` measures their accuracy against
//! f32's.

use hapi_client::{StorageClient, WireDtype};
use tokio::runtime::Runtime;

use super::config::JobConfig;
use crate::dataset::Sample;

/// f16's largest finite value.
const F16_MAX: f64 = 65504.0;
/// Headroom over the values seen: other objects may reach further.
const HEADROOM: f64 = 16.0;
/// Objects whose features are looked at.
const OBJECTS: usize = 4;

/// The dtype `--wire-dtype auto` gives for features pushed down to `splits` (each >= 1, at
/// least one), and why (a line for stderr and the results).
pub(super) fn choose(
    rt: &Runtime,
    client: &StorageClient,
    cfg: &JobConfig,
    samples: &[Sample],
    splits: &[usize],
) -> anyhow::Result<(WireDtype, String)> {
    anyhow::ensure!(
        !splits.is_empty(),
        "--wire-dtype auto: no split that sends features"
    );
    anyhow::ensure!(
        !samples.is_empty(),
        "--wire-dtype auto: no training object to measure features on"
    );
    let keys: Vec<String> = samples
        .iter()
        .take(OBJECTS)
        .map(|s| s.key.clone())
        .collect();
    let mut most = 0.0f64;
    let mut at = splits[0];
    for &s in splits {
        let f = rt.block_on(client.invoke(&cfg.bucket, &keys, &cfg.model, s))?;
        let m = f.data.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
        anyhow::ensure!(
            m.is_finite(),
            "--wire-dtype auto: the features at split {s} are not finite"
        );
        if m >= most {
            most = m;
            at = s;
        }
    }
    let range = if splits.len() == 1 {
        format!("split {}", splits[0])
    } else {
        format!("splits {}..={}", splits[0], splits[splits.len() - 1])
    };
    let dtype = if most * HEADROOM <= F16_MAX {
        WireDtype::F16
    } else {
        WireDtype::Bf16
    };
    Ok((
        dtype,
        format!(
            "--wire-dtype auto: {} objects' features at {range} reach |x| = {most:.3} (at split {at}); {} ({})",
            keys.len(),
            dtype.name(),
            if dtype == WireDtype::F16 {
                format!("within f16's {F16_MAX} with {HEADROOM}x to spare")
            } else {
                format!("past f16's {F16_MAX} / {HEADROOM}: bf16 keeps f32's range")
            }
        ),
    ))
}

//! Per-layer forward time and output size on this process's device: the numbers the split
//! choice is made from.

use crate::{ModelPackage, Result, device};
use std::time::Instant;
use tch::Tensor;

pub use hapi_wire::profile::LayerProfile;

/// Times every layer of `pkg` on a random batch of `batch` samples: one warm-up run, then the
/// median of `reps` runs. Each layer gets the previous layer's real output as input.
pub fn profile_layers(pkg: &ModelPackage, batch: i64, reps: usize) -> Result<Vec<LayerProfile>> {
    let measured = profile_layers_while(pkg, batch, reps, &|| true)?;
    Ok(measured.unwrap_or_default())
}

/// [`profile_layers`], asking `go_on` before each run of a layer (its warm-up included) and
/// stopping with `None` the first time it answers false: a host measures on a tenant's behalf
/// only within that tenant's time limit and share of the cores.
pub fn profile_layers_while(
    pkg: &ModelPackage,
    batch: i64,
    reps: usize,
    go_on: &dyn Fn() -> bool,
) -> Result<Option<Vec<LayerProfile>>> {
    let reps = reps.max(1);
    let shape: Vec<i64> = std::iter::once(batch)
        .chain(pkg.manifest().input.shape.iter().copied())
        .collect();
    tch::manual_seed(0);
    let mut x = Tensor::randn(shape.as_slice(), (tch::Kind::Float, pkg.device()));
    let mut out = Vec::with_capacity(pkg.num_layers());
    for (i, layer) in pkg.manifest().layers.iter().enumerate() {
        if !go_on() {
            return Ok(None);
        }
        let mut y = pkg.run(i..i + 1, &x)?; // warm-up
        // Done before `go_on` is asked (and the time it waits is left out of the measurement's).
        device::synchronize(pkg.device());
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            if !go_on() {
                return Ok(None);
            }
            // The last run's output goes before the next is made: a host measures in memory
            // held for one layer's input and output at a time (`SegmentCost::run_bytes`), and
            // two outputs at once went past it by an output a sample.
            drop(y);
            device::synchronize(pkg.device());
            let started = Instant::now();
            y = pkg.run(i..i + 1, &x)?;
            device::synchronize(pkg.device());
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        out.push(LayerProfile {
            index: i,
            name: layer.name.clone(),
            batch,
            seconds_per_sample: times[times.len() / 2] / batch as f64,
            output_bytes_per_sample: layer.output_bytes_per_sample(),
        });
        x = y;
    }
    Ok(Some(out))
}

//! The memory model of model segments on this host's device: what running layers [a, b) on a
//! batch of `n` samples takes, as `weights + workspace + n * per_sample` bytes.
//!
//! Per layer, measured once per model (on first use) and cached:
//!
//! - **weights**: fp32 bytes of the layer's parameters (from the manifest). They are resident as
//!   long as the model is loaded and are charged to the budget once, when it is.
//! - **per_sample**: how much the process's peak memory grows per sample while the layer runs,
//!   its input already allocated: the output plus whatever the layer allocates inside (an
//!   inverted-residual block's expanded activations, im2col buffers). On CPU it is measured
//!   from the kernel's peak resident set (`VmHWM`, reset through `/proc/self/clear_refs`) at
//!   two batch sizes; the slope is the per-sample cost and the intercept the workspace. A
//!   measurement below the activation-pair bound of DESIGN.md §2 (the output must exist while
//!   the input does) is noise from the allocator or other threads, and the bound is used.
//!   libtorch's CUDA allocator statistics are not reachable through `tch`, so on CUDA the model
//!   is the activation-pair bound with the layer's output counted twice (room for one
//!   intermediate of the output's size) and no workspace measured; `method` says which.
//!
//! A segment [a, b) holds, per sample, its input for the whole run (the caller keeps it), the
//! largest of its layers' working sets, and the output copied out for the guest; its workspace
//! is the largest of its layers'.

use hapi_model::ModelPackage;
use hapi_wire::profile::{LayerMemory, ModelMemory};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Batch sizes of the two measurements.
pub const MEASURE_BATCHES: (i64, i64) = (4, 16);
/// Repetitions per layer and batch (the median growth is used).
pub const MEASURE_REPS: usize = 3;

fn elements(shape: &[i64]) -> u64 {
    shape
        .iter()
        .map(|&d| u64::try_from(d).unwrap_or(0))
        .product()
}

/// Measures (CPU) or bounds (CUDA) every layer of `pkg`.
pub fn measure(pkg: &ModelPackage) -> Result<ModelMemory, String> {
    let started = Instant::now();
    let cpu = pkg.device() == Device::Cpu && rss::available();
    let (small, large) = MEASURE_BATCHES;
    let mut layers = Vec::with_capacity(pkg.num_layers());
    // Each layer gets the previous layer's real output as input, at both batch sizes.
    let input = |b: i64| {
        let shape: Vec<i64> = std::iter::once(b)
            .chain(pkg.manifest().input.shape.iter().copied())
            .collect();
        Tensor::randn(shape.as_slice(), (Kind::Float, pkg.device()))
    };
    tch::manual_seed(0);
    let (mut x1, mut xs, mut xl) = (input(1), input(small), input(large));
    for (i, layer) in pkg.manifest().layers.iter().enumerate() {
        let in_bytes = 4 * elements(&layer.input_shape);
        let out_bytes = layer.output_bytes_per_sample();
        let weights_bytes = 4 * layer.params;
        // Times with the allocator as it serves requests; memory with exact accounting.
        let (t1, _) = timed(pkg, i, &x1)?;
        let (ts, ys) = timed(pkg, i, &xs)?;
        let (tl, yl) = timed(pkg, i, &xl)?;
        let (measured, workspace) = if cpu {
            let (gs, gl) =
                rss::exact(|| Ok::<_, String>((growth(pkg, i, &xs)?, growth(pkg, i, &xl)?)))?;
            let slope = gl.saturating_sub(gs) / (large - small) as u64;
            (slope, gs.saturating_sub(slope * small as u64))
        } else {
            (0, 0)
        };
        let x1_next = ys.narrow(0, 0, 1);
        let bound = if cpu { out_bytes } else { 2 * out_bytes };
        layers.push(LayerMemory {
            index: i,
            name: layer.name.clone(),
            weights_bytes,
            input_bytes_per_sample: in_bytes,
            output_bytes_per_sample: out_bytes,
            per_sample_bytes: measured.max(bound),
            workspace_bytes: workspace,
            measured_per_sample_bytes: measured,
            seconds_per_sample: vec![t1, ts / small as f64, tl / large as f64],
        });
        (x1, xs, xl) = (x1_next, ys, yl);
    }
    Ok(ModelMemory {
        model: pkg.name().to_string(),
        method: if cpu { "rss-peak" } else { "activation-bound" }.into(),
        batches: [small, large],
        time_batches: vec![1, small, large],
        seconds: started.elapsed().as_secs_f64(),
        layers,
    })
}

/// Median forward time of layer `i` on `x` after a warm-up, and the output.
fn timed(pkg: &ModelPackage, i: usize, x: &Tensor) -> Result<(f64, Tensor), String> {
    let run = || {
        let y = pkg.run(i..i + 1, x).map_err(|e| e.to_string());
        hapi_model::device::synchronize(pkg.device());
        y
    };
    drop(run()?);
    let mut times = Vec::with_capacity(MEASURE_REPS);
    let mut y = None;
    for _ in 0..MEASURE_REPS {
        drop(y.take());
        let started = Instant::now();
        let out = run()?;
        times.push(started.elapsed().as_secs_f64());
        y = Some(out);
    }
    times.sort_by(f64::total_cmp);
    let y = y.ok_or("no repetition ran")?;
    Ok((times[times.len() / 2], y))
}

/// Median peak growth of the resident set while layer `i` runs on `x`, the input already
/// allocated and the output kept.
fn growth(pkg: &ModelPackage, i: usize, x: &Tensor) -> Result<u64, String> {
    let run = || pkg.run(i..i + 1, x).map_err(|e| e.to_string());
    drop(run()?); // warm-up: one-off allocations (weight packing) are not per call
    let mut grown = Vec::with_capacity(MEASURE_REPS);
    for _ in 0..MEASURE_REPS {
        rss::reset_peak();
        let base = rss::current();
        let out = run()?;
        grown.push(rss::peak().saturating_sub(base));
        drop(out);
    }
    grown.sort_unstable();
    Ok(grown[grown.len() / 2])
}

/// The process's resident set, from `/proc/self/status` (Linux).
pub mod rss {
    fn field(name: &str) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    }

    /// Current resident set size in bytes (0 where unknown).
    pub fn current() -> u64 {
        field("VmRSS:").unwrap_or(0)
    }

    /// Peak resident set size since start or the last [`reset_peak`].
    pub fn peak() -> u64 {
        field("VmHWM:").unwrap_or(0)
    }

    /// Resets the peak to the current resident set.
    pub fn reset_peak() {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    /// Whether peaks can be measured here: the files exist and the reset takes effect.
    pub fn available() -> bool {
        current() > 0 && std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }

    /// Runs `f` with exact accounting: glibc serves blocks above its mmap threshold with their
    /// own mappings, returned to the kernel when freed, but raises the threshold as such blocks
    /// are freed, after which big tensors come from, and stay in, the heap, and the resident set
    /// no longer follows what is allocated. A low fixed threshold makes it follow, and so does
    /// glibc's default trim threshold (freed memory at the top of a heap goes back to the
    /// kernel, trimmed first); afterwards the allocator is set for serving again
    /// ([`serving`]). Measurements are serialised.
    pub fn exact<T>(f: impl FnOnce() -> T) -> T {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = crate::locks::lock(&ONE);
        set_thresholds(256 << 10, 128 << 10);
        // What serving kept at the top of this thread's heap goes back now: a block is taken
        // from the top, resident already, before glibc considers a mapping of its own. Freeing
        // a block of 128 KiB (above the fast bins) merges it with the top and trims that to the
        // threshold just set; free blocks within the heap stay, as they did before.
        drop(std::hint::black_box(Vec::<u8>::with_capacity(128 << 10)));
        let out = f();
        serving();
        out
    }

    /// Sets glibc's allocator for serving, before the first model runs and after each exact
    /// measurement: blocks up to 32 MiB (glibc's own ceiling for its dynamic mmap threshold)
    /// come from the heap, since mapping and faulting in every large tensor would slow
    /// inference several times; and up to 64 MiB freed at the top of a heap (a thread arena's
    /// heap is at most that) stays there for the next batch. Setting the mmap threshold fixes
    /// glibc's trim threshold at its default, 128 KiB: every device batch then handed its
    /// activations back to the kernel when it freed them and faulted them in again in the
    /// next, and a third of a device worker's time on the CPU went to page faults. `hapi-host
    /// serve` hands freed memory back every few seconds instead (`malloc_trim`).
    pub fn serving() {
        set_thresholds(32 << 20, 64 << 20);
    }

    fn set_thresholds(mmap: i32, trim: i32) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator tuning; any value is valid.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        let _ = (mmap, trim);
    }
}

//! The memory model's measurement instrument, alone in its process: the resident set's peak
//! follows allocation under exact accounting (no other test allocates or frees meanwhile).

use hapi_host::memory::rss;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The tests here take turns: each counts the whole process's memory.
fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn peaks_are_measurable_here() {
    let _alone = alone();
    assert!(rss::available(), "/proc/self/status and clear_refs");
    rss::exact(|| {
        // Free blocks within the heap stay resident under exact accounting too, and a test
        // before this one on this thread's arena may have left 8 MiB of them: the instrument
        // is checked from a heap without any.
        // SAFETY: malloc_trim takes no pointers and is safe to call from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
        for _ in 0..3 {
            // Freed and allocated again: each time the resident set grows by the block.
            rss::reset_peak();
            let base = rss::current();
            let v = vec![1u8; 8 << 20];
            let grown = rss::peak().saturating_sub(base);
            drop(v);
            assert!(grown >= 7 << 20, "peak grew {grown} bytes for 8 MiB");
        }
    });
}

/// A profile's measurement runs in the memory its reservation holds: `run_bytes(batch)` of the
/// whole model, which counts one layer's output at a time. It kept the previous run's output
/// while the next one ran: one more output a layer, about 2.6 MB a sample for resnet18.
#[test]
fn a_profile_measures_within_its_reservation() {
    let _alone = alone();
    let pkg = hapi_model::ModelPackage::load(
        &hapi_model::models_dir().join("resnet18"),
        tch::Device::Cpu,
    )
    .expect("package");
    let memory = hapi_host::memory::measure(&pkg).expect("memory model");
    let cost = memory.segment(0..memory.layers.len());
    let batch = 8;
    // Warm: libtorch's and the allocator's first-use costs are not the measurement's.
    hapi_model::profile::profile_layers(&pkg, batch, 1).expect("warm-up");
    let grown = rss::exact(|| {
        rss::reset_peak();
        let base = rss::current();
        hapi_model::profile::profile_layers(&pkg, batch, 3).expect("profile");
        rss::peak().saturating_sub(base)
    });
    let held = cost.run_bytes(batch as u64);
    eprintln!("the profile's peak grew {grown} bytes; its reservation {held}");
    assert!(
        grown <= held,
        "the profile's peak grew {grown} bytes, past its reservation of {held}"
    );
}

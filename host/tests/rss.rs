//! The memory model's measurement instrument, alone in its process: the resident set's peak
//! follows allocation under exact accounting (no other test allocates or frees meanwhile), and
//! the allocator as the device's batches use it.

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

/// Minor page faults of this process so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    usage.ru_minflt
}

/// Page faults per forward of `pkg`'s first layers at batch 4, after warm-up forwards.
fn faults_per_batch(pkg: &hapi_model::ModelPackage) -> i64 {
    let x = tch::Tensor::randn([4, 3, 224, 224], (tch::Kind::Float, tch::Device::Cpu));
    let run = || drop(pkg.run(0..7, &x).expect("forward"));
    for _ in 0..3 {
        run();
    }
    let before = minor_faults();
    for _ in 0..10 {
        run();
    }
    (minor_faults() - before) / 10
}

/// Between device batches the allocator keeps what a batch freed for the next
/// ([`rss::serving`]). Left with glibc's trim threshold (128 KiB once the mmap threshold is
/// set, as exact measurement sets it), every batch handed its activations back to the kernel
/// and faulted them in again: a third of a device worker's time on the CPU.
#[test]
fn device_batches_do_not_fault_their_memory_in_again() {
    let _alone = alone();
    let pkg = hapi_model::ModelPackage::load(
        &hapi_model::models_dir().join("efficientnet_lite0"),
        tch::Device::Cpu,
    )
    .expect("package");
    // Activations of a batch of 4 through these layers: several MiB, hundreds of pages each.
    let trimming = rss::exact(|| faults_per_batch(&pkg));
    rss::serving();
    let serving = faults_per_batch(&pkg);
    eprintln!("minor faults per batch: {trimming} trimming on every free, {serving} serving");
    assert!(
        trimming >= 256,
        "the trimming allocator faulted only {trimming} pages a batch: the test no longer sees the cost"
    );
    assert!(
        serving * 8 <= trimming,
        "serving, a batch faulted in {serving} pages (with trimming on every free, {trimming})"
    );
}

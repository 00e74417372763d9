//! The allocator as the device's batches use it, alone in its process: page faults are the
//! whole process's, and the tests of the measurement instrument (`rss.rs`) leave the heaps
//! in states that move them.

use hapi_host::memory::rss;

/// Minor page faults of this process so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    usage.ru_minflt
}

/// Page faults per forward of `pkg`'s first layers at batch 4, after warm-up forwards: the
/// least of five rounds of ten, since the count is the whole process's and anything else that
/// faults (libtorch's own threads growing their arenas) only adds to it.
fn faults_per_batch(pkg: &hapi_model::ModelPackage) -> i64 {
    let x = tch::Tensor::randn([4, 3, 224, 224], (tch::Kind::Float, tch::Device::Cpu));
    let run = || drop(pkg.run(0..7, &x).expect("forward"));
    for _ in 0..3 {
        run();
    }
    (0..5)
        .map(|_| {
            let before = minor_faults();
            for _ in 0..10 {
                run();
            }
            (minor_faults() - before) / 10
        })
        .min()
        .expect("five rounds")
}

/// Between device batches the allocator keeps what a batch freed for the next
/// ([`rss::serving`]). Left with glibc's trim threshold (128 KiB once the mmap threshold is
/// set, as exact measurement sets it), every batch handed its activations back to the kernel
/// and faulted them in again: a third of a device worker's time on the CPU.
#[test]
fn device_batches_do_not_fault_their_memory_in_again() {
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

//! Who frees what a device call leaves behind: a call's input (up to its tenant's memory
//! limit) is freed off the dispatcher thread, whose time is every tenant's next batch. Counted
//! by this binary's allocator, which records large frees with the thread that made them.

mod common;

use common::{TestHost, sample_key, start_tenants, tenant_token, tenants_policy};
use hapi_tests::alloc::{Counting, forget_large_frees, large_frees, thread_named, threads_named};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests one at a time: the record of large frees is the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_input_is_freed_off_the_dispatcher() {
    let _one = ONE_AT_A_TIME.lock().await;
    let h: TestHost = start_tenants(|store, state| {
        tenants_policy(store, state, "pool = true", 1, &["resnet18"], |_| {
            String::new()
        })
    })
    .await;
    // 30 images of 3x224x224 f32: a device input of 18 MB, past the recorded size; through
    // the max pool, an output of 24 MB.
    let keys: Vec<String> = (0..30)
        .map(|i| sample_key(common::SAMPLES[i % common::SAMPLES.len()]))
        .collect();
    let body = json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 4});
    let warm = h
        .warm(&tenant_token(0), "feature-extract", body.clone())
        .await;
    assert_eq!(warm.status(), 200);
    let dispatcher = thread_named("device-dispatch").expect("the dispatcher's thread");
    forget_large_frees();
    let resp = h.invoke(&tenant_token(0), "feature-extract", body).await;
    assert_eq!(resp.status(), 200);
    drop(resp.bytes().await.expect("body"));
    // Give the reaper a moment to free what it was handed.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let frees = large_frees();
    eprintln!("large frees (thread, MiB): {frees:?}; dispatcher {dispatcher}");
    assert!(
        frees.iter().any(|&(_, mib)| mib >= 20),
        "the input was freed: {frees:?}"
    );
    assert!(
        frees.iter().all(|&(tid, _)| tid != dispatcher),
        "freed on the dispatcher: {frees:?}"
    );
}

/// A pooled batch copies its calls' inputs into its tensor once: they were joined into one
/// buffer first (freed on the device worker when the batch ended), a second copy of the whole
/// batch's input that no memory model or account counted. Three tenants' calls of 16 samples
/// (9.6 MB each) arrive within the window; the first batch pools the first call with part of
/// the second (with three tenants active a batch may run half as long again as its leader's
/// samples), and its joined input (13 MiB in one run) was freed on the worker's thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_batch_copies_its_inputs_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    use hapi_host::account::Deadline;
    use hapi_host::device::executor::Device;
    use hapi_host::device::types::DeviceConfig;
    use std::sync::Arc;
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tempdir");
    let text = common::policy_text(&dir.path().join("store"), &dir.path().join("state"));
    let policy =
        hapi_host::policy::Policy::parse("policy.toml", &text, dir.path()).expect("policy");
    let models = hapi_host::models::Models::open(&policy, tch::Device::Cpu, None).expect("models");
    // This device's worker: the thread of that name that was not there before it started (the
    // other test's host may still be ending).
    let before = threads_named("device-worker-0");
    // No batch is due before 48 samples are in (a window of 5 s, and batches may run for
    // 100 s).
    let d = Device::start(
        DeviceConfig {
            budget: 4 << 30,
            adapt: false,
            pool: true,
            window: Duration::from_secs(5),
            max_batch: 48,
            slice: Duration::from_secs(100),
            batch_time: Duration::from_secs(100),
            workers: 1,
            resident_for: Duration::from_secs(600),
        },
        Arc::new(models),
    )
    .expect("device");
    let deadline = Deadline::new(Duration::from_secs(300));
    let mut calls = Vec::new();
    for name in ["first", "second", "third"] {
        let tenant: Arc<str> = Arc::from(name);
        let pin = d
            .acquire("resnet18", &tenant, &deadline, None)
            .await
            .expect("resnet18");
        let job = common::device_job(&tenant, pin, 16, Duration::from_secs(60));
        forget_large_frees();
        let d2 = Arc::clone(&d);
        calls.push(tokio::spawn(async move { d2.run(job).await }));
    }
    let mut ran = Vec::new();
    for c in calls {
        ran.push(c.await.expect("join").expect("ran"));
    }
    let worker = threads_named("device-worker-0")
        .into_iter()
        .find(|t| !before.contains(t))
        .expect("the device worker's thread");
    let memory = d.memory();
    assert!(
        memory.largest_batch > 16,
        "no batch pooled two calls: {memory:?}"
    );
    let frees = large_frees();
    eprintln!("large frees (thread, MiB): {frees:?}; worker {worker}");
    assert!(
        frees.iter().all(|&(tid, _)| tid != worker),
        "a large buffer was freed on the device worker: {frees:?}"
    );
    drop(ran);
}

//! Who frees what a device call leaves behind: a call's input (up to its tenant's memory
//! limit) is freed off the dispatcher thread, whose time is every tenant's next batch. Counted
//! by this binary's allocator, which records large frees with the thread that made them.

mod common;

use common::{TestHost, sample_key, start_tenants, tenant_token, tenants_policy};
use hapi_tests::alloc::{Counting, forget_large_frees, large_frees, thread_named};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_input_is_freed_off_the_dispatcher() {
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

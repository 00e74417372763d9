//! Every limit as a pair: obeyed and violated. After a violation, another tenant's invocation
//! succeeds: the host is unaffected.

mod common;

use common::components::{growing_table, instantiating};
use common::{ALICE, BOB, CLOCKY, TIGHT, TestHost, error_code, features, hostile, raw};
use hapi_host::policy::hash_token;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Bob reads his own object: the host still serves other tenants.
async fn others_still_served(h: &TestHost) {
    let body = json!({"bucket": "secret", "keys": ["bob/data.bin"], "model": "resnet18", "split": 0, "options": {"mode": "read"}});
    assert_eq!(
        raw(h.invoke(BOB, "hostile", body).await).await,
        b"bob's data"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_obeyed() {
    let h = TestHost::start().await;
    let out = raw(h
        .invoke(
            TIGHT,
            "hostile",
            hostile("alloc", &[("bytes", "8000000")], &[]),
        )
        .await)
    .await;
    assert_eq!(
        u64::from_le_bytes(out.try_into().expect("8 bytes")),
        8_000_000u64.div_ceil(4096)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_violated() {
    let h = TestHost::start().await;
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("alloc", &[("bytes", "100000000")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "memory_limit_exceeded", "{message}");
    assert!(message.contains("33554432"), "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensor_memory_held_in_the_host_is_limited_too() {
    let h = TestHost::start().await;
    // 64 tensors of 1 MiB: within the guest's own memory one at a time, over it in the host.
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("tensors", &[("count", "64"), ("bytes", "1048576")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "memory_limit_exceeded", "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_of_a_refused_compute_are_not_kept_in_the_host() {
    let h = TestHost::start().await;
    // The model resident: `tight`'s 1 s goes to the computes, not to a cold load.
    let body = json!({"bucket": "datasets", "keys": [common::sample_key(0)],
        "model": "resnet18", "split": 1});
    assert_eq!(h.warm(ALICE, "feature-extract", body).await.status(), 200);
    // 64 computes of two 1 MiB inputs, each refused before it runs (one input per compute):
    // 128 MiB in all, four times the tenant's limit, if the host kept the inputs it was given.
    let out = raw(h
        .invoke(
            TIGHT,
            "hostile",
            hostile(
                "inputs",
                &[
                    ("graph", "resnet18[0..1]"),
                    ("count", "64"),
                    ("bytes", "1048576"),
                ],
                &[],
            ),
        )
        .await)
    .await;
    assert_eq!(u64::from_le_bytes(out.try_into().expect("8 bytes")), 64);
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_obeyed() {
    let h = TestHost::start().await;
    let out = raw(h
        .invoke(TIGHT, "hostile", hostile("output", &[("bytes", "10")], &[]))
        .await)
    .await;
    assert_eq!(out, [7; 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_violated_stops_the_guest_within_its_deadline() {
    let h = TestHost::start().await;
    let started = Instant::now();
    let resp = h.invoke(TIGHT, "hostile", hostile("loop", &[], &[])).await;
    let elapsed = started.elapsed();
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    println!("endless loop stopped after {elapsed:?} (limit 1 s)");
    // Deadline 1 s (the policy), plus slack for instantiation and the epoch tick.
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_limit_obeyed() {
    let h = TestHost::start().await;
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("output", &[("bytes", "65000")], &[]),
        )
        .await;
    let declared: u64 = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("content-length");
    assert!(declared <= 65536, "the whole body counts: {declared}");
    assert_eq!(raw(resp).await.len(), 65000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_limit_violated() {
    let h = TestHost::start().await;
    // 64 KiB of data: the safetensors header takes the body over the 64 KiB limit.
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("output", &[("bytes", "65536")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "output_too_large", "{message}");
    assert!(message.contains("output limit of 65536"), "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_rank_obeyed_and_violated() {
    let h = TestHost::start().await;
    let rank = hapi_wire::tensor::MAX_RANK.to_string();
    assert_eq!(
        raw(h
            .invoke(
                TIGHT,
                "hostile",
                hostile("wide-output", &[("rank", &rank)], &[])
            )
            .await)
        .await,
        [1]
    );
    // 8 million dimensions and one byte of data: refused, not a 16 MB body.
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("wide-output", &[("rank", "8000000")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert!(
        code == "bad_output" || code == "memory_limit_exceeded",
        "{code}: {message}"
    );
    assert!(message.len() < 1024, "{}", message.len());
    let resp = h
        .invoke(
            BOB,
            "hostile",
            hostile(
                "wide-output",
                &[("rank", &(hapi_wire::tensor::MAX_RANK + 1).to_string())],
                &[],
            ),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "bad_output", "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_message_bound_obeyed_and_violated() {
    let h = TestHost::start().await;
    let bound = hapi_host::account::text::MAX_MESSAGE;
    let resp = h
        .invoke(
            BOB,
            "hostile",
            hostile("long-error", &[("bytes", "3000")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 400).await;
    assert_eq!(code, "bad_request");
    assert!(message.ends_with(&"e".repeat(3000)), "kept whole");
    // 24 MiB of message: what comes back is bounded.
    let resp = h
        .invoke(
            BOB,
            "hostile",
            hostile("long-error", &[("bytes", &(24 << 20).to_string())], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 400).await;
    assert_eq!(code, "bad_request");
    assert!(message.len() <= bound, "{} bytes", message.len());
    assert!(
        message.ends_with(&format!("({} bytes in all)", (24 << 20) + 13)),
        "{}",
        &message[message.len() - 60..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_limit_obeyed_and_violated() {
    let h = TestHost::start().await;
    let max = hapi_host::wasm::limits::MAX_HANDLES;
    let kept = raw(h
        .invoke(
            BOB,
            "hostile",
            hostile(
                "dims",
                &[("count", &(max - 100).to_string()), ("rank", "1")],
                &[],
            ),
        )
        .await)
    .await;
    assert_eq!(
        u64::from_le_bytes(kept.try_into().expect("8 bytes")),
        (max - 100) as u64
    );
    let resp = h
        .invoke(
            BOB,
            "hostile",
            hostile(
                "dims",
                &[("count", &(max + 1).to_string()), ("rank", "1")],
                &[],
            ),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "table_limit_exceeded", "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_holds_inside_a_blocking_host_call() {
    let h = TestHost::start().await;
    let sleep = |ms: &str| json!({"bucket": "b", "keys": [], "model": "resnet18", "split": 0, "options": {"ms": ms}});
    // `clocky` has a 1 s limit: a 300 ms sleep is within it.
    let slept = raw(h.invoke(CLOCKY, "sleeper", sleep("300")).await).await;
    assert!(u64::from_le_bytes(slept.try_into().expect("8 bytes")) >= 300);
    // An 8 s sleep is a single host call; the host ends it at the deadline.
    let started = Instant::now();
    let resp = h.invoke(CLOCKY, "sleeper", sleep("8000")).await;
    let took = started.elapsed();
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_are_bounded_per_call() {
    let h = TestHost::start().await;
    let random = |len: u64| json!({"bucket": "b", "keys": [], "model": "resnet18", "split": 0, "options": {"random": len.to_string()}});
    let limit = hapi_host::wasm::limits::MAX_RANDOM_BYTES;
    // `clocky` is granted `random`: one call may ask for up to MAX_RANDOM_BYTES...
    let got = raw(h.invoke(CLOCKY, "sleeper", random(limit)).await).await;
    assert_eq!(u64::from_le_bytes(got.try_into().expect("8 bytes")), limit);
    // ...and no more: the host allocates nothing for a larger request and ends the call.
    for len in [limit + 1, u64::MAX] {
        let (code, message) = error_code(h.invoke(CLOCKY, "sleeper", random(len)).await, 422).await;
        assert_eq!(code, "function_trapped", "{message}");
        assert!(message.contains("exceeds limit"), "{message}");
    }
    others_still_served(&h).await;
}

/// A component not granted `random` gets no entropy: the hash-map seed every component may ask
/// for (`wasi:random/insecure-seed`, which std's `RandomState` reads) is the same at every
/// invocation (wasmtime drew a fresh 128 bits for each), and its function's own: another
/// function's differs, and so does another tenant's running the same bytes (one public value,
/// then one per code digest, let anyone whose data a function hashes choose colliding data:
/// the second with a copy of the function of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_not_granted_random_gets_its_functions_seed_every_time() {
    let h = TestHost::start().await;
    let other = common::components::variant("hostile", "other");
    assert_eq!(h.put_function(ALICE, "other", other).await.status(), 201);
    let mut seeds = std::collections::BTreeMap::<&str, Vec<Vec<u8>>>::new();
    for function in ["hostile", "other", "hostile", "other", "hostile"] {
        let seed = raw(h.invoke(ALICE, function, hostile("seed", &[], &[])).await).await;
        assert_eq!(seed.len(), 8, "{function}: {seed:?}");
        seeds.entry(function).or_default().push(seed);
    }
    for (function, seen) in &seeds {
        assert!(seen.iter().all(|s| *s == seen[0]), "{function}: {seen:?}");
    }
    assert_ne!(seeds["hostile"][0], seeds["other"][0], "{seeds:?}");
    // Bob's `hostile` is the same file as Alice's, neither granted `random`.
    let bobs = raw(h.invoke(BOB, "hostile", hostile("seed", &[], &[])).await).await;
    assert_eq!(bobs.len(), 8, "{bobs:?}");
    assert_ne!(
        bobs, seeds["hostile"][0],
        "two tenants' copies of one function"
    );
    let again = raw(h.invoke(BOB, "hostile", hostile("seed", &[], &[])).await).await;
    assert_eq!(again, bobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_byte_caps_obeyed() {
    let h = TestHost::start().await;
    // 1 KiB object under the 2 KiB object cap; 3 x 1 KiB = the 3 KiB invocation cap.
    let keys = ["fashion-mnist/small.bin"; 3];
    let out = raw(h
        .invoke(TIGHT, "hostile", hostile("read", &[], &keys))
        .await)
    .await;
    assert_eq!(out.len(), 3 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_byte_cap_violated() {
    let h = TestHost::start().await;
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("read", &[], &["fashion-mnist/big.bin"]),
        )
        .await;
    let (code, message) = error_code(resp, 413).await;
    assert_eq!(code, "object_too_large", "{message}");
    assert!(message.contains("2048"), "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocation_read_cap_violated() {
    let h = TestHost::start().await;
    let keys = ["fashion-mnist/small.bin"; 4];
    let resp = h
        .invoke(TIGHT, "hostile", hostile("read", &[], &keys))
        .await;
    let (code, message) = error_code(resp, 413).await;
    assert_eq!(code, "object_too_large", "{message}");
    assert!(message.contains("3072"), "{message}");
    others_still_served(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_the_host_answers_429_with_retry_after() {
    let h = TestHost::start().await;
    // `tight` may run 2 at once and have 1 waiting; the fourth of four endless loops is
    // refused at once, the third waits for a slot and then runs into its time limit too.
    let calls = (0..4).map(|_| h.invoke(TIGHT, "hostile", hostile("loop", &[], &[])));
    let responses = futures_join(calls).await;
    let limited = responses.iter().filter(|r| r.status() == 422).count();
    assert_eq!(limited, 3, "the admitted three end at their time limit");
    let refused: Vec<&reqwest::Response> = responses.iter().filter(|r| r.status() == 429).collect();
    assert_eq!(
        refused.len(),
        1,
        "{:?}",
        responses
            .iter()
            .map(reqwest::Response::status)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        refused[0]
            .headers()
            .get("retry-after")
            .expect("Retry-After"),
        "1"
    );
}

/// Runs `call` while `tight` is full: its two slots running endless loops and its one queue
/// place taken (the loops then end at the tenant's 1 s limit); returns `call`'s output.
async fn when_tight_is_full<T>(h: &TestHost, call: impl Future<Output = T>) -> T {
    let tenant = Arc::clone(&h.host.policy().tenants["tight"]);
    let admission = h.host.admission(&tenant);
    let loops = futures_join((0..3).map(|_| h.invoke(TIGHT, "hostile", hostile("loop", &[], &[]))));
    let full = async {
        let until = Instant::now() + Duration::from_secs(30);
        while admission.load() != (2, 1) {
            assert!(Instant::now() < until, "the loops never filled the slots");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        call.await
    };
    let (responses, out) = tokio::join!(loops, full);
    assert!(responses.iter().all(|r| r.status() == 422));
    out
}

/// A model's profile takes one of the tenant's slots, as an invocation does: with `tight`'s two
/// slots running endless loops and its one queue place taken, a profile is refused at once
/// (429 `busy`); alone, it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_takes_one_of_the_tenants_slots() {
    let h = TestHost::start().await;
    let profile = |token: &'static str| {
        h.client
            .get(format!("{}/v1/models/resnet18/profile", h.url))
            .bearer_auth(token)
            .send()
    };
    let refused = when_tight_is_full(&h, async { profile(TIGHT).await.expect("profile") }).await;
    let (code, message) = error_code(refused, 429).await;
    assert_eq!(code, "busy", "{message}");
    // Measured by alice, kept for all (`tight`'s 1 s may not cover the measurement itself on
    // a loaded machine: it runs within the tenant's limit, below).
    assert_eq!(profile(ALICE).await.expect("profile").status(), 200);
    assert_eq!(profile(TIGHT).await.expect("profile").status(), 200);
}

/// A profile's measurement runs within its tenant's time limit, as an invocation's device
/// work does: tenant `quick` (50 ms, far less than resnet18's measurement at batch 8 on a CPU,
/// about 0.56 s here) gets 422 `time_limit_exceeded` when the model it loaded is resident, and
/// its second request is answered that stop without measuring again; nothing it measured is
/// kept (alice's request then measures the whole model). The measurement had run to its end
/// past the limit and answered 200, holding the model's turn, device memory and a core
/// meanwhile; then (32b5673) every request measured again to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_stops_at_its_tenants_time_limit() {
    const QUICK: &str = "quick-token";
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    common::write_store(&store);
    let text = format!(
        "{}\n[tenants.quick]\ntoken_sha256 = \"{}\"\nmodels = [\"resnet18\"]\ntimeout = \"50ms\"\n",
        common::policy_text(&store, &tmp.path().join("state")),
        hash_token(QUICK)
    );
    let h = TestHost::start_with(tmp, store, text).await;
    let profile = |token: &'static str| {
        h.client
            .get(format!("{}/v1/models/resnet18/profile", h.url))
            .bearer_auth(token)
            .send()
    };
    // The model resident (loaded by alice's call): `quick`'s time goes to the measurement.
    let body = serde_json::json!({"bucket": "datasets", "keys": [common::sample_key(0)],
        "model": "resnet18", "split": 1});
    assert_eq!(h.warm(ALICE, "feature-extract", body).await.status(), 200);
    let stopped = profile(QUICK).await.expect("profile");
    let (code, message) = error_code(stopped, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    assert!(message.contains("time limit of 50ms exceeded"), "{message}");
    // Its next request is answered the stop, not measured again: a tenant could otherwise
    // start measurement after measurement, each to its time limit.
    let again = profile(QUICK).await.expect("profile");
    let (code, message) = error_code(again, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    assert!(
        message.contains("takes longer than this tenant's time limit")
            && message.contains("is not started again for this tenant"),
        "measured again: {message}"
    );
    let full = profile(ALICE).await.expect("profile");
    assert_eq!(full.status(), 200);
    let full: serde_json::Value = full.json().await.expect("JSON");
    assert_eq!(full["layers"].as_array().map(Vec::len), Some(15), "{full}");
}

/// A profile stopped at its tenant's limit while the tenant's own invocations took the share
/// from it is remembered too: tenant `busy` (400 ms, eight slots on two workers) runs seven
/// endless loops beside its profile, which then spends most of its time waiting for a slot.
/// Those waits were taken for other tenants' load, which excuses a stop, and every request
/// measured again to the limit, holding the model's turn and device memory each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_stopped_behind_its_own_tenants_work_is_remembered() {
    const BUSY: &str = "busy-token";
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    common::write_store(&store);
    let text = format!(
        "{}\n[tenants.busy]\ntoken_sha256 = \"{}\"\nmodels = [\"resnet18\"]\n\
         timeout = \"400ms\"\nconcurrency = 8\nqueue = 0\n\
         [tenants.busy.functions]\nhostile = \"{}\"\n",
        common::policy_text_for(
            &format!("store = \"{}\"", store.display()),
            "workers = 2",
            &tmp.path().join("state")
        ),
        hash_token(BUSY),
        common::guest("hostile").display()
    );
    let h = TestHost::start_with(tmp, store, text).await;
    let profile = || {
        h.client
            .get(format!("{}/v1/models/resnet18/profile", h.url))
            .bearer_auth(BUSY)
            .send()
    };
    let body = serde_json::json!({"bucket": "datasets", "keys": [common::sample_key(0)],
        "model": "resnet18", "split": 1});
    assert_eq!(h.warm(ALICE, "feature-extract", body).await.status(), 200);
    let tenant = Arc::clone(&h.host.policy().tenants["busy"]);
    let admission = h.host.admission(&tenant);
    let loops = futures_join((0..7).map(|_| h.invoke(BUSY, "hostile", hostile("loop", &[], &[]))));
    let stopped = async {
        let until = Instant::now() + Duration::from_secs(30);
        while admission.load().0 != 7 {
            assert!(Instant::now() < until, "the loops never took their slots");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        profile().await.expect("profile")
    };
    let (responses, stopped) = tokio::join!(loops, stopped);
    assert!(responses.iter().all(|r| r.status() == 422));
    let (code, message) = error_code(stopped, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    assert!(
        message.contains("time limit of 400ms exceeded"),
        "{message}"
    );
    let again = profile().await.expect("profile");
    let (code, message) = error_code(again, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    assert!(
        message.contains("is not started again for this tenant"),
        "measured again: {message}"
    );
}

/// A profile whose client hangs up while the model is measured keeps its tenant's slot until
/// the measurement ends, as a device batch does: tenant `prof` (one slot, no queue) could
/// otherwise start a measurement, hang up, and start the next, running as many at once as it
/// has models unmeasured, each holding device memory and a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_keeps_its_slot_while_it_measures_after_its_client_hangs_up() {
    const PROF: &str = "prof-token";
    let h = common::start_tenants(|store, state| {
        let text = common::policy_text_for(
            &format!("store = \"{}\"", store.display()),
            "measure_at_start = false",
            state,
        );
        format!(
            "{text}\n[tenants.prof]\ntoken_sha256 = \"{}\"\ngrants = []\nmodels = [\"vit_b_16\", \"densenet121\"]\nmemory = \"64MiB\"\ntimeout = \"600s\"\nconcurrency = 1\nqueue = 0\n",
            hash_token(PROF)
        )
    })
    .await;
    let prof = h.host.policy().tenants["prof"].clone();
    let admission = h.host.admission(&prof);
    let addr = h.url.trim_start_matches("http://").to_string();
    let mut conn = TcpStream::connect(&addr).await.expect("connect");
    conn.write_all(
        format!("GET /v1/models/vit_b_16/profile HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {PROF}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("send");
    let until = Instant::now() + Duration::from_secs(30);
    while admission.load() != (1, 0) {
        assert!(Instant::now() < until, "{:?}", admission.load());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past the model's load (which goes on after its caller has gone, one per tenant at a
    // time), measuring: the measurement's memory is reserved in the budget while it runs.
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        let text = h.metrics().await;
        let reserved = text
            .lines()
            .find_map(|l| l.strip_prefix("hapi_device_reserved_bytes "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if reserved.is_some_and(|r| r > 0.0) {
            break;
        }
        assert!(Instant::now() < until, "never measuring:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut answer = [0u8; 64];
    let early = tokio::time::timeout(
        Duration::from_millis(100),
        tokio::io::AsyncReadExt::read(&mut conn, &mut answer),
    )
    .await;
    assert!(
        early.is_err(),
        "the profile was answered within 3 s: the test proves nothing"
    );
    drop(conn);
    let second = h
        .client
        .get(format!("{}/v1/models/densenet121/profile", h.url))
        .bearer_auth(PROF)
        .send()
        .await
        .expect("profile request");
    let (code, message) = error_code(second, 429).await;
    assert_eq!(code, "busy", "{message}");
    // The slot comes back when the measurement ends.
    let until = Instant::now() + Duration::from_secs(300);
    while admission.load() != (0, 0) {
        assert!(Instant::now() < until, "{:?}", admission.load());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request the tenant has no room for (`tight`'s two slots running endless loops, its one
/// queue place taken) is refused before its body is used: the body, 3 MiB, is read and
/// dropped, so that the client, still sending it, gets the 429 `busy` answer and not a broken
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_answered_while_its_body_is_still_being_sent() {
    let h = TestHost::start().await;
    let mut body = hostile("read", &[], &[]);
    body["options"]["pad"] = "x".repeat(3 << 20).into();
    let post = async {
        h.client
            .post(format!("{}/v1/invoke/hostile", h.url))
            .bearer_auth(TIGHT)
            .json(&body)
            .send()
            .await
            .expect("answered, not cut off")
    };
    let refused = when_tight_is_full(&h, post).await;
    let (code, message) = error_code(refused, 429).await;
    assert_eq!(code, "busy", "{message}");
}

async fn futures_join<F: Future<Output = reqwest::Response>>(
    calls: impl Iterator<Item = F>,
) -> Vec<reqwest::Response> {
    futures::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_guest_gets_a_clear_error() {
    let h = TestHost::start().await;
    let (code, message) = error_code(
        h.invoke(TIGHT, "hostile", hostile("panic", &[], &[])).await,
        422,
    )
    .await;
    assert_eq!(code, "function_trapped", "{message}");
    let (code, message) = error_code(
        h.invoke(TIGHT, "hostile", hostile("bad-output", &[], &[]))
            .await,
        422,
    )
    .await;
    assert_eq!(code, "bad_output", "{message}");
    others_still_served(&h).await;
}

/// A wasi-nn tensor returned by its handle (`output::nn`) is checked as bytes are: its data
/// against its dimensions, its rank, its type (the response has no fp64 or i32); a valid one is
/// answered with its bytes as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_handed_over_by_its_handle_is_checked_like_bytes() {
    let h = TestHost::start().await;
    let nn = |ty: &str, dims: &str, bytes: &str| {
        hostile(
            "nn-output",
            &[("type", ty), ("dims", dims), ("bytes", bytes)],
            &[],
        )
    };
    let resp = h.invoke(TIGHT, "hostile", nn("u8", "2,3", "6")).await;
    assert_eq!(raw(resp).await, vec![1u8; 6]);
    let (shape, values) = features(h.invoke(TIGHT, "hostile", nn("fp32", "2", "8")).await).await;
    assert_eq!(shape, vec![2]);
    assert_eq!(values, vec![f32::from_le_bytes([1; 4]); 2]);
    for (body, needle) in [
        (nn("fp32", "1000,1000", "16"), "need 4000000 bytes"),
        (nn("fp64", "2", "16"), "fp64"),
        (nn("i32", "2", "8"), "i32"),
        (nn("u8", "1,1,1,1,1,1,1,1,1", "1"), "rank 9"),
    ] {
        let (code, message) = error_code(h.invoke(TIGHT, "hostile", body).await, 422).await;
        assert_eq!(code, "bad_output", "{message}");
        assert!(message.contains(needle), "{needle}: {message}");
    }
    others_still_served(&h).await;
}

/// The host's instance pool holds the sum of the tenants' `concurrency` (at least
/// `MIN_INSTANCES`): five tenants of 64 (320, past 256) each run 64 calls at once, and every
/// call is served. The pool had held 256 instances for all, so tenants within their
/// concurrency were answered 429 for slots that others held. A reload that raises the sum past
/// the pool says that a restart is needed; invocations past the pool then get 429 `busy` with
/// `Retry-After`, never a server error, and the host serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_instance_pool_holds_every_tenants_concurrency() {
    use hapi_host::wasm::engine::MIN_INSTANCES;
    let tenants = (MIN_INSTANCES as usize).div_ceil(64) + 1;
    let text = |store: &std::path::Path, state: &std::path::Path, tenants: usize| {
        let mut text = common::tenants_policy(
            store,
            state,
            "max_connections = 2048\nmax_connections_per_client = 2048",
            tenants,
            &["resnet18"],
            |_| "concurrency = 64\nqueue = 0\ncapabilities = [\"clocks\", \"random\"]".into(),
        );
        text.push('\n');
        for t in 0..tenants {
            text = text.replace(
                &format!("[tenants.t{t}.functions]\n"),
                &format!(
                    "[tenants.t{t}.functions]\nsleeper = \"{}\"\n",
                    common::guest("sleeper").display()
                ),
            );
        }
        text
    };
    let mut dirs = None;
    let h = common::start_tenants(|store, state| {
        dirs = Some((store.to_path_buf(), state.to_path_buf()));
        text(store, state, tenants)
    })
    .await;
    let (store, state) = dirs.expect("the policy was written");
    let sleep =
        json!({"bucket": "b", "keys": [], "model": "m", "split": 0, "options": {"ms": "1500"}});
    let all_at_once = |tenants: usize| {
        let calls = (0..tenants * 64).map(|i| {
            let (h, body) = (&h, sleep.clone());
            async move {
                h.invoke(&common::tenant_token(i % tenants), "sleeper", body)
                    .await
            }
        });
        futures::future::join_all(calls)
    };
    let count = |responses: &[reqwest::Response]| {
        let mut counts = std::collections::BTreeMap::new();
        for r in responses {
            *counts.entry(r.status().as_u16()).or_insert(0usize) += 1;
        }
        counts
    };
    let responses = all_at_once(tenants).await;
    let counts = count(&responses);
    eprintln!("{} calls at once: {counts:?}", tenants * 64);
    assert_eq!(
        counts,
        [(200, tenants * 64)].into(),
        "every tenant within its concurrency is served"
    );
    // One tenant more: past the pool the host started with.
    let restart = h
        .reload(&text(&store, &state, tenants + 1))
        .await
        .expect("reloaded");
    assert!(
        restart.iter().any(|r| r.contains("the instance pool")
            && r.contains(&format!("adds up to {}", (tenants + 1) * 64))),
        "{restart:?}"
    );
    let responses = all_at_once(tenants + 1).await;
    let counts = count(&responses);
    eprintln!(
        "{} calls at once past the pool: {counts:?}",
        (tenants + 1) * 64
    );
    assert!(counts.keys().all(|&s| s == 200 || s == 429), "{counts:?}");
    assert!(
        counts.get(&429).copied().unwrap_or(0) >= 1,
        "the slots never ran out: {counts:?}"
    );
    for r in responses.into_iter().filter(|r| r.status() == 429) {
        assert_eq!(r.headers().get("retry-after").expect("Retry-After"), "1");
        let (code, _) = error_code(r, 429).await;
        assert_eq!(code, "busy");
    }
    let back = raw(h
        .invoke(
            &common::tenant_token(0),
            "sleeper",
            json!({"bucket": "b", "keys": [], "model": "m", "split": 0, "options": {"ms": "1"}}),
        )
        .await)
    .await;
    assert_eq!(back.len(), 8);
}

/// The guest's stack (wasmtime's bound on Wasm's own stack, within the host's fiber stack):
/// recursion within it returns, recursion past it is a trap, and the host serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_limit_obeyed_and_violated() {
    let h = TestHost::start().await;
    let out = raw(h
        .invoke(
            TIGHT,
            "hostile",
            hostile("recurse", &[("depth", "1000")], &[]),
        )
        .await)
    .await;
    assert_eq!(
        u64::from_le_bytes(out.try_into().expect("8 bytes")),
        1000 * 1001 / 2
    );
    let resp = h
        .invoke(
            TIGHT,
            "hostile",
            hostile("recurse", &[("depth", "100000000")], &[]),
        )
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "function_trapped", "{message}");
    assert!(message.contains("stack"), "{message}");
    others_still_served(&h).await;
}

/// The time limit holds inside a large compute, pooled or not: the call ends at its deadline
/// (the device drops its slices or its thread stops between them) and the host serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_holds_inside_a_large_compute_pooled_or_not() {
    for pool in [true, false] {
        let h = common::start_tenants(|store, state| {
            common::tenants_policy(
                store,
                state,
                &format!("pool = {pool}"),
                1,
                &["resnet18"],
                |_| String::new(),
            )
            .replace("timeout = \"120s\"", "timeout = \"1s\"")
        })
        .await;
        // Warm, then 96 images through every layer of ResNet-18: several seconds of compute.
        let one = json!({"bucket": "datasets", "keys": [common::sample_key(0)], "model": "resnet18", "split": 15});
        assert_eq!(
            h.warm(&common::tenant_token(0), "feature-extract", one.clone())
                .await
                .status(),
            200
        );
        let keys: Vec<String> = (0..96)
            .map(|i| common::sample_key(common::SAMPLES[i % 6]))
            .collect();
        let large = json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 15});
        let started = Instant::now();
        let resp = h
            .invoke(&common::tenant_token(0), "feature-extract", large)
            .await;
        let took = started.elapsed();
        let (code, message) = error_code(resp, 422).await;
        assert_eq!(code, "time_limit_exceeded", "pool = {pool}: {message}");
        assert!(
            took < Duration::from_millis(1500),
            "pool = {pool}: {took:?}"
        );
        assert_eq!(
            h.invoke(&common::tenant_token(0), "feature-extract", one)
                .await
                .status(),
            200
        );
        // The abandoned call's last slice ends within a slice's time; then nothing is held.
        let until = Instant::now() + Duration::from_secs(2);
        while h.host.device().memory().reserved > 0 {
            assert!(
                Instant::now() < until,
                "pool = {pool}: memory left reserved"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

const HANGUP: &str = "hangup-token";

/// Sends `POST /v1/invoke/{function}` on a connection of its own and returns the connection
/// without reading the answer; dropping it hangs up.
async fn send_raw(url: &str, token: &str, function: &str, body: &serde_json::Value) -> TcpStream {
    let addr = url.trim_start_matches("http://");
    let body = body.to_string();
    let request = format!(
        "POST /v1/invoke/{function} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    stream
}

/// Invokes until the tenant's one slot takes the call (not 429), and returns its answer.
async fn when_admitted(
    h: &TestHost,
    body: serde_json::Value,
    patience: Duration,
) -> reqwest::Response {
    let until = Instant::now() + patience;
    loop {
        let resp = h.invoke(HANGUP, "hostile", body.clone()).await;
        if resp.status() != 429 || Instant::now() > until {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tenant `hangup`'s invocations running now.
fn running(h: &TestHost) -> usize {
    let tenant = Arc::clone(&h.host.policy().tenants["hangup"]);
    h.host.admission(&tenant).load().0
}

/// Waits (30 s at most) until tenant `hangup` has `n` invocations running.
async fn wait_for(h: &TestHost, n: usize, what: &str, why: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while running(h) != n {
        assert!(
            Instant::now() < until,
            "{what}: waited 30 s for the call {why}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The value of metric `name` for tenant `hangup`'s `hostile` calls with outcome `code`.
fn metric(text: &str, name: &str, code: &str) -> Option<f64> {
    let series = format!("{name}{{tenant=\"hangup\",function=\"hostile\",code=\"{code}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.parse().expect("a number"))
}

/// An invocation stopped while it waits in a host call (here its client hangs up while the
/// guest sleeps, holding 900 MB it wrote) frees its memory on a slot of its tenant's share. Its
/// task was aborted, and the memory freed on a worker while the tenant held no slot: a tenant
/// abandoning such calls had their teardown beside its whole share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_invocations_memory_is_freed_on_its_tenants_share() {
    let h = common::start_tenants(|store, state| {
        common::policy_text(store, state).replacen(
            "timeout = \"1s\"\ncapabilities",
            "memory = \"1GiB\"\ntimeout = \"60s\"\ncapabilities",
            1,
        )
    })
    .await;
    let clocky = Arc::clone(&h.host.policy().tenants["clocky"]);
    let admission = h.host.admission(&clocky);
    let cpu = Arc::clone(h.host.runtime().cpu());
    let body = json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0,
        "options": {"ms": "60000", "touch": "900000000"}});
    let conn = send_raw(&h.url, CLOCKY, "sleeper", &body).await;
    let until = Instant::now() + Duration::from_secs(30);
    while admission.load() != (1, 0) {
        assert!(Instant::now() < until, "the call did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its memory written (well under a second), it sleeps: a host call's wait, on no slot.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cpu.load("clocky"), (0, 0), "asleep, on no slot");
    assert_eq!(admission.load(), (1, 0), "still running");
    drop(conn);
    // Until the call is gone and the tenant holds no slot: for how long it held one (the
    // teardown's, given back once the memory is freed).
    let watching = tokio::task::spawn_blocking(move || {
        let until = Instant::now() + Duration::from_secs(30);
        let (mut first, mut last) = (None, None);
        loop {
            let (running, _) = cpu.load("clocky");
            let now = Instant::now();
            if running > 0 {
                first.get_or_insert(now);
                last = Some(now);
            } else if admission.load() == (0, 0) || now > until {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        (first.zip(last).map(|(f, l)| l - f), admission.load())
    });
    let (held, left) = watching.await.expect("watch");
    eprintln!("the teardown held a slot for {held:?}");
    assert_eq!(left, (0, 0), "the call ended");
    assert!(
        held.is_some(),
        "its memory was freed on no slot of its tenant's share"
    );
}

/// A client that hangs up stops its invocation, and the tenant is still charged for what it
/// used. Tenant `hangup` may run one call at once and queue none, with a 60 s limit: a guest
/// that reads an object (or runs a model segment) and then never returns holds the slot until
/// its client closes the connection; then the slot is free at once (the next call runs, long
/// before the 60 s), and the metrics count the abandoned calls under `client_closed` with the
/// bytes they read and their device time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_stops_its_invocation_and_is_charged_for_it() {
    let h = common::start_tenants(|store, state| {
        let mut text = common::policy_text(store, state);
        text.push_str(&format!(
            "\n[tenants.hangup]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"datasets\", prefix = \"fashion-mnist/\" }}]\nmodels = [\"resnet18\"]\nmemory = \"512MiB\"\ntimeout = \"60s\"\nconcurrency = 1\nqueue = 0\n[tenants.hangup.functions]\nhostile = \"{}\"\n",
            hash_token(HANGUP),
            common::guest("hostile").display()
        ));
        text
    })
    .await;
    let read = hostile("read", &[], &["fashion-mnist/small.bin"]);
    // The model loaded before the call that computes hangs.
    let segment = hostile(
        "graph",
        &[
            ("graph", "resnet18[0..4]"),
            ("dims", "1,3,224,224"),
            ("bytes", "602112"),
            ("count", "2"),
        ],
        &[],
    );
    let warm = when_admitted(&h, segment.clone(), Duration::from_secs(120)).await;
    assert_eq!(warm.status(), 200);
    // Read to its end: a response holds its slot until its last byte is written, which the
    // host sees a moment after the client has it.
    warm.bytes().await.expect("the warm-up's output");
    wait_for(&h, 0, "the warm-up", "to give its slot back").await;
    for (what, body) in [("a read", &read), ("a model segment", &segment)] {
        let mut hanging = body.clone();
        hanging["options"]["hang"] = "yes".into();
        let mut attempts = 0;
        let conn = loop {
            attempts += 1;
            let mut conn = send_raw(&h.url, HANGUP, "hostile", &hanging).await;
            wait_for(&h, 1, what, "to run").await;
            // Time for its work before it hangs (a few milliseconds of it).
            tokio::time::sleep(Duration::from_secs(2)).await;
            if running(&h) == 1 {
                break conn;
            }
            // The slot that `wait_for` saw may have been the last call's, given back a moment
            // after its client had the answer, and this call refused (429): say what came.
            let mut answer = vec![0u8; 512];
            let n = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::io::AsyncReadExt::read(&mut conn, &mut answer),
            )
            .await;
            let answer = String::from_utf8_lossy(&answer[..n.map_or(0, |r| r.unwrap_or(0))]);
            assert!(
                answer.starts_with("HTTP/1.1 429") && attempts < 3,
                "{what}: the call ended by itself (attempt {attempts}): {answer}"
            );
        };
        let hung_up = Instant::now();
        drop(conn);
        wait_for(&h, 0, what, "to give its slot back").await;
        assert!(
            hung_up.elapsed() < Duration::from_secs(30),
            "{what}: the slot was held {:?} after the client left",
            hung_up.elapsed()
        );
        let resp = h.invoke(HANGUP, "hostile", read.clone()).await;
        assert_eq!(resp.status(), 200, "{what}: {:?}", resp.text().await);
    }
    let text = h.metrics().await;
    let closed = |name| metric(&text, name, "client_closed");
    assert_eq!(closed("hapi_invocations_total"), Some(2.0), "{text}");
    assert_eq!(closed("hapi_read_bytes_total"), Some(1024.0), "{text}");
    assert!(
        closed("hapi_compute_seconds_total").expect("compute") > 0.0,
        "{text}"
    );
    assert_eq!(closed("hapi_output_bytes_total"), Some(0.0), "{text}");
    assert!(
        closed("hapi_invocation_seconds_total").expect("seconds") >= 4.0,
        "{text}"
    );
}

/// A compute that its time limit stops part way is counted for the device time it had: each
/// batch's time is added as the batch ends, to the invocation's `hapi_compute_seconds_total`
/// and the tenant's `hapi_device_seconds_total` (both were added only when a call finished, so a
/// tenant whose large calls always ran out of time had device time recorded for nobody). The
/// metrics are read once the device runs no batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_time_is_counted_for_a_compute_its_time_limit_stops() {
    const STOPPED: &str = "stopped-token";
    let h = common::start_tenants(|store, state| {
        let mut text = common::policy_text(store, state);
        text.push_str(&format!(
            "\n[tenants.stopped]\ntoken_sha256 = \"{}\"\ngrants = []\nmodels = [\"resnet18\"]\nmemory = \"512MiB\"\ntimeout = \"3s\"\n[tenants.stopped.functions]\nhostile = \"{}\"\n",
            hash_token(STOPPED),
            common::guest("hostile").display()
        ));
        text
    })
    .await;
    let graph = |dims: &str, bytes: usize| {
        hostile(
            "graph",
            &[
                ("graph", "resnet18[0..15]"),
                ("dims", dims),
                ("bytes", &bytes.to_string()),
            ],
            &[],
        )
    };
    // Alice loads and measures the model (its first use), within her 20 s.
    let warm = h
        .warm(ALICE, "hostile", graph("1,3,224,224", 602_112))
        .await;
    assert_eq!(warm.status(), 200, "{:?}", warm.text().await);
    // 192 samples through the whole network: many seconds of batches on this CPU, past its 3 s.
    let resp = h
        .invoke(STOPPED, "hostile", graph("192,3,224,224", 192 * 602_112))
        .await;
    let (code, message) = error_code(resp, 422).await;
    assert_eq!(code, "time_limit_exceeded", "{message}");
    let until = Instant::now() + Duration::from_secs(60);
    while h.host.device().memory().running_batches > 0 {
        assert!(
            Instant::now() < until,
            "the stopped call's last batch never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = h.metrics().await;
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let compute = value(
        "hapi_compute_seconds_total{tenant=\"stopped\",function=\"hostile\",code=\"time_limit_exceeded\"}",
    );
    let device = value("hapi_device_seconds_total{tenant=\"stopped\"}");
    // The batch running when the call stopped is the tenant's once it ends, and may end after
    // the invocation's own count was taken.
    assert!(
        compute > 0.3 && device >= compute,
        "device time counted: {compute} s for the invocation, {device} s for the tenant"
    );
}

/// A guest's table grows to the bound the host states, and past it the invocation stops with
/// `table_limit_exceeded`: the pool's own default (20,000) had refused a growth below the
/// bound stated (100,000), answering -1 to the guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_grows_to_its_bound_and_no_further() {
    use hapi_host::wasm::limits::MAX_TABLE_ELEMENTS;
    let h = TestHost::start().await;
    let max = MAX_TABLE_ELEMENTS as u32;
    for (name, by) in [("grow-max", max), ("grow-over", max + 1)] {
        let body = instantiating("hostile", &growing_table(by), 1);
        assert_eq!(
            h.put_function(ALICE, name, body).await.status(),
            201,
            "{name}"
        );
    }
    let output = hostile("output", &[("bytes", "2")], &[]);
    assert_eq!(
        raw(h.invoke(ALICE, "grow-max", output.clone()).await).await,
        [7, 7]
    );
    let (code, message) = error_code(h.invoke(ALICE, "grow-over", output).await, 422).await;
    assert_eq!(code, "table_limit_exceeded", "{message}");
    assert!(message.contains(&format!("at most {max}")), "{message}");
    others_still_served(&h).await;
}

/// The request's keys and options are the tenant's while its function runs, beside the guest's
/// own copy of them in its memory: the host held them (up to 4.6 MiB a call) on no account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_keys_are_charged_while_the_function_runs() {
    let h = TestHost::start().await;
    let bob = Arc::clone(&h.host.policy().tenants["bob"]);
    let f = h.host.function("bob", "hostile").expect("bob's hostile");
    let keys: Vec<String> = (0..4096)
        .map(|i| format!("{i:04}{}", "k".repeat(996)))
        .collect();
    let key_bytes: u64 = keys.iter().map(|k| k.len() as u64).sum();
    let req: hapi_wire::InvokeRequest = serde_json::from_value(json!({
        "bucket": "secret", "keys": keys, "options": {"mode": "output", "bytes": "2"}
    }))
    .expect("a request");
    let done = h.host.invoke(&bob, &f, req).await;
    assert!(done.result.is_ok(), "{:?}", done.result.err());
    eprintln!(
        "{} bytes held at most for {key_bytes} bytes of keys",
        done.memory_peak
    );
    assert!(
        done.memory_peak >= 2 * key_bytes,
        "{} bytes held at most; the keys are {key_bytes}, the guest's copy and the host's",
        done.memory_peak
    );
}

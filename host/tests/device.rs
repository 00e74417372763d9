//! The device under load: the memory model, storage batch adaptation, pooling across tenants,
//! and admission control, through real HTTP invocations of the real guest.
//!
//! The tests in this file run one at a time: the memory model is measured from the process's
//! resident set, which a concurrently running host would disturb.

mod common;

use common::{
    SAMPLES, TestHost, features, raw, sample_key, start_tenants, tenant_token, tenants_policy,
};
use hapi_host::account::Deadline;
use hapi_host::device::budget::Budget;
use hapi_wire::profile::{ModelMemory, SegmentCost};
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Mutex;

fn serial() -> &'static Mutex<()> {
    static M: OnceLock<Mutex<()>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(()))
}

const MODEL: &str = "efficientnet_lite0";
const SPLIT: usize = 7;
const TENANTS: usize = 8;
/// Images per request: a "full-size" request.
const FULL: usize = 24;

fn token(t: usize) -> String {
    tenant_token(t)
}

async fn start(host: &str) -> TestHost {
    start_tenants(|store, state| {
        tenants_policy(store, state, host, TENANTS, &[MODEL], |_| {
            "concurrency = 2".into()
        })
    })
    .await
}

/// Tenant `t`'s request: `n` images, a different rotation of the samples for each tenant.
fn body(t: usize, n: usize) -> Value {
    let keys: Vec<String> = (0..n)
        .map(|i| sample_key(SAMPLES[(t + i) % SAMPLES.len()]))
        .collect();
    json!({"bucket": "datasets", "keys": keys, "model": MODEL, "split": SPLIT})
}

/// Every tenant invokes at once; the responses in tenant order.
async fn all_at_once(h: &TestHost, n: usize) -> Vec<reqwest::Response> {
    let calls = (0..TENANTS)
        .map(|t| async move { h.invoke(&token(t), "feature-extract", body(t, n)).await });
    futures::future::join_all(calls).await
}

async fn memory_model(h: &TestHost) -> ModelMemory {
    memory_model_of(h, MODEL).await
}

async fn memory_model_of(h: &TestHost, model: &str) -> ModelMemory {
    common::profile_at(&h.client, &h.url, model).await.memory
}

async fn metric(h: &TestHost, name: &str) -> f64 {
    let text = h.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Budget that fits the weights and exactly two full-size requests (plus half a request).
fn budget_for_two(m: &ModelMemory) -> (u64, SegmentCost) {
    let cost = m.segment(0..SPLIT);
    let full = cost.run_bytes(FULL as u64);
    (m.weights() + 2 * full + full / 2, cost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_profile_reports_a_measured_memory_model() {
    let _one = serial().lock().await;
    let h = start("").await;
    let m = memory_model(&h).await;
    let manifest = h.host.runtime().models().manifest(MODEL).expect("manifest");
    assert_eq!(m.method, "rss-peak");
    assert_eq!(m.layers.len(), manifest.layers.len());
    for (l, spec) in m.layers.iter().zip(&manifest.layers) {
        assert_eq!(l.weights_bytes, 4 * spec.params, "{}", l.name);
        assert_eq!(l.output_bytes_per_sample, spec.output_bytes_per_sample());
        // Never below the activation-pair bound: the output exists while the layer runs.
        assert!(l.per_sample_bytes >= l.output_bytes_per_sample, "{l:?}");
    }
    // The inverted-residual block after the stem expands 16 channels to 96 at 112x112: what it
    // allocates inside is several times its 784 KB output, and the measurement sees it.
    let b1 = &m.layers[4];
    assert_eq!(b1.name, "blocks.1");
    assert!(
        b1.measured_per_sample_bytes > 3 * b1.output_bytes_per_sample,
        "blocks.1 measured {} bytes per sample, output {}",
        b1.measured_per_sample_bytes,
        b1.output_bytes_per_sample
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_profile_runs_once_in_memory_held_from_the_budget_at_a_batch_the_budget_holds() {
    let _one = serial().lock().await;
    let probe = start("").await;
    // Two first profiles at once: one measurement, its memory reserved once.
    let (a, b) = tokio::join!(
        common::profile_at(&probe.client, &probe.url, MODEL),
        common::profile_at(&probe.client, &probe.url, MODEL)
    );
    // What holds the device is the operator's to see; a tenant's profile tells the budget.
    let device = probe.host.device().memory();
    assert!(device.weights > 0, "the model is loaded: {device:?}");
    assert_eq!(
        (a.device_memory.budget, a.device_memory.weights),
        (device.budget, 0),
        "{:?}",
        a.device_memory
    );
    drop(probe);
    assert_eq!(a.layers, b.layers, "one measurement");
    let m = a.memory;
    let whole = m.segment(0..m.layers.len());
    let one = m.weights() + whole.run_bytes(a.batch as u64);
    assert!(
        device.budget >= one + whole.run_bytes(a.batch as u64),
        "the budget ({}) holds two measurements' memory, so holding it twice would show",
        device.budget
    );
    let peak = device.peak_bytes;
    assert!(
        peak <= one,
        "two first profiles at once reserved memory once: peak {peak} bytes, weights and one \
         measurement at batch {} {one}",
        a.batch
    );
    // Room beside the weights for the whole model at batch 3, not 4.
    let budget = m.weights() + whole.run_bytes(3) + whole.per_sample / 2;
    let h = start(&format!("memory_budget = \"{budget}B\"")).await;
    let p = common::profile_at(&h.client, &h.url, MODEL).await;
    assert_eq!(p.batch, 3, "measured at the largest batch the budget holds");
    assert!(p.layers.iter().all(|l| l.batch == 3), "{:?}", p.layers);
    let d = &h.host.device().memory();
    assert!(
        d.peak_bytes >= m.weights() + whole.run_bytes(3) && d.peak_bytes <= budget,
        "the measurement's memory was held in the budget: peak {} bytes, weights {}, batch 3 \
         of the model {}, budget {budget}",
        d.peak_bytes,
        m.weights(),
        whole.run_bytes(3)
    );
    assert_eq!(d.reserved, 0, "and given back: {d:?}");
    // Measured once: the next profile holds nothing and gives the same layers.
    let again = common::profile_at(&h.client, &h.url, MODEL).await;
    assert_eq!(again.batch, 3);
    assert_eq!(again.layers, p.layers);
}

/// A model's first profile makes room as a tenant's own work does: never from a neighbour's
/// model within its share, not even one sample's (the fallback for a batch every tenant waits
/// behind; nobody waits behind a profile), and it waits for room no longer than its tenant's
/// time limit. Here the prober's room beside its own resnet18 is one byte short of a sample,
/// and unloading the neighbour's efficientnet_lite0, idle, within its half of the budget,
/// would make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_profile_does_not_unload_a_neighbours_model_within_its_share() {
    let _one = serial().lock().await;
    let (theirs, mine) = ("efficientnet_lite0", "resnet18");
    let probe = start("").await;
    let models = probe.host.runtime().models();
    let memory = |m: &str| {
        let pkg = models.load(m).expect(m);
        models.memory(m, &pkg).expect(m)
    };
    let (m_theirs, m_mine) = (memory(theirs), memory(mine));
    drop(probe);
    let one = m_mine.segment(0..m_mine.layers.len()).run_bytes(1);
    let budget = m_theirs.weights() + m_mine.weights() + one - 1;
    assert!(
        m_theirs.weights() <= budget / 2,
        "the neighbour within its share"
    );
    let h = start_tenants(|store, state| {
        let text = tenants_policy(
            store,
            state,
            &format!("memory_budget = \"{budget}B\"\nresident_for = \"10m\""),
            2,
            &[theirs, mine],
            |_| String::new(),
        );
        // The prober's time limit: 3 s.
        let (before, after) = text.split_at(text.find("[tenants.t1]").expect("t1"));
        format!(
            "{before}{}",
            after.replacen("timeout = \"120s\"", "timeout = \"3s\"", 1)
        )
    })
    .await;
    let call = json!({"bucket": "datasets", "keys": [sample_key(SAMPLES[0])], "model": theirs, "split": 3});
    let resp = h.invoke(&token(0), "feature-extract", call).await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let started = std::time::Instant::now();
    let resp = h
        .client
        .get(format!("{}/v1/models/{mine}/profile", h.url))
        .bearer_auth(token(1))
        .send()
        .await
        .expect("profile request");
    let waited = started.elapsed();
    let status = resp.status();
    let mut text = resp.text().await.unwrap_or_default();
    text.truncate(400);
    eprintln!("the profile: {status} after {waited:?}: {text}");
    let d = h.host.device().memory();
    assert_eq!(
        d.evictions, 0,
        "the neighbour's model stayed: {d:?}; the profile: {status} {text}"
    );
    assert!(
        status == 429 || status == 503,
        "no room by the rules: refused, {status} {text}"
    );
    assert!(text.contains("found no room"), "{text}");
    assert!(
        waited < Duration::from_secs(10),
        "waited {waited:?}, past the prober's 3 s limit"
    );
}

/// The model packages of the test policy, opened as a host opens them, for tests of the
/// device's budget on its own.
struct Packages {
    _dir: tempfile::TempDir,
    models: Arc<hapi_host::models::Models>,
}

impl Packages {
    /// A pooling device of one worker over these packages, adapting, with no batch window,
    /// batches of at most 16 and 50 ms slices and batch time (the wait rule's tests).
    fn pooled_device(
        &self,
        budget: u64,
        resident_for: Duration,
    ) -> Arc<hapi_host::device::executor::Device> {
        hapi_host::device::executor::Device::start(
            hapi_host::device::types::DeviceConfig {
                budget,
                adapt: true,
                pool: true,
                window: Duration::ZERO,
                max_batch: 16,
                slice: Duration::from_millis(50),
                batch_time: Duration::from_millis(50),
                workers: 1,
                resident_for,
            },
            Arc::clone(&self.models),
        )
        .expect("device")
    }

    /// A device of one worker over these packages that does not adapt (batches bounded by
    /// `max_batch` alone, whatever the memory model finds efficient), on a 4 GiB budget.
    fn fixed_device(
        &self,
        pool: bool,
        window: Duration,
        max_batch: i64,
        (slice, batch_time): (Duration, Duration),
    ) -> Arc<hapi_host::device::executor::Device> {
        hapi_host::device::executor::Device::start(
            hapi_host::device::types::DeviceConfig {
                budget: 4 << 30,
                adapt: false,
                pool,
                window,
                max_batch,
                slice,
                batch_time,
                workers: 1,
                resident_for: RESIDENT_FOR,
            },
            Arc::clone(&self.models),
        )
        .expect("device")
    }

    /// The memory models of `models`, measured on their first load (on a pooled device of its
    /// own, which goes with them): later loads only load.
    async fn measured<const N: usize>(&self, models: [&str; N]) -> [Arc<ModelMemory>; N] {
        let d = self.pooled_device(4 << 30, RESIDENT_FOR);
        let (t, s) = (Arc::from("measure"), Deadline::new(LONG));
        let mut memory = Vec::with_capacity(N);
        for m in models {
            memory.push(Arc::clone(
                &d.acquire(m, &t, &s, None).await.expect(m).memory,
            ));
        }
        memory.try_into().expect("one per model")
    }

    fn open() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = common::policy_text(&dir.path().join("store"), &dir.path().join("state"));
        let policy =
            hapi_host::policy::Policy::parse("policy.toml", &text, dir.path()).expect("policy");
        let models = hapi_host::models::Models::open(&policy, tch::Device::Cpu, None);
        Self {
            _dir: dir,
            models: Arc::new(models.expect("models")),
        }
    }

    fn weights(&self, m: &str) -> u64 {
        self.models.weights(m).expect("a model of the test policy")
    }

    /// Pins `model` for `tenant`, loading it if need be, within `limit`.
    async fn pin(
        &self,
        budget: &Arc<Budget>,
        model: &str,
        tenant: &str,
        limit: Duration,
    ) -> Result<hapi_host::device::budget::Pin, hapi_host::device::DeviceError> {
        let deadline = Deadline::new(limit);
        budget
            .acquire(&self.models, model, &Arc::from(tenant), &deadline, None)
            .await
    }

    /// One use of `model` by `tenant` (pinned and let go); the loads it took (0 or 1).
    async fn use_model(&self, budget: &Arc<Budget>, model: &str, tenant: &str) -> u64 {
        let before = budget.snapshot().loads;
        drop(self.pin(budget, model, tenant, LONG).await.expect(model));
        budget.snapshot().loads - before
    }
}

/// Longer than any of these tests takes: uses stay fresh throughout.
/// A profile's wait for room (taken before the model's turn, which it must not hold while it
/// waits) holds nothing, and ends when the room is there, or when its answer is: another
/// call's measurement, kept, which gives its room back once kept; at its deadline it is
/// `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_room_holds_nothing_and_ends_with_the_room_or_the_answer() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (total, measuring) = (1u64 << 20, 1u64 << 10);
    let budget = Budget::new(total, Duration::from_secs(30));
    let answered = Arc::new(AtomicBool::new(false));
    let wait = |need: u64, limit: Duration| {
        let (budget, answered) = (Arc::clone(&budget), Arc::clone(&answered));
        tokio::spawn(async move {
            let deadline = Deadline::new(limit);
            let done = move || answered.load(Ordering::SeqCst);
            budget
                .wait_room(need, "t", &deadline, "a test's profile", done)
                .await
        })
    };
    // The room.
    let all = budget
        .reserve_now(total, "other")
        .expect("the whole budget");
    let waiting = wait(1, LONG);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "it waits for the room");
    assert_eq!(budget.snapshot().reserved, total, "and holds none of it");
    drop(all);
    assert!(waiting.await.expect("join").is_ok(), "the room came");
    // The answer: a measurement keeps it, then gives back room too small for this one.
    let others = budget
        .reserve_now(total - measuring, "other")
        .expect("room");
    let measurement = budget.reserve_now(measuring, "measurer").expect("room");
    let waiting = wait(2 * measuring, LONG);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "it waits");
    answered.store(true, Ordering::SeqCst);
    drop(measurement);
    assert!(
        waiting.await.expect("join").is_ok(),
        "answered without the room"
    );
    // Neither: `Busy` at its deadline.
    answered.store(false, Ordering::SeqCst);
    let waited = wait(2 * measuring, Duration::from_millis(300))
        .await
        .expect("join");
    assert!(
        matches!(&waited, Err(hapi_host::device::types::DeviceError::Busy(m)) if m.contains("found no room")),
        "{waited:?}"
    );
    drop(others);
}

const RESIDENT_FOR: Duration = Duration::from_secs(600);
const LONG: Duration = Duration::from_secs(300);

/// A pin taken and dropped while nobody looked at the room leaves the room as it was (or
/// smaller: the model was used since), so it wakes none of the waiters; one dropped after a
/// waiter looked does. A guest calling `load-by-name` on a loaded model in a loop (a pin and
/// its drop each) woke every waiting load and reservation, and the dispatcher, on each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_taken_and_dropped_while_nobody_looks_wake_nobody() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let model = "efficientnet_lite0";
    // The attacker's model, in use, is within its half and kept for it: a reservation of the
    // whole budget waits.
    let budget = Budget::new(2 * p.weights(model) + (1 << 20), RESIDENT_FOR);
    p.use_model(&budget, model, "attacker").await;
    let reserve = || {
        let budget = Arc::clone(&budget);
        tokio::spawn(async move {
            let deadline = Deadline::new(LONG);
            budget
                .reserve(budget.total(), "waiter", &deadline, "a test's reservation")
                .await
        })
    };
    let waiting = reserve();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the reservation waits");
    let before = budget.snapshot().wakes;
    for _ in 0..1000 {
        let pin = p.pin(&budget, model, "attacker", LONG).await.expect(model);
        // A reservation refused while the pin is held, by a caller that does not wait for a
        // change (a call refused with adaptation off, the dispatcher's next batch): a look
        // at the room that waits for nothing.
        assert!(budget.reserve_now(budget.total(), "attacker").is_none());
        drop(pin);
    }
    let woken = budget.snapshot().wakes - before;
    assert!(woken <= 2, "{woken} wakes for 1,000 pins taken and dropped");
    // A waiter that looks while the model is pinned is woken when the pin goes.
    let pin = p.pin(&budget, model, "attacker", LONG).await.expect(model);
    let second = reserve();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = budget.snapshot().wakes;
    drop(pin);
    assert_eq!(
        budget.snapshot().wakes - before,
        1,
        "the pin's drop woke them"
    );
    for w in [waiting, second] {
        assert!(!w.is_finished(), "still no room");
        w.abort();
    }
}

/// Pins of a model no wait for the running batches' room counts on wake nobody: each pin of an
/// idle model woke every waiter while any such wait was registered, and each drop again after
/// the woken had looked, for as long as a tenant kept pinning its own model in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_beside_a_wait_they_do_not_touch_wake_nobody() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let model = "efficientnet_lite0";
    let w = p.weights(model);
    // The attacker's model, idle and kept for it within its share; a batch of the rest; a
    // reservation that the batch's ending will meet, without the attacker's model.
    let budget = Budget::new(3 * w, RESIDENT_FOR);
    p.use_model(&budget, model, "attacker").await;
    let batch = budget.reserve_batch(2 * w, "heavy").expect("the rest");
    let b = Arc::clone(&budget);
    let waiting = tokio::spawn(async move {
        let deadline = Deadline::new(LONG);
        b.reserve(2 * w, "waiter", &deadline, "a test's reservation")
            .await
            .map(drop)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        budget.snapshot().waiting,
        1,
        "the reservation waits for the batch"
    );
    let before = budget.snapshot().wakes;
    for _ in 0..100 {
        let pin = p.pin(&budget, model, "attacker", LONG).await.expect(model);
        drop(pin);
    }
    let woken = budget.snapshot().wakes - before;
    assert!(woken <= 2, "{woken} wakes for 100 pins taken and dropped");
    assert_eq!(
        budget.snapshot().waiting,
        1,
        "still met by the batch's ending"
    );
    drop(batch);
    let reserved = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the reservation ends")
        .expect("join");
    assert!(reserved.is_ok(), "{reserved:?}");
}

/// A pin that makes its tenant one of a model's owners shrinks every owner's share: another
/// owner may be over its own now, its idle model room a waiter may take. Taking it wakes the
/// waiters (its drop may come seconds later). The waiter slept until the first owner's use went
/// stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_that_makes_its_tenant_an_owner_wakes_the_waiters() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (kept, stale) = ("resnet18", "efficientnet_lite0");
    // Room for both and as much again as the difference: the budget is twice the kept model,
    // so that it is within its half beside a claimant (its share: the budget over its owners
    // and the claimant), and over its third beside one more owner.
    let free = p.weights(kept) - p.weights(stale);
    let resident_for = Duration::from_secs(1);
    let budget = Budget::new(p.weights(kept) + p.weights(stale) + free, resident_for);
    p.use_model(&budget, kept, "a").await;
    p.use_model(&budget, stale, "old").await;
    tokio::time::sleep(resident_for + Duration::from_millis(200)).await;
    // `a` uses its model again; the other is nobody's now.
    p.use_model(&budget, kept, "a").await;
    assert_eq!(budget.snapshot().loaded, 2);
    // The free bytes and the stale model are too little (the kept model's size); `a`'s
    // model is within its share and kept.
    let waiting = {
        let budget = Arc::clone(&budget);
        let need = p.weights(kept) + (1 << 20);
        tokio::spawn(async move {
            let deadline = Deadline::new(LONG);
            budget
                .reserve(need, "waiter", &deadline, "a test's reservation")
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the reservation waits");
    let before = budget.snapshot().wakes;
    // `b` holds its pin (a call of seconds): the room is there from the pin on.
    let pin = p.pin(&budget, stale, "b", LONG).await.expect(stale);
    assert_eq!(
        budget.snapshot().wakes - before,
        1,
        "the new owner's pin woke the waiters when taken"
    );
    let reserved = tokio::time::timeout(LONG, waiting).await;
    assert!(
        matches!(reserved, Ok(Ok(Ok(_)))),
        "`a`, over its share beside `b`, gave up its idle model's room: {reserved:?}"
    );
    drop(pin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_that_cannot_fit_unloads_no_model() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (idle, used) = ("efficientnet_lite0", "resnet18");
    let free = 1 << 20;
    let budget = Budget::new(p.weights(idle) + p.weights(used) + free, RESIDENT_FOR);
    p.use_model(&budget, idle, "t").await;
    let pinned = p.pin(&budget, used, "t", LONG).await.expect(used);
    let s = budget.snapshot();
    assert_eq!((s.loaded, s.evictions), (2, 0), "{s:?}");
    // Unloading the idle model would not make room: it stays.
    let big = free + p.weights(idle) + 1;
    assert!(budget.reserve_now(big, "t").is_none());
    let s = budget.snapshot();
    assert_eq!((s.loaded, s.evictions), (2, 0), "{s:?}");
    // Unloading it makes room: it goes.
    let held = budget
        .reserve_now(free + p.weights(idle), "t")
        .expect("room once it is unloaded");
    let s = budget.snapshot();
    assert_eq!((s.loaded, s.evictions), (1, 1), "{s:?}");
    drop((held, pinned));
}

/// A model whose weights fit the budget but not beside one sample's run is refused before it
/// is loaded again, once its memory model is known: each call loaded it (unloading idle
/// models, its weights charged, read from disk) only to be refused once it was loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_run_one_sample_is_not_loaded_again() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let model = "resnet18";
    let budget = Budget::new(p.weights(model) + (1 << 20), RESIDENT_FOR);
    let mut loads = Vec::new();
    for _ in 0..3 {
        let e = p
            .pin(&budget, model, "t", LONG)
            .await
            .expect_err("one sample does not fit beside the weights");
        assert!(
            matches!(e, hapi_host::device::DeviceError::TooLarge(_)),
            "{e}"
        );
        assert!(e.to_string().contains("to run one sample"), "{e}");
        loads.push(budget.snapshot().loads);
    }
    // The first call may load it (to measure it, unless this process has already); no later
    // call does.
    assert!(
        loads[0] <= 1 && loads[1] == loads[0] && loads[2] == loads[0],
        "{loads:?}"
    );
    let s = budget.snapshot();
    assert_eq!((s.loaded, s.weights), (0, 0), "{s:?}");
}

/// A tenant that loads model after model (resnet18, densenet121, resnet18, ...) in a budget
/// with room for one of them beside a neighbour's efficientnet_lite0: it unloads its own
/// models, never the neighbour's, which holds less than its half of the budget. With
/// `resident_for = 0` (least recently used, whoever's), each of its loads unloads the
/// neighbour's model too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_loading_model_after_model_unloads_its_own_not_a_neighbours() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (mine, a, b) = ("efficientnet_lite0", "resnet18", "densenet121");
    let total = p.weights(mine) + p.weights(a).max(p.weights(b)) + (1 << 20);
    assert!(p.weights(mine) <= total / 2);
    assert!(p.weights(a) + p.weights(b) + p.weights(mine) > total);
    for (resident_for, kept) in [(RESIDENT_FOR, true), (Duration::ZERO, false)] {
        let budget = Budget::new(total, resident_for);
        p.use_model(&budget, mine, "victim").await;
        for m in [a, b, a, b] {
            p.use_model(&budget, m, "loader").await;
        }
        let s = budget.snapshot();
        // Kept: lite0 and the loader's last model, 3 of its own unloaded. Not kept: lite0
        // went at the loader's second load and stayed out.
        let expect = if kept { (2, 3, 5) } else { (1, 4, 5) };
        assert_eq!(
            (s.loaded, s.evictions, s.loads),
            expect,
            "{resident_for:?}: {s:?}"
        );
        let reloads = p.use_model(&budget, mine, "victim").await;
        assert_eq!(
            reloads,
            u64::from(!kept),
            "{resident_for:?}: the victim's reloads"
        );
    }
}

/// Room for a tenant's batch comes from models nobody uses, then its own: a neighbour's model,
/// within its share, stays, even when it is the least recently used. With `resident_for = 0`
/// the batch unloads the neighbour's model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_makes_room_from_its_own_models_not_a_neighbours() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (theirs, mine) = ("efficientnet_lite0", "resnet18");
    let free = 1 << 20;
    let total = p.weights(theirs) + p.weights(mine) + free;
    assert!(p.weights(theirs) <= total / 2 && p.weights(theirs) <= p.weights(mine));
    for (resident_for, kept) in [(RESIDENT_FOR, true), (Duration::ZERO, false)] {
        let budget = Budget::new(total, resident_for);
        // The neighbour's model is the least recently used.
        p.use_model(&budget, theirs, "neighbour").await;
        p.use_model(&budget, mine, "me").await;
        let need = free + p.weights(theirs);
        let held = budget
            .reserve_now(need, "me")
            .expect("room from my own model");
        // One model unloaded either way: mine, or (least recently used, whoever's) theirs.
        let s = budget.snapshot();
        assert_eq!((s.loaded, s.evictions), (1, 1), "{resident_for:?}: {s:?}");
        drop(held);
        let reloads = p.use_model(&budget, theirs, "neighbour").await;
        assert_eq!(
            reloads,
            u64::from(!kept),
            "{resident_for:?}: the neighbour's reloads"
        );
    }
}

/// A batch that cannot get one sample's room by the rules (the neighbour's model within its
/// share, the leader's own pinned: the leader wants more than its share) unloads nothing and
/// waits, as a load does, until the neighbour's model goes stale; the dispatcher passes over
/// such a leader meanwhile. It had run one sample at a time, unloading the neighbour's idle
/// model each time: a tenant keeping its own models pinned by queued calls made its
/// neighbour load its model again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fits_no_sample_by_the_rules_unloads_no_neighbours_model() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (theirs, mine) = ("efficientnet_lite0", "resnet18");
    let free = 1 << 20;
    let total = p.weights(theirs) + p.weights(mine) + free;
    let one = 2 * free;
    for (resident_for, runs) in [(RESIDENT_FOR, false), (Duration::ZERO, true)] {
        let budget = Budget::new(total, resident_for);
        p.use_model(&budget, theirs, "neighbour").await;
        let running = p.pin(&budget, mine, "me", LONG).await.expect(mine);
        let room = budget.room_for(one, "me");
        let held = budget.reserve_now(one, "me");
        let s = budget.snapshot();
        if runs {
            // The neighbour's use is stale at once: its model is nobody's.
            assert!(room >= one, "{room}");
            assert!(held.is_some());
            assert_eq!((s.loaded, s.evictions), (1, 1), "{s:?}");
        } else {
            assert_eq!(room, free, "the free bytes only");
            assert!(budget.room_once_reservations_end("me") < one);
            assert!(held.is_none(), "no sample's room");
            assert_eq!((s.loaded, s.evictions), (2, 0), "{s:?}");
        }
        drop((held, running));
    }
}

/// A tenant loads one model at a time: while its load of resnet50 (measured on first use:
/// seconds) goes on after its caller gave up, its load of another model waits, and says why;
/// another tenant's load of that model does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_loads_one_model_at_a_time() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let (slow, next) = ("resnet50", "efficientnet_lite0");
    let gave_up = p
        .pin(&budget, slow, "me", Duration::from_millis(50))
        .await
        .expect_err("resnet50's first load takes longer than 50 ms");
    assert!(gave_up.to_string().contains("being loaded"), "{gave_up}");
    let waited = p
        .pin(&budget, next, "me", Duration::from_millis(200))
        .await
        .expect_err("my second load waits for my first");
    let text = waited.to_string();
    assert!(
        text.contains("one model at a time") && text.contains(slow),
        "{text}"
    );
    assert_eq!(
        p.use_model(&budget, next, "other").await,
        1,
        "the other's load"
    );
    // Once my load is done, mine go on.
    assert_eq!(
        p.use_model(&budget, slow, "me").await,
        0,
        "resnet50 is loaded"
    );
    assert_eq!(p.use_model(&budget, next, "me").await, 0, "lite0 is loaded");
}

/// A model's load is CPU work for the tenant that asked for it (a libtorch load on a blocking
/// thread): it waits for a slot of the tenant's share of the invocation workers and holds it
/// until the load ends, as the tenant's guest code would (a tenant alternating two models that
/// do not fit its room together reloads on every call, a core's worth of loads beside every
/// tenant's share).
#[test]
fn a_load_runs_on_a_slot_of_its_tenants_share() {
    // One blocking thread, which a load waiting on it for its slot would hold.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(a_load_runs_on_a_slot_of_its_tenants_share_here());
}

async fn a_load_runs_on_a_slot_of_its_tenants_share_here() {
    use hapi_host::account::Pace;
    use hapi_host::wasm::cpu::{CpuShares, Turn};
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let cpu = CpuShares::new(1);
    let me: Arc<str> = Arc::from("me");
    // The tenant's guest code holds the one worker; its invocation then loads densenet121
    // (not resnet50, whose slow first load the test above counts on: a load here would leave
    // its files in the page cache).
    let guest = Turn::new(&cpu, &me, 1, std::time::Instant::now() + LONG);
    assert!(guest.take().await, "a slot");
    let pace = guest.sibling() as Arc<dyn Pace>;
    let loading = {
        let (budget, models, me) = (Arc::clone(&budget), Arc::clone(&p.models), Arc::clone(&me));
        tokio::spawn(async move {
            let deadline = Deadline::new(LONG);
            budget
                .acquire(&models, "densenet121", &me, &deadline, Some(pace))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !loading.is_finished(),
        "the load waits for the tenant's slot"
    );
    assert_eq!(cpu.load(&me), (1, 1), "held by the guest; the load waits");
    // It waits off the blocking thread: other blocking work runs meanwhile.
    let other = tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(|| 1));
    let other = other.await;
    assert!(
        matches!(other, Ok(Ok(1))),
        "the load held the blocking thread while it waited for its slot: {other:?}"
    );
    // The guest waits in a host call: the load takes the slot and holds it while it runs.
    guest.give();
    let mut held_while_loading = 0;
    while !loading.is_finished() {
        held_while_loading = held_while_loading.max(cpu.load(&me).0);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let pin = loading
        .await
        .expect("load task")
        .expect("densenet121 loads");
    assert_eq!(held_while_loading, 1, "the load held a slot while it ran");
    assert_eq!(cpu.load(&me), (0, 0), "and gave it back when it ended");
    drop(pin);
}

/// A tenant's load waits for a slot of its share ahead of the tenant's own invocations: another
/// tenant that calls the model meanwhile finds it `Loading` and waits for that load. Behind
/// the heavy tenant's queue (three invocations, each holding the one worker for 2 s, as guests
/// in long host copies do) the load began only after them, and the light tenant's call ran
/// into its time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_waits_ahead_of_its_tenants_invocations() {
    use hapi_host::account::Pace;
    use hapi_host::wasm::cpu::{CpuShares, Turn};
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let cpu = CpuShares::new(1);
    let (heavy, light): (Arc<str>, Arc<str>) = (Arc::from("heavy"), Arc::from("light"));
    let until = std::time::Instant::now() + LONG;
    let reach = |want: (usize, usize), what: &'static str| {
        let (cpu, heavy) = (Arc::clone(&cpu), Arc::clone(&heavy));
        async move {
            let by = std::time::Instant::now() + Duration::from_secs(10);
            while cpu.load(&heavy) != want {
                assert!(
                    std::time::Instant::now() < by,
                    "{what}: {:?}",
                    cpu.load(&heavy)
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let guest = Turn::new(&cpu, &heavy, 1, until);
    assert!(guest.take().await, "a slot");
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let t = Turn::new(&cpu, &heavy, 1, until);
            tokio::spawn(async move {
                assert!(t.take().await, "a slot in turn");
                tokio::time::sleep(Duration::from_secs(2)).await;
                t.give();
            })
        })
        .collect();
    reach((1, 3), "three invocations queued").await;
    // The guest's invocation loads resnet18, then waits in its host call.
    let pace = guest.sibling() as Arc<dyn Pace>;
    let loading = {
        let (budget, models, heavy) = (
            Arc::clone(&budget),
            Arc::clone(&p.models),
            Arc::clone(&heavy),
        );
        tokio::spawn(async move {
            let deadline = Deadline::new(LONG);
            budget
                .acquire(&models, "resnet18", &heavy, &deadline, Some(pace))
                .await
        })
    };
    reach((1, 4), "the load queued").await;
    guest.give();
    let deadline = Deadline::new(Duration::from_secs(4));
    let pin = budget
        .acquire(&p.models, "resnet18", &light, &deadline, None)
        .await;
    assert!(
        pin.is_ok(),
        "the light tenant waited for the heavy one's queue: {:?}",
        pin.err()
    );
    drop(pin);
    drop(loading.await.expect("load task").expect("resnet18 loads"));
    for q in queued {
        q.await.expect("queued invocation");
    }
}

/// A pace that says the caller's time is up, or that panics.
#[derive(Debug)]
struct NoTime {
    panics: bool,
}

impl hapi_host::account::Pace for NoTime {
    fn pace(&self) -> bool {
        assert!(!self.panics, "a pace that panics");
        false
    }

    fn try_pace(&self) -> Option<bool> {
        assert!(!self.panics, "a pace that panics");
        Some(false)
    }

    fn turn(&self) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async { false })
    }
}

/// A load whose caller's time is up before a slot of its share came free is not begun: the
/// caller is told its time limit passed (not a host fault), nothing stays charged or
/// `Loading`, and the tenant's next load goes on; so after a pace that panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_whose_caller_has_no_time_left_is_not_begun() {
    use hapi_host::device::DeviceError;
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let me: Arc<str> = Arc::from("me");
    for panics in [false, true] {
        let deadline = Deadline::new(LONG);
        let pace = Arc::new(NoTime { panics }) as Arc<dyn hapi_host::account::Pace>;
        let refused = budget
            .acquire(&p.models, "resnet18", &me, &deadline, Some(pace))
            .await
            .expect_err("not begun");
        if panics {
            assert!(
                matches!(refused, DeviceError::Failed(ref m) if m.contains("panicked")),
                "{refused}"
            );
        } else {
            assert!(matches!(refused, DeviceError::Expired(_)), "{refused}");
        }
        let b = budget.snapshot();
        assert_eq!(
            (b.weights, b.loaded),
            (0, 0),
            "nothing charged or loaded: {b:?}"
        );
    }
    // The tenant's next load is not held up behind a load left `Loading`.
    assert_eq!(p.use_model(&budget, "efficientnet_lite0", "me").await, 1);
}

/// A tenant whose model does not fit beside what a neighbour within its share keeps waits,
/// and is told why; once the neighbour's use is older than `resident_for`, it loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_past_the_loaders_share_waits_for_the_neighbours_models_to_go_stale() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (small, mid, big) = ("efficientnet_lite0", "densenet121", "resnet18");
    // The neighbour holds lite0 and densenet121, over half the budget until lite0 goes; then
    // densenet121 alone is within its half and resnet18 does not fit beside it.
    let total = 2 * p.weights(mid) + (2 << 20);
    assert!(p.weights(mid) <= total / 2 && p.weights(small) + p.weights(mid) > total / 2);
    assert!(p.weights(big) + p.weights(mid) > total && p.weights(big) <= total);
    let resident_for = Duration::from_millis(1500);
    let budget = Budget::new(total, resident_for);
    for m in [small, mid] {
        p.use_model(&budget, m, "neighbour").await;
    }
    let used = std::time::Instant::now();
    let err = p
        .pin(&budget, big, "loader", Duration::from_millis(300))
        .await
        .expect_err("no room within the neighbour's share");
    let text = err.to_string();
    assert!(
        text.contains("held by other tenants' models") && text.contains(big),
        "{text}"
    );
    let s = budget.snapshot();
    // Nothing was unloaded for a load that could not fit anyway.
    assert_eq!((s.loaded, s.evictions, s.deferred), (2, 0, 1), "{s:?}");
    // Waiting on, it loads once the neighbour's use is past `resident_for`, woken by the
    // expiry itself (nothing else changes the budget meanwhile).
    assert_eq!(p.use_model(&budget, big, "loader").await, 1);
    let waited = used.elapsed();
    assert!(waited >= resident_for, "loaded after {waited:?}");
    assert!(
        waited < resident_for + Duration::from_secs(5),
        "loaded after {waited:?}"
    );
    let s = budget.snapshot();
    assert_eq!(s.deferred, 2, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pooled_and_adapted_features_equal_whole_unpooled_ones_for_eight_tenants() {
    let _one = serial().lock().await;
    let reference = start("pool = false\nadapt_batch = false").await;
    let mut expected = Vec::new();
    for resp in all_at_once(&reference, 10).await {
        expected.push(features(resp).await);
    }
    let m = memory_model(&reference).await;
    drop(reference);
    // Room for about 3 samples at a time, and batches of at most 5: every call is cut into
    // sub-batches, and batches mix tenants.
    let cost = m.segment(0..SPLIT);
    let budget = m.weights() + cost.run_bytes(3) + cost.per_sample / 2;
    let h = start(&format!(
        "pool = true\nadapt_batch = true\nmax_batch = 5\nbatch_window = \"20ms\"\nmemory_budget = \"{budget}B\""
    ))
    .await;
    for (t, resp) in all_at_once(&h, 10).await.into_iter().enumerate() {
        let (shape, values) = features(resp).await;
        assert_eq!(shape, expected[t].0, "tenant {t}");
        let d = max_abs_diff(&values, &expected[t].1);
        assert!(d <= 1e-5, "tenant {t}: max abs difference {d}");
    }
    let snap = h.host.device().memory();
    assert!(snap.largest_batch <= 5, "{snap:?}");
    assert!(snap.batches >= (TENANTS * 10 / 5) as u64, "{snap:?}");
    assert!(snap.peak_bytes <= budget, "{snap:?} over budget {budget}");
    let mixed = metric(&h, "hapi_device_batch_samples_total").await;
    assert!(mixed >= (TENANTS * 10) as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_for_two_full_requests_serves_eight_tenants_only_with_adaptation() {
    let _one = serial().lock().await;
    let probe = start("").await;
    let (budget, _) = budget_for_two(&memory_model(&probe).await);
    drop(probe);

    // Adaptation off: calls run whole, and those that do not fit are refused (429).
    let off = start(&format!(
        "pool = false\nadapt_batch = false\nmemory_budget = \"{budget}B\""
    ))
    .await;
    let m_off = memory_model(&off).await;
    let cost = m_off.segment(0..SPLIT);
    let fit = (budget - m_off.weights()) / cost.run_bytes(FULL as u64);
    let (mut ok_off, mut refused) = (0, 0);
    for resp in all_at_once(&off, FULL).await {
        match resp.status().as_u16() {
            200 => ok_off += 1,
            429 => {
                assert_eq!(resp.headers().get("retry-after").expect("Retry-After"), "1");
                let body: Value = resp.json().await.expect("JSON");
                assert_eq!(body["code"], "device_busy", "{body}");
                refused += 1;
            }
            other => panic!(
                "adaptation off: {other}: {}",
                resp.text().await.unwrap_or_default()
            ),
        }
    }
    let peak_off = metric(&off, "hapi_device_calls_peak").await;
    let snap_off = off.host.device().memory();
    drop(off);
    assert!(refused >= 1, "{ok_off} served, none refused");
    assert!(peak_off <= fit as f64, "{peak_off} at once, {fit} fit");
    assert!(snap_off.peak_bytes <= budget);

    // Adaptation on (and pooling): everyone is served, within the same budget.
    let on = start(&format!("memory_budget = \"{budget}B\"")).await;
    for (t, resp) in all_at_once(&on, FULL).await.into_iter().enumerate() {
        let (shape, _) = features(resp).await;
        assert_eq!(shape[0], FULL, "tenant {t}");
    }
    let peak_on = metric(&on, "hapi_device_calls_peak").await;
    let snap_on = on.host.device().memory();
    assert!(snap_on.peak_bytes <= budget, "{snap_on:?}");
    eprintln!(
        "budget {budget} B fits {fit} full requests of {FULL}: adaptation off served {ok_off}/{TENANTS} \
         ({refused} refused), at most {peak_off} at once; adaptation on served {TENANTS}/{TENANTS}, \
         {peak_on} at once; ratio {:.1}",
        peak_on / peak_off.max(1.0)
    );
    assert!(
        peak_on >= 2.0 * peak_off,
        "on: {peak_on} at once, off: {peak_off}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_too_large_for_the_budget_is_refused_without_adaptation_and_served_with_it() {
    let _one = serial().lock().await;
    let probe = start("").await;
    let m = memory_model(&probe).await;
    drop(probe);
    let cost = m.segment(0..SPLIT);
    // Fits 4 samples at a time; the request has 12.
    let budget = m.weights() + cost.run_bytes(4);
    let off = start(&format!(
        "adapt_batch = false\nmemory_budget = \"{budget}B\""
    ))
    .await;
    let resp = off.invoke(&token(0), "feature-extract", body(0, 12)).await;
    let (code, message) = common::error_code(resp, 422).await;
    assert_eq!(code, "does_not_fit_device", "{message}");
    assert!(message.contains("12 samples"), "{message}");
    drop(off);
    let on = start(&format!("memory_budget = \"{budget}B\"")).await;
    let (shape, _) = features(on.invoke(&token(0), "feature-extract", body(0, 12)).await).await;
    assert_eq!(shape[0], 12);
    assert!(on.host.device().memory().largest_batch <= 4);
}

/// The `total` stage of a response's Server-Timing, in ms.
fn total_ms(resp: &reqwest::Response) -> f64 {
    resp.headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| {
            t.split(',')
                .find_map(|p| p.trim().strip_prefix("total;dur=")?.parse().ok())
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_call_outlives_its_limit_waiting_for_the_device() {
    let _one = serial().lock().await;
    let probe = start("").await;
    let m = memory_model(&probe).await;
    drop(probe);
    // Every frozen layer, one sample on the device at a time, and a 1 s time limit.
    let freeze = 25;
    let cost = m.segment(0..freeze);
    let budget = m.weights() + cost.run_bytes(1) + cost.per_sample / 2;
    let h = start_tenants(|store, state| {
        tenants_policy(
            store,
            state,
            &format!("memory_budget = \"{budget}B\""),
            TENANTS,
            &[MODEL],
            |_| String::new(),
        )
        .replace("timeout = \"120s\"", "timeout = \"1s\"")
    })
    .await;
    // Warm: the model is loaded before the load starts.
    let mut first = body(0, 1);
    first["split"] = json!(freeze);
    features(h.warm(&token(0), "feature-extract", first).await).await;
    // Eight tenants' 8 images each take longer than 1 s together: waiting for the device
    // counts, so calls end with `time_limit_exceeded` at their deadline, never much later.
    let calls = (0..TENANTS).map(|t| {
        let h = &h;
        async move {
            let mut b = body(t, 8);
            b["split"] = json!(freeze);
            let started = std::time::Instant::now();
            let resp = h.invoke(&token(t), "feature-extract", b).await;
            (started.elapsed(), resp)
        }
    });
    let (mut served, mut expired) = (0, 0);
    for (t, (took, resp)) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert!(
            took < Duration::from_millis(1500),
            "tenant {t}: {took:?} for a 1 s limit"
        );
        if resp.status() == 200 {
            assert!(total_ms(&resp) <= 1500.0);
            served += 1;
        } else {
            let (code, message) = common::error_code(resp, 422).await;
            assert_eq!(code, "time_limit_exceeded", "tenant {t}: {message}");
            assert!(message.contains("device"), "{message}");
            expired += 1;
        }
    }
    eprintln!("{served} served, {expired} ended at their deadline");
    assert!(
        expired >= 1,
        "the load fitted the time limit: the test proves nothing"
    );
    assert!(h.host.device().memory().largest_batch <= 1);
    // Abandoned calls left nothing behind: the device serves the next call at once.
    let mut again = body(0, 1);
    again["split"] = json!(freeze);
    features(h.invoke(&token(1), "feature-extract", again).await).await;
    assert_eq!(h.host.device().memory().reserved, 0);
    assert_eq!(h.host.device().memory().in_progress, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_that_can_never_fit_is_refused_with_adaptation_on_and_others_are_served() {
    let _one = serial().lock().await;
    let probe = start("").await;
    let m = memory_model(&probe).await;
    drop(probe);
    // Room for the weights and one sample of layers [0, 2) (and of any single layer, which
    // loading the model asks for), not for one sample of layers [0, 7): its input, its
    // largest working set and its output at once.
    let short = m.segment(0..2).run_bytes(1);
    let long = m.segment(0..SPLIT).run_bytes(1);
    let budget = m.weights() + short.max(m.one_sample_peak()) + 1;
    assert!(
        m.weights() + long > budget,
        "the long segment fits after all: {long} bytes for one sample, budget {budget}, \
         one-layer peak {}",
        m.one_sample_peak()
    );
    let h = start(&format!("memory_budget = \"{budget}B\"")).await;
    let b = body(0, 2);
    let started = std::time::Instant::now();
    let (code, message) =
        common::error_code(h.invoke(&token(0), "feature-extract", b).await, 422).await;
    assert_eq!(code, "does_not_fit_device", "{message}");
    assert!(started.elapsed() < Duration::from_secs(30));
    // The device did not stall: a segment that fits is served.
    let mut fits = body(1, 2);
    fits["split"] = json!(2);
    let (shape, _) = features(h.invoke(&token(1), "feature-extract", fits).await).await;
    assert_eq!(shape[0], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_load_that_outlasts_the_limit_is_answered_429_and_goes_on() {
    let _one = serial().lock().await;
    // AlexNet, which no other test in this process loads, measured at first use (not before
    // serving): its first load and memory measurement take seconds, longer than the 1 s limit.
    let h = start_tenants(|store, state| {
        tenants_policy(
            store,
            state,
            "measure_at_start = false",
            1,
            &["alexnet"],
            |_| String::new(),
        )
        .replace("timeout = \"120s\"", "timeout = \"1s\"")
    })
    .await;
    let call =
        json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "alexnet", "split": 3});
    let started = std::time::Instant::now();
    let resp = h.invoke(&token(0), "feature-extract", call.clone()).await;
    let took = started.elapsed();
    assert_eq!(resp.headers().get("retry-after").expect("Retry-After"), "1");
    let (code, message) = common::error_code(resp, 429).await;
    assert_eq!(code, "device_busy", "{message}");
    assert!(message.contains("being loaded"), "{message}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    // The load went on without the caller: a later call is served. Until then a call is told
    // the model is being loaded (429), or, once it is, may still spend its 1 s limit behind
    // the model's first runs (TorchScript profiles its first calls; 422 in the full suite).
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let resp = h.invoke(&token(0), "feature-extract", call.clone()).await;
        if resp.status() == 200 {
            break;
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(
            status == 429 || (status == 422 && text.contains("time_limit_exceeded")),
            "{status}: {text}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the model never loaded"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "alexnet: served {:?} after its first call",
        started.elapsed()
    );
}

/// A package whose files change on disk while the host runs is not loaded again until a
/// restart: its memory model, and what a reload keeps serving, are of the files the host read.
/// A layer file changed under an unchanged manifest had been loaded as it was now, beside the
/// memory model of the old one.
#[test]
fn a_package_changed_on_disk_is_not_loaded_again_until_a_restart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let models = tmp.path().join("models");
    let source = hapi_model::models_dir().join("resnet18");
    let pkg = models.join("resnet18");
    std::fs::create_dir_all(&pkg).expect("mkdir");
    for entry in std::fs::read_dir(&source).expect("package") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, pkg.join(path.file_name().expect("name"))).expect("copy");
    }
    let text = common::policy_text(&tmp.path().join("store"), &tmp.path().join("state")).replace(
        &hapi_model::models_dir().display().to_string(),
        &models.display().to_string(),
    );
    let policy =
        hapi_host::policy::Policy::parse("policy.toml", &text, tmp.path()).expect("policy");
    let m = hapi_host::models::Models::open(&policy, tch::Device::Cpu, None).expect("models");
    assert!(m.load("resnet18").is_ok(), "the package as read");
    // Other weights in a layer's file, of the same shape (the next block's, as retrained
    // weights would be); the manifest unchanged.
    std::fs::copy(pkg.join("05_layer1_1.pt"), pkg.join("04_layer1_0.pt")).expect("swap");
    match m.load("resnet18") {
        Ok(_) => panic!("the changed files were loaded"),
        Err(e) => assert!(
            e.contains("changed on disk") && e.contains("after a restart"),
            "{e}"
        ),
    }
}

/// A libtorch error inside a device batch (here: a package whose layer 1 is another layer's
/// TorchScript, so running it fails) fails that batch's call with 500 `host_fault` and a request
/// id, with no internals in the body; the dispatcher serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_batch_is_a_host_fault_with_a_request_id_and_the_device_serves_on() {
    let _one = serial().lock().await;
    let tmp = tempfile::tempdir().expect("tmp");
    let (models, state) = (tmp.path().join("models"), tmp.path().join("state"));
    let source = hapi_model::models_dir().join("resnet18");
    let broken = models.join("resnet18");
    std::fs::create_dir_all(&broken).expect("mkdir");
    for entry in std::fs::read_dir(&source).expect("package") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        std::fs::copy(&path, broken.join(name)).expect("copy");
    }
    // Layer 1 declares layer 8's parameters from the start (more than it holds, which loads),
    // so that the swapped file below still loads and fails only when it runs.
    let manifest = broken.join("manifest.json");
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(&manifest).expect("manifest")).expect("json");
    m["layers"][1]["params"] = m["layers"][8]["params"].clone();
    std::fs::write(&manifest, m.to_string()).expect("write manifest");
    let graph = |name: &str, dims: &str, bytes: usize| {
        json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0,
               "options": {"mode": "graph", "graph": name, "dims": dims, "bytes": bytes.to_string()}})
    };
    let policy = |store: &std::path::Path| {
        common::policy_text(store, &state)
            .replace(
                &hapi_model::models_dir().display().to_string(),
                &models.display().to_string(),
            )
            .replace(
                "models = [\"efficientnet_lite0\", \"resnet18\"]",
                "models = [\"resnet18\"]",
            )
    };
    // A healthy host measures the package's memory model and keeps it in the state directory.
    {
        let h = start_tenants(|store, _| policy(store)).await;
        assert_eq!(
            raw(h
                .warm(
                    common::ALICE,
                    "hostile",
                    graph("resnet18[0..2]", "1,3,224,224", 602_112)
                )
                .await)
            .await,
            1u32.to_le_bytes(),
            "one output tensor (usize is 32-bit in the guest)"
        );
    }
    // Layer 1 (a BatchNorm over 64 channels) becomes layer 8 (a block over 128 channels).
    std::fs::copy(broken.join("08_layer3_0.pt"), broken.join("01_bn1.pt")).expect("swap");
    // Memory models are kept by the package's files, which the swap changed (measured again,
    // the package would fail there, not in a batch): the healthy one is kept again under the
    // new files' key, so that the host loads the package without measuring it.
    let memory = state.join("memory");
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(&memory)
        .expect("memory models")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("resnet18-"))
        })
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let name = kept[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let before = name.split('-').nth(1).expect("the files' key");
    let found = hapi_host::policy::packages::scan(std::slice::from_ref(&models)).expect("scan");
    let now = &found["resnet18"].fingerprint[..16];
    assert_ne!(before, now);
    std::fs::copy(&kept[0], memory.join(name.replacen(before, now, 1))).expect("keep");
    let h = start_tenants(|store, _| policy(store)).await;
    let resp = h
        .invoke(
            common::ALICE,
            "hostile",
            graph("resnet18[0..2]", "1,3,224,224", 602_112),
        )
        .await;
    let id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("x-request-id")
        .to_string();
    let (code, message) = common::error_code(resp, 500).await;
    assert_eq!(code, "host_fault", "{message}");
    assert!(message.contains(&id), "{message}");
    assert!(
        !message.contains("channels") && !message.contains("torch"),
        "internals leaked: {message}"
    );
    assert!(metric(&h, "hapi_device_faults").await >= 1.0);
    // The device serves on: layer 0 alone is fine.
    assert_eq!(
        raw(h
            .invoke(
                common::ALICE,
                "hostile",
                graph("resnet18[0..1]", "1,3,224,224", 602_112)
            )
            .await)
        .await,
        1u32.to_le_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pooled_batches_run_side_by_side_up_to_the_device_workers() {
    let _one = serial().lock().await;
    for workers in [1u64, 2] {
        // Batches of one sample: each call is cut into 12 batches, and while one tenant's batch
        // runs, the other tenant's can run only on a second worker.
        let h = start(&format!(
            "pool = true\nmax_batch = 1\ndevice_workers = {workers}"
        ))
        .await;
        let warm = h.warm(&token(0), "feature-extract", body(0, 1)).await;
        assert_eq!(warm.status(), 200);
        let calls = (0..2).map(|t| {
            let h = &h;
            async move { h.invoke(&token(t), "feature-extract", body(t, 12)).await }
        });
        for (t, resp) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(resp.status(), 200, "tenant {t}");
            let (shape, _) = features(resp).await;
            assert_eq!(shape[0], 12, "tenant {t}");
        }
        let snap = h.host.device().memory();
        assert_eq!(snap.peak_running_batches, workers, "{snap:?}");
        assert_eq!(snap.running_batches, 0, "{snap:?}");
        assert_eq!(snap.largest_batch, 1, "{snap:?}");
    }
}

/// AlexNet's frozen layers: a segment that runs fastest in large batches on a CPU.
const BATCHING: (&str, usize) = ("alexnet", 17);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_tenants_pool_into_batches_longer_than_one_tenants_slice() {
    let _one = serial().lock().await;
    let (model, split) = BATCHING;
    let body = |t: usize, n: usize| {
        let keys: Vec<String> = (0..n)
            .map(|i| sample_key(SAMPLES[(t + i) % SAMPLES.len()]))
            .collect();
        json!({"bucket": "datasets", "keys": keys, "model": model, "split": split})
    };
    // The slice (5 ms) admits one sample; one worker; batch mates have 100 ms to arrive.
    let start = |batch_time: &str| {
        let host = format!(
            "pool = true\nslice = \"5ms\"\nbatch_time = \"{batch_time}\"\nbatch_window = \"100ms\"\ndevice_workers = 1"
        );
        start_tenants(move |store, state| {
            tenants_policy(store, state, &host, TENANTS, &[model], |_| String::new())
        })
    };
    let mut largest = Vec::new();
    for batch_time in ["2s", "5ms"] {
        let h = start(batch_time).await;
        let warm = h.warm(&token(0), "feature-extract", body(0, 1)).await;
        assert_eq!(warm.status(), 200, "batch_time = {batch_time}");
        let memory = memory_model_of(&h, model).await;
        let fastest = memory.segment(0..split).efficient_batch.unwrap_or(32);
        assert!(
            fastest >= 4,
            "{model}[0..{split}] runs fastest at batch {fastest} here: the test proves nothing"
        );
        // Eight tenants' two images each, at once.
        let calls = (0..TENANTS).map(|t| {
            let (h, b) = (&h, body(t, 2));
            async move { h.invoke(&token(t), "feature-extract", b).await }
        });
        for (t, resp) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            let (shape, _) = features(resp).await;
            assert_eq!(shape[0], 2, "tenant {t}");
        }
        largest.push(h.host.device().memory().largest_batch);
    }
    // Pooled work runs in batches of several tenants' samples up to `batch_time`; with
    // `batch_time` no longer than the slice, every batch holds one sample.
    assert!(largest[0] >= 4, "batches with batch_time = 2s: {largest:?}");
    assert_eq!(largest[1], 1, "batches with batch_time = 5ms: {largest:?}");
}

/// A leader whose segment cannot get one sample's room (a neighbour's model, pinned by its
/// queued call, holds the memory) is passed over, not waited for: the neighbour's call, which
/// fits, runs, and the leader's runs once the neighbour's model is let go. It was waited for,
/// and every tenant's batches with it, until the neighbour's deadline: a tenant whose calls
/// never fit stalled the device for everyone and never paid for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_fit_a_sample_does_not_hold_up_a_neighbour_that_can() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (big, small) = ("resnet18", "efficientnet_lite0");
    let device = |budget: u64, resident_for: Duration| p.pooled_device(budget, resident_for);
    // The two segments' one-sample runs, from their memory models (measured on first load).
    let [one_big, one_small] = p
        .measured([big, small])
        .await
        .map(|m| m.segment(0..1).run_bytes(1));
    assert!(
        one_big > one_small,
        "{one_big} <= {one_small}: the test proves nothing"
    );
    // Both models loaded leave room for one sample of the small segment, not of the big one.
    // The light tenant's model is its own for a second after its last use.
    let d = device(
        p.weights(big) + p.weights(small) + one_small,
        Duration::from_secs(1),
    );
    let (heavy, light): (Arc<str>, Arc<str>) = (Arc::from("heavy"), Arc::from("light"));
    let limit = Duration::from_secs(10);
    let job = |tenant: &Arc<str>, pin| common::device_job(tenant, pin, 1, limit);
    let deadline = Deadline::new(LONG);
    let heavy_pin = d.acquire(big, &heavy, &deadline, None).await.expect(big);
    let light_pin = d
        .acquire(small, &light, &deadline, None)
        .await
        .expect(small);
    // The heavy tenant's call comes first (the older of two level tenants leads).
    let d2 = Arc::clone(&d);
    let heavy_job = job(&heavy, heavy_pin);
    let heavy_call = tokio::spawn(async move { d2.run(heavy_job).await });
    while d.memory().in_progress == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = std::time::Instant::now();
    let light_ran = d.run(job(&light, light_pin)).await;
    let light_took = started.elapsed();
    let heavy_ran = heavy_call.await.expect("join");
    eprintln!("the light call ran in {light_took:?}");
    assert!(light_ran.is_ok(), "{light_ran:?}");
    // With the light call done its model is idle, and a second later nobody's: the heavy
    // call's sample unloads it then and runs.
    assert!(heavy_ran.is_ok(), "{heavy_ran:?}");
    assert_eq!(d.memory().evictions, 1);
}

/// Memory a profile holds (seconds of measurement outside the dispatcher) is not waited for
/// as a running batch's is: a leader whose one sample fits only once the profile ends is
/// passed over, and a neighbour's call that fits runs now. The dispatcher had waited for every
/// reservation to end, so one tenant's profile, and its own call that could not fit beside
/// it, held up every tenant's batches until the measurement ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_memory_does_not_hold_up_the_batches_of_others() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let (big, small) = ("resnet18", "efficientnet_lite0");
    let device = |budget: u64| p.pooled_device(budget, RESIDENT_FOR);
    let [one_big, one_small] = p
        .measured([big, small])
        .await
        .map(|m| m.segment(0..1).run_bytes(1));
    assert!(
        one_big > one_small,
        "{one_big} <= {one_small}: the test proves nothing"
    );
    // Both models loaded leave room for a profile's one sample of the big segment and one
    // sample of the small one; with the profile's held, the big segment's sample does not fit.
    let d = device(p.weights(big) + p.weights(small) + one_big + one_small);
    let (heavy, light): (Arc<str>, Arc<str>) = (Arc::from("heavy"), Arc::from("light"));
    let limit = Duration::from_secs(20);
    let job = |tenant: &Arc<str>, pin| common::device_job(tenant, pin, 1, limit);
    let deadline = Deadline::new(LONG);
    let heavy_pin = d.acquire(big, &heavy, &deadline, None).await.expect(big);
    let light_pin = d
        .acquire(small, &light, &deadline, None)
        .await
        .expect(small);
    let profile = d
        .reserve(one_big, &heavy, &deadline, "a profile")
        .await
        .expect("room for the profile");
    let held = Duration::from_secs(4);
    let d2 = Arc::clone(&d);
    let heavy_job = job(&heavy, heavy_pin);
    let heavy_call = tokio::spawn(async move { d2.run(heavy_job).await });
    while d.memory().in_progress == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ends = tokio::spawn(async move {
        tokio::time::sleep(held).await;
        drop(profile);
    });
    let started = std::time::Instant::now();
    let light_ran = d.run(job(&light, light_pin)).await;
    let light_took = started.elapsed();
    let profile_held = !ends.is_finished();
    eprintln!("the light call ran in {light_took:?} beside a profile held for {held:?}");
    assert!(light_ran.is_ok(), "{light_ran:?}");
    assert!(
        profile_held,
        "the light call waited {light_took:?}, until the profile gave its memory back"
    );
    ends.await.expect("join");
    let heavy_ran = heavy_call.await.expect("join");
    assert!(
        heavy_ran.is_ok(),
        "the heavy call runs once the profile ends: {heavy_ran:?}"
    );
}

/// A profile measured at a smaller batch than the budget can hold (the device's memory was
/// short, held by a neighbour's work: `Host::profile` says so) is answered to its tenant for a
/// while and not kept for others; one at the largest batch is. The first was kept for every tenant until the host
/// restarted: a tenant could fix a shared model's profile, from which every tenant's trainer
/// plans its split, by profiling it first while holding the device's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_measured_at_a_smaller_batch_is_not_kept() {
    use hapi_host::models::PROFILE_BATCH;
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let model = "efficientnet_lite0";
    let pin = p.pin(&budget, model, "t", LONG).await.expect(model);
    let small = p
        .models
        .profile(model, &pin.model, 1, false, "t", &|| true)
        .expect("measured")
        .expect("not stopped");
    assert_eq!(small.first().map(|l| l.batch), Some(1));
    assert!(
        p.models.profiled(model).is_none(),
        "a profile at batch 1 was kept"
    );
    // It is answered to its tenant for a while (`Host::profile` asks before measuring again),
    // to no one else: a tenant that kept its room small measured the whole model again on every
    // call, each after the model's turn, ahead of other tenants' calls.
    let again = p.models.profiled_for(model, "t").expect("answered to t");
    assert!(Arc::ptr_eq(&again, &small));
    assert!(p.models.profiled_for(model, "u").is_none());
    let full = p
        .models
        .profile(model, &pin.model, PROFILE_BATCH, true, "t", &|| true)
        .expect("measured")
        .expect("not stopped");
    assert_eq!(full.first().map(|l| l.batch), Some(PROFILE_BATCH));
    let kept = p.models.profiled(model).expect("kept").expect("measured");
    assert!(Arc::ptr_eq(&kept, &full));
}

/// A measurement stops when its tenant's time is up (`go_on`, which the host makes its
/// tenant's pace and deadline, answers false), and what it measured is kept for no one, as
/// neither a profile nor a failure: the next caller measures. It ran to its end whatever the
/// limit: a tenant with a 1 s limit held the model's turn, device memory and a core for a
/// whole model's runs, every minute per model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_stops_when_its_tenants_time_is_up_and_keeps_nothing() {
    use hapi_host::models::PROFILE_BATCH;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let _one = serial().lock().await;
    let p = Packages::open();
    let budget = Budget::new(4 << 30, RESIDENT_FOR);
    let model = "resnet18";
    let pin = p.pin(&budget, model, "t", LONG).await.expect(model);
    let layers = pin.model.num_layers();
    for keep in [false, true] {
        let asked = AtomicUsize::new(0);
        let three_runs = || asked.fetch_add(1, Ordering::SeqCst) < 3;
        let stopped = p
            .models
            .profile(model, &pin.model, PROFILE_BATCH, keep, "t", &three_runs)
            .expect("no failure");
        assert!(stopped.is_none(), "keep {keep}: measured to its end");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            4,
            "keep {keep}: ran past its stop"
        );
        assert!(p.models.profiled(model).is_none(), "keep {keep}: kept");
        assert!(
            p.models.profiled_for(model, "t").is_none(),
            "keep {keep}: kept for t"
        );
    }
    let asked = AtomicUsize::new(0);
    let counted = || {
        asked.fetch_add(1, Ordering::SeqCst);
        true
    };
    let full = p
        .models
        .profile(model, &pin.model, PROFILE_BATCH, true, "t", &counted)
        .expect("measured")
        .expect("not stopped");
    assert_eq!(full.len(), layers);
    // Asked before each layer's warm-up and each of its timed runs.
    assert_eq!(
        asked.load(Ordering::SeqCst),
        layers * (1 + hapi_host::models::PROFILE_REPS)
    );
    assert!(p.models.profiled(model).is_some());
}

/// A leader whose batch waits for batch mates (one sample, below its target, its window not
/// over) does not hold the device meanwhile: its neighbours' due batches on another segment run
/// during the wait. The leader waited with every worker idle: among three or more active
/// tenants (with two, the slice is the smaller call's, so a one-sample call is due at once), a
/// tenant sending one sample at a time led whenever it had a call queued and left the device
/// idle for a window before each of its calls, charged to no one, while its neighbours' due
/// batches waited. Here the window is 8 s: the neighbours' calls end before the leader's on the
/// code after the fix, after it before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_waiting_for_batch_mates_does_not_hold_up_its_neighbours_due_batches() {
    let _one = serial().lock().await;
    let p = Packages::open();
    let window = Duration::from_secs(8);
    // Not adapting: batches are bounded by `max_batch` alone, whatever batch sizes the memory
    // model finds efficient on this machine.
    let d = p.fixed_device(
        true,
        window,
        16,
        (Duration::from_millis(50), Duration::from_millis(50)),
    );
    let job = |tenant: &Arc<str>, pin, n| common::device_job(tenant, pin, n, window * 3);
    let deadline = Deadline::new(LONG);
    let trickle: Arc<str> = Arc::from("trickle");
    let trickle_pin = d
        .acquire("resnet18", &trickle, &deadline, None)
        .await
        .expect("resnet18");
    // Two neighbours with 64 samples each of another segment: batches of up to 16, due at once.
    let mut neighbours = Vec::new();
    for name in ["first", "second"] {
        let t: Arc<str> = Arc::from(name);
        let pin = d
            .acquire("efficientnet_lite0", &t, &deadline, None)
            .await
            .expect("efficientnet_lite0");
        let (d2, call) = (Arc::clone(&d), job(&t, pin, 64));
        neighbours.push(tokio::spawn(async move { d2.run(call).await }));
    }
    while d.memory().running_batches == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // One sample while their first batch runs: with the least virtual time, it leads.
    let d2 = Arc::clone(&d);
    let one = job(&trickle, trickle_pin, 1);
    let trickle_call = tokio::spawn(async move { d2.run(one).await });
    for n in neighbours {
        let ran = n.await.expect("join");
        assert!(ran.is_ok(), "{ran:?}");
    }
    assert!(
        !trickle_call.is_finished(),
        "the neighbours' due batches waited for the leader's window"
    );
    let trickle_ran = trickle_call.await.expect("join");
    assert!(trickle_ran.is_ok(), "{trickle_ran:?}");
}

/// With pooling and adaptation off, a call's device memory (reserved whole when it comes)
/// stays reserved while its sub-batch runs, even once the call has stopped: it was given back
/// when the call stopped, and the budget showed free what the running batch still used (on a
/// GPU, room another tenant's batch would run out of memory in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpooled_calls_memory_stays_reserved_while_its_batch_runs() {
    use hapi_host::device::DeviceError;
    let _one = serial().lock().await;
    let p = Packages::open();
    let d = p.fixed_device(
        false,
        Duration::ZERO,
        128,
        (Duration::from_secs(60), Duration::from_secs(60)),
    );
    let t: Arc<str> = Arc::from("t");
    let pin = d
        .acquire("resnet18", &t, &Deadline::new(LONG), None)
        .await
        .expect("resnet18");
    // One sub-batch of 128 samples through resnet18's first blocks (seconds here), stopped
    // at 300 ms.
    let mut call = common::device_job(&t, pin, 128, Duration::from_millis(300));
    call.range = 0..5;
    let ran = d.run(call).await;
    assert!(matches!(ran, Err(DeviceError::Expired(_))), "{ran:?}");
    let m = d.memory();
    assert_eq!(
        m.batches, 0,
        "the sub-batch ended already: the test needs a longer one"
    );
    assert!(
        m.reserved > 0,
        "the running sub-batch's memory was given back with its call"
    );
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while d.memory().batches == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the sub-batch never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.memory().reserved, 0, "given back once it ended");
}

/// A batch already running when its invocation stops (here its client hangs up) runs to its
/// end, holding the call's input, output and model pin: the invocation's admission slot is
/// held with them, so the tenant's next call waits for it instead of holding as much again
/// beside it. The slot was given back with the invocation: a tenant could hold (concurrency
/// + device workers) calls' memory by hanging up on long batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_outlives_its_invocation_holds_the_tenants_slot_until_it_ends() {
    let _one = serial().lock().await;
    // Not alexnet: `a_first_load_that_outlasts_the_limit_is_answered_429_and_goes_on` needs
    // its first load in this process to be slow.
    let (model, split) = ("resnet18", 6);
    let host = "pool = true\ndevice_workers = 1\nbatch_time = \"2s\"";
    let h = start_tenants(|store, state| {
        tenants_policy(store, state, host, 1, &[model], |_| {
            "concurrency = 1".into()
        })
    })
    .await;
    let body = |n: usize| {
        let keys: Vec<String> = (0..n)
            .map(|i| sample_key(SAMPLES[i % SAMPLES.len()]))
            .collect();
        json!({"bucket": "datasets", "keys": keys, "model": model, "split": split})
    };
    assert_eq!(
        h.warm(&token(0), "feature-extract", body(1)).await.status(),
        200
    );
    let tenant = Arc::clone(&h.host.policy().tenants["t0"]);
    let admission = h.host.admission(&tenant);
    let device = || h.host.device().memory();
    // One call of 128 images: batches of up to 2 s (a tenant alone runs long batches).
    let call = {
        let (client, url, token) = (h.client.clone(), h.url.clone(), token(0));
        let b = body(128);
        tokio::spawn(
            async move { common::invoke_at(&client, &url, &token, "feature-extract", b).await },
        )
    };
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while device().running_batches == 0 {
        assert!(std::time::Instant::now() < until, "no batch ran");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The client hangs up; the invocation stops (its device call no longer counted in
    // progress) while its batch runs on.
    call.abort();
    let mut seen = None;
    while device().running_batches > 0 {
        if device().in_progress == 0 {
            seen = Some(admission.load().0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let Some(held) = seen else {
        panic!("the batch ended before the invocation stopped: the test proves nothing");
    };
    assert_eq!(
        held, 1,
        "the slot while the stopped invocation's batch runs"
    );
    while device().running_batches > 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(admission.load().0, 0, "the slot once the batch ended");
    assert_eq!(
        h.invoke(&token(0), "feature-extract", body(1))
            .await
            .status(),
        200
    );
}

/// A tenant whose call has been cut into slices for over a second is still active: it was
/// forgotten after a second (its last arrival), so that a neighbour's call ran as if alone, in
/// long batches, while the first tenant's work waited behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_work_queued_stays_active_however_long_its_call() {
    let _one = serial().lock().await;
    let p = Packages::open();
    // Not adapting: batches of at most 16, long ones (2 s) for a tenant alone, 5 ms slices
    // of one tenant's work while others are active.
    let d = p.fixed_device(
        true,
        Duration::ZERO,
        16,
        (Duration::from_millis(5), Duration::from_secs(2)),
    );
    let deadline = Deadline::new(LONG);
    let (long, other): (Arc<str>, Arc<str>) = (Arc::from("long"), Arc::from("other"));
    let long_pin = d
        .acquire("resnet18", &long, &deadline, None)
        .await
        .expect("resnet18");
    let other_pin = d
        .acquire("resnet18", &other, &deadline, None)
        .await
        .expect("resnet18");
    // 256 samples through resnet18's first blocks: batches of 16, seconds in all here.
    let mut call = common::device_job(&long, long_pin, 256, LONG);
    call.range = 0..5;
    let d2 = Arc::clone(&d);
    let long_call = tokio::spawn(async move { d2.run(call).await });
    while d.memory().running_batches == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // 16 samples of another segment, over a second after the long call came.
    let ran = d
        .run(common::device_job(&other, other_pin, 16, LONG))
        .await
        .expect("the other call");
    assert!(
        !long_call.is_finished(),
        "the long call ended first: the test needs a longer one"
    );
    assert!(
        ran.batches > 1,
        "the other tenant's 16 samples ran in {} batch(es), as if alone",
        ran.batches
    );
    // Stopped, and its running batch waited for: libtorch still running in a worker when the
    // test process exits can crash it.
    long_call.abort();
    let _ = long_call.await;
    let until = std::time::Instant::now() + LONG;
    while d.memory().running_batches > 0 {
        assert!(std::time::Instant::now() < until, "the batch never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A tenant's load that waits for the room a neighbour's batches hold gets it when they end.
/// In the host the dispatcher starts the neighbour's next batch within microseconds of one
/// ending, on a thread of its own, while the load's wait, woken then, has to be scheduled on
/// an invocation worker (busy with guests, up to a tick) to take the room: it could lose
/// every such race, and be answered `device_busy` at its deadline for as long as the
/// neighbour kept calls coming. Here the race is run in the dispatcher's favour every time: the
/// next batch reserves on this thread the moment the last one's memory is given back, while
/// the runtime's workers are busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_waiting_for_the_room_of_a_neighbours_batches_gets_it() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let small = "efficientnet_lite0";
    // The small model's memory model, measured on its first load, so that the load below only
    // loads.
    p.measured([small]).await;
    let room = 2 * p.weights(small);
    let budget = Budget::new(room, RESIDENT_FOR);
    let heavy = "heavy";
    let light: Arc<str> = Arc::from("light");
    let batch = budget
        .reserve_batch(room, heavy)
        .expect("a batch of all of it");
    let (b, models, t) = (
        Arc::clone(&budget),
        Arc::clone(&p.models),
        Arc::clone(&light),
    );
    let load = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(20));
        b.acquire(&models, small, &t, &deadline, None).await
    });
    // Time for the load to find no room and wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!load.is_finished(), "{:?}", load.await);
    // Both of the runtime's workers busy (guests at work), the batch ends and the next one
    // reserves at once: what the load needs is left to it.
    let busy = Arc::new(std::sync::Barrier::new(3));
    let guests: Vec<_> = (0..2)
        .map(|_| {
            let busy = Arc::clone(&busy);
            tokio::spawn(async move {
                busy.wait();
                std::thread::sleep(Duration::from_millis(100));
            })
        })
        .collect();
    busy.wait();
    drop(batch);
    let again = budget.reserve_batch(room, heavy);
    // Nor a batch of the waiting tenant's own (its batches took the room its load waited for
    // while everyone else's were cut).
    let own = budget.reserve_batch(room, &light);
    for g in guests {
        g.await.expect("guest");
    }
    assert!(
        again.is_none(),
        "the next batch took the room the waiting load needs"
    );
    assert!(own.is_none(), "the waiting tenant's own batch took it");
    // The load ends in its own time (a libtorch load, on a worker just freed); until then its
    // wait holds its room, so the rest is asked for after it.
    let loaded = load.await.expect("join");
    assert!(loaded.is_ok(), "{loaded:?}");
    assert_eq!(budget.snapshot().waiting, 0, "the wait ended with the load");
    let next = budget
        .reserve_batch(room - p.weights(small), heavy)
        .expect("the rest, beside the loaded model");
    drop(next);
}

/// Of two waits for the room running batches hold, the older has it when they end: each left
/// the other's need free, so that where the room fits one and not both, neither was met
/// until its deadline (a second tenant's wait could fail a first's load on purpose).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_waits_for_the_batches_room_the_older_has_it() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let small = "efficientnet_lite0";
    p.measured([small]).await;
    let w = p.weights(small);
    let room = 2 * w;
    let budget = Budget::new(room, RESIDENT_FOR);
    let batch = budget.reserve_batch(room, "heavy").expect("all of it");
    let (b, models) = (Arc::clone(&budget), Arc::clone(&p.models));
    let first = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(5));
        b.acquire(&models, small, &Arc::from("first"), &deadline, None)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A second wait, for more than is left beside the first's need.
    let b = Arc::clone(&budget);
    let second = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(5));
        b.reserve(w + w / 2, "second", &deadline, "a reservation")
            .await
            .map(drop)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(budget.snapshot().waiting, 2);
    drop(batch);
    let loaded = first.await.expect("join");
    assert!(loaded.is_ok(), "{loaded:?}");
    // The second's need does not fit beside the loaded model: it waits to its deadline.
    let reserved = second.await.expect("join");
    assert!(reserved.is_err(), "{reserved:?}");
    assert_eq!(budget.snapshot().waiting, 0);
}

/// A wait for the room running batches hold holds nothing back while they could no longer give
/// it that room (here an idle model it counted on is pinned by another tenant): it held
/// everyone's work back until its deadline; then until it was woken, and each pin woke every
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_batches_can_no_longer_meet_holds_nothing_back() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let (big, small) = ("resnet18", "efficientnet_lite0");
    let [big_memory, _] = p.measured([big, small]).await;
    let (wb, ws) = (p.weights(big), p.weights(small));
    // The big model's weights and one sample's run: what its load is let wait for (the budget
    // refuses a model that could never run one sample at once).
    let one = big_memory.one_sample_peak();
    let total = wb + one;
    // The batch and the small model make the total; without the small one, the batch's room
    // is less than the big model's weights.
    assert!(
        one < ws && ws < wb,
        "{one}, {ws}, {wb}: the test proves nothing"
    );
    // Room for the big model: the small one, idle and nobody's (no residency), and a batch.
    let budget = Budget::new(total, Duration::ZERO);
    let deadline = Deadline::new(LONG);
    let idle = budget
        .acquire(&p.models, small, &Arc::from("old"), &deadline, None)
        .await
        .expect(small);
    drop(idle);
    let batch = budget.reserve_batch(total - ws, "heavy").expect("the rest");
    let (b, models) = (Arc::clone(&budget), Arc::clone(&p.models));
    let waiting = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(3));
        b.acquire(&models, big, &Arc::from("light"), &deadline, None)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(budget.snapshot().waiting, 1, "the big model's load waits");
    assert_eq!(budget.snapshot().held_back, wb, "its need is held back");
    // Another tenant pins the small model, again and again: while it is pinned, the batch
    // ending would not give the load room, and its need is held back from nobody; nobody is
    // woken for it (each pin woke every waiter of the host, and its drop again).
    let wakes = budget.snapshot().wakes;
    for _ in 0..100 {
        let pin = budget
            .acquire(&p.models, small, &Arc::from("other"), &deadline, None)
            .await
            .expect(small);
        assert_eq!(budget.snapshot().held_back, 0, "held back beside the pin");
        drop(pin);
    }
    assert!(
        budget.snapshot().wakes - wakes <= 2,
        "{} wakes for 100 pins",
        budget.snapshot().wakes - wakes
    );
    let pinned = budget
        .acquire(&p.models, small, &Arc::from("other"), &deadline, None)
        .await
        .expect(small);
    assert_eq!(budget.snapshot().held_back, 0, "held back beside the pin");
    drop(batch);
    assert!(
        budget.reserve_batch(total - ws, "heavy").is_some(),
        "a wait that could no longer be met held the room back"
    );
    let loaded = waiting.await.expect("join");
    assert!(loaded.is_err(), "{loaded:?}");
    drop(pinned);
}

/// Bytes beside a test's budget: room for other tenants' small reservations.
const SLACK: u64 = 4096;

/// A budget of `model`'s room and `SLACK`, and a neighbour's batch holding that room (the
/// model's weights and one sample's run: the budget refuses a model that could never run one
/// sample); with the model's weights and the budget's total.
async fn a_batch_holding_the_room_of(
    p: &Packages,
    model: &str,
) -> (
    Arc<Budget>,
    u64,
    u64,
    hapi_host::device::budget::Reservation,
) {
    let [memory] = p.measured([model]).await;
    let w = p.weights(model);
    let total = w + memory.one_sample_peak() + SLACK;
    let budget = Budget::new(total, RESIDENT_FOR);
    let batch = budget
        .reserve_batch(total - SLACK, "heavy")
        .expect("the whole budget");
    (budget, w, total, batch)
}

/// Runs `work` on a runtime of its own, whose one thread the test keeps busy for `busy` once
/// told to (the sender): a waiter that cannot look. Joined, the thread gives `work`'s answer.
fn on_a_runtime_kept_busy<T: Send + 'static>(
    busy: Duration,
    work: impl Future<Output = T> + Send + 'static,
) -> (tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<T>) {
    let (told, tell) = tokio::sync::oneshot::channel::<()>();
    let (block, thread) = on_a_runtime_blocked_at_will(work);
    // Once told, the one block; then the sender goes, and the thread ends with `work`.
    tokio::spawn(async move {
        if tell.await.is_ok() {
            let _ = block.send(busy);
        }
    });
    (told, thread)
}

/// A wait holds its need back from other work only while its waiter takes the room within
/// `LOOK_GRACE` of its being there: a waiter that did not (its tenant kept its other host
/// calls waking and spinning ahead of it in its queue) kept the room the batches gave back
/// from everyone until it looked; and with the grace counted from the last wake, others' wakes
/// every 10 ms kept it from running out. Once it looks, the room is held back for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_waiter_does_not_look_holds_nothing_back_for_long() {
    use hapi_host::device::budget::LOOK_GRACE;
    let _one = serial().lock().await;
    let p = Packages::open();
    let model = "resnet18";
    let (budget, _, total, batch) = a_batch_holding_the_room_of(&p, model).await;
    // The waiter on a runtime of its own, whose one thread the test keeps busy for a second.
    let (b, models) = (Arc::clone(&budget), Arc::clone(&p.models));
    let (block, waiter) = on_a_runtime_kept_busy(Duration::from_secs(1), async move {
        let deadline = Deadline::new(Duration::from_secs(6));
        b.acquire(&models, model, &Arc::from("light"), &deadline, None)
            .await
            .map(drop)
    });
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while budget.snapshot().waiting == 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(budget.snapshot().waiting, 1, "the load waits for the batch");
    block.send(()).expect("the waiter's runtime");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Another tenant's small reservations wake everyone every 10 ms once they fit.
    let quiet = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (b, q) = (Arc::clone(&budget), Arc::clone(&quiet));
    let noise = tokio::spawn(async move {
        while !q.load(std::sync::atomic::Ordering::Relaxed) {
            drop(b.reserve_now(1, "noise"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    // The batch ends while the waiter cannot look: its need is held back for `LOOK_GRACE`
    // from then, however often others wake the waiters, then the room is anyone's.
    drop(batch);
    let ended = std::time::Instant::now();
    let again = loop {
        if let Some(r) = budget.reserve_batch(total - SLACK, "heavy") {
            break r;
        }
        assert!(
            ended.elapsed() < Duration::from_millis(800),
            "the room stayed held back for a waiter that did not look"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let took = ended.elapsed();
    assert!(took >= LOOK_GRACE / 2, "not held back at all: {took:?}");
    quiet.store(true, std::sync::atomic::Ordering::Relaxed);
    noise.await.expect("noise");
    // Its thread free again, the waiter looks (the batch's end woke it) and its wait stands:
    // when this batch ends, the room is the wait's.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(budget.snapshot().waiting, 1, "the wait stands");
    drop(again);
    assert!(
        budget.reserve_batch(total - SLACK, "heavy").is_none(),
        "the room is held back for the wait"
    );
    let loaded = tokio::task::spawn_blocking(move || waiter.join().expect("waiter"))
        .await
        .expect("join");
    assert!(loaded.is_ok(), "{loaded:?}");
}

/// Waits for the running batches' room behind one that holds nothing back (its waiter quiet
/// past `LOOK_GRACE`) are held for in turn: only the oldest wait's need was held back, so while
/// it held nothing, nobody's was, and a neighbour's batch took the room a later wait waited
/// for. A claim refused because its room is left for an older wait is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_behind_one_that_holds_nothing_is_held_for_and_a_claim_is_told_why() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let budget = Budget::new(1000, RESIDENT_FOR);
    let batch = budget.reserve_batch(600, "heavy").expect("room");
    // The oldest wait, on a runtime whose one thread the test keeps busy for a second.
    let b = Arc::clone(&budget);
    let (block, first) = on_a_runtime_kept_busy(Duration::from_secs(1), async move {
        let deadline = Deadline::new(Duration::from_secs(6));
        b.reserve(800, "first", &deadline, "a call").await.map(drop)
    });
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while budget.snapshot().waiting == 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        budget.snapshot().held_back,
        800,
        "the first wait's need is held back"
    );
    // 300 bytes are free but left for the first wait: the claim is told that, not that other
    // tenants' models hold the device's memory.
    let deadline = Deadline::new(Duration::from_millis(200));
    let told = budget
        .reserve(300, "told", &deadline, "a call")
        .await
        .map(drop);
    assert!(
        matches!(&told, Err(hapi_host::device::DeviceError::Busy(m)) if m.contains("left free for another call")),
        "{told:?}"
    );
    let b = Arc::clone(&budget);
    let second = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(5));
        b.reserve(300, "second", &deadline, "a call").await
    });
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while budget.snapshot().waiting < 2 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        budget.snapshot().waiting,
        2,
        "the second wait is registered"
    );
    block.send(()).expect("the first waiter's runtime");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The batch ends while the first waiter cannot look; a neighbour tries for 750 bytes all
    // the while, which would leave the second wait too little.
    drop(batch);
    let ended = std::time::Instant::now();
    let mut taken = None;
    while taken.is_none() && ended.elapsed() < Duration::from_millis(600) {
        taken = budget.reserve_batch(750, "heavy");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        taken.is_none(),
        "the neighbour took the room the second wait waited for"
    );
    // The second wait has its room (kept until the first has looked again).
    let got = second.await.expect("join");
    assert!(got.is_ok(), "{got:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    drop(got);
    let first = tokio::task::spawn_blocking(move || first.join().expect("first"))
        .await
        .expect("join");
    assert!(first.is_ok(), "{first:?}");
}

/// Two waits whose waiters were slow to look do not hold the room for each other: the first's
/// grace ran out, the second held the room back with no grace of its own running (none began
/// without a wake), and the first, looking, was refused for the second's hold and held the
/// room back again itself, each waiting for the other until a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_waits_whose_waiters_were_slow_do_not_hold_the_room_for_each_other() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let budget = Budget::new(1000, RESIDENT_FOR);
    let batch = budget.reserve_batch(600, "heavy").expect("room");
    // A wait of `tenant` on a runtime whose one thread the test keeps busy for `busy` once
    // told to; each gives its room back once it has it, so that the other may have it then
    // (the first, lapsed, waits behind the second).
    let slow = |tenant: &'static str, busy: Duration| {
        let b = Arc::clone(&budget);
        on_a_runtime_kept_busy(busy, async move {
            let deadline = Deadline::new(Duration::from_secs(3));
            b.reserve(800, tenant, &deadline, "a call").await.map(drop)
        })
    };
    let registered = |n: u64| {
        let budget = Arc::clone(&budget);
        async move {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while budget.snapshot().waiting < n && std::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert_eq!(budget.snapshot().waiting, n, "{n} waits registered");
        }
    };
    let (block1, first) = slow("first", Duration::from_millis(300));
    registered(1).await;
    block1.send(()).expect("the first waiter's runtime");
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The batch ends while the first waiter cannot look; the second registers meanwhile.
    drop(batch);
    let ended = std::time::Instant::now();
    let (block2, second) = slow("second", Duration::from_millis(300));
    registered(2).await;
    block2.send(()).expect("the second waiter's runtime");
    // Each looks again after some 300 ms: one of them has the room then.
    let first = tokio::task::spawn_blocking(move || first.join().expect("first"))
        .await
        .expect("join");
    let took = ended.elapsed();
    let second = tokio::task::spawn_blocking(move || second.join().expect("second"))
        .await
        .expect("join");
    assert!(
        first.is_ok() || second.is_ok(),
        "neither wait had the room: {first:?}, {second:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "the first wait took {took:?}"
    );
}

/// Time alone can make a wait for the batches' room unmeetable: a use growing stale grows
/// the other owners' shares, and a model the wait counted on as held beyond its owner's share
/// is within it then. Its need is held back from nobody from then, and it looks again when
/// the use grows stale: it held its need back from everyone until something else woke it, the
/// batches' ending at the latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_time_makes_unmeetable_holds_nothing_back() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let (wanted, big, small) = ("resnet50", "resnet18", "efficientnet_lite0");
    let (wl, wb, ws) = (p.weights(wanted), p.weights(big), p.weights(small));
    // A batch that, with the big model, makes the wanted model's room; the budget is the two
    // models and the batch.
    let batch_bytes = wl - wb;
    let total = wb + ws + batch_bytes;
    // Among three owners (the waiter, `x` with the big model, `y` with the small one) the big
    // model is beyond its owner's share and the small one within; among two, the big one is
    // within; and the small one with the batch is not the wanted model's room.
    assert!(
        3 * wb > total && 2 * wb <= total && 3 * ws <= total && ws < wb && wl > wb + ws,
        "{wl}, {wb}, {ws}: the test proves nothing"
    );
    let resident_for = Duration::from_secs(2);
    let budget = Budget::new(total, resident_for);
    drop(p.pin(&budget, small, "y", LONG).await.expect(small));
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(p.pin(&budget, big, "x", LONG).await.expect(big));
    // `x`'s use grows stale a second after `y`'s.
    let x_stale = std::time::Instant::now() + resident_for;
    let batch = budget
        .reserve_batch(batch_bytes, "heavy")
        .expect("the rest");
    let (b, models) = (Arc::clone(&budget), Arc::clone(&p.models));
    let waiting = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(4));
        b.acquire(&models, wanted, &Arc::from("light"), &deadline, None)
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        budget.snapshot().waiting,
        1,
        "the wanted model's load waits"
    );
    assert_eq!(budget.snapshot().held_back, wl, "its need is held back");
    // `y`'s use grows stale about 0.7 s from now: the big model is within `x`'s share then.
    let until = x_stale - Duration::from_millis(150);
    while budget.snapshot().held_back > 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        budget.snapshot().held_back,
        0,
        "a wait the batch's ending could no longer meet held its need back"
    );
    // It looks again then (at the use growing stale), and ends.
    let until = x_stale - Duration::from_millis(100);
    while budget.snapshot().waiting > 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        budget.snapshot().waiting,
        0,
        "the wait looked again when time changed it"
    );
    let loaded = waiting.await.expect("join");
    assert!(loaded.is_err(), "{loaded:?}");
    drop(batch);
}

/// A wait the running batches' ending would meet is held for even where a neighbour's model,
/// kept for it within its share, holds room too: such a wait was not registered (its room
/// counted as held by other tenants' models), so it held nothing back, and each batch that
/// ended gave its room to the next before the waiter could look, to its deadline, whenever a
/// neighbour kept a model in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_batches_would_meet_is_held_for_beside_a_neighbours_model() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let small = "efficientnet_lite0";
    p.measured([small]).await;
    let ws = p.weights(small);
    // The neighbour's model, idle and kept for it within its half; a batch of the other half.
    let budget = Budget::new(2 * ws, RESIDENT_FOR);
    p.use_model(&budget, small, "x").await;
    let batch = budget.reserve_batch(ws, "heavy").expect("the other half");
    let b = Arc::clone(&budget);
    // The reservation is kept until the test ends (given back at once, the room would be
    // free again for the next batch).
    let waiting = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(5));
        b.reserve(ws, "light", &deadline, "a test's reservation")
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(budget.snapshot().waiting, 1, "the reservation waits");
    assert_eq!(budget.snapshot().held_back, ws, "its need is held back");
    // The batch ends, and the next one tries at once, before the waiter can look (or after
    // it has taken the room).
    drop(batch);
    let next = budget.reserve_batch(ws, "heavy");
    assert!(
        next.is_none(),
        "the next batch took the room the waiting reservation needs"
    );
    let reserved = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the reservation ends")
        .expect("join");
    assert!(reserved.is_ok(), "{reserved:?}");
    assert_eq!(budget.snapshot().waiting, 0);
    drop(reserved);
}

/// With no residency window (`resident_for = 0`), a registered waiter waits for a change, not
/// for a clock: it looked every millisecond (the next use to grow stale was taken as 1 ms away
/// when none would), each look a refusal, so that every neighbour's pin held longer than that
/// woke every waiter when dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_residency_a_waiter_does_not_poll_and_pins_wake_nobody() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let small = "efficientnet_lite0";
    let [memory] = p.measured([small]).await;
    let ws = p.weights(small);
    let rest = memory.one_sample_peak() + SLACK;
    let budget = Budget::new(ws + rest, Duration::ZERO);
    // The model pinned the whole time by `a`; a batch of the rest; a reservation of half of
    // it, which the batch's ending meets.
    let held = p.pin(&budget, small, "a", LONG).await.expect(small);
    let batch = budget.reserve_batch(rest, "heavy").expect("the rest");
    let b = Arc::clone(&budget);
    let waiting = tokio::spawn(async move {
        let deadline = Deadline::new(Duration::from_secs(10));
        b.reserve(rest / 2, "light", &deadline, "a test's reservation")
            .await
            .map(drop)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(budget.snapshot().waiting, 1, "the reservation waits");
    let before = budget.snapshot().wakes;
    for _ in 0..20 {
        let pin = p.pin(&budget, small, "other", LONG).await.expect(small);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(pin);
    }
    let woken = budget.snapshot().wakes - before;
    assert!(woken <= 2, "{woken} wakes for 20 pins held 20 ms each");
    drop(batch);
    let reserved = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the reservation ends")
        .expect("join");
    assert!(reserved.is_ok(), "{reserved:?}");
    drop(held);
}

/// A wait that ends wakes the waiters only if it held room back: every registered wait that
/// ended (met, aborted at its deadline, or dropped) woke every waiter, each of whom looked
/// again, so that a tenant's waits ending in turn made work for every waiter of the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_held_nothing_back_wakes_nobody_when_it_ends() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let budget = Budget::new(1000, RESIDENT_FOR);
    let batch = budget.reserve_batch(600, "heavy").expect("room");
    // Twenty waits of 500 bytes, each met by the batch's ending; the oldest holds its need.
    let mut waits = Vec::new();
    for i in 0..20 {
        let b = Arc::clone(&budget);
        waits.push(tokio::spawn(async move {
            let deadline = Deadline::new(LONG);
            b.reserve(500, &format!("t{i}"), &deadline, "a test's reservation")
                .await
                .map(drop)
        }));
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while budget.snapshot().waiting <= i && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(budget.snapshot().waiting, 20, "twenty waits registered");
    assert_eq!(budget.snapshot().held_back, 500, "the oldest's need held");
    let before = budget.snapshot().wakes;
    // The newest ends (its caller gone): it held nothing back.
    let newest = waits.pop().expect("twenty");
    newest.abort();
    let _ = newest.await;
    assert_eq!(budget.snapshot().waiting, 19);
    assert_eq!(
        budget.snapshot().wakes - before,
        0,
        "a wait that held nothing back woke the waiters when it ended"
    );
    // The oldest ends: it held room back, the next holds it now, and the waiters are woken.
    let oldest = waits.remove(0);
    oldest.abort();
    let _ = oldest.await;
    assert_eq!(budget.snapshot().waiting, 18);
    assert_eq!(
        budget.snapshot().held_back,
        500,
        "the next oldest's need held"
    );
    assert!(
        budget.snapshot().wakes - before >= 1,
        "the holder's end woke nobody"
    );
    for w in waits {
        w.abort();
        let _ = w.await;
    }
    drop(batch);
}

/// Runs `work` on a runtime of its own, whose one thread the test keeps busy for each duration
/// it sends (a waiter that cannot look, again and again); joined once the sender is dropped,
/// the thread gives `work`'s answer.
fn on_a_runtime_blocked_at_will<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> (
    tokio::sync::mpsc::UnboundedSender<Duration>,
    std::thread::JoinHandle<T>,
) {
    let (block, mut blocks) = tokio::sync::mpsc::unbounded_channel::<Duration>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let work = tokio::spawn(work);
            while let Some(busy) = blocks.recv().await {
                std::thread::sleep(busy);
            }
            work.await.expect("join")
        })
    });
    (block, thread)
}

/// A wait whose waiter is late at every look is held for `MAX_LAPSES` times at most: each time
/// its grace ran out, its waiter's next look held the room back again, so that the device
/// drained of others' work for its need and sat idle for a grace at every look, to the call's
/// deadline. A waiter late once is held for again (behind the waits registered meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_waiter_is_late_at_every_look_is_held_for_a_bounded_number_of_times() {
    use hapi_host::device::budget::{LOOK_GRACE, MAX_LAPSES};
    let _one = serial().lock().await;
    let p = Packages::open();
    let model = "resnet18";
    let (budget, w, total, mut batch) = a_batch_holding_the_room_of(&p, model).await;
    let (b, models) = (Arc::clone(&budget), Arc::clone(&p.models));
    let (block, waiter) = on_a_runtime_blocked_at_will(async move {
        let deadline = Deadline::new(Duration::from_secs(20));
        b.acquire(&models, model, &Arc::from("light"), &deadline, None)
            .await
            .map(drop)
    });
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while budget.snapshot().waiting == 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(budget.snapshot().waiting, 1, "the load waits for the batch");
    assert_eq!(budget.snapshot().held_back, w, "its need is held back");
    // Each round: the waiter's thread busy for 400 ms, the batch ends meanwhile, and a
    // neighbour's next batch tries every 2 ms until it has the room; then the waiter looks.
    let mut held_for = Vec::new();
    let mut held_after_look = Vec::new();
    for _ in 0..=MAX_LAPSES {
        block
            .send(Duration::from_millis(400))
            .expect("the waiter's runtime");
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(batch);
        let ended = std::time::Instant::now();
        batch = loop {
            if let Some(r) = budget.reserve_batch(total - SLACK, "heavy") {
                break r;
            }
            assert!(
                ended.elapsed() < Duration::from_millis(350),
                "the room stayed held back for a waiter that did not look"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        held_for.push(ended.elapsed());
        // Its thread free again, the waiter looks (the batch's end woke it) and is refused.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(budget.snapshot().waiting, 1, "the wait stands");
        held_after_look.push(budget.snapshot().held_back);
    }
    println!("held for {held_for:?}; held back after each look {held_after_look:?}");
    let lapses = usize::try_from(MAX_LAPSES).expect("small");
    // Held for at each batch's end until its last lapse, then not at all.
    for (i, took) in held_for.iter().enumerate() {
        if i < lapses {
            assert!(*took >= LOOK_GRACE / 2, "round {i}: not held for: {took:?}");
        } else {
            assert!(
                *took < LOOK_GRACE / 2,
                "round {i}: held for past its lapses: {took:?}"
            );
        }
    }
    let mut want = vec![w; lapses - 1];
    want.extend([0, 0]);
    assert_eq!(
        held_after_look, want,
        "held back after each of the waiter's late looks"
    );
    // The room free, the waiter (on time now) takes it.
    drop(batch);
    drop(block);
    let loaded = tokio::task::spawn_blocking(move || waiter.join().expect("waiter"))
        .await
        .expect("join");
    assert!(loaded.is_ok(), "{loaded:?}");
}

/// A wait that comes to hold the room back without any wake (the wait before it made
/// unmeetable by a pin of its tenant's own model, which wakes nobody) is woken when its grace
/// begins, whoever begins it: begun at the dispatcher's look, which woke nobody, the grace ran
/// out while its waiter slept on, and the wait lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_comes_to_hold_the_room_unwoken_is_woken_when_its_grace_begins() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let p = Packages::open();
    let small = "efficientnet_lite0";
    p.measured([small]).await;
    let ws = p.weights(small);
    // `a`'s model, idle and within its share; a batch of `ws`; `ws` free.
    let budget = Budget::new(3 * ws, RESIDENT_FOR);
    p.use_model(&budget, small, "a").await;
    let batch = budget.reserve_batch(ws, "heavy").expect("a third");
    let reserve = |need: u64, tenant: &'static str| {
        let b = Arc::clone(&budget);
        tokio::spawn(async move {
            let deadline = Deadline::new(Duration::from_secs(10));
            b.reserve(need, tenant, &deadline, "a test's reservation")
                .await
        })
    };
    let registered = |n: u64| {
        let budget = Arc::clone(&budget);
        async move {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while budget.snapshot().waiting < n && std::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert_eq!(budget.snapshot().waiting, n, "{n} waits registered");
        }
    };
    // `a`'s wait: its own model and the batch's room meet it; `c`'s, behind it: the free room
    // meets it, but it is left for `a`'s.
    let first = reserve(ws * 5 / 2, "a");
    registered(1).await;
    let second = reserve(ws, "c");
    registered(2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(budget.snapshot().held_back, ws * 5 / 2, "`a`'s need held");
    assert!(
        !second.is_finished(),
        "`c`'s wait took the room left for `a`'s"
    );
    // `a` pins its model: its wait can no longer be met, and `c`'s holds the room now, free
    // for it; nobody is woken. The dispatcher looks at the room.
    let pin = p.pin(&budget, small, "a", LONG).await.expect(small);
    assert_eq!(budget.snapshot().held_back, ws, "`c`'s need held");
    let _ = budget.room_for(1, "heavy");
    let got = tokio::time::timeout(Duration::from_secs(2), second)
        .await
        .expect("`c`'s waiter was not woken when its grace began")
        .expect("join");
    assert!(got.is_ok(), "{got:?}");
    drop(got);
    drop(pin);
    first.abort();
    let _ = first.await;
    drop(batch);
}

/// A wait that takes the room held for it wakes the waiters no more than its end does (here
/// once: the room left still meets its need, so it held room back to its end): its waiter's
/// own attempt, finding its wait the holder with its room free, began that wait's grace again,
/// and the lock's release woke every waiter of the host for a grace nobody needed, once per
/// wait held for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_takes_the_room_held_for_it_wakes_the_waiters_once() {
    use hapi_host::device::budget::Budget;
    let _one = serial().lock().await;
    let budget = Budget::new(1000, RESIDENT_FOR);
    let batch = budget.reserve_batch(600, "heavy").expect("room");
    let b = Arc::clone(&budget);
    let wait = tokio::spawn(async move {
        let deadline = Deadline::new(LONG);
        b.reserve(500, "light", &deadline, "a test's reservation")
            .await
    });
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while budget.snapshot().waiting < 1 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(budget.snapshot().held_back, 500, "the wait's need held");
    let before = budget.snapshot().wakes;
    // The batch ends (one wake); the waiter takes the room and its wait ends (one more).
    drop(batch);
    let got = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the waiter did not take the room")
        .expect("join");
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(budget.snapshot().waiting, 0);
    assert_eq!(
        budget.snapshot().wakes - before,
        2,
        "wakes from the batch's end to the wait's end: the batch's end, the wait's end, and no \
         other"
    );
    drop(got);
}

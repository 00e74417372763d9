//! `cargo xtask bench pooling`: the device shared by many tenants.
//!
//! 1. Throughput: 1, 2, 4, 8 and 16 tenants, each a closed loop of small requests (1 to 8
//!    images, seeded), through HTTP and the real guest, with pooling off (every call runs on its
//!    own thread) and on (calls merged into device batches, run by the device workers);
//!    aggregate samples/s, p50 and p99 request latency, the mean device batch, and the requests'
//!    median decode, queue and compute times (the host's Server-Timing). Every point
//!    runs in a fresh `hapi-host` process (a shared state directory keeps the memory model, so
//!    only the model's load is repeated), three times (`--reps`), modes interleaved; the table
//!    gives the median and the spread (min-max). Per segment, from the host's memory model: the
//!    batching ceiling (per-sample time at batch 1 / at the fastest batch) and the gain
//!    available to pooling (per-sample time at the requests' mean size / at the fastest batch).
//! 2. Fairness: a light tenant (requests of 4 images, one at a time) alone, then next to a
//!    tenant flooding the host (4 requests of 8 images outstanding at all times); the light
//!    tenant's median latency against its solo median. Fresh process, three repetitions.
//! 3. Burst: 200 requests of 8 images at once from one tenant (4 running, 8 waiting): how many
//!    are answered 429, and how far the process's resident set grows (in this process).
//!
//! Storage batch adaptation is on throughout (the default). Prints tables and writes JSON and
//! an SVG plot (`--out DIR`, default target/bench). `--seconds S` per measurement (default 5),
//! `--reps N` (default 3), `--models a:split,...` (default alexnet:17, efficientnet_lite0:7,
//! resnet50:21), `--tenants 1,2,...` the throughput points' tenant counts (default 1,2,4,8,16),
//! `--host "key = value; ..."` extra `[host]` settings for every host process,
//! `--device D` the host's device (`cpu`, the default; `cuda`, `cuda:N`).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{
    SAMPLES, TestHost, invoke_at, sample_key, start_tenants, tenant_token, tenants_policy, warm_at,
    write_store,
};
use hapi_host::memory::rss;
use hapi_tests::HostProcess;
use hapi_wire::profile::{DeviceMemory, ModelProfile};
use serde_json::{Value, json};
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The tenant counts of the throughput points, unless `--tenants` names others.
const TENANTS: [usize; 5] = [1, 2, 4, 8, 16];

struct Args {
    /// `--fairness-only`: skip the throughput sweep and the burst.
    fairness_only: bool,
    seconds: f64,
    reps: usize,
    /// `--host "key = value; ..."`: extra `[host]` settings for every host (e.g. `slice = "200ms"`).
    host: String,
    models: Vec<(String, usize)>,
    /// `--tenants 1,2`: the throughput points' tenant counts (default [`TENANTS`]).
    tenants: Vec<usize>,
    out: PathBuf,
}

/// The hosts' device (`--device`).
static DEVICE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `policy` (the tests' policy, on the CPU) on the bench's device.
fn on_device(policy: String) -> String {
    match DEVICE.get().map(String::as_str) {
        Some(d) if d != "cpu" => policy.replacen("device = \"cpu\"", &format!("device = {d:?}"), 1),
        _ => policy,
    }
}

fn args() -> Args {
    let argv = common::BenchArgs::from_env();
    let _ = DEVICE.set(argv.value("--device").unwrap_or_else(|| "cpu".into()));
    let models = argv
        .value("--models")
        .unwrap_or_else(|| "alexnet:17,efficientnet_lite0:7,resnet50:21".into());
    Args {
        fairness_only: argv.has("--fairness-only"),
        seconds: argv
            .value("--seconds")
            .map_or(5.0, |s| s.parse().expect("--seconds")),
        reps: argv
            .value("--reps")
            .map_or(3, |s| s.parse().expect("--reps")),
        host: argv.value("--host").unwrap_or_default().replace(';', "\n"),
        models: models
            .split(',')
            .map(|m| {
                let (name, split) = m.split_once(':').expect("--models name:split,...");
                (name.to_string(), split.parse().expect("split"))
            })
            .collect(),
        tenants: argv.value("--tenants").map_or_else(
            || TENANTS.to_vec(),
            |v| {
                v.split(',')
                    .map(|n| n.trim().parse().expect("--tenants 1,2,..."))
                    .collect()
            },
        ),
        out: argv.out(),
    }
}

/// xorshift64*: the request sizes, reproducible per tenant.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn body(model: &str, split: usize, n: usize, salt: usize) -> Value {
    let keys: Vec<String> = (0..n)
        .map(|i| sample_key(SAMPLES[(salt + i) % SAMPLES.len()]))
        .collect();
    json!({"bucket": "datasets", "keys": keys, "model": model, "split": split})
}

/// Server-Timing stages (decode, queue, compute, ms) of successful requests, by tenant.
static STAGES: std::sync::Mutex<Vec<(usize, [f64; 3])>> = std::sync::Mutex::new(Vec::new());

fn stages(resp: &reqwest::Response) -> Option<[f64; 3]> {
    let header = resp.headers().get("server-timing")?.to_str().ok()?;
    let get = |name: &str| -> Option<f64> {
        header.split(',').find_map(|part| {
            part.trim()
                .strip_prefix(name)?
                .strip_prefix(";dur=")?
                .parse()
                .ok()
        })
    };
    Some([get("decode")?, get("queue")?, get("compute")?])
}

/// A host the bench talks to over HTTP.
struct Target {
    url: String,
    client: reqwest::Client,
}

impl Target {
    fn of(h: &TestHost) -> Self {
        Self {
            url: h.url.clone(),
            client: h.client.clone(),
        }
    }

    async fn invoke(&self, t: usize, body: Value) -> reqwest::Response {
        let token = tenant_token(t);
        invoke_at(&self.client, &self.url, &token, "feature-extract", body).await
    }

    async fn profile(&self, model: &str) -> ModelProfile {
        common::profile_at(&self.client, &self.url, model).await
    }

    /// The device's batches and their samples so far, from the operator's `/metrics` (a
    /// tenant's profile tells the budget only).
    async fn device(&self) -> DeviceMemory {
        let text = common::metrics_text(&self.client, &self.url, common::OPERATOR).await;
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} in /metrics"))
        };
        DeviceMemory {
            batches: value("hapi_device_batches_total") as u64,
            batch_samples: value("hapi_device_batch_samples_total") as u64,
            ..Default::default()
        }
    }

    /// The first request: loads the model (and, the first time, measures its memory); retried
    /// while the host answers that the model is still loading.
    async fn warm(&self, model: &str, split: usize) {
        let token = tenant_token(0);
        let body = body(model, split, 4, 0);
        let patience = Duration::from_secs(300);
        let resp = warm_at(
            &self.client,
            &self.url,
            &token,
            "feature-extract",
            body,
            patience,
        )
        .await;
        let status = resp.status().as_u16();
        assert_eq!(
            status,
            200,
            "warm-up: {}",
            resp.text().await.unwrap_or_default()
        );
    }
}

/// A fresh `hapi-host` process for one point: its policy written under `dir`, the store and
/// state directories shared by all points.
struct Fresh {
    _process: HostProcess,
    target: Target,
}

fn fresh(
    dir: &std::path::Path,
    name: &str,
    host: &str,
    tenants: usize,
    models: &[&str],
    tenant: impl Fn(usize) -> String,
) -> Fresh {
    let policy = on_device(tenants_policy(
        &dir.join("store"),
        &dir.join("state"),
        host,
        tenants,
        models,
        tenant,
    ));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, policy).expect("policy");
    let process = HostProcess::serve(
        &hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host")),
        &path,
        "127.0.0.1:0",
    );
    let target = Target {
        url: process.url.clone(),
        client: reqwest::Client::new(),
    };
    Fresh {
        _process: process,
        target,
    }
}

/// One request; its latency, or the status when it failed.
async fn request(h: &Target, t: usize, body: Value) -> Result<Duration, u16> {
    let started = Instant::now();
    let resp = h.invoke(t, body).await;
    let status = resp.status().as_u16();
    let ok = resp.status().is_success();
    let timing = stages(&resp);
    let _ = resp.bytes().await;
    if ok {
        if let Some(st) = timing {
            STAGES
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((t, st));
        }
        Ok(started.elapsed())
    } else {
        Err(status)
    }
}

/// Median decode, queue and compute ms of tenant `t`'s requests (every tenant's with `None`)
/// since the last call.
fn take_stages(t: Option<usize>) -> [f64; 3] {
    let mut all = STAGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mine: Vec<[f64; 3]> = all
        .iter()
        .filter(|(x, _)| t.is_none_or(|t| *x == t))
        .map(|(_, s)| *s)
        .collect();
    all.clear();
    let mut out = [f64::NAN; 3];
    for (k, o) in out.iter_mut().enumerate() {
        let mut v: Vec<f64> = mine.iter().map(|s| s[k]).collect();
        v.sort_by(f64::total_cmp);
        if !v.is_empty() {
            *o = v[(v.len() - 1) / 2];
        }
    }
    out
}

/// Tenant `t` sends requests of `sizes()` images, `outstanding` at a time, until `until`.
async fn closed_loop(
    h: &Target,
    t: usize,
    model: &str,
    split: usize,
    outstanding: usize,
    until: Instant,
    size: impl Fn(&mut Rng) -> usize + Copy,
) -> (Vec<Duration>, usize, usize) {
    let lanes = (0..outstanding).map(|lane| async move {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64) << 8 | lane as u64));
        let (mut lat, mut samples, mut failed) = (Vec::new(), 0usize, 0usize);
        let mut i = 0;
        while Instant::now() < until {
            let n = size(&mut rng);
            match request(h, t, body(model, split, n, t + i)).await {
                Ok(d) => {
                    lat.push(d);
                    samples += n;
                }
                Err(_) => failed += 1,
            }
            i += 1;
        }
        (lat, samples, failed)
    });
    let mut all = (Vec::new(), 0, 0);
    for (l, s, f) in futures::future::join_all(lanes).await {
        all.0.extend(l);
        all.1 += s;
        all.2 += f;
    }
    all
}

fn quantile(v: &mut [Duration], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
}

async fn start(model: &str, pool: bool, tenants: usize, tenant: fn(usize) -> String) -> TestHost {
    let host = format!("pool = {pool}\nmax_batch = 32");
    let models = [model];
    start_tenants(|store, state| {
        on_device(tenants_policy(
            store, state, &host, tenants, &models, tenant,
        ))
    })
    .await
}

/// Median and spread of `v`.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2], v[0], v[v.len() - 1])
}

/// Per-sample device seconds of a segment at `n` samples (fractional: interpolated between the
/// measured batch sizes, flat beyond them).
fn per_sample(times: &[(i64, f64)], n: f64) -> f64 {
    let Some(&(b0, t0)) = times.first() else {
        return f64::NAN;
    };
    if n <= b0 as f64 {
        return t0;
    }
    for w in times.windows(2) {
        let ((b0, t0), (b1, t1)) = (w[0], w[1]);
        if n <= b1 as f64 {
            return t0 + (t1 - t0) * (n - b0 as f64) / (b1 - b0).max(1) as f64;
        }
    }
    times[times.len() - 1].1
}

/// One throughput point: samples/s, p50 ms, p99 ms, mean batch, failed requests, and the
/// median decode, queue and compute ms of its requests (the host's Server-Timing).
type Point = (f64, f64, f64, f64, usize, [f64; 3]);

/// One throughput point in a fresh process.
async fn point(
    dir: &std::path::Path,
    extra: &str,
    model: &str,
    split: usize,
    pool: bool,
    n: usize,
    window: Duration,
) -> Point {
    let host = fresh(
        dir,
        &format!("{model}-{pool}-{n}"),
        &format!("pool = {pool}\nmax_batch = 32\n{extra}"),
        n,
        &[model],
        |_| "concurrency = 2".into(),
    );
    let h = &host.target;
    h.warm(model, split).await;
    let before = h.device().await;
    take_stages(None);
    let started = Instant::now();
    let until = started + window;
    let runs = (0..n).map(|t| {
        closed_loop(h, t, model, split, 1, until, |r| {
            1 + (r.next() % 8) as usize
        })
    });
    let results = futures::future::join_all(runs).await;
    let elapsed = started.elapsed().as_secs_f64();
    let after = h.device().await;
    let mut lat: Vec<Duration> = results.iter().flat_map(|r| r.0.clone()).collect();
    let samples: usize = results.iter().map(|r| r.1).sum();
    let failed: usize = results.iter().map(|r| r.2).sum();
    let batches = after.batches - before.batches;
    let mean_batch = (after.batch_samples - before.batch_samples) as f64 / batches.max(1) as f64;
    let (p50, p99) = (quantile(&mut lat, 0.5), quantile(&mut lat, 0.99));
    let stages = take_stages(None);
    (
        samples as f64 / elapsed,
        p50,
        p99,
        mean_batch,
        failed,
        stages,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let window = Duration::from_secs_f64(args.seconds);
    let device = DEVICE.get().cloned().unwrap_or_default();
    let mut report = json!({"seconds": args.seconds, "reps": args.reps, "device": device,
        "throughput": [], "segments": [], "fairness": [], "burst": {}});
    println!(
        "pooling benchmark on {device}: {} s per point, {} repetitions, a fresh host process per point, requests of 1-8 images",
        args.seconds, args.reps
    );
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(&dir.path().join("store"));

    // 1. Throughput.
    let throughput_models = if args.fairness_only {
        &[][..]
    } else {
        &args.models[..]
    };
    let mean_request = 4.5; // requests of 1..=8 images, uniformly
    for (model, split) in throughput_models {
        // The segment's times on this device, from the host's memory model.
        let profile = {
            let host = fresh(
                dir.path(),
                &format!("{model}-profile"),
                "",
                1,
                &[model],
                |_| String::new(),
            );
            host.target.warm(model, *split).await;
            host.target.profile(model).await
        };
        let cost = profile.memory.segment(0..*split);
        let best = cost
            .times
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .copied()
            .unwrap_or((1, f64::NAN));
        let at1 = per_sample(&cost.times, 1.0);
        let ceiling = at1 / best.1;
        let available = per_sample(&cost.times, mean_request) / best.1;
        println!(
            "\n{model} [0..{split}]: per-sample ms {}; ceiling {ceiling:.2}x (batch {}), gain available to pooling {available:.2}x (requests of {mean_request} on average); device alone at the best batch: {:.1} samples/s",
            cost.times
                .iter()
                .map(|(b, t)| format!("{:.1}@{b}", t * 1e3))
                .collect::<Vec<_>>()
                .join(" "),
            best.0,
            1.0 / best.1
        );
        report["segments"].as_array_mut().expect("array").push(json!({
            "model": model, "split": split, "times": cost.times, "best_batch": best.0,
            "ceiling": ceiling, "gain_available": available, "device_samples_per_s": 1.0 / best.1,
        }));
        let mut runs: Vec<(bool, usize, Point)> = Vec::new();
        for rep in 0..args.reps {
            for &n in &args.tenants {
                for pool in [false, true] {
                    let r = point(dir.path(), &args.host, model, *split, pool, n, window).await;
                    eprintln!(
                        "  rep {rep} pooling {} tenants {n}: {:.1} samples/s, mean batch {:.1}, median ms decode {:.1} queue {:.1} compute {:.1}",
                        if pool { "on" } else { "off" },
                        r.0,
                        r.3,
                        r.5[0],
                        r.5[1],
                        r.5[2]
                    );
                    runs.push((pool, n, r));
                }
            }
        }
        println!(
            "{:>8} {:>8} {:>22} {:>9} {:>9} {:>10} {:>7}",
            "pooling",
            "tenants",
            "samples/s med (min-max)",
            "p50 ms",
            "p99 ms",
            "mean batch",
            "failed"
        );
        let of = |pool: bool, n: usize| -> Vec<&Point> {
            runs.iter()
                .filter(|r| r.0 == pool && r.1 == n)
                .map(|r| &r.2)
                .collect()
        };
        for pool in [false, true] {
            for &n in &args.tenants {
                let pts = of(pool, n);
                let rate = spread(&pts.iter().map(|p| p.0).collect::<Vec<_>>());
                let p50 = spread(&pts.iter().map(|p| p.1).collect::<Vec<_>>()).0;
                let p99 = spread(&pts.iter().map(|p| p.2).collect::<Vec<_>>()).0;
                let batch = spread(&pts.iter().map(|p| p.3).collect::<Vec<_>>()).0;
                let failed: usize = pts.iter().map(|p| p.4).sum();
                let stage = |k: usize| spread(&pts.iter().map(|p| p.5[k]).collect::<Vec<_>>()).0;
                println!(
                    "{:>8} {n:>8} {:>8.1} ({:>5.1}-{:>5.1}) {p50:>9.1} {p99:>9.1} {batch:>10.1} {failed:>7}",
                    if pool { "on" } else { "off" },
                    rate.0,
                    rate.1,
                    rate.2
                );
                report["throughput"].as_array_mut().expect("array").push(json!({
                    "model": model, "split": split, "pool": pool, "tenants": n,
                    "samples_per_s": rate.0, "samples_per_s_min": rate.1, "samples_per_s_max": rate.2,
                    "runs": pts.iter().map(|p| p.0).collect::<Vec<_>>(),
                    "p50_ms": p50, "p99_ms": p99, "mean_batch": batch, "failed": failed,
                    "stages_ms": {"decode": stage(0), "queue": stage(1), "compute": stage(2)},
                }));
            }
        }
        println!(
            "  pooled / unpooled (median, and the ratio's range over repetitions paired in order); pooled / device alone:"
        );
        for &n in &args.tenants {
            let (on, off) = (of(true, n), of(false, n));
            let med = |v: &[&Point]| spread(&v.iter().map(|p| p.0).collect::<Vec<_>>()).0;
            let pairs: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a.0 / b.0).collect();
            let (_, lo, hi) = spread(&pairs);
            println!(
                "  {n:>2} tenants: {:.2}x ({lo:.2}-{hi:.2}); {:.2} of {:.1} samples/s",
                med(&on) / med(&off),
                med(&on) * best.1,
                1.0 / best.1
            );
        }
    }
    let rows = report["throughput"].as_array().expect("array").clone();

    // 2. Fairness, on the first model.
    let (model, split) = &args.models[0];
    println!(
        "\nfairness ({model}): light tenant, 4 images per request, alone and next to a flood; median of {} fresh processes",
        args.reps
    );
    println!(
        "{:>8} {:>14} {:>16} {:>22} {:>16}",
        "pooling", "solo p50 ms", "flooded p50 ms", "ratio med (min-max)", "flood samples/s"
    );
    for pool in [false, true] {
        let mut reps = Vec::new();
        for rep in 0..args.reps {
            let host = fresh(
                dir.path(),
                &format!("fair-{pool}-{rep}"),
                &format!("pool = {pool}\nmax_batch = 32\n{}", args.host),
                2,
                &[model],
                |t| {
                    if t == 1 {
                        "concurrency = 4".into()
                    } else {
                        "concurrency = 1".into()
                    }
                },
            );
            let h = &host.target;
            h.warm(model, *split).await;
            take_stages(Some(0));
            let until = Instant::now() + window;
            let (mut solo, _, _) = closed_loop(h, 0, model, *split, 1, until, |_| 4).await;
            let solo_stages = take_stages(Some(0));
            let started = Instant::now();
            let until = started + window;
            let (light, heavy) = tokio::join!(
                closed_loop(h, 0, model, *split, 1, until, |_| 4),
                closed_loop(h, 1, model, *split, 4, until, |_| 8)
            );
            let flood_rate = heavy.1 as f64 / started.elapsed().as_secs_f64();
            let flooded_stages = take_stages(Some(0));
            let mut flooded = light.0;
            let (s, f) = (quantile(&mut solo, 0.5), quantile(&mut flooded, 0.5));
            reps.push((s, f, flood_rate, solo_stages, flooded_stages, flooded.len()));
        }
        let ratios: Vec<f64> = reps.iter().map(|r| r.1 / r.0).collect();
        let (ratio, lo, hi) = spread(&ratios);
        let k = ratios.iter().position(|&r| r == ratio).unwrap_or(0);
        let (s, f, flood_rate, solo_stages, flooded_stages, n) = reps[k];
        println!(
            "{:>8} {s:>14.1} {f:>16.1} {ratio:>8.2} ({lo:.2}-{hi:.2}) {flood_rate:>16.1}   light p50 decode/queue/compute ms: solo {:.0}/{:.0}/{:.0}, flooded {:.0}/{:.0}/{:.0}",
            if pool { "on" } else { "off" },
            solo_stages[0],
            solo_stages[1],
            solo_stages[2],
            flooded_stages[0],
            flooded_stages[1],
            flooded_stages[2],
        );
        report["fairness"]
            .as_array_mut()
            .expect("array")
            .push(json!({
                "model": model, "split": split, "pool": pool,
                "solo_p50_ms": s, "flooded_p50_ms": f, "ratio": ratio, "ratio_min": lo, "ratio_max": hi,
                "ratios": ratios,
            "light_stages_ms_solo": {"decode": solo_stages[0], "queue": solo_stages[1], "compute": solo_stages[2]},
            "light_stages_ms_flooded": {"decode": flooded_stages[0], "queue": flooded_stages[1], "compute": flooded_stages[2]},
                "light_requests": n, "flood_samples_per_s": flood_rate,
            }));
    }

    if args.fairness_only {
        return;
    }
    // 3. Burst: 200 requests at once from a tenant allowed 4 running and 8 waiting.
    let h = start(model, true, 1, |_| "concurrency = 4\nqueue = 8".into()).await;
    let target = Target::of(&h);
    target.warm(model, *split).await;
    let base = rss::current();
    rss::reset_peak();
    let started = Instant::now();
    let burst = (0..200).map(|i| request(&target, 0, body(model, *split, 8, i)));
    let results = futures::future::join_all(burst).await;
    let took = started.elapsed().as_secs_f64();
    let peak = rss::peak();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results.iter().filter(|r| **r == Err(429)).count();
    let other = results.len() - ok - refused;
    let device = h.host.device().memory();
    println!(
        "\nburst ({model}): 200 requests of 8 images at once, 4 running + 8 waiting allowed\n  \
         served {ok}, refused 429 {refused}, other {other}, in {took:.1} s; resident set {:.0} MiB \
         before, peak {:.0} MiB (+{:.0} MiB); device peak {:.0} MiB of a {:.0} MiB budget",
        base as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        peak.saturating_sub(base) as f64 / 1048576.0,
        device.peak_bytes as f64 / 1048576.0,
        device.budget as f64 / 1048576.0,
    );
    report["burst"] = json!({
        "model": model, "split": split, "requests": 200, "served": ok, "refused_429": refused,
        "other": other, "seconds": took, "rss_before": base, "rss_peak": peak,
        "device_peak_bytes": device.peak_bytes, "device_budget": device.budget,
    });

    std::fs::create_dir_all(&args.out).expect("output directory");
    let json_path = args.out.join("pooling.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report).expect("JSON"),
    )
    .expect("write JSON");
    let svg_path = args.out.join("pooling.svg");
    std::fs::write(&svg_path, plot(&rows, &args.models)).expect("write SVG");
    println!("\nwrote {} and {}", json_path.display(), svg_path.display());
}

/// Samples/s against tenants, pooling off and on, one panel per model.
fn plot(rows: &[Value], models: &[(String, usize)]) -> String {
    let (pw, ph, m) = (380.0, 260.0, 50.0);
    let width = pw * models.len() as f64 + 20.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" font-family="sans-serif" font-size="11">"#,
        ph + 40.0
    );
    for (k, (model, split)) in models.iter().enumerate() {
        let x0 = k as f64 * pw + 10.0;
        let series = |pool: bool| -> Vec<(usize, f64)> {
            TENANTS
                .iter()
                .filter_map(|&n| {
                    rows.iter()
                        .find(|r| {
                            r["model"] == model.as_str() && r["pool"] == pool && r["tenants"] == n
                        })
                        .and_then(|r| r["samples_per_s"].as_f64())
                        .map(|v| (n, v))
                })
                .collect()
        };
        let ymax = series(true)
            .iter()
            .chain(series(false).iter())
            .map(|p| p.1)
            .fold(1.0, f64::max)
            * 1.15;
        let px = |n: usize| x0 + m + (n as f64).log2() / 4.0 * (pw - m - 20.0);
        let py = |v: f64| 20.0 + (ph - m) * (1.0 - v / ymax);
        let _ = write!(
            svg,
            r#"<text x="{}" y="14" text-anchor="middle" font-weight="bold">{model} [0..{split}]: samples/s</text>"#,
            x0 + pw / 2.0
        );
        let _ = write!(
            svg,
            r##"<line x1="{a}" y1="{b}" x2="{c}" y2="{b}" stroke="#333"/><line x1="{a}" y1="20" x2="{a}" y2="{b}" stroke="#333"/>"##,
            a = x0 + m,
            b = py(0.0),
            c = px(16) + 10.0
        );
        for &n in &TENANTS {
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{n}</text>"#,
                px(n),
                py(0.0) + 14.0
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">tenants</text>"#,
            px(4),
            py(0.0) + 28.0
        );
        for i in 0..=4 {
            let v = ymax / 1.15 * f64::from(i) / 4.0;
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#,
                x0 + m - 4.0,
                py(v) + 4.0
            );
        }
        for (pool, colour, label, dy) in [
            (false, "#888", "pooling off", 0.0),
            (true, "#c33", "pooling on", 14.0),
        ] {
            let pts: Vec<String> = series(pool)
                .iter()
                .map(|&(n, v)| format!("{:.1},{:.1}", px(n), py(v)))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                pts.join(" ")
            );
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" fill="{colour}">{label}</text>"#,
                x0 + m + 8.0,
                32.0 + dy
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

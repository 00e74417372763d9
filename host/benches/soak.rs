//! `cargo xtask soak [--tenants N] [--minutes M] [--quiet-neighbours]`: one `hapi-host` process
//! under a mixed load for a while (with `--quiet-neighbours`, the same well-behaved load alone,
//! for a baseline).
//!
//! Well-behaved tenants (all but eight) each run a closed loop of small feature extractions
//! (two images, resnet18 layers [0, 4)) with a think time of 0-400 ms. Eight hostile tenants,
//! one of each kind, attack all the while: a flood of large computes, memory bombs, endless
//! loops, sleeps in host calls, calls of 192 samples, slow clients (withheld bodies, half-sent
//! headers), deploy bombs (uploads of 7.5 MB of code) and output bombs (8M-dimension tensors,
//! 24 MiB error messages).
//!
//! Reports: requests and status codes per kind of tenant, the well-behaved tenants' 5xx (goal:
//! zero), their p50/p99 against a solo run of one of them, the host's resident set over time
//! (sampled every second; goal: at the end within 128 MiB of its level after the warm-up, the
//! first 10% of the run), and the device budget's peak. Prints a table; writes
//! `soak.json` to `--out` (default target/bench).

#[path = "../tests/common/mod.rs"]
mod common;

use common::components::{guest_with, module};
use common::{guest, hostile, proc_memory, sample_key, write_store};
use hapi_host::policy::hash_token;
use hapi_tests::HostProcess;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const HOSTILE: [&str; 8] = [
    "flood", "memory", "loop", "sleep", "large", "slow", "deploy", "output",
];
const OPERATOR: &str = "soak-operator";

struct Args {
    tenants: usize,
    minutes: f64,
    out: PathBuf,
    /// `--quiet-neighbours`: the hostile tenants are configured but send nothing, for a
    /// baseline of the same well-behaved load.
    quiet: bool,
}

fn args() -> Args {
    let argv = common::BenchArgs::from_env();
    Args {
        tenants: argv
            .value("--tenants")
            .map_or(64, |s| s.parse().expect("--tenants N")),
        minutes: argv
            .value("--minutes")
            .map_or(10.0, |s| s.parse().expect("--minutes M")),
        quiet: argv.has("--quiet-neighbours"),
        out: argv.out(),
    }
}

fn token(name: &str) -> String {
    format!("{name}-token")
}

fn policy(dir: &Path, store: &Path, good: usize) -> String {
    let mut p = format!(
        r#"
[host]
listen = "127.0.0.1:0"
store = "{}"
models = "{}"
state = "{}"
device = "cpu"
memory_budget = "1GiB"
operator_token_sha256 = "{}"
header_timeout = "5s"
body_timeout = "5s"
idle_timeout = "10s"
max_connections = 1024
max_connections_per_client = 1024
"#,
        store.display(),
        hapi_model::models_dir().display(),
        dir.join("state").display(),
        hash_token(OPERATOR)
    );
    let fe = guest("feature-extract");
    let hostile = guest("hostile");
    let sleeper = guest("sleeper");
    for i in 0..good {
        p.push_str(&format!(
            "\n[tenants.w{i}]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"datasets\", prefix = \"fashion-mnist/\" }}]\nmodels = [\"resnet18\"]\nmemory = \"256MiB\"\ntimeout = \"60s\"\nconcurrency = 2\n[tenants.w{i}.functions]\nfeature-extract = \"{}\"\n",
            hash_token(&token(&format!("w{i}"))),
            fe.display()
        ));
    }
    for kind in HOSTILE {
        let (memory, timeout, concurrency) = match kind {
            "flood" => ("512MiB", "120s", 4),
            "large" => ("512MiB", "120s", 1),
            _ => ("128MiB", "1s", 2),
        };
        p.push_str(&format!(
            "\n[tenants.{kind}]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"datasets\", prefix = \"fashion-mnist/\" }}]\nmodels = [\"resnet18\"]\nmemory = \"{memory}\"\ntimeout = \"{timeout}\"\nconcurrency = {concurrency}\nqueue = 2\nmax_output = \"64KiB\"\ndeploy = true\ncapabilities = [\"clocks\", \"random\"]\n[tenants.{kind}.functions]\nhostile = \"{}\"\nsleeper = \"{}\"\n",
            hash_token(&token(kind)),
            hostile.display(),
            sleeper.display()
        ));
    }
    p
}

fn good_body(i: usize) -> Value {
    json!({"bucket": "datasets", "keys": [sample_key(common::SAMPLES[i % 6]), sample_key(common::SAMPLES[(i + 1) % 6])], "model": "resnet18", "split": 4})
}

/// Status codes and latencies, per tenant.
#[derive(Default)]
struct Log {
    latencies: BTreeMap<String, Vec<f64>>,
    statuses: BTreeMap<String, BTreeMap<u16, u64>>,
    transport_errors: BTreeMap<String, u64>,
    /// The slow tenant's connections: opened, and closed by the host before the client gave up.
    slow: (u64, u64),
}

struct Load<'a> {
    url: &'a str,
    client: reqwest::Client,
    log: Mutex<Log>,
    until: Instant,
}

impl Load<'_> {
    async fn invoke(&self, tenant: &str, function: &str, body: &Value) {
        let started = Instant::now();
        let r = self
            .client
            .post(format!("{}/v1/invoke/{function}", self.url))
            .bearer_auth(token(tenant))
            .json(body)
            .send()
            .await;
        let status = match r {
            Ok(resp) => {
                let s = resp.status().as_u16();
                let _ = resp.bytes().await;
                Some(s)
            }
            Err(_) => None,
        };
        self.record(tenant, status, started.elapsed());
    }

    /// Logs a request's status (`None`: no answer) and, if it succeeded, its latency.
    fn record(&self, tenant: &str, status: Option<u16>, took: Duration) {
        let mut log = self.log.lock().expect("log");
        match status {
            Some(s) => {
                *log.statuses
                    .entry(tenant.to_string())
                    .or_default()
                    .entry(s)
                    .or_default() += 1;
                if s == 200 {
                    let ms = took.as_secs_f64() * 1e3;
                    log.latencies
                        .entry(tenant.to_string())
                        .or_default()
                        .push(ms);
                }
            }
            None => *log.transport_errors.entry(tenant.to_string()).or_default() += 1,
        }
    }

    async fn good(&self, i: usize) {
        let name = format!("w{i}");
        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
        while Instant::now() < self.until {
            self.invoke(&name, "feature-extract", &good_body(i)).await;
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            tokio::time::sleep(Duration::from_millis(rng % 400)).await;
        }
    }

    async fn hostile(&self, kind: &str, addr: &str) {
        let input48 = (48 * 3 * 224 * 224 * 4).to_string();
        let input192 = (192 * 3 * 224 * 224 * 4).to_string();
        let bomb = guest_with(
            "hostile",
            &[module(
                15,
                hapi_host::wasm::compile::MAX_FUNCTION_BODY - 100,
            )],
        );
        let mut n = 0u64;
        while Instant::now() < self.until {
            n += 1;
            match kind {
                "flood" => {
                    let body = hostile(
                        "graph",
                        &[
                            ("graph", "resnet18[0..4]"),
                            ("dims", "48,3,224,224"),
                            ("bytes", &input48),
                        ],
                        &[],
                    );
                    let calls = (0..4).map(|_| self.invoke(kind, "hostile", &body));
                    futures::future::join_all(calls).await;
                }
                "memory" => {
                    let b = if n.is_multiple_of(2) {
                        hostile("tensors", &[("count", "64"), ("bytes", "4194304")], &[])
                    } else {
                        hostile("alloc", &[("bytes", "1073741824")], &[])
                    };
                    self.invoke(kind, "hostile", &b).await;
                }
                "loop" => {
                    self.invoke(kind, "hostile", &hostile("loop", &[], &[]))
                        .await
                }
                "sleep" => {
                    let b = json!({"bucket": "b", "keys": [], "model": "m", "split": 0, "options": {"ms": "8000"}});
                    self.invoke(kind, "sleeper", &b).await;
                }
                "large" => {
                    let b = hostile(
                        "graph",
                        &[
                            ("graph", "resnet18[0..4]"),
                            ("dims", "192,3,224,224"),
                            ("bytes", &input192),
                        ],
                        &[],
                    );
                    self.invoke(kind, "hostile", &b).await;
                }
                "slow" => {
                    let req = format!(
                        "POST /v1/invoke/hostile HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 1000\r\n\r\n{{",
                        token(kind)
                    );
                    let mut held = Vec::new();
                    for i in 0..20 {
                        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                            let raw: &[u8] = if i % 2 == 0 {
                                req.as_bytes()
                            } else {
                                b"GET /healthz HTTP/1.1\r\nX-Half: "
                            };
                            let _ = s.write_all(raw).await;
                            held.push(s);
                        }
                    }
                    // The host's header and body timeouts are 5 s: by 6 s it has closed them.
                    tokio::time::sleep(Duration::from_secs(6)).await;
                    let mut closed = 0;
                    for s in &mut held {
                        use tokio::io::AsyncReadExt;
                        let mut buf = [0u8; 512];
                        // A 408 answer, or none, then the end of the stream.
                        let end = async {
                            loop {
                                match s.read(&mut buf).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(_) => {}
                                }
                            }
                        };
                        if tokio::time::timeout(Duration::from_millis(50), end)
                            .await
                            .is_ok()
                        {
                            closed += 1;
                        }
                    }
                    let mut log = self.log.lock().expect("log");
                    log.slow.0 += held.len() as u64;
                    log.slow.1 += closed;
                }
                "deploy" => {
                    let started = Instant::now();
                    let r = self
                        .client
                        .put(format!("{}/v1/functions/bomb", self.url))
                        .bearer_auth(token(kind))
                        .body(bomb.clone())
                        .send()
                        .await;
                    let status = r.map(|r| r.status().as_u16()).ok();
                    self.record(kind, status, started.elapsed());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                _ => {
                    let b = if n.is_multiple_of(2) {
                        hostile("wide-output", &[("rank", "8000000")], &[])
                    } else {
                        hostile("long-error", &[("bytes", "25165824")], &[])
                    };
                    self.invoke(kind, "hostile", &b).await;
                }
            }
        }
    }
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    assert!(
        a.tenants > HOSTILE.len(),
        "--tenants must be more than {}",
        HOSTILE.len()
    );
    let good = a.tenants - HOSTILE.len();
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("store");
    write_store(&store);
    let policy_path = dir.path().join("policy.toml");
    std::fs::write(&policy_path, policy(dir.path(), &store, good)).expect("policy");
    let host = HostProcess::serve(
        &hapi_tests::package_binary("hapi-host", env!("CARGO_BIN_EXE_hapi-host")),
        &policy_path,
        "127.0.0.1:0",
    );
    let pid = host.child.id();
    let url = host.url.clone();
    let addr = url.trim_start_matches("http://").to_string();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(180))
        .build()
        .expect("client");

    // Solo: one well-behaved tenant alone, after a warm-up.
    let solo = Load {
        url: &url,
        client: client.clone(),
        log: Mutex::default(),
        until: Instant::now() + Duration::from_secs(15),
    };
    for _ in 0..3 {
        solo.invoke("w0", "feature-extract", &good_body(0)).await;
    }
    *solo.log.lock().expect("log") = Log::default();
    solo.good(0).await;
    let mut solo_lat = solo
        .log
        .lock()
        .expect("log")
        .latencies
        .remove("w0")
        .unwrap_or_default();
    let (solo_p50, solo_p99) = (quantile(&mut solo_lat, 0.5), quantile(&mut solo_lat, 0.99));
    eprintln!(
        "solo: p50 {solo_p50:.1} ms, p99 {solo_p99:.1} ms ({} calls)",
        solo_lat.len()
    );

    // The soak.
    let run = Duration::from_secs_f64(a.minutes * 60.0);
    let started = Instant::now();
    let load = Load {
        url: &url,
        client,
        log: Mutex::default(),
        until: started + run,
    };
    let samples: Mutex<Vec<(f64, u64)>> = Mutex::default();
    let sampler = async {
        while Instant::now() < load.until {
            samples
                .lock()
                .expect("samples")
                .push((started.elapsed().as_secs_f64(), proc_memory(pid, "VmRSS:")));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let goods = futures::future::join_all((0..good).map(|i| load.good(i)));
    let bads = futures::future::join_all(
        HOSTILE
            .iter()
            .filter(|_| !a.quiet)
            .map(|k| load.hostile(k, &addr)),
    );
    tokio::join!(goods, bads, sampler);
    let samples = samples.into_inner().expect("samples");
    let metrics = common::metrics_text(&reqwest::Client::new(), &url, OPERATOR).await;
    let metric = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let (budget, peak) = (
        metric("hapi_device_budget_bytes"),
        metric("hapi_device_peak_bytes"),
    );
    drop(host);

    // Report.
    let log = load.log.into_inner().expect("log");
    let warm = run.as_secs_f64() * 0.1;
    let after_warm = samples
        .iter()
        .find(|(t, _)| *t >= warm)
        .map_or(0, |(_, r)| *r);
    let end = samples.last().map_or(0, |(_, r)| *r);
    // One sample moves by ±200 MiB under this load: compare minutes' medians as well.
    let minute = 60.0_f64.min(run.as_secs_f64() / 10.0);
    let window_median = |from: f64| {
        let mut w: Vec<f64> = samples
            .iter()
            .filter(|(t, _)| *t >= from && *t < from + minute)
            .map(|(_, r)| *r as f64)
            .collect();
        quantile(&mut w, 0.5) as u64
    };
    let first_window = window_median(warm);
    let last_window = window_median(run.as_secs_f64() - minute);
    let max = samples.iter().map(|(_, r)| *r).max().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut good_5xx = 0u64;
    let mut good_requests = 0u64;
    let mut all_good = Vec::new();
    let mut tenants = Vec::new();
    for i in 0..good {
        let name = format!("w{i}");
        let st = log.statuses.get(&name).cloned().unwrap_or_default();
        let n: u64 = st.values().sum();
        let e5: u64 = st.iter().filter(|(s, _)| **s >= 500).map(|(_, c)| c).sum();
        good_requests += n;
        good_5xx += e5;
        let mut lat = log.latencies.get(&name).cloned().unwrap_or_default();
        all_good.extend(lat.iter().copied());
        let (p50, p99) = (quantile(&mut lat, 0.5), quantile(&mut lat, 0.99));
        tenants.push(
            json!({"tenant": name, "requests": n, "statuses": st, "p50_ms": p50, "p99_ms": p99,
            "p50_vs_solo": p50 / solo_p50, "p99_vs_solo": p99 / solo_p99,
            "transport_errors": log.transport_errors.get(&name).copied().unwrap_or(0)}),
        );
    }
    let (g50, g99) = (quantile(&mut all_good, 0.5), quantile(&mut all_good, 0.99));
    println!(
        "\nsoak: {} tenants ({good} well-behaved, {} hostile{}), {:.1} min",
        a.tenants,
        HOSTILE.len(),
        if a.quiet { ", silent" } else { "" },
        run.as_secs_f64() / 60.0
    );
    println!("| tenants | requests | status codes | 5xx | p50 ms (x solo) | p99 ms (x solo) |");
    println!("|---|---|---|---|---|---|");
    let transport_good: u64 = (0..good)
        .filter_map(|i| log.transport_errors.get(&format!("w{i}")))
        .sum();
    let mut good_statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for i in 0..good {
        for (s, c) in log.statuses.get(&format!("w{i}")).into_iter().flatten() {
            *good_statuses.entry(*s).or_default() += c;
        }
    }
    println!(
        "| well-behaved ({good}) | {good_requests} | {good_statuses:?} | {good_5xx} | {g50:.1} ({:.2}x) | {g99:.1} ({:.2}x) |",
        g50 / solo_p50,
        g99 / solo_p99
    );
    for kind in HOSTILE {
        let st = log.statuses.get(kind).cloned().unwrap_or_default();
        let n: u64 = st.values().sum();
        let e5: u64 = st.iter().filter(|(s, _)| **s >= 500).map(|(_, c)| c).sum();
        if kind == "slow" {
            let (opened, closed) = log.slow;
            println!(
                "| {kind} | {opened} connections | {closed} closed by the host within 6 s | | | |"
            );
        } else {
            println!("| {kind} | {n} | {st:?} | {e5} | | |");
        }
    }
    println!(
        "\nsolo (one well-behaved tenant alone): p50 {solo_p50:.1} ms, p99 {solo_p99:.1} ms; transport errors of well-behaved tenants: {transport_good}"
    );
    println!(
        "host resident set, medians of {minute:.0} s windows: {:.0} MiB after the warm-up, {:.0} MiB at the end ({:+.0} MiB)",
        mib(first_window),
        mib(last_window),
        mib(last_window) - mib(first_window)
    );
    println!(
        "host resident set: {:.0} MiB after the warm-up ({warm:.0} s), {:.0} MiB at the end ({:+.0} MiB), {:.0} MiB at most; device budget peak {:.0} of {:.0} MiB",
        mib(after_warm),
        mib(end),
        mib(end) - mib(after_warm),
        mib(max),
        peak / (1 << 20) as f64,
        budget / (1 << 20) as f64
    );
    let report = json!({
        "tenants": a.tenants, "well_behaved": good, "hostile": HOSTILE, "minutes": a.minutes,
        "solo": {"p50_ms": solo_p50, "p99_ms": solo_p99, "calls": solo_lat.len()},
        "well_behaved_requests": good_requests, "well_behaved_5xx": good_5xx,
        "well_behaved_transport_errors": transport_good,
        "well_behaved_p50_ms": g50, "well_behaved_p99_ms": g99,
        "per_tenant": tenants,
        "slow_connections": {"opened": log.slow.0, "closed_by_host_within_6s": log.slow.1},
        "hostile_statuses": HOSTILE.iter().map(|k| (k.to_string(), log.statuses.get(*k).cloned().unwrap_or_default())).collect::<BTreeMap<_, _>>(),
        "quiet_neighbours": a.quiet,
        "rss": {"after_warm_up": after_warm, "end": end, "max": max, "window_seconds": minute,
                "first_window_median": first_window, "last_window_median": last_window,
                "samples": samples},
        "device": {"budget": budget, "peak": peak},
    });
    std::fs::create_dir_all(&a.out).expect("out dir");
    let path = a.out.join(if a.quiet {
        "soak-quiet.json"
    } else {
        "soak.json"
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&report).expect("json")).expect("write");
    println!("wrote {}", path.display());
}

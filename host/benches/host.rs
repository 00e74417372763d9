//! `cargo xtask bench host`: what one invocation costs, and what the Wasm sandbox adds.
//!
//! 1. Instantiate-and-run of an almost empty pushdown (fresh store, limits, one call).
//! 2. The same extraction (read, decode, preprocess, layers [0, s)) through the Wasm guest and
//!    natively in the host process, per request.
//! 3. The latency breakdown of one HTTP invocation (Server-Timing stages plus HTTP overhead).
//!
//! Prints a table and writes JSON (path from `--json`, default target/bench/host.json).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{ALICE, SAMPLES, TestHost, sample_key};
use hapi_model::{ModelPackage, models_dir};
use hapi_preprocess::preprocess;
use hapi_wire::InvokeRequest;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (quantile(&v, 0.5), quantile(&v, 0.99))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench/host.json").to_string()
        });
    let h = TestHost::start().await;
    let alice = h.host.policy().tenants["alice"].clone();

    // 1. Empty pushdown: one call that returns a 1-byte tensor.
    let hostile = h.host.function("alice", "hostile").expect("hostile");
    let empty = InvokeRequest {
        bucket: "datasets".into(),
        keys: vec![],
        model: "resnet18".into(),
        split: 0,
        options: BTreeMap::from([
            ("mode".into(), "output".into()),
            ("bytes".into(), "1".into()),
        ]),
    };
    let host = &h.host;
    for _ in 0..100 {
        host.invoke(&alice, &hostile, empty.clone())
            .await
            .result
            .expect("warm-up");
    }
    let n_empty = 2000;
    let mut times = Vec::with_capacity(n_empty);
    for _ in 0..n_empty {
        let t = Instant::now();
        host.invoke(&alice, &hostile, empty.clone())
            .await
            .result
            .expect("empty invocation");
        times.push(t.elapsed());
    }
    let (empty_p50, empty_p99) = stats(times);

    // 2. Wasm guest versus native, same images, same model segment.
    let (model, split) = ("resnet18", 6usize);
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    let fe = h
        .host
        .function("alice", "feature-extract")
        .expect("feature-extract");
    let inv = InvokeRequest {
        bucket: "datasets".into(),
        keys: keys.clone(),
        model: model.into(),
        split: split as u32,
        options: BTreeMap::new(),
    };
    let pkg = ModelPackage::load(&models_dir().join(model), tch::Device::Cpu).expect("package");
    let i = &pkg.manifest().input;
    let t = i.transform();
    let native = || {
        let mut batch = Vec::new();
        for k in &keys {
            let bytes = std::fs::read(h.store.join("datasets").join(k)).expect("object");
            batch.extend(preprocess(&bytes, &t).expect("preprocess"));
        }
        let x = tch::Tensor::from_slice(&batch).reshape([keys.len() as i64, 3, 224, 224]);
        let y = pkg.run(0..split, &x).expect("run");
        hapi_model::tensor::f32_to_le_bytes(&y)
            .expect("bytes")
            .len()
    };
    let reps = 15;
    let (mut wasm_t, mut native_t, mut stages) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..reps + 2 {
        let t0 = Instant::now();
        let done = host.invoke(&alice, &fe, inv.clone()).await;
        let (out, timings) = (done.result, done.timings);
        out.expect("wasm extraction");
        let w = t0.elapsed();
        let t1 = Instant::now();
        native();
        let n = t1.elapsed();
        if r >= 2 {
            wasm_t.push(w);
            native_t.push(n);
            stages.push(timings);
        }
    }
    let (wasm_p50, _) = stats(wasm_t);
    let (native_p50, _) = stats(native_t);
    let med = |f: &dyn Fn(&hapi_host::wasm::invoke::Timings) -> Duration| {
        stats(stages.iter().map(f).collect()).0
    };
    let (s_inst, s_read, s_guest, s_compute) = (
        med(&|t| t.instantiate),
        med(&|t| t.read),
        med(&|t| t.guest()),
        med(&|t| t.compute),
    );

    // 3. One HTTP invocation, end to end.
    let body = json!({"bucket": "datasets", "keys": keys, "model": model, "split": split});
    let mut http = Vec::new();
    let mut server: Vec<(String, f64)> = Vec::new();
    for r in 0..reps + 2 {
        let t0 = Instant::now();
        let resp = h.invoke(ALICE, "feature-extract", body.clone()).await;
        let timing = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = resp.bytes().await.expect("body");
        let total = t0.elapsed();
        assert!(bytes.len() > 1000);
        if r >= 2 {
            http.push(total);
            server = timing
                .split(", ")
                .filter_map(|s| {
                    let (name, dur) = s.split_once(";dur=")?;
                    Some((name.to_string(), dur.parse().ok()?))
                })
                .collect();
        }
    }
    let (http_p50, _) = stats(http);
    let server_total = server
        .iter()
        .find(|(n, _)| n == "total")
        .map_or(0.0, |(_, v)| *v);

    println!(
        "\nhost benchmark ({} images of Fashion-MNIST, {model}[0..{split}], CPU)",
        keys.len()
    );
    println!("{:<46} {:>12}", "measure", "value");
    println!(
        "{:<46} {:>10.1}us",
        "empty pushdown instantiate+run, p50",
        us(empty_p50)
    );
    println!(
        "{:<46} {:>10.1}us",
        "empty pushdown instantiate+run, p99",
        us(empty_p99)
    );
    println!(
        "{:<46} {:>10.2}ms",
        "extraction via Wasm guest, p50",
        ms(wasm_p50)
    );
    println!(
        "{:<46} {:>10.2}ms",
        "extraction natively in the host, p50",
        ms(native_p50)
    );
    let ratio = wasm_p50.as_secs_f64() / native_p50.as_secs_f64();
    println!("{:<46} {:>12.3}", "Wasm / native", ratio);
    println!("{:<46} {:>10.2}ms", "  instantiate", ms(s_inst));
    println!("{:<46} {:>10.2}ms", "  read (objects)", ms(s_read));
    println!(
        "{:<46} {:>10.2}ms",
        "  decode + preprocess (in guest)",
        ms(s_guest)
    );
    println!(
        "{:<46} {:>10.2}ms",
        "  compute (wasi-nn on libtorch)",
        ms(s_compute)
    );
    println!(
        "{:<46} {:>10.2}ms",
        "HTTP invocation end to end, p50",
        ms(http_p50)
    );
    for (name, v) in &server {
        println!(
            "{:<46} {:>10.2}ms",
            format!("  server-timing {name} (last)"),
            v
        );
    }
    println!(
        "{:<46} {:>10.2}ms",
        "  HTTP + client (end to end - server total)",
        ms(http_p50) - server_total
    );

    let report = json!({
        "images": keys.len(), "model": model, "split": split, "device": "cpu",
        "empty_pushdown_us": {"p50": us(empty_p50), "p99": us(empty_p99), "n": n_empty},
        "extraction_ms": {"wasm_p50": ms(wasm_p50), "native_p50": ms(native_p50), "ratio": ratio,
            "stages": {"instantiate": ms(s_inst), "read": ms(s_read), "guest_decode": ms(s_guest), "compute": ms(s_compute)}},
        "http_ms": {"p50": ms(http_p50), "server_timing": server.iter().map(|(n, v)| (n.clone(), json!(v))).collect::<serde_json::Map<_, _>>()},
    });
    if let Some(dir) = std::path::Path::new(&json_path).parent() {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .expect("write JSON");
    println!("\nJSON: {json_path}");
}

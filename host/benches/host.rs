//! `cargo xtask bench host`: what one invocation costs, and what the Wasm sandbox adds.
//!
//! 1. Instantiate-and-run of an almost empty pushdown (fresh store, limits, one call).
//! 2. The same extraction (read, decode, preprocess, layers [0, s)) through the Wasm guest and
//!    natively in the host process, per request.
//! 3. The latency breakdown of one HTTP invocation (Server-Timing stages plus HTTP overhead).
//! 4. Decoding and preprocessing per image, in the guest and natively, for PNG and JPEG at
//!    Fashion-MNIST size (28x28) and photo size (500x375).
//!
//! Steps 2 and 4 run in rounds; the table gives each round and their median.
//! Prints a table and writes JSON (path from `--json`, default target/bench/host.json).
//!
//! `--decode-against <decode_bench.wasm>` also runs another build of the decode-bench guest
//! (a copy made before a change to the guests' decoding) in the same rounds, after this build,
//! and gives this build's time over it, median of the rounds' ratios: changes of a few percent
//! show there that the spread between whole runs (20-40% on this machine) hides.
//! `--decode-rounds N` (default 9) sets the rounds of step 4.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{ALICE, SAMPLES, sample_key};
use hapi_model::{ModelPackage, models_dir};
use hapi_preprocess::{Transform, decode, preprocess, transform_into_le_bytes};
use hapi_wire::InvokeRequest;
use image::{DynamicImage, ImageFormat};
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

/// `a[i] / b[i]` for each round.
fn ratios_of(a: &[Duration], b: &[Duration]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect()
}

/// Per-round ratios as one line: "1.057 1.074 1.076".
fn rounds_line(ratios: &[f64]) -> String {
    ratios
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The decode-bench guest's answer: (decode, preprocess) times of each timed repetition.
fn guest_times(data: &[u8]) -> Vec<[Duration; 2]> {
    data.chunks_exact(8)
        .map(|b| {
            let ms = |b: &[u8]| {
                let v = f32::from_le_bytes(b.try_into().expect("f32"));
                Duration::from_secs_f32(v / 1e3)
            };
            [ms(&b[..4]), ms(&b[4..])]
        })
        .collect()
}

/// One round's p50s over its repetitions' (decode, preprocess) times: of decode + preprocess,
/// of decoding, of preprocessing.
fn p50s(v: &[[Duration; 2]]) -> [Duration; 3] {
    [
        stats(v.iter().map(|p| p[0] + p[1]).collect()).0,
        stats(v.iter().map(|p| p[0]).collect()).0,
        stats(v.iter().map(|p| p[1]).collect()).0,
    ]
}

/// Column `k` of per-round p50s.
fn column(rounds: &[[Duration; 3]], k: usize) -> Vec<Duration> {
    rounds.iter().map(|r| r[k]).collect()
}

/// `lo-hi` of per-round ratios.
fn range(ratios: &[f64]) -> String {
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    format!("{lo:.2}-{hi:.2}")
}

/// What the guest does to one object, natively: decode, then preprocess into tensor bytes;
/// the time of each, as the decode-bench guest times them.
fn native_decode(bytes: &[u8], t: &Transform, out: &mut Vec<u8>) -> [Duration; 2] {
    out.clear();
    let t0 = Instant::now();
    let img = decode(bytes).expect("decode");
    let t1 = Instant::now();
    transform_into_le_bytes(&img, t, out).expect("preprocess");
    [t1 - t0, t1.elapsed()]
}

struct DecodeRow {
    image: String,
    guest: Duration,
    native: Duration,
    /// (guest, native) p50s of the decoding and of the preprocessing alone, and the median
    /// over rounds of their ratio.
    decode: (Duration, Duration, f64),
    preprocess: (Duration, Duration, f64),
    ratio: f64,
    round_ratios: Vec<f64>,
    in_invocation: Duration,
    /// With `--decode-against`: that build's p50 (decode + preprocess), and this build's time
    /// over it per round, of decode + preprocess and of decoding alone.
    against: Option<Against>,
}

struct Against {
    p50: Duration,
    ratios: Vec<f64>,
    decode_ratios: Vec<f64>,
}

/// The decode cases, written into the store under alice's grant: (name, key, bytes). A
/// Fashion-MNIST sample (28x28 grayscale) and a real photo (scikit-image's coffee, 600x400,
/// resized to 500x375), each as PNG and as JPEG (quality 90).
fn decode_objects(bucket: &std::path::Path) -> Vec<(String, String, Vec<u8>)> {
    let small =
        hapi_data::fashion_mnist::encode_png(common::fashion_test().image(0), 28, 28).expect("png");
    let small = image::load_from_memory(&small).expect("sample");
    let coffee = image::open(hapi_tests::photos_dir().join("coffee.png"))
        .expect("coffee.png (run `cargo xtask setup`)");
    let photo = DynamicImage::ImageRgb8(image::imageops::resize(
        &coffee.to_rgb8(),
        500,
        375,
        image::imageops::FilterType::Triangle,
    ));
    let encode = |img: &DynamicImage, format: ImageFormat| {
        let mut buf = std::io::Cursor::new(Vec::new());
        match format {
            ImageFormat::Jpeg => img
                .write_with_encoder(image::codecs::jpeg::JpegEncoder::new_with_quality(
                    &mut buf, 90,
                ))
                .expect("jpeg"),
            _ => img.write_to(&mut buf, format).expect("png"),
        }
        buf.into_inner()
    };
    let mut cases = Vec::new();
    for (size, img) in [("28x28", &small), ("500x375", &photo)] {
        for (ext, format) in [("png", ImageFormat::Png), ("jpg", ImageFormat::Jpeg)] {
            let key = format!("fashion-mnist/bench/{size}.{ext}");
            let bytes = encode(img, format);
            let path = bucket.join(&key);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, &bytes).expect("write object");
            cases.push((format!("{} {size}", ext.to_uppercase()), key, bytes));
        }
    }
    cases
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The value after option `name` ("" when it is last), if given.
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args.get(i + 1).cloned().unwrap_or_default())
    };
    let json_path = arg("--json").filter(|p| !p.is_empty()).unwrap_or_else(|| {
        common::workspace()
            .join("target/bench/host.json")
            .display()
            .to_string()
    });
    let against = arg("--decode-against").map(|p| {
        let path = std::path::PathBuf::from(&p);
        assert!(
            path.is_file(),
            "--decode-against {p}: no such file (a decode_bench.wasm built before the change)"
        );
        std::path::absolute(path).expect("absolute path")
    });
    let decode_rounds: usize = arg("--decode-rounds").map_or(9, |n| {
        n.parse()
            .ok()
            .filter(|&n| n >= 1)
            .unwrap_or_else(|| panic!("--decode-rounds {n}: expected a count >= 1"))
    });
    // The test policy plus a tenant granted clocks, which the decode bench guest imports, and
    // guest memory slots that keep their first 16 MiB resident (`host.keep_resident`).
    let h = common::start_tenants(|store, state| {
        format!(
            "{}\n[tenants.bencher]\ntoken_sha256 = \"{}\"\ngrants = [{{ bucket = \"datasets\", prefix = \"fashion-mnist/\" }}]\nmodels = [\"resnet18\"]\ncapabilities = [\"clocks\"]\ntimeout = \"60s\"\n[tenants.bencher.functions]\ndecode-bench = \"{}\"\n{}",
            common::policy_text_for(
                &format!("store = \"{}\"", store.display()),
                "keep_resident = \"16MiB\"",
                state
            ),
            hapi_host::policy::hash_token("bencher-token"),
            common::guest("decode-bench").display(),
            against.as_ref().map_or(String::new(), |p| format!(
                "decode-against = \"{}\"\n",
                p.display()
            ))
        )
    })
    .await;
    let alice = h.host.policy().tenants["alice"].clone();

    // 1. Empty pushdown: one call that returns a 1-byte tensor.
    let hostile = h.host.function("alice", "hostile").expect("hostile");
    let empty = InvokeRequest {
        bucket: "datasets".into(),
        keys: vec![],
        model: Some("resnet18".into()),
        split: Some(0),
        options: BTreeMap::from([
            ("mode".into(), "output".into()),
            ("bytes".into(), "1".into()),
        ]),
        quantize: None,
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
        model: Some(model.into()),
        split: Some(split as u32),
        options: BTreeMap::new(),
        quantize: None,
    };
    let pkg = ModelPackage::load(&models_dir().join(model), tch::Device::Cpu).expect("package");
    let i = &pkg.manifest().input;
    let t = i.transform();
    // Natively: decode and preprocess every image, then layers [0, split) in batches of
    // `chunk` samples (all at once, or as the host's device cut the guest's call).
    let native = |chunk: usize| {
        let mut batch = Vec::new();
        for k in &keys {
            let bytes = std::fs::read(h.store.join("datasets").join(k)).expect("object");
            batch.extend(preprocess(&bytes, &t).expect("preprocess"));
        }
        let x = tch::Tensor::from_slice(&batch).reshape([keys.len() as i64, 3, 224, 224]);
        let parts: Vec<tch::Tensor> = x
            .split(chunk as i64, 0)
            .iter()
            .map(|part| pkg.run(0..split, part).expect("run"))
            .collect();
        let y = tch::Tensor::cat(&parts, 0);
        hapi_model::tensor::f32_to_le_bytes(&y)
            .expect("bytes")
            .len()
    };
    let reps = 15;
    let rounds = 3;
    let (mut wasm_p50s, mut native_p50s, mut stages) = (Vec::new(), Vec::new(), Vec::new());
    let mut same_p50s = Vec::new();
    // The device may run a call in several batches (adaptation to the fastest batch size
    // measured at the model's first load), where the plain native path runs one: the native
    // loop is also timed in the device's batches, which isolates what the guest adds.
    let before = h.host.device().memory().batches;
    host.invoke(&alice, &fe, inv.clone())
        .await
        .result
        .expect("wasm extraction");
    let cut = (h.host.device().memory().batches - before).max(1) as usize;
    let chunk = keys.len().div_ceil(cut);
    let batches_before = h.host.device().memory().batches;
    for _ in 0..rounds {
        let (mut wasm_t, mut native_t, mut same_t) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..reps + 2 {
            let t0 = Instant::now();
            let done = host.invoke(&alice, &fe, inv.clone()).await;
            let (out, timings) = (done.result, done.timings);
            out.expect("wasm extraction");
            let w = t0.elapsed();
            let t1 = Instant::now();
            native(keys.len());
            let n = t1.elapsed();
            let t2 = Instant::now();
            native(chunk);
            let same = t2.elapsed();
            if r >= 2 {
                wasm_t.push(w);
                native_t.push(n);
                same_t.push(same);
                stages.push(timings);
            }
        }
        wasm_p50s.push(stats(wasm_t).0);
        native_p50s.push(stats(native_t).0);
        same_p50s.push(stats(same_t).0);
    }
    let calls = (rounds * (reps + 2)) as f64;
    let batches_per_call = (h.host.device().memory().batches - batches_before) as f64 / calls;
    let ratios = ratios_of(&wasm_p50s, &native_p50s);
    let (wasm_p50, native_p50) = (stats(wasm_p50s.clone()).0, stats(native_p50s.clone()).0);
    let ratio = median(&ratios);
    let same_ratios = ratios_of(&wasm_p50s, &same_p50s);
    let (same_p50, same_ratio) = (stats(same_p50s.clone()).0, median(&same_ratios));
    let med = |f: &dyn Fn(&hapi_host::wasm::invoke::Timings) -> Duration| {
        stats(stages.iter().map(f).collect()).0
    };
    let (s_inst, s_read, s_guest, s_compute) = (
        med(&|t| t.instantiate),
        med(&|t| t.read),
        med(&|t| t.guest()),
        med(&|t| t.compute),
    );

    // 4. Decode and preprocess per image, timed inside the guest by its own clock (the
    // decode-bench guest: warm-up, then timed rounds into a reused buffer) against the same loop
    // natively. Also the guest's share of a real split-0 invocation of 8 copies of the image
    // (time outside host calls, per image: it adds the fresh instance's memory growth and
    // handing the 600 KB tensor to the host).
    let bencher = h.host.policy().tenants["bencher"].clone();
    let db = h
        .host
        .function("bencher", "decode-bench")
        .expect("decode-bench");
    let decode_cases = decode_objects(&h.store.join("datasets"));
    // Many short rounds, guest and native in turn: this machine's speed drifts over seconds,
    // and a ratio of two loops run far apart measures the drift (the median of per-round
    // ratios does not).
    let (per_call, timed) = (8usize, 10usize);
    let against_fn = against.as_ref().map(|_| {
        h.host
            .function("bencher", "decode-against")
            .expect("decode-against")
    });
    let mut decode_rows = Vec::new();
    for (name, key, bytes) in &decode_cases {
        let bench_inv = InvokeRequest {
            bucket: "datasets".into(),
            keys: vec![key.clone()],
            model: Some(model.into()),
            split: Some(0),
            options: BTreeMap::from([("reps".into(), timed.to_string())]),
            quantize: None,
        };
        // Per round: `p50s` of the guest, of native code, and (`--decode-against`) of the other
        // build.
        let (mut g_round, mut n_round, mut a_round) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..decode_rounds {
            let out = host.invoke(&bencher, &db, bench_inv.clone()).await;
            g_round.push(p50s(&guest_times(
                &out.result.expect("decode-bench invocation").data,
            )));
            if let Some(f) = &against_fn {
                let out = host.invoke(&bencher, f, bench_inv.clone()).await;
                a_round.push(p50s(&guest_times(
                    &out.result.expect("decode-against invocation").data,
                )));
            }
            let mut buf = Vec::with_capacity(4 * t.sample_len());
            for _ in 0..2 {
                native_decode(bytes, &t, &mut buf);
            }
            let native: Vec<[Duration; 2]> = (0..timed)
                .map(|_| native_decode(bytes, &t, &mut buf))
                .collect();
            n_round.push(p50s(&native));
        }
        let ratios = ratios_of(&column(&g_round, 0), &column(&n_round, 0));
        let real = InvokeRequest {
            bucket: "datasets".into(),
            keys: vec![key.clone(); per_call],
            model: Some(model.into()),
            split: Some(0),
            options: BTreeMap::new(),
            quantize: None,
        };
        let mut in_call = Vec::new();
        for r in 0..reps + 2 {
            let done = host.invoke(&alice, &fe, real.clone()).await;
            done.result.expect("split-0 invocation");
            if r >= 2 {
                in_call.push(done.timings.guest() / per_call as u32);
            }
        }
        let part = |k: usize| {
            let (g, n) = (column(&g_round, k), column(&n_round, k));
            let r = median(&ratios_of(&g, &n));
            (stats(g).0, stats(n).0, r)
        };
        decode_rows.push(DecodeRow {
            image: name.clone(),
            guest: stats(column(&g_round, 0)).0,
            native: stats(column(&n_round, 0)).0,
            decode: part(1),
            preprocess: part(2),
            ratio: median(&ratios),
            round_ratios: ratios,
            in_invocation: stats(in_call).0,
            against: against_fn.as_ref().map(|_| Against {
                p50: stats(column(&a_round, 0)).0,
                ratios: ratios_of(&column(&g_round, 0), &column(&a_round, 0)),
                decode_ratios: ratios_of(&column(&g_round, 1), &column(&a_round, 1)),
            }),
        });
    }

    // 3. One HTTP invocation, end to end.
    let body = json!({"bucket": "datasets", "keys": keys, "model": model, "split": split});
    let mut http = Vec::new();
    // Per request: end to end less the server's own total (HTTP, the client and the socket).
    let mut outside = Vec::new();
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
            let server_total = server
                .iter()
                .find(|(n, _)| n == "total")
                .map_or(0.0, |(_, v)| *v);
            outside.push(total.saturating_sub(Duration::from_secs_f64(server_total / 1e3)));
        }
    }
    let (http_p50, _) = stats(http);
    let (outside_p50, _) = stats(outside);

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
    println!(
        "{:<46} {:>12.3}",
        format!("Wasm / native (median of {rounds} rounds)"),
        ratio
    );
    println!("{:<46} {:>12}", "  each round", rounds_line(&ratios));
    println!(
        "{:<46} {:>12.2}",
        "  device batches per Wasm call (native: 1)", batches_per_call
    );
    println!(
        "{:<46} {:>10.2}ms",
        format!("natively in the device's batches of {chunk}, p50"),
        ms(same_p50)
    );
    println!(
        "{:<46} {:>12.3}",
        "Wasm / native in the same batches", same_ratio
    );
    println!("{:<46} {:>12}", "  each round", rounds_line(&same_ratios));
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
        "  HTTP + client (end to end - server total), p50",
        ms(outside_p50)
    );

    println!(
        "\ndecode + preprocess per image (resize {}, crop {}; p50 of {timed}, median of {decode_rounds} rounds' ratios)",
        t.resize, t.crop
    );
    println!(
        "{:<14} {:>10} {:>10} {:>7}  {:<20} {:>14}  {:>22}  {:>22}",
        "image",
        "guest",
        "native",
        "ratio",
        "rounds (min-max)",
        "in invocation",
        "decode g/n us (ratio)",
        "preprocess g/n us (ratio)"
    );
    for row in &decode_rows {
        let part =
            |(g, n, r): (Duration, Duration, f64)| format!("{:.1}/{:.1} ({r:.2})", us(g), us(n));
        println!(
            "{:<14} {:>8.3}ms {:>8.3}ms {:>7.3}  {:<20} {:>12.3}ms  {:>22}  {:>22}",
            row.image,
            ms(row.guest),
            ms(row.native),
            row.ratio,
            range(&row.round_ratios),
            ms(row.in_invocation),
            part(row.decode),
            part(row.preprocess)
        );
    }

    if let Some(path) = &against {
        println!(
            "\nthis build of decode-bench against {} (same rounds, run after it; median of {decode_rounds} rounds' ratios)",
            path.display()
        );
        println!(
            "{:<14} {:>10} {:>10}  {:>14}  {:<12}  {:>14}  {:<12}",
            "image", "against", "this", "this/against", "(min-max)", "decode only", "(min-max)"
        );
        for row in &decode_rows {
            if let Some(a) = &row.against {
                println!(
                    "{:<14} {:>8.3}ms {:>8.3}ms  {:>14.3}  {:<12}  {:>14.3}  {:<12}",
                    row.image,
                    ms(a.p50),
                    ms(row.guest),
                    median(&a.ratios),
                    range(&a.ratios),
                    median(&a.decode_ratios),
                    range(&a.decode_ratios)
                );
            }
        }
    }

    let report = json!({
        "images": keys.len(), "model": model, "split": split, "device": "cpu",
        "empty_pushdown_us": {"p50": us(empty_p50), "p99": us(empty_p99), "n": n_empty},
        "decode_per_image_ms": decode_rows.iter().map(|r| json!({
            "image": r.image, "guest": ms(r.guest), "native": ms(r.native), "ratio": r.ratio,
            "round_ratios": r.round_ratios, "guest_in_invocation": ms(r.in_invocation),
            "decode": {"guest": ms(r.decode.0), "native": ms(r.decode.1), "ratio": r.decode.2},
            "preprocess": {"guest": ms(r.preprocess.0), "native": ms(r.preprocess.1), "ratio": r.preprocess.2},
            "against": r.against.as_ref().map(|a| json!({
                "guest": ms(a.p50), "ratio": median(&a.ratios), "round_ratios": a.ratios,
                "decode_ratio": median(&a.decode_ratios), "decode_round_ratios": a.decode_ratios}))})).collect::<Vec<_>>(),
        "decode_rounds": decode_rounds,
        "decode_against": against.as_ref().map(|p| p.display().to_string()),
        "extraction_ms": {"wasm_p50": ms(wasm_p50), "native_p50": ms(native_p50), "ratio": ratio, "round_ratios": ratios,
            "device_batches_per_call": batches_per_call,
            "native_same_batches_p50": ms(same_p50), "same_batches_chunk": chunk,
            "same_batches_ratio": same_ratio, "same_batches_round_ratios": same_ratios,
            "stages": {"instantiate": ms(s_inst), "read": ms(s_read), "guest_decode": ms(s_guest), "compute": ms(s_compute)}},
        "http_ms": {"p50": ms(http_p50), "outside_server_p50": ms(outside_p50), "server_timing": server.iter().map(|(n, v)| (n.clone(), json!(v))).collect::<serde_json::Map<_, _>>()},
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

//! Features through the Wasm pushdown function equal native extraction.

mod common;

use common::{ALICE, SAMPLES, TestHost, features, guest, raw, sample_key};
use hapi_model::{ModelPackage, models_dir};
use hapi_preprocess::preprocess;
use serde_json::json;

/// The same images, preprocessed and run natively in Rust through the model crate.
fn native(store: &std::path::Path, model: &str, split: usize) -> (Vec<i64>, Vec<f32>) {
    let pkg = ModelPackage::load(&models_dir().join(model), tch::Device::Cpu).expect("package");
    let i = &pkg.manifest().input;
    let t = i.transform();
    let mut batch = Vec::new();
    for s in SAMPLES {
        let bytes = std::fs::read(store.join("datasets").join(sample_key(s))).expect("object");
        batch.extend(preprocess(&bytes, &t).expect("preprocess"));
    }
    let c = i64::from(t.crop);
    let x = tch::Tensor::from_slice(&batch).reshape([SAMPLES.len() as i64, 3, c, c]);
    let y = pkg.run(0..split, &x).expect("native run");
    (y.size(), Vec::try_from(y.view(-1)).expect("values"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_features_equal_native_features_for_first_middle_and_freeze_splits() {
    let h = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    for (model, splits) in [
        ("efficientnet_lite0", [1, 13, 25]),
        ("resnet18", [1, 6, 11]),
    ] {
        for split in splits {
            let resp = h
                .warm(
                    ALICE,
                    "feature-extract",
                    json!({"bucket": "datasets", "keys": keys, "model": model, "split": split}),
                )
                .await;
            let timing = resp
                .headers()
                .get("server-timing")
                .expect("Server-Timing")
                .to_str()
                .expect("ascii")
                .to_string();
            for stage in [
                "read;dur=",
                "decode;dur=",
                "compute;dur=",
                "encode;dur=",
                "total;dur=",
            ] {
                assert!(timing.contains(stage), "{timing}");
            }
            let (shape, wasm) = features(resp).await;
            let (native_shape, native) = native(&h.store, model, split);
            let native_shape: Vec<usize> = native_shape.iter().map(|&d| d as usize).collect();
            assert_eq!(shape, native_shape, "{model} split {split}");
            let diff = wasm
                .iter()
                .zip(&native)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!("{model} split {split}: shape {shape:?}, max |wasm - native| = {diff:e}");
            assert!(diff <= 1e-5, "{model} split {split}: max diff {diff}");
            assert!(
                native.iter().any(|v| *v != 0.0),
                "{model} split {split}: all-zero features prove nothing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_zero_returns_the_preprocessed_images() {
    let h = TestHost::start().await;
    let resp = h
        .warm(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "resnet18", "split": 0}),
        )
        .await;
    let (shape, values) = features(resp).await;
    assert_eq!(shape, [1, 3, 224, 224]);
    let (_, native) = native(&h.store, "resnet18", 0);
    assert_eq!(values[..], native[..values.len()]);
}

/// The guest's preprocessing is the native code's, bit for bit, on every path the resampler
/// takes: RGB photos (PNG, JPEG) reduced by small and large factors, enlarged, a tall portrait
/// whose vertical pass runs first, and grayscale; JPEGs of several shapes. The guest runs its
/// Wasm SIMD kernels (`preprocess/src/resize/simd128.rs`), natively the portable loops run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guests_preprocessing_equals_the_native_code_on_every_resampling_path() {
    use image::{DynamicImage, ImageFormat, RgbImage};
    let h = TestHost::start().await;
    let coffee = image::open(hapi_tests::photos_dir().join("coffee.png"))
        .expect("coffee.png (run `cargo xtask setup`)")
        .to_rgb8();
    // Noise with edges: rounding differences would show.
    let synthetic = |w: u32, h: u32| {
        RgbImage::from_fn(w, h, |x, y| {
            let v = (x * 7919 + y * 104_729) ^ (x * y);
            image::Rgb([
                (v % 251) as u8,
                ((v >> 3) % 253) as u8,
                ((x + 3 * y) % 256) as u8,
            ])
        })
    };
    let encode = |img: DynamicImage, format: ImageFormat| {
        let mut buf = std::io::Cursor::new(Vec::new());
        img.write_to(&mut buf, format).expect("encode");
        buf.into_inner()
    };
    let resized =
        |w, h| image::imageops::resize(&coffee, w, h, image::imageops::FilterType::Triangle);
    let cases = [
        (
            "coffee-600x400.png",
            encode(coffee.clone().into(), ImageFormat::Png),
        ),
        (
            "coffee-500x375.jpg",
            encode(resized(500, 375).into(), ImageFormat::Jpeg),
        ),
        (
            "noise-300x260.png",
            encode(synthetic(300, 260).into(), ImageFormat::Png),
        ),
        (
            "noise-1000x700.png",
            encode(synthetic(1000, 700).into(), ImageFormat::Png),
        ),
        (
            "noise-300x1000.png",
            encode(synthetic(300, 1000).into(), ImageFormat::Png),
        ),
        (
            "noise-100x80.png",
            encode(synthetic(100, 80).into(), ImageFormat::Png),
        ),
        (
            "gray-350x300.png",
            encode(
                DynamicImage::from(synthetic(350, 300)).grayscale(),
                ImageFormat::Png,
            ),
        ),
        // JPEG: zune-jpeg runs its Wasm SIMD kernels in the guest (vendor/zune-jpeg) and its
        // AVX2 ones natively. Noise (every AC coefficient busy), sizes that are no multiple of
        // the 16-pixel MCU (one narrower than 16), and grayscale.
        (
            "noise-301x259.jpg",
            encode(synthetic(301, 259).into(), ImageFormat::Jpeg),
        ),
        (
            "noise-33x200.jpg",
            encode(synthetic(33, 200).into(), ImageFormat::Jpeg),
        ),
        (
            "noise-12x40.jpg",
            encode(synthetic(12, 40).into(), ImageFormat::Jpeg),
        ),
        (
            "gray-350x300.jpg",
            encode(
                DynamicImage::from(synthetic(350, 300)).grayscale(),
                ImageFormat::Jpeg,
            ),
        ),
    ];
    // JPEG as cameras and libjpeg write it (Pillow 13 from the venv): 4:2:0 and 4:2:2 chroma
    // (the upsamplers), restart markers every 5 MCUs and every MCU row (the bit reader's
    // marker path), and progressive (its own decoding loop, then the full IDCT per block).
    let mut cases = cases.to_vec();
    let photo = std::env::temp_dir().join(format!("hapi-invoke-jpeg-{}", std::process::id()));
    std::fs::create_dir_all(&photo).expect("mkdir");
    let source = photo.join("coffee-301x203.png");
    resized(301, 203).save(&source).expect("write PNG");
    for (name, options) in [
        ("pillow-progressive.jpg", r#"{"progressive": true}"#),
        (
            "pillow-restart-5-blocks.jpg",
            r#"{"restart_marker_blocks": 5}"#,
        ),
        (
            "pillow-restart-rows-422.jpg",
            r#"{"restart_marker_rows": 1, "subsampling": 1}"#,
        ),
    ] {
        cases.push((name, pillow_jpeg(&source, &photo.join(name), options)));
    }
    std::fs::remove_dir_all(&photo).expect("clean up");
    let pkg =
        ModelPackage::load(&models_dir().join("resnet18"), tch::Device::Cpu).expect("package");
    let t = pkg.manifest().input.transform();
    for (name, bytes) in &cases {
        let key = format!("fashion-mnist/resize/{name}");
        let path = h.store.join("datasets").join(&key);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, bytes).expect("object");
        let resp = h
            .warm(
                ALICE,
                "feature-extract",
                json!({"bucket": "datasets", "keys": [key], "model": "resnet18", "split": 0}),
            )
            .await;
        let (shape, values) = features(resp).await;
        assert_eq!(shape, [1, 3, 224, 224], "{name}");
        let native = preprocess(bytes, &t).expect("preprocess");
        let differ = values.iter().zip(&native).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "{name}: {differ} of {} values differ",
            native.len()
        );
    }
}

/// The Wasm SIMD kernels in `vendor/zune-jpeg` against the scalar code they stand in for, run
/// by the `kernel-check` guest inside the host (Cranelift's code, as every guest runs them):
/// random blocks, dense and sparse, from a photo's magnitudes to `i32`'s range (where the SIMD
/// code hands over to the scalar one), full and 4x4, into rows of three strides and into
/// buffers too short for them, and random colour conversions, in range and any `i16`. Every
/// output the same, and the SIMD code, not its fallback, ran for most blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vendored_simd_kernels_equal_the_scalar_code_inside_the_host() {
    let h = TestHost::start().await;
    let wasm = std::fs::read(guest("kernel-check")).expect("kernel-check guest");
    let put = h.put_function(ALICE, "kernel-check", wasm).await;
    assert_eq!(put.status(), 201, "{:?}", put.text().await);
    let blocks = 24_000;
    let resp = h
        .invoke(
            ALICE,
            "kernel-check",
            json!({"bucket": "datasets", "keys": [], "options": {"seed": "7", "blocks": blocks.to_string()}}),
        )
        .await;
    let line = String::from_utf8(raw(resp).await).expect("utf-8");
    let count = |key: &str| -> u64 {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    for kernel in ["idct", "idct4x4", "colour"] {
        assert_eq!(count(kernel), blocks, "{line}");
        assert_eq!(count(&format!("{kernel}_differ")), 0, "{line}");
    }
    // The blocks cycle through eight kinds; the first three (a photo's magnitudes) always run
    // the SIMD code, the last two never (beyond i16), the others partly.
    for kernel in ["idct", "idct4x4"] {
        let simd = count(&format!("{kernel}_simd"));
        assert!(
            simd >= blocks * 3 / 8,
            "{kernel}: {simd} of {blocks} on the SIMD path: {line}"
        );
        assert!(
            simd <= blocks * 5 / 8,
            "{kernel}: {simd} of {blocks} on the SIMD path: {line}"
        );
    }
}

/// `source` saved by Pillow (the venv's Python) as a JPEG of quality 90 with
/// the save `options` (JSON) at `dest`; its bytes.
fn pillow_jpeg(source: &std::path::Path, dest: &std::path::Path, options: &str) -> Vec<u8> {
    let python = hapi_tests::python();
    let script = "import json, sys\nfrom PIL import Image\n\
                  Image.open(sys.argv[1]).save(sys.argv[2], 'JPEG', quality=90, **json.loads(sys.argv[3]))";
    let status = std::process::Command::new(python)
        .args(["-c", script])
        .arg(source)
        .arg(dest)
        .arg(options)
        .status()
        .expect("run Pillow");
    assert!(
        status.success(),
        "Pillow could not write {options}: {status}"
    );
    std::fs::read(dest).expect("Pillow's JPEG")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_split_features_stop_at_the_freeze_index_and_without_a_model_the_function_says_so()
 {
    let h = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    let resp = h
        .warm(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": keys, "model": "resnet18"}),
        )
        .await;
    let (shape, wasm) = features(resp).await;
    let pkg =
        ModelPackage::load(&models_dir().join("resnet18"), tch::Device::Cpu).expect("package");
    let freeze = pkg.manifest().freeze_index;
    let (native_shape, native) = native(&h.store, "resnet18", freeze);
    let native_shape: Vec<usize> = native_shape.iter().map(|&d| d as usize).collect();
    assert_eq!(
        shape, native_shape,
        "resnet18 up to its freeze index {freeze}"
    );
    let diff = wasm
        .iter()
        .zip(&native)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 1e-5, "max diff {diff}");

    let resp = h
        .invoke(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": [sample_key(0)], "split": 2}),
        )
        .await;
    let (code, message) = common::error_code(resp, 400).await;
    assert_eq!(code, "bad_request");
    assert!(message.contains("needs `model`"), "{message}");
}

/// `"quantize": "int8"`: the host sends the function's f32 output as int8 with per-channel
/// scales, every value within half a step of the f32 one, in about a quarter of the bytes; a
/// function that answers in another type is refused with a message that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn int8_features_are_the_f32_ones_within_half_a_step_in_a_quarter_of_the_bytes() {
    let h = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    // At split 25 (pooled, [n, 1280]: one scale per sample) and 6 ([n, 40, 28, 28]: one per
    // channel).
    for split in [25, 6] {
        let body = |quantize: bool| {
            let mut b = json!({"bucket": "datasets", "keys": keys,
                               "model": "efficientnet_lite0", "split": split});
            if quantize {
                b["quantize"] = json!("int8");
            }
            b
        };
        let wide = h.warm(ALICE, "feature-extract", body(false)).await;
        assert!(wide.status().is_success(), "{}", wide.status());
        let wide = wide.bytes().await.expect("body");
        let (shape, f32s) = hapi_client::parse_features(&wide).expect("f32 features");
        let resp = h.warm(ALICE, "feature-extract", body(true)).await;
        assert!(resp.status().is_success(), "{}", resp.status());
        let bytes = resp.bytes().await.expect("body");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let t = st.tensor("features").expect("features");
        let s = st.tensor("features_scale").expect("scales");
        assert_eq!(t.dtype(), safetensors::Dtype::I8);
        assert_eq!(s.dtype(), safetensors::Dtype::F32);
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let (n, groups, per_group) = hapi_wire::quantize::groups(&dims).expect("groups");
        assert_eq!(s.shape(), [n as usize, groups as usize]);
        assert_eq!(groups, if split == 25 { 1 } else { shape[1] as u64 });
        let scales: Vec<f32> = s
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // Each group's scale is its largest magnitude over 127.
        for (k, group) in f32s.chunks(per_group as usize).enumerate() {
            let most = group.iter().fold(0.0f32, |m, a| m.max(a.abs()));
            assert_eq!(scales[k], most / 127.0, "split {split}, group {k}");
        }
        let (client_shape, widened) = hapi_client::parse_features(&bytes).expect("widened");
        assert_eq!(client_shape, shape);
        for (k, (a, b)) in f32s.iter().zip(&widened).enumerate() {
            let step = scales[k / per_group as usize];
            assert!(
                (a - b).abs() <= step * 0.5001,
                "split {split}, value {k}: {a} sent as {b} (step {step})"
            );
        }
        println!(
            "int8 at split {split}: {} bytes against {} for f32 ({:.3}x)",
            bytes.len(),
            wide.len(),
            bytes.len() as f64 / wide.len() as f64
        );
        assert!(
            bytes.len() as u64 <= wide.len() as u64 / 4 + 4 * n * groups + 512,
            "{} bytes",
            bytes.len()
        );
    }
    // The function's output must be f32.
    let resp = h
        .invoke(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": keys, "model": "efficientnet_lite0",
                   "split": 25, "options": {"dtype": "f16"}, "quantize": "int8"}),
        )
        .await;
    let (code, message) = common::error_code(resp, 400).await;
    assert_eq!(code, "bad_request");
    assert!(message.contains("applies to f32 outputs"), "{message}");
    let resp = h
        .invoke(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": keys, "quantize": "int4"}),
        )
        .await;
    let (code, message) = common::error_code(resp, 400).await;
    assert_eq!(code, "bad_json");
    assert!(message.contains("`int4`, expected `int8`"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f16_and_bf16_features_are_the_f32_ones_narrowed_on_the_device_in_half_the_bytes() {
    let h = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    let body = |dtype: &str| {
        json!({"bucket": "datasets", "keys": keys, "model": "efficientnet_lite0", "split": 25,
               "options": {"dtype": dtype}})
    };
    let wide = h.warm(ALICE, "feature-extract", body("f32")).await;
    assert!(wide.status().is_success(), "{}", wide.status());
    let wide = wide.bytes().await.expect("body");
    let (shape, f32s) = hapi_client::parse_features(&wide).expect("f32 features");
    assert!(f32s.iter().any(|v| *v != 0.0));
    for (dtype, kind, name) in [
        ("f16", tch::Kind::Half, safetensors::Dtype::F16),
        ("bf16", tch::Kind::BFloat16, safetensors::Dtype::BF16),
    ] {
        let resp = h.warm(ALICE, "feature-extract", body(dtype)).await;
        assert!(resp.status().is_success(), "{dtype}: {}", resp.status());
        let bytes = resp.bytes().await.expect("body");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let t = st.tensor("features").expect("features");
        assert_eq!(t.dtype(), name, "{dtype}");
        let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        assert_eq!(dims, shape, "{dtype}");
        // Exactly the f32 features rounded as libtorch rounds them, two bytes each.
        let narrowed = tch::Tensor::from_slice(&f32s).to_kind(kind);
        let mut expected = vec![0u8; 2 * f32s.len()];
        narrowed.copy_data_u8(&mut expected, f32s.len());
        assert!(
            t.data() == &expected[..],
            "{dtype}: not the f32 features narrowed"
        );
        println!(
            "{dtype}: {} bytes against {} for f32 ({:.3}x)",
            bytes.len(),
            wide.len(),
            bytes.len() as f64 / wide.len() as f64
        );
        assert!(
            bytes.len() * 2 <= wide.len() + 256,
            "{dtype}: {} bytes",
            bytes.len()
        );
        // The client widens them back to what libtorch widens them to.
        let (client_shape, widened) = hapi_client::parse_features(&bytes).expect("widened");
        assert_eq!(client_shape, shape);
        let back: Vec<f32> =
            Vec::try_from(narrowed.to_kind(tch::Kind::Float)).expect("widened by libtorch");
        assert!(
            widened == back,
            "{dtype}: the client widens otherwise than libtorch"
        );
    }
}

//! Features through the Wasm pushdown function equal native extraction.

mod common;

use common::{ALICE, SAMPLES, TestHost, features, sample_key};
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

//! A model imported with `hapi-model import` (an ONNX file of a TensorFlow-style model: NHWC,
//! BGR, 0-255 pixels, squashed, bicubic) served by the host: the pushdown's features equal the
//! native path's, which preprocesses as the package declares.

mod common;

use common::{ALICE, TestHost, features, sample_key};
use hapi_model::{ModelPackage, models_dir};
use hapi_tests::{photos_dir, workspace};
use serde_json::json;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_nhwc_bgr_model_is_served_with_its_declared_preprocessing() {
    let python = std::env::var("HAPI_PYTHON").expect(
        "HAPI_PYTHON is not set: run the tests through `cargo xtask test`, or `source <(cargo xtask env)` first",
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    std::fs::copy(
        workspace().join("model/tests/tinynets.py"),
        d.join("tinynets.py"),
    )
    .expect("copy");
    let models = d.join("models");
    std::fs::create_dir_all(&models).expect("mkdir");
    // The packages the other tenants of the test policy name.
    for m in ["resnet18", "efficientnet_lite0"] {
        std::os::unix::fs::symlink(models_dir().join(m), models.join(m)).expect("link");
    }
    let run = |args: &[&str]| {
        let out = Command::new(&python)
            .args(args)
            .current_dir(d)
            .output()
            .expect("python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "-W",
        "ignore",
        "-c",
        "import tinynets; tinynets.save_onnx_nhwc('tiny.onnx', 32)",
    ]);
    let importer = workspace().join("model/export/import_model.py");
    run(&[
        &importer.to_string_lossy(),
        "tiny.onnx",
        "--name",
        "tiny_onnx",
        "--out",
        "models",
        "--layout",
        "nhwc",
        "--channel-order",
        "bgr",
        "--scale",
        "255",
        "--mean",
        "103.9,116.8,123.7",
        "--std",
        "58.4,57.1,57.4",
        "--resize",
        "squash",
        "--size",
        "40",
        "--crop",
        "32",
        "--interpolation",
        "bicubic",
    ]);

    let store = d.join("store");
    common::write_store(&store);
    let photo = "fashion-mnist/coffee.png";
    std::fs::copy(
        photos_dir().join("coffee.png"),
        store.join("datasets").join(photo),
    )
    .expect("photo");
    let text = common::policy_text(&store, &d.join("state"))
        .replace(
            &format!("models = \"{}\"", models_dir().display()),
            &format!("models = \"{}\"", models.display()),
        )
        .replace(
            r#"models = ["efficientnet_lite0", "resnet18"]"#,
            r#"models = ["efficientnet_lite0", "resnet18", "tiny_onnx"]"#,
        );
    assert!(
        text.contains(&models.display().to_string()),
        "models line replaced"
    );
    let h = TestHost::start_with(tempfile::tempdir().expect("tmp"), store.clone(), text).await;
    let keys = vec![sample_key(0), photo.to_string(), sample_key(1)];
    let split = 4; // through the model's transpose, the stem and the first block
    let resp = h
        .warm(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": keys, "model": "tiny_onnx", "split": split}),
        )
        .await;
    let (shape, wasm) = features(resp).await;

    let pkg = ModelPackage::load(&models.join("tiny_onnx"), tch::Device::Cpu).expect("package");
    let t = pkg.manifest().input.transform();
    let mut batch = Vec::new();
    for k in &keys {
        let bytes = std::fs::read(store.join("datasets").join(k)).expect("object");
        batch.extend(hapi_preprocess::preprocess(&bytes, &t).expect("preprocess"));
    }
    let x = tch::Tensor::from_slice(&batch).reshape([keys.len() as i64, 32, 32, 3]);
    let y = pkg.run(0..split, &x).expect("native");
    let native: Vec<f32> = Vec::try_from(y.contiguous().view(-1)).expect("values");
    let want: Vec<usize> = y.size().iter().map(|&d| d as usize).collect();
    assert_eq!(shape, want);
    assert_eq!(shape, [3, 8, 8, 8]);
    let diff = wasm
        .iter()
        .zip(&native)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff <= 1e-4, "max |wasm - native| = {diff}");
    assert!(native.iter().any(|v| *v != 0.0));
}

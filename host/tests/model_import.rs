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
    let python = hapi_tests::python();
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

/// `from` as a package named `name` in `to`: its layer files linked, its manifest renamed.
fn renamed_package(from: &std::path::Path, to: &std::path::Path, name: &str) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("package") {
        let path = entry.expect("entry").path();
        let file = path.file_name().expect("name");
        if file != "manifest.json" {
            std::os::unix::fs::symlink(&path, to.join(file)).expect("link");
        }
    }
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(from.join("manifest.json")).expect("manifest"))
            .expect("json");
    m["name"] = json!(name);
    std::fs::write(to.join("manifest.json"), m.to_string()).expect("write manifest");
}

async fn model_names(h: &TestHost, token: &str) -> Vec<(String, u64)> {
    let list: serde_json::Value = h
        .client
        .get(format!("{}/v1/models", h.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    list.as_array()
        .expect("array")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().expect("name").to_string(),
                m["layers"].as_u64().expect("layers"),
            )
        })
        .collect()
}

/// Private packages: alice's `mine` (resnet18's layers) and bob's `mine` (EfficientNet-Lite0's)
/// share a name and never meet; no other tenant lists, describes, profiles or loads either,
/// not even by the host's internal id; every usable package's memory model is kept before the
/// first call; a reload serves a new private package and holds back a changed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_models_are_scoped_per_tenant_and_measured_before_serving() {
    use common::{BOB, TIGHT, error_code};
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let (alice_models, bob_models) = (d.join("alice-models"), d.join("bob-models"));
    renamed_package(
        &models_dir().join("resnet18"),
        &alice_models.join("mine"),
        "mine",
    );
    renamed_package(
        &models_dir().join("efficientnet_lite0"),
        &bob_models.join("mine"),
        "mine",
    );
    let store = d.join("store");
    common::write_store(&store);
    let bob_png = "bob/sample.png";
    std::fs::copy(
        store.join("datasets").join(sample_key(0)),
        store.join("secret").join(bob_png),
    )
    .expect("bob's image");
    let state = d.join("state");
    let text = common::policy_text(&store, &state)
        .replace(
            "\n[tenants.alice.functions]",
            &format!(
                "\nprivate_models = \"{}\"\n[tenants.alice.functions]",
                alice_models.display()
            ),
        )
        .replace(
            "\n[tenants.bob.functions]",
            &format!(
                "\nprivate_models = [\"{}\"]\n[tenants.bob.functions]",
                bob_models.display()
            ),
        );
    let h = TestHost::start_with(tmp, store, text).await;

    // Measured before serving: a kept memory model per usable package, none for the rest.
    let kept: Vec<String> = std::fs::read_dir(state.join("memory"))
        .expect("memory models kept")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let count = |prefix: &str| kept.iter().filter(|f| f.starts_with(prefix)).count();
    assert_eq!(count("mine-"), 2, "{kept:?}");
    assert_eq!(count("resnet18-"), 1, "{kept:?}");
    assert_eq!(count("efficientnet_lite0-"), 1, "{kept:?}");
    assert_eq!(kept.len(), 4, "only packages some tenant may use: {kept:?}");

    // Each lists its own `mine`.
    let alice = model_names(&h, ALICE).await;
    assert!(alice.contains(&("mine".into(), 15)), "{alice:?}");
    assert!(
        alice.contains(&("efficientnet_lite0".into(), 26)),
        "{alice:?}"
    );
    let bob = model_names(&h, BOB).await;
    assert_eq!(bob, [("mine".into(), 26), ("resnet18".into(), 15)]);
    assert!(
        !model_names(&h, TIGHT)
            .await
            .iter()
            .any(|(n, _)| n.contains("mine")),
        "tight has no private models"
    );

    // Alice's `mine` is resnet18's weights: the same features.
    let fe = |model: &str, split: u32, keys: &[String], bucket: &str| json!({"bucket": bucket, "keys": keys, "model": model, "split": split});
    let keys = vec![sample_key(0), sample_key(1)];
    let (shape, mine) = features(
        h.warm(ALICE, "feature-extract", fe("mine", 4, &keys, "datasets"))
            .await,
    )
    .await;
    let (shape_r, resnet) = features(
        h.warm(
            ALICE,
            "feature-extract",
            fe("resnet18", 4, &keys, "datasets"),
        )
        .await,
    )
    .await;
    assert_eq!((shape.clone(), mine), (shape_r, resnet));
    assert_eq!(shape, [2, 64, 56, 56]);
    // Bob's `mine` is EfficientNet-Lite0's: its layer-3 output.
    let (shape, _) = features(
        h.warm(
            BOB,
            "feature-extract",
            fe("mine", 3, &[bob_png.to_string()], "secret"),
        )
        .await,
    )
    .await;
    let lite0 = hapi_model::Manifest::load(&bob_models.join("mine")).expect("manifest");
    let want: Vec<usize> = std::iter::once(1)
        .chain(lite0.layers[2].output_shape.iter().map(|&d| d as usize))
        .collect();
    assert_eq!(shape, want);

    // Tight may use neither, by name or by the host's id for alice's.
    for model in ["mine", "alice/mine", "bob/mine"] {
        let (code, message) = error_code(
            h.invoke(TIGHT, "hostile", json!({"bucket": "datasets", "keys": [], "model": "resnet18", "split": 0,
                "options": {"mode": "graph", "graph": format!("{model}[0..1]"), "dims": "1,3,224,224", "bytes": "602112"}}))
                .await,
            422,
        )
        .await;
        assert_eq!(code, "inference_failed", "{message}");
        // An id is not even a graph name; `mine` is not tight's.
        let needle = if model.contains('/') {
            "is not `<model>[a..b]`"
        } else {
            "not one tenant `tight` may use"
        };
        assert!(message.contains(needle), "{model}: {message}");
        let resp = h
            .client
            .get(format!(
                "{}/v1/models/{}/profile",
                h.url,
                model.replace('/', "%2F")
            ))
            .bearer_auth(TIGHT)
            .send()
            .await
            .expect("profile");
        // An id is not a name the API takes (400 bad_name); `mine` is not tight's (404).
        let want = if model.contains('/') { 400 } else { 404 };
        assert_eq!(resp.status().as_u16(), want, "{model}");
    }
    // Nor bob alice's, through feature-extract's `describe` and load.
    let (code, message) = error_code(
        h.invoke(
            BOB,
            "feature-extract",
            fe("alice/mine", 2, &[bob_png.to_string()], "secret"),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(code, "bad_request", "{message}");
    assert!(
        message.contains("not one tenant `bob` may use"),
        "{message}"
    );

    // A reload: bob's new package is measured and served; alice's changed one keeps serving as
    // first read, and the reload says so.
    renamed_package(
        &models_dir().join("alexnet"),
        &bob_models.join("other"),
        "other",
    );
    let manifest = alice_models.join("mine/manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).expect("read")).expect("json");
    m["display_name"] = json!("changed");
    std::fs::write(&manifest, m.to_string()).expect("write");
    let policy = hapi_host::policy::Policy::load(&h.policy_path).expect("policy");
    let host = std::sync::Arc::clone(&h.host);
    let restart = tokio::task::spawn_blocking(move || host.reload(policy))
        .await
        .expect("join")
        .expect("reloaded");
    assert_eq!(
        restart,
        ["model package `alice/mine` (its files changed)".to_string()]
    );
    assert!(
        std::fs::read_dir(state.join("memory"))
            .expect("memory")
            .any(|e| e
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .starts_with("other-")),
        "the new package is measured at the reload"
    );
    let bob = model_names(&h, BOB).await;
    assert!(bob.contains(&("other".into(), 22)), "{bob:?}");
    let (shape, again) = features(
        h.warm(ALICE, "feature-extract", fe("mine", 4, &keys, "datasets"))
            .await,
    )
    .await;
    assert_eq!(shape, [2, 64, 56, 56]);
    assert!(again.iter().any(|v| *v != 0.0));
}

/// A model id that a reload removed and a later reload brings back with another package is
/// not served until a restart: alice's `mine` (resnet18's layers, loaded on the device) goes
/// with her `private_models`, and comes back as EfficientNet-Lite0's layers. The device still
/// held resnet18's weights and its profiles under the id, and the new package was listed and
/// described while those ran: a tenant added again under a removed tenant's name got the
/// removed tenant's weights and profile. The first package back is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_models_id_that_comes_back_with_another_package_is_not_served() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let (first, other) = (d.join("first"), d.join("other"));
    renamed_package(&models_dir().join("resnet18"), &first.join("mine"), "mine");
    renamed_package(
        &models_dir().join("efficientnet_lite0"),
        &other.join("mine"),
        "mine",
    );
    let store = d.join("store");
    common::write_store(&store);
    let state = d.join("state");
    let base = common::policy_text(&store, &state);
    let with = |dir: &std::path::Path| {
        base.replace(
            "\n[tenants.alice.functions]",
            &format!(
                "\nprivate_models = \"{}\"\n[tenants.alice.functions]",
                dir.display()
            ),
        )
    };
    let h = TestHost::start_with(tmp, store, with(&first)).await;
    let body = json!({"bucket": "datasets", "keys": [sample_key(0)], "model": "mine", "split": 4});
    let (shape, _) = features(h.warm(ALICE, "feature-extract", body.clone()).await).await;
    assert_eq!(shape, [1, 64, 56, 56], "resnet18's layers");
    let mine = |names: Vec<(String, u64)>| names.into_iter().find(|(n, _)| n == "mine");
    assert_eq!(
        h.reload(&base).await.expect("reloaded"),
        Vec::<String>::new()
    );
    assert_eq!(mine(model_names(&h, ALICE).await), None);
    let restart = h.reload(&with(&other)).await.expect("reloaded");
    assert_eq!(restart.len(), 1, "{restart:?}");
    assert!(
        restart[0].contains("`alice/mine`") && restart[0].contains("not served until a restart"),
        "{restart:?}"
    );
    assert_eq!(mine(model_names(&h, ALICE).await), None, "not listed");
    let resp = h.invoke(ALICE, "feature-extract", body.clone()).await;
    assert_eq!(resp.status(), 400, "not served");
    // The package it had comes back: served as before.
    assert_eq!(
        h.reload(&with(&first)).await.expect("reloaded"),
        Vec::<String>::new()
    );
    assert_eq!(
        mine(model_names(&h, ALICE).await),
        Some(("mine".into(), 15))
    );
    let (shape, _) = features(h.warm(ALICE, "feature-extract", body).await).await;
    assert_eq!(shape, [1, 64, 56, 56]);
}

/// Tenants' private packages of one name (`mine`: resnet18's layers for even tenants,
/// EfficientNet-Lite0's for odd ones, all 3x224x224 in) are each its tenant's model: with
/// pooling on, calls for the same layers of two of them at the same time are never one batch.
/// They were, keyed by the manifest's name: a batch ran its leader's model on every tenant's
/// images.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_tenants_packages_of_one_name_are_never_pooled() {
    const TENANTS: usize = 6;
    let models = tempfile::tempdir().expect("tmp");
    let (resnet, lite0) = (models.path().join("resnet"), models.path().join("lite0"));
    renamed_package(&models_dir().join("resnet18"), &resnet.join("mine"), "mine");
    renamed_package(
        &models_dir().join("efficientnet_lite0"),
        &lite0.join("mine"),
        "mine",
    );
    // One device worker; batch mates have 100 ms to arrive.
    let host = "pool = true\ndevice_workers = 1\nbatch_window = \"100ms\"\nbatch_time = \"2s\"";
    let h = common::start_tenants(|store, state| {
        common::tenants_policy(store, state, host, TENANTS, &[], |t| {
            let dir = if t % 2 == 0 { &resnet } else { &lite0 };
            format!("private_models = \"{}\"", dir.display())
        })
    })
    .await;
    let keys: Vec<String> = (0..2).map(|i| sample_key(common::SAMPLES[i])).collect();
    let call = |t: usize| {
        let body = json!({"bucket": "datasets", "keys": &keys, "model": "mine", "split": 1});
        let h = &h;
        async move {
            let resp = h
                .warm(&common::tenant_token(t), "feature-extract", body)
                .await;
            let status = resp.status().as_u16();
            assert_eq!(
                status,
                200,
                "t{t}: {}",
                resp.text().await.unwrap_or_default()
            );
            features(resp).await
        }
    };
    // Each alone: what its own model gives.
    let mut alone = Vec::new();
    for t in 0..TENANTS {
        alone.push(call(t).await);
    }
    assert_ne!(alone[0].0, alone[1].0, "two models' layer 1");
    let batches = h.host.device().memory().batches;
    for round in 0..3 {
        let got = futures::future::join_all((0..TENANTS).map(call)).await;
        for (t, got) in got.into_iter().enumerate() {
            assert!(got == alone[t], "round {round}: t{t}'s features changed");
        }
    }
    eprintln!(
        "{} batches, largest {}",
        h.host.device().memory().batches - batches,
        h.host.device().memory().largest_batch
    );
}

/// A tenant's private package whose manifest is a shared model's, byte for byte (bob is not
/// granted the shared `efficientnet_lite0`, so he may name a package so), has a memory model
/// of its own: keyed by the manifest alone, it was the shared model's, measured on whichever
/// package came first (bob's: `bob/...` sorts first) and kept across restarts, so a tenant's
/// package set what every tenant of the shared model is charged by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_package_with_a_shared_manifest_has_a_memory_model_of_its_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let mine = d.join("bob-models/efficientnet_lite0");
    let shared = models_dir().join("efficientnet_lite0");
    std::fs::create_dir_all(&mine).expect("mkdir");
    for entry in std::fs::read_dir(&shared).expect("package") {
        let path = entry.expect("entry").path();
        let file = path.file_name().expect("name");
        if file == "manifest.json" {
            std::fs::copy(&path, mine.join(file)).expect("manifest");
        } else {
            std::os::unix::fs::symlink(&path, mine.join(file)).expect("link");
        }
    }
    let store = d.join("store");
    common::write_store(&store);
    let state = d.join("state");
    let text = common::policy_text(&store, &state).replace(
        "\n[tenants.bob.functions]",
        &format!(
            "\nprivate_models = \"{}\"\n[tenants.bob.functions]",
            d.join("bob-models").display()
        ),
    );
    let _h = TestHost::start_with(tmp, store, text).await;
    let mut kept: Vec<String> = std::fs::read_dir(state.join("memory"))
        .expect("memory models kept")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("efficientnet_lite0-"))
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().any(|f| f.contains("-bob-")), "{kept:?}");
}

/// A package whose layer files change under the same manifest has its memory model measured
/// again: keyed by the manifest alone, the model measured on the old files was kept and used
/// after a restart, and every tenant of the model was charged by it (a package re-exported
/// without touching its manifest, or a tenant's private package with heavier layers).
#[test]
fn a_package_whose_layers_change_is_measured_again() {
    use hapi_host::models::Models;
    use hapi_host::policy::Policy;
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    // A copy of efficientnet_lite0's files, not links: its layers' times are its own.
    let mine = d.join("private/lite");
    std::fs::create_dir_all(&mine).expect("mkdir");
    for entry in std::fs::read_dir(models_dir().join("efficientnet_lite0")).expect("package") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, mine.join(path.file_name().expect("name"))).expect("copy");
    }
    let store = d.join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    let text = common::policy_text(&store, &d.join("state")).replace(
        "\n[tenants.bob.functions]",
        &format!(
            "\nprivate_models = \"{}\"\n[tenants.bob.functions]",
            d.join("private").display()
        ),
    );
    let path = d.join("policy.toml");
    std::fs::write(&path, text).expect("policy");
    let kept = d.join("memory");
    let measure = || {
        let policy = Policy::load(&path).expect("policy");
        let models = Models::open(&policy, tch::Device::Cpu, Some(kept.clone())).expect("models");
        let ids: Vec<String> = models
            .usable(&policy)
            .into_iter()
            .filter(|id| id.starts_with("bob/"))
            .collect();
        assert_eq!(ids, ["bob/efficientnet_lite0"]);
        models.measure_ahead(&ids);
        let mut files: Vec<String> = std::fs::read_dir(&kept)
            .expect("kept")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        files
    };
    let first = measure();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(measure(), first, "unchanged files: the kept model");
    // The same bytes with another modification time: as a re-export that kept the manifest.
    let layer = mine.join("00_conv_stem.pt");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&layer)
        .and_then(|f| f.set_modified(later))
        .expect("touch");
    let after = measure();
    assert_eq!(after.len(), 2, "measured again: {after:?}");
}

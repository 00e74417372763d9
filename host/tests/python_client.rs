//! The Python client (`clients/python`) against a real host: invoke, errors, the PyTorch
//! dataset over DataLoader workers, and hapi-train's seeded subsets.

mod common;

use common::{ALICE, SAMPLES, TestHost, features, sample_key};
use hapi_tests::workspace;
use serde_json::{Value, json};
use std::process::Command;

/// The subset `hapi-train --train-limit` keeps (compute/src/dataset.rs), for comparison.
fn rust_subset(keys: &[String], limit: usize, seed: u64) -> Vec<String> {
    let mut idx: Vec<usize> = (0..keys.len()).collect();
    let mut rng = hapi_data::SplitMix64::new(seed);
    for i in (1..idx.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        idx.swap(i, j);
    }
    let mut keep: Vec<usize> = idx.into_iter().take(limit).collect();
    keep.sort_unstable();
    keep.into_iter().map(|i| keys[i].clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_and_its_dataset_deliver_the_hosts_features() {
    let python = hapi_tests::python();
    let h = TestHost::start().await;
    let keys: Vec<String> = SAMPLES.iter().map(|&i| sample_key(i)).collect();
    // Load the model before Python's first call (its client retries, but the test should not
    // depend on a first load finishing within the retry budget).
    let warm = h
        .warm(
            ALICE,
            "feature-extract",
            json!({"bucket": "datasets", "keys": keys, "model": "resnet18", "split": 2}),
        )
        .await;
    let (shape, direct) = features(warm).await;

    let tmp = tempfile::tempdir().expect("tempdir");
    let spec = tmp.path().join("spec.json");
    let body = json!({
        "bucket": "datasets",
        "keys": keys,
        "missing": "fashion-mnist/test/00_tshirt_top/none.png",
        "corrupt": "fashion-mnist/corrupt.png",
        "root": "fashion-mnist/test",
    });
    std::fs::write(&spec, body.to_string()).expect("spec");
    let (url, out) = (h.url.clone(), tmp.path().to_path_buf());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(workspace().join("clients/python/tests/check_client.py"))
            .arg(&url)
            .arg(ALICE)
            .arg(&spec)
            .arg(&out)
            .env("PYTHONPATH", workspace().join("clients/python"))
            .output()
            .expect("running python")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "check_client.py failed:\n{stderr}");
    let found: Value = serde_json::from_slice(
        output
            .stdout
            .split(|&b| b == b'\n')
            .rfind(|l| !l.is_empty())
            .expect("a JSON line"),
    )
    .expect("JSON findings");
    println!("{found:#}");

    assert_eq!(found["healthy"], true);
    assert!(
        found["models"]
            .as_array()
            .expect("models")
            .contains(&json!("resnet18"))
    );
    assert!(
        found["functions"]
            .as_array()
            .expect("functions")
            .contains(&json!("feature-extract"))
    );
    assert_eq!(found["shape"], json!(shape));
    assert_eq!(found["int8_dtype"], "torch.float32", "{found}");
    assert_eq!(found["int8_within_half_a_step"], true, "{found}");
    assert_eq!(found["metadata"]["model"], "resnet18");
    assert_eq!(found["metadata"]["split"], "2");
    assert_eq!(found["metadata"]["function"], "feature-extract");
    for stage in ["compute", "decode", "total"] {
        assert!(
            found["timing_stages"]
                .as_array()
                .expect("stages")
                .contains(&json!(stage)),
            "{stage}"
        );
    }
    // The client's tensor is the host's, bit for bit.
    let bytes = std::fs::read(tmp.path().join("features.safetensors")).expect("features");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let t = st.tensor("features").expect("tensor");
    let py: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(py, direct);

    assert_eq!(
        found["missing"],
        json!({"status": 404, "code": "object_not_found", "key": "fashion-mnist/test/00_tshirt_top/none.png"})
    );
    assert_eq!(found["bad_option"]["status"], 400);
    assert_eq!(found["bad_option"]["code"], "bad_request");
    let n = keys.len();
    assert_eq!(found["dataset_labels"], json!((0..n).collect::<Vec<_>>()));
    assert_eq!(
        found["dataset_equal"], true,
        "dataset rows differ from the invocation's"
    );
    assert_eq!(found["skip_bad_labels"], json!((0..n).collect::<Vec<_>>()));
    let warnings = found["skip_bad_warnings"].to_string();
    assert!(warnings.contains("fashion-mnist/corrupt.png"), "{warnings}");
    assert_eq!(
        found["strict"],
        json!({"code": "bad_object", "key": "fashion-mnist/corrupt.png"})
    );

    let mut listed = keys.clone();
    // samples_from_keys: sorted by class, then by key within a class.
    listed.sort_by_key(|k| (k.split('/').nth(2).map(str::to_string), k.clone()));
    assert_eq!(found["listed"], json!(listed));
    assert_eq!(found["subset"], json!(rust_subset(&listed, 3, 0)));
}

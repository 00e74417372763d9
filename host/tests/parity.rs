//! Parity with PyTorch: EfficientNet-Lite0 features and classes from the storage tier (the
//! Wasm guest's preprocessing and the package's layers, through the host) against torchvision's
//! preprocessing and the original PyTorch module, on real photos.

mod common;

use common::{ALICE, TestHost, features};
use hapi_tests::{photos_dir, workspace};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |best, (i, &x)| if x > best.1 { (i, x) } else { best },
        )
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lite0_features_and_classes_match_pytorch_on_real_photos() {
    let python = hapi_tests::python();
    // scikit-image's photos: PNG and JPEG; the 16-bit chessboard is left out (Pillow keeps
    // its high byte when converting, a different image).
    let mut photos: Vec<PathBuf> = std::fs::read_dir(photos_dir())
        .expect("photos (run `cargo xtask setup`)")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg"))
        .filter(|p| !p.ends_with("chessboard_RGB.png"))
        .collect();
    photos.sort();
    assert!(photos.len() >= 20, "{} photos", photos.len());

    let tmp = tempfile::tempdir().expect("tmp");
    let jobs = tmp.path().join("jobs.json");
    std::fs::write(&jobs, serde_json::to_vec(&photos).expect("json")).expect("jobs");
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    let reference = {
        let (jobs, out) = (jobs.clone(), out.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(python)
                .arg(workspace().join("tests/python/lite0_reference.py"))
                .arg(&jobs)
                .arg(&out)
                .output()
                .expect("python")
        })
    };

    let h = TestHost::start().await;
    let keys: Vec<String> = photos
        .iter()
        .map(|p| {
            let name = p.file_name().expect("name").to_string_lossy();
            let key = format!("fashion-mnist/photos/{name}");
            let dst = h.store.join("datasets").join(&key);
            std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
            std::fs::copy(p, dst).expect("copy");
            key
        })
        .collect();
    // Up to the freeze index (the features a head trains on), then through the classifier.
    let mut host_features = Vec::new();
    let mut host_logits = Vec::new();
    for chunk in keys.chunks(4) {
        let body = json!({"bucket": "datasets", "keys": chunk, "model": "efficientnet_lite0"});
        let (shape, f) = features(h.warm(ALICE, "feature-extract", body).await).await;
        assert_eq!(shape, [chunk.len(), 1280]);
        host_features.extend(f.chunks_exact(1280).map(<[f32]>::to_vec));
        let body = json!({"bucket": "datasets", "keys": chunk, "model": "efficientnet_lite0", "split": 26});
        let (shape, l) = features(h.warm(ALICE, "feature-extract", body).await).await;
        assert_eq!(shape, [chunk.len(), 1000]);
        host_logits.extend(l.chunks_exact(1000).map(<[f32]>::to_vec));
    }

    let done = reference.await.expect("join");
    assert!(
        done.status.success(),
        "lite0_reference.py failed:\n{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let mut worst = (1.0f64, String::new());
    let mut agree = 0;
    for (i, p) in photos.iter().enumerate() {
        let name = p.file_name().expect("name").to_string_lossy().into_owned();
        let want = f32s(&std::fs::read(out.join(format!("{i}.features.bin"))).expect("features"));
        let logits = f32s(&std::fs::read(out.join(format!("{i}.logits.bin"))).expect("logits"));
        let c = cosine(&host_features[i], &want);
        let (ours, theirs) = (argmax(&host_logits[i]), argmax(&logits));
        println!("{name:<28} cosine {c:.7}  top-1 {ours} / {theirs}");
        if c < worst.0 {
            worst = (c, name.clone());
        }
        assert!(c >= 0.9999, "{name}: cosine similarity {c} < 0.9999");
        assert_eq!(ours, theirs, "{name}: top-1 class differs");
        agree += 1;
    }
    println!(
        "{} photos: minimum cosine {:.7} ({}), top-1 agrees on {agree}",
        photos.len(),
        worst.0,
        worst.1
    );
}

//! Helpers shared by this package's integration tests (each test binary uses a part).
#![allow(dead_code)]

use hapi_tests::workspace;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The operator's token: the tests read /metrics with it.
pub const OPERATOR: &str = "operator-token";

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The `hapi-host` binary, built by cargo (another package's binary is not in
/// `CARGO_BIN_EXE_*`); its path comes from cargo's own build report.
pub fn host_binary() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let out = Command::new(cargo())
            .args([
                "build",
                "--package",
                "hapi-host",
                "--bin",
                "hapi-host",
                "--message-format=json",
            ])
            .current_dir(workspace())
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo build -p hapi-host");
        assert!(out.status.success(), "building hapi-host failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"]["name"] == "hapi-host")
            .find_map(|v| v["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported the hapi-host executable")
    })
}

pub fn losses(results: &Value) -> Vec<f64> {
    results["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .flat_map(|e| e["step_losses"].as_array().expect("losses").clone())
        .map(|v| v.as_f64().expect("f64"))
        .collect()
}

pub fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "different step counts");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The longest and the median interval between iteration ends of a run's first epoch, in
/// seconds: how long a failure held training up against its usual pace.
pub fn stall(results: &Value) -> (f64, f64) {
    let ends: Vec<f64> = results["epochs"][0]["trace"]
        .as_array()
        .expect("trace")
        .iter()
        .map(|i| i["end_unix"].as_f64().expect("end"))
        .collect();
    let mut gaps: Vec<f64> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_by(f64::total_cmp);
    (
        gaps.last().copied().unwrap_or(0.0),
        gaps.get(gaps.len() / 2).copied().unwrap_or(0.0),
    )
}

pub fn invocations(url: &str) -> u64 {
    let Ok(text) = http_get(url, "/metrics") else {
        return 0;
    };
    text.lines()
        .filter(|l| l.starts_with("hapi_invocations_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

pub fn http_get(url: &str, path: &str) -> std::io::Result<String> {
    http_get_as(url, path, OPERATOR)
}

/// `GET path` on `url` with bearer `token`: the whole response, headers and body.
pub fn http_get_as(url: &str, path: &str, token: &str) -> std::io::Result<String> {
    let addr = url.trim_start_matches("http://");
    hapi_tests::cluster::http(addr, "GET", path, Some(token), b"")
}

/// The first `train` + `test` Fashion-MNIST test-split images as PNG objects in ImageFolder
/// layout under `fashion-mnist/{train,test}/<class>/`: (key, bytes).
pub fn fashion_objects(train: usize, test: usize) -> Vec<(String, Vec<u8>)> {
    let src = std::env::var_os("HAPI_FASHION_MNIST").map_or_else(
        || PathBuf::from(hapi_data::fashion_mnist::DEFAULT_SOURCE),
        PathBuf::from,
    );
    let data = hapi_data::fashion_mnist::read_split(&src, "t10k")
        .expect("Fashion-MNIST (run `cargo xtask setup`)");
    let prefix = object_store::path::Path::from("fashion-mnist");
    (0..train + test)
        .map(|i| {
            let split = if i < train { "train" } else { "test" };
            let key = hapi_data::fashion_mnist::key(&prefix, split, data.labels[i], i).to_string();
            let png = hapi_data::fashion_mnist::encode_png(data.image(i), 28, 28).expect("png");
            (key, png)
        })
        .collect()
}

/// The `trainer` tenant's tables: token `token`, EfficientNet-Lite0 on `datasets/fashion-mnist/`,
/// the `feature-extract` guest built from source.
pub fn trainer_tenant(token: &str) -> String {
    format!(
        r#"[tenants.trainer]
token_sha256 = "{}"
grants = [{{ bucket = "datasets", prefix = "fashion-mnist/" }}]
models = ["efficientnet_lite0"]
memory = "1GiB"
timeout = "60s"
concurrency = 8
[tenants.trainer.functions]
feature-extract = "{}"
"#,
        hapi_host::policy::hash_token(token),
        hapi_tests::guest("feature-extract").display(),
    )
}

//! `cargo xtask eval-sweep` and `eval-dtype`. eval-sweep: a sweep of heads (learning rates) on
//! the same data through the feature store. Job 1 extracts through the storage tier and stores the features; jobs 2-N
//! train from the store. Each later job is run a second time without the store, to show it
//! trains exactly as it would have: same step losses, same accuracy.

use crate::jobs::{self, TOKEN};
use crate::setup;
use crate::sh;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Options {
    model: String,
    train: String,
    test: String,
    epochs: String,
    lrs: Vec<String>,
}

/// `o` with `args` applied; `--lrs` is known only to `eval-sweep` (its default in `o.lrs`).
fn options(command: &str, args: &[String], mut o: Options) -> Result<Options, String> {
    let sweep = !o.lrs.is_empty();
    let mut lrs = o.lrs.join(",");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let slot = match a.as_str() {
            "--model" => &mut o.model,
            "--train-limit" => &mut o.train,
            "--test-limit" => &mut o.test,
            "--epochs" => &mut o.epochs,
            "--lrs" if sweep => &mut lrs,
            other => {
                return Err(format!(
                    "unknown option `{other}` for `{command}` (known: --model M, --train-limit N, --test-limit N, --epochs N{})",
                    if sweep { ", --lrs A,B,..." } else { "" }
                ));
            }
        };
        *slot = it.next().ok_or(format!("{a} needs a value"))?.clone();
    }
    if sweep {
        o.lrs = lrs.split(',').map(|s| s.trim().to_string()).collect();
        if o.lrs.len() < 2 || o.lrs.iter().any(|l| l.parse::<f64>().is_err()) {
            return Err(format!(
                "--lrs `{lrs}`: at least two learning rates, comma-separated"
            ));
        }
    }
    Ok(o)
}

fn defaults(train: &str, test: &str, epochs: &str, lrs: &[&str]) -> Options {
    Options {
        model: "efficientnet_lite0".into(),
        train: train.into(),
        test: test.into(),
        epochs: epochs.into(),
        lrs: lrs.iter().map(|l| l.to_string()).collect(),
    }
}

/// One hapi-train run: its results and its wall time (the whole process: model load, listing,
/// extraction or the store, training, evaluation).
fn train(bins: &Path, args: &[&str], out: &Path, env: &setup::Env) -> Result<(Value, f64), String> {
    let started = Instant::now();
    sh::run(
        Command::new(bins.join("hapi-train"))
            .args(args)
            .arg("--out")
            .arg(out)
            .envs(env.vars()),
    )?;
    let wall = started.elapsed().as_secs_f64();
    let text = std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let v: Value = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok((v, wall))
}

fn losses(r: &Value) -> Vec<f64> {
    r["epochs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["step_losses"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_f64())
        .collect()
}

fn accuracy(r: &Value) -> f64 {
    r["epochs"]
        .as_array()
        .and_then(|e| e.last())
        .and_then(|e| e["test_accuracy"].as_f64())
        .unwrap_or(f64::NAN)
}

/// Writes `out/summary.json` and says where.
fn write_summary(out: &Path, doc: Value) -> Result<(), String> {
    let summary = out.join("summary.json");
    let text = serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&summary, text).map_err(|e| format!("{}: {e}", summary.display()))?;
    println!("summary: {}", summary.display());
    Ok(())
}

/// `rel` under the workspace, emptied.
fn fresh_dir(env: &setup::Env, rel: &str) -> Result<PathBuf, String> {
    let out = env.workspace.join(rel);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// Fashion-MNIST in the local store (`data/store`), and a `hapi-host` serving `model` from it
/// with its policy and state under `out` (`pool = false`: device batches from each call alone).
/// Returns the host and the store's path.
fn fashion_mnist_host(
    env: &setup::Env,
    bins: &Path,
    out: &Path,
    model: &str,
    pool: bool,
) -> Result<(jobs::HostProcess, String), String> {
    let store = env.workspace.join("data/store");
    jobs::load_fashion_mnist(env, bins, &store)?;
    let mut text = jobs::policy(
        env,
        &store.display().to_string(),
        "",
        &out.join("host-state"),
        &jobs::token_hash(bins)?,
        &format!("\"{model}\""),
        "fashion-mnist",
    );
    if !pool {
        text = text.replace("device = \"auto\"\n", "device = \"auto\"\npool = false\n");
    }
    let policy_path = out.join("policy.toml");
    std::fs::write(&policy_path, text).map_err(|e| format!("{}: {e}", policy_path.display()))?;
    let mut cmd = Command::new(bins.join("hapi-host"));
    cmd.args(["serve", "--policy"])
        .arg(&policy_path)
        .envs(env.vars());
    Ok((jobs::start_host(cmd)?, store.display().to_string()))
}

/// The hapi-train arguments both evaluations share (`--split freeze`, batch 32).
fn common_args(url: &str, store: &str, o: &Options) -> Vec<String> {
    [
        "--host",
        url,
        "--token",
        TOKEN,
        "--store",
        store,
        "--bucket",
        "datasets",
        "--prefix",
        "fashion-mnist",
        "--model",
        &o.model,
        "--batch",
        "32",
        "--split",
        "freeze",
        "--train-limit",
        &o.train,
        "--test-limit",
        &o.test,
        "--epochs",
        &o.epochs,
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = options(
        "eval-sweep",
        args,
        defaults("2000", "500", "3", &["0.0003", "0.001", "0.003", "0.01"]),
    )?;
    let env = setup::run()?;
    let bins = jobs::build(&env)?;
    let out = fresh_dir(&env, "target/eval-sweep")?;
    let features = out.join("features");
    // Device batches from each call alone: jobs compared loss for loss must see the same
    // batches, not those that timing made (libtorch rounds differently per batch size).
    let (host, store) = fashion_mnist_host(&env, &bins, &out, &o.model, false)?;
    let features_s = features.display().to_string();
    let common = common_args(&host.url, &store, &o);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let mut rows = Vec::new();
    let mut first_s = f64::NAN;
    for (i, lr) in o.lrs.iter().enumerate() {
        sh::step(&format!("job {}: lr {lr}, with the feature store", i + 1));
        let mut a = common.clone();
        a.extend(["--lr", lr, "--feature-store", &features_s]);
        let (stored, wall) = train(&bins, &a, &out.join(format!("job{}.json", i + 1)), &env)?;
        if i == 0 {
            first_s = wall;
        }
        let mut row = json!({
            "job": i + 1,
            "lr": lr.parse::<f64>().unwrap_or(f64::NAN),
            "wall_s": wall,
            "speedup_vs_job1": first_s / wall,
            "epochs_without_extraction": stored["epochs"].as_array().map_or(0, |e| e.iter().filter(|e| e["from_cache"] == true).count()),
            "bytes_received": stored["epochs"].as_array().map_or(0, |e| e.iter().filter_map(|e| e["bytes_received"].as_u64()).sum::<u64>()),
            "test_accuracy": accuracy(&stored),
        });
        if i > 0 {
            sh::step(&format!(
                "job {}: lr {lr}, without the store (the reference)",
                i + 1
            ));
            let mut a = common.clone();
            a.extend(["--lr", lr, "--cache-features"]);
            let (plain, plain_wall) = train(
                &bins,
                &a,
                &out.join(format!("job{}-plain.json", i + 1)),
                &env,
            )?;
            let (x, y) = (losses(&stored), losses(&plain));
            let diff = if x.len() == y.len() {
                x.iter()
                    .zip(&y)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max)
            } else {
                f64::INFINITY
            };
            row["plain_wall_s"] = json!(plain_wall);
            row["max_loss_diff_vs_plain"] = json!(diff);
            row["plain_test_accuracy"] = json!(accuracy(&plain));
        }
        rows.push(row);
    }
    drop(host);
    println!(
        "\nsweep of {} heads: {}, {} train / {} test Fashion-MNIST, {} epochs, --split freeze",
        rows.len(),
        o.model,
        o.train,
        o.test,
        o.epochs
    );
    println!(
        "  job  lr       wall s  vs job 1  no extraction  MB received  test acc  max |loss diff| without store"
    );
    for r in &rows {
        println!(
            "  {:>3}  {:<7}  {:>6.1}  {:>7.1}x  {:>13}  {:>11.1}  {:>7.2}%  {}",
            r["job"].to_string(),
            r["lr"].to_string(),
            r["wall_s"].as_f64().unwrap_or(f64::NAN),
            r["speedup_vs_job1"].as_f64().unwrap_or(f64::NAN),
            format!("{}/{}", r["epochs_without_extraction"], o.epochs),
            r["bytes_received"].as_u64().unwrap_or(0) as f64 / 1e6,
            r["test_accuracy"].as_f64().unwrap_or(f64::NAN) * 100.0,
            r["max_loss_diff_vs_plain"]
                .as_f64()
                .map_or("-".to_string(), |d| format!("{d:.1e}")),
        );
    }
    write_summary(
        &out,
        json!({"model": o.model, "train": o.train, "test": o.test, "epochs": o.epochs, "jobs": rows}),
    )
}

/// `cargo xtask eval-dtype`: the same linear probe (EfficientNet-Lite0's frozen layers pushed
/// down, a new classifier trained) with features sent as f32, f16, bf16 and int8: bytes per
/// sample on the network and test accuracy.
pub fn dtype(args: &[String]) -> Result<(), String> {
    let o = options("eval-dtype", args, defaults("5000", "2000", "10", &[]))?;
    let env = setup::run()?;
    let bins = jobs::build(&env)?;
    let out = fresh_dir(&env, "target/eval-dtype")?;
    let (host, store) = fashion_mnist_host(&env, &bins, &out, &o.model, true)?;
    let common = common_args(&host.url, &store, &o);
    let mut rows = Vec::new();
    for dtype in ["f32", "f16", "bf16", "int8"] {
        sh::step(&format!("--wire-dtype {dtype}"));
        let mut args: Vec<&str> = common.iter().map(String::as_str).collect();
        args.extend(["--cache-features", "--wire-dtype", dtype]);
        let (r, wall) = train(&bins, &args, &out.join(format!("{dtype}.json")), &env)?;
        let first = &r["epochs"][0];
        let bytes = first["bytes_received"].as_u64().unwrap_or(0);
        let samples = first["samples"].as_u64().unwrap_or(0).max(1);
        rows.push(json!({
            "dtype": dtype,
            "bytes_per_sample": bytes as f64 / samples as f64,
            "epoch1_s": first["wall_s"],
            "wall_s": wall,
            "test_accuracy": accuracy(&r),
        }));
    }
    drop(host);
    let base_bytes = rows[0]["bytes_per_sample"].as_f64().unwrap_or(f64::NAN);
    let base_acc = rows[0]["test_accuracy"].as_f64().unwrap_or(f64::NAN);
    println!(
        "\nwire dtypes: {}, {} train / {} test Fashion-MNIST, {} epochs, --split freeze",
        o.model, o.train, o.test, o.epochs
    );
    println!("  dtype  bytes/sample  vs f32  epoch 1 s  test acc  vs f32 (points)");
    for r in &mut rows {
        let b = r["bytes_per_sample"].as_f64().unwrap_or(f64::NAN);
        let a = r["test_accuracy"].as_f64().unwrap_or(f64::NAN);
        r["bytes_vs_f32"] = json!(b / base_bytes);
        r["accuracy_points_vs_f32"] = json!((a - base_acc) * 100.0);
        println!(
            "  {:<5}  {:>12.1}  {:>5.3}x  {:>9.1}  {:>7.2}%  {:+.2}",
            r["dtype"].as_str().unwrap_or("?"),
            b,
            b / base_bytes,
            r["epoch1_s"].as_f64().unwrap_or(f64::NAN),
            a * 100.0,
            (a - base_acc) * 100.0
        );
    }
    write_summary(
        &out,
        json!({"model": o.model, "train": o.train, "test": o.test, "epochs": o.epochs, "dtypes": rows}),
    )
}

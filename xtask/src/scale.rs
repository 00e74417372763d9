//! `cargo xtask eval-scale`: the trainer pulling features through 1, 2, .. N storage nodes,
//! each behind its own shaped link; aggregate samples/s, scaling efficiency, bytes on each
//! link, and a bottleneck model fed with these measurements for 10, 100 and 1,000 nodes.

use crate::jobs::{self, TOKEN};
use crate::setup::{self, Env};
use crate::sh;
use hapi_tests::cluster::{self, Cluster, EVAL};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: cargo xtask eval-scale [--nodes N] [--link MBIT] [--samples N] [--model M] [--split S] [--compute-link-gbit G]";

struct Options {
    nodes: usize,
    link: u32,
    samples: usize,
    model: String,
    split: String,
    compute_link_gbit: f64,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        nodes: 4,
        link: 16,
        samples: 256,
        model: "efficientnet_lite0".into(),
        split: "0".into(),
        compute_link_gbit: 25.0,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))?;
        let bad = || format!("{a} {v}: not a number\n{USAGE}");
        match a.as_str() {
            "--nodes" => o.nodes = v.parse().map_err(|_| bad())?,
            "--link" => o.link = v.parse().map_err(|_| bad())?,
            "--samples" => o.samples = v.parse().map_err(|_| bad())?,
            "--model" => o.model = v.clone(),
            "--split" => o.split = v.clone(),
            "--compute-link-gbit" => o.compute_link_gbit = v.parse().map_err(|_| bad())?,
            other => return Err(format!("unknown option `{other}`\n{USAGE}")),
        }
    }
    if o.nodes == 0 || o.nodes > cluster::MAX_NODES || o.samples < 16 || o.link == 0 {
        return Err(format!(
            "--nodes 1..{}, --samples >= 16, --link > 0\n{USAGE}",
            cluster::MAX_NODES
        ));
    }
    Ok(o)
}

/// One node count's run.
struct Point {
    nodes: usize,
    /// Hosts read replicas from their own volume servers and the trainer routes by placement.
    locality: bool,
    samples: usize,
    wall_s: f64,
    compute_stage_s: f64,
    iterations: usize,
    features_bytes: u64,
    /// Bytes through the storage nodes' links during the run, all nodes: into them, out.
    link_in: u64,
    link_out: u64,
    per_node_out: Vec<u64>,
}

impl Point {
    fn rate(&self) -> f64 {
        self.samples as f64 / self.wall_s
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let o = options(args)?;
    if let Some(why) = cluster::unavailable() {
        return Err(format!("eval-scale: {why}"));
    }
    let env = setup::run()?;
    let bins = jobs::build(&env)?;
    let out = env.workspace.join("target/eval-scale");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = std::env::temp_dir().join("hapi-eval-scale");
    let mut points = Vec::new();
    let mut metadata_rate = 0.0;
    let started = Instant::now();
    for (n, locality) in (1..=o.nodes).flat_map(|n| [(n, false), (n, true)]) {
        sh::step(&format!(
            "{n} storage node(s), {} Mbit/s each, {} ({:.0} s so far)",
            o.link,
            if locality {
                "with locality"
            } else {
                "through the S3 gateway"
            },
            started.elapsed().as_secs_f64()
        ));
        let mut c = start(&env, &bins, &work, n, &o.model, locality)?;
        // Loaded unshaped (the links under test carry the job, not the set-up).
        load(&env, &bins, &c, o.samples)?;
        if n == o.nodes && !locality {
            metadata_rate = probe_metadata(&c)?;
            println!(
                "  metadata path: {metadata_rate:.0} lookups/s (HEAD through the filer, 8 clients)"
            );
        }
        c.shape_storage(Some(o.link))?;
        let p = measure(&env, &bins, &c, &o, &out, locality)?;
        println!(
            "  {:.2} samples/s, epoch {:.1} s, {:.0} KB of features per sample, {:.0} KB out of the storage nodes per sample",
            p.rate(),
            p.wall_s,
            p.features_bytes as f64 / p.samples as f64 / 1e3,
            p.link_out as f64 / p.samples as f64 / 1e3
        );
        points.push(p);
        drop(c);
    }
    report(&o, &points, metadata_rate, &out)?;
    println!("eval-scale took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn start(
    env: &Env,
    bins: &Path,
    work: &Path,
    n: usize,
    model: &str,
    locality: bool,
) -> Result<Cluster, String> {
    // The compute node's link is not under test: unshaped (the model takes a real one).
    let mut config = crate::cluster::demo_config(
        env,
        bins,
        EVAL,
        n,
        work.to_path_buf(),
        &format!("\"{model}\""),
        "photos",
    )?;
    config.locality = locality;
    config.host_env.push(("OMP_NUM_THREADS".into(), "1".into()));
    let c = Cluster::start(&config)?;
    c.create_bucket("datasets")?;
    Ok(c)
}

/// ImageNet-like JPEG photos (about 100 KB each) into s3://datasets/photos.
fn load(env: &Env, bins: &Path, c: &Cluster, samples: usize) -> Result<(), String> {
    // hapi-data keeps one photo in ten for the test split.
    let count = (samples * 10 / 9 + 16).to_string();
    sh::output(
        Command::new(bins.join("hapi-data"))
            .args([
                "--store", "s3://", "--bucket", "datasets", "photos", "--prefix", "photos",
                "--photos",
            ])
            .arg(&env.photos)
            .args(["--count", &count])
            .envs(env.vars())
            .envs(c.s3_env()),
    )
    .map(|_| ())
}

fn measure(
    env: &Env,
    bins: &Path,
    c: &Cluster,
    o: &Options,
    out: &Path,
    locality: bool,
) -> Result<Point, String> {
    let n = c.nodes.len();
    let file = out.join(format!(
        "nodes-{n}{}.json",
        if locality { "-locality" } else { "" }
    ));
    let before: Vec<(u64, u64)> = (0..n).map(|i| c.link_bytes(i)).collect::<Result<_, _>>()?;
    let mut cmd = cluster::in_namespace(&c.network.compute(), bins.join("hapi-train"));
    for node in &c.nodes {
        cmd.args(["--host", &node.host_url]);
    }
    cmd.args([
        "--token", TOKEN, "--store", "s3://", "--bucket", "datasets", "--prefix", "photos",
    ])
    .args(["--model", &o.model, "--split", &o.split, "--batch", "16"])
    .args(["--request-size", "4", "--in-flight", "4", "--prefetch", "2"])
    .args([
        "--train-limit",
        &o.samples.to_string(),
        "--epochs",
        "1",
        "--no-test",
    ])
    .args(["--quiet", "--device", "cpu", "--out"])
    .arg(&file)
    .envs(env.vars())
    .envs(c.tenant_s3_env());
    if locality {
        cmd.arg("--locality");
    }
    sh::output(&mut cmd)?;
    let after: Vec<(u64, u64)> = (0..n).map(|i| c.link_bytes(i)).collect::<Result<_, _>>()?;
    let r: Value = serde_json::from_slice(
        &std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?,
    )
    .map_err(|e| format!("{}: {e}", file.display()))?;
    let e = &r["epochs"][0];
    let num = |k: &str| e[k].as_f64().ok_or(format!("{}: no `{k}`", file.display()));
    let per_node_out: Vec<u64> = before.iter().zip(&after).map(|(b, a)| a.1 - b.1).collect();
    Ok(Point {
        nodes: n,
        locality,
        samples: num("samples")? as usize,
        wall_s: num("wall_s")?,
        compute_stage_s: num("compute_stage_s")?,
        iterations: num("iterations")? as usize,
        features_bytes: num("bytes_received")? as u64,
        link_in: before.iter().zip(&after).map(|(b, a)| a.0 - b.0).sum(),
        link_out: per_node_out.iter().sum(),
        per_node_out,
    })
}

/// Metadata lookups per second the store's front end answers: HEADs of stored objects through
/// the filer (no object bytes move), from 8 keep-alive clients for 3 s.
fn probe_metadata(c: &Cluster) -> Result<f64, String> {
    let filer = format!("{}:8888", c.meta_addr);
    let keys = list(&filer, "/buckets/datasets/photos/", 2)?;
    if keys.is_empty() {
        return Err("the metadata probe found no objects under photos/".into());
    }
    let keys = std::sync::Arc::new(keys);
    let stop = Instant::now() + Duration::from_secs(3);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (keys, filer) = (keys.clone(), filer.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let s =
                    std::net::TcpStream::connect(&filer).map_err(|e| format!("{filer}: {e}"))?;
                let mut reader = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
                let mut w = s;
                let mut done = 0u64;
                let mut i = t;
                while Instant::now() < stop {
                    let key = &keys[i % keys.len()];
                    i += 8;
                    write!(w, "HEAD {key} HTTP/1.1\r\nHost: {filer}\r\n\r\n")
                        .map_err(|e| e.to_string())?;
                    let mut status = String::new();
                    reader.read_line(&mut status).map_err(|e| e.to_string())?;
                    if !status.contains(" 200") {
                        return Err(format!("HEAD {key}: {}", status.trim()));
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).map_err(|e| e.to_string())? > 2 {
                        line.clear();
                    }
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t.join().map_err(|_| "a probe thread panicked")??;
    }
    Ok(total as f64 / 3.0)
}

/// Object paths under `dir` on the filer, `depth` directory levels down (its JSON listing).
fn list(filer: &str, dir: &str, depth: usize) -> Result<Vec<String>, String> {
    let mut s = std::net::TcpStream::connect(filer).map_err(|e| format!("{filer}: {e}"))?;
    write!(
        s,
        "GET {dir}?limit=100000 HTTP/1.0\r\nHost: {filer}\r\nAccept: application/json\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).map_err(|e| format!("listing {dir}: {e}"))?;
    let mut out = Vec::new();
    for entry in v["Entries"].as_array().into_iter().flatten() {
        let path = entry["FullPath"].as_str().unwrap_or_default();
        // A directory's Mode has the directory bit (1 << 31).
        let is_dir = entry["Mode"].as_u64().is_some_and(|m| m & (1 << 31) != 0);
        if is_dir && depth > 0 {
            out.extend(list(filer, &format!("{path}/"), depth - 1)?);
        } else if !is_dir {
            out.push(path.to_string());
        }
    }
    Ok(out)
}

/// The bounds on aggregate samples/s at `n` storage nodes, from the measurements.
struct Model {
    per_node: f64,
    compute_link: f64,
    compute: f64,
    metadata: f64,
}

impl Model {
    fn predict(&self, n: usize) -> (f64, &'static str) {
        [
            (self.per_node * n as f64, "storage links"),
            (self.compute_link, "compute node's link"),
            (self.compute, "compute stage"),
            (self.metadata, "metadata path"),
        ]
        .into_iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap_or((0.0, "none"))
    }
}

fn report(o: &Options, all: &[Point], metadata: f64, out: &Path) -> Result<(), String> {
    let modes: Vec<(bool, Vec<&Point>)> = [false, true]
        .into_iter()
        .map(|l| (l, all.iter().filter(|p| p.locality == l).collect()))
        .collect();
    let samples: usize = all.iter().map(|p| p.samples).sum();
    let feature_bytes = all.iter().map(|p| p.features_bytes).sum::<u64>() as f64 / samples as f64;
    // The compute stage's capacity: a batch per mean compute-stage time, the best run's (the
    // others shared the cores with more hosts).
    let compute = all
        .iter()
        .map(|p| p.samples as f64 / p.iterations as f64 / p.compute_stage_s)
        .fold(0.0, f64::max);
    let model = |points: &[&Point]| Model {
        per_node: points.first().map_or(0.0, |p| p.rate()),
        compute_link: o.compute_link_gbit * 1e9 / 8.0 / feature_bytes,
        compute,
        metadata,
    };
    println!();
    println!(
        "eval-scale: {}, split {}, {} samples, each storage node's link {} Mbit/s",
        o.model,
        o.split,
        all.first().map_or(0, |p| p.samples),
        o.link
    );
    println!(
        "| storage nodes | locality | samples/s | epoch s | efficiency | model samples/s | KB out of storage nodes per sample | KB into them per sample | spread (max/min node out) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (locality, points) in &modes {
        let m = model(points);
        for p in points {
            let eff = p.rate() / (p.nodes as f64 * m.per_node);
            let (pred, _) = m.predict(p.nodes);
            let max = p.per_node_out.iter().copied().max().unwrap_or(0) as f64;
            let min = p.per_node_out.iter().copied().min().unwrap_or(0).max(1) as f64;
            println!(
                "| {} | {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} |",
                p.nodes,
                if *locality { "yes" } else { "no" },
                p.rate(),
                p.wall_s,
                eff,
                pred,
                p.link_out as f64 / p.samples as f64 / 1e3,
                p.link_in as f64 / p.samples as f64 / 1e3,
                max / min
            );
            rows.push(json!({
                "nodes": p.nodes, "locality": locality, "samples": p.samples, "wall_s": p.wall_s,
                "samples_per_s": p.rate(), "efficiency": eff, "model_samples_per_s": pred,
                "features_bytes": p.features_bytes, "link_out_bytes": p.link_out,
                "link_in_bytes": p.link_in, "per_node_out_bytes": p.per_node_out,
                "compute_stage_s": p.compute_stage_s, "iterations": p.iterations,
            }));
        }
    }
    let plain = model(&modes[0].1);
    let near = model(&modes[1].1);
    println!();
    println!(
        "model: min(N x one node's samples/s ({:.2} through the gateway, {:.2} with locality), {:.0} samples/s through a {} Gbit/s compute link at {:.0} KB per sample, {:.1} samples/s compute stage (measured here, CPU), {:.0} samples/s metadata lookups (measured))",
        plain.per_node,
        near.per_node,
        plain.compute_link,
        o.compute_link_gbit,
        feature_bytes / 1e3,
        compute,
        metadata
    );
    println!(
        "| storage nodes | model samples/s, through the gateway | with locality | bottleneck (with locality) |"
    );
    println!("|---|---|---|---|");
    let mut projected = Vec::new();
    for n in [10, 100, 1000] {
        let (a, _) = plain.predict(n);
        let (b, what) = near.predict(n);
        println!("| {n} | {a:.1} | {b:.1} | {what} |");
        projected
            .push(json!({"nodes": n, "samples_per_s": a, "with_locality": b, "bottleneck": what}));
    }
    let summary = json!({
        "model": o.model, "split": o.split, "link_mbit": o.link,
        "compute_link_gbit": o.compute_link_gbit, "measured": rows, "projected": projected,
        "bounds": {
            "per_node_samples_per_s": plain.per_node, "per_node_with_locality": near.per_node,
            "compute_link_samples_per_s": plain.compute_link,
            "compute_stage_samples_per_s": compute, "metadata_lookups_per_s": metadata,
            "feature_bytes_per_sample": feature_bytes,
        },
    });
    let path = out.join("summary.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let svg = out.join("scaling.svg");
    std::fs::write(&svg, plot(&modes[0].1, &modes[1].1))
        .map_err(|e| format!("{}: {e}", svg.display()))?;
    println!("\nJSON: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

/// Samples/s against storage nodes, through the gateway and with locality, and linear
/// scaling from one node through the gateway.
fn plot(plain: &[&Point], near: &[&Point]) -> String {
    let (w, h, m) = (480.0, 320.0, 48.0);
    let one = plain.first().map_or(0.0, |p| p.rate());
    let nmax = plain.len().max(near.len()) as f64;
    let ymax = plain
        .iter()
        .chain(near)
        .map(|p| p.rate())
        .fold(one * nmax, f64::max)
        * 1.1;
    let x = |n: f64| m + (n - 1.0) / (nmax - 1.0).max(1.0) * (w - 2.0 * m);
    let y = |v: f64| h - m - v / ymax.max(1e-9) * (h - 2.0 * m);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<line x1="{m}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{m}" y1="{m}" x2="{m}" y2="{b}" stroke="black"/>
<text x="{cx}" y="{tb}" text-anchor="middle">storage nodes</text><text x="12" y="{cy}" transform="rotate(-90 12 {cy})" text-anchor="middle">samples/s</text>
"#,
        b = h - m,
        r = w - m,
        cx = w / 2.0,
        tb = h - 12.0,
        cy = h / 2.0
    );
    let line = |pts: Vec<(f64, f64)>, style: &str| {
        let d: Vec<String> = pts
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        format!(
            "<polyline points=\"{}\" fill=\"none\" {style}/>\n",
            d.join(" ")
        )
    };
    s += &line(
        (1..=plain.len())
            .map(|n| (n as f64, one * n as f64))
            .collect(),
        r#"stroke="gray" stroke-dasharray="4 3""#,
    );
    for (points, colour) in [(plain, "steelblue"), (near, "darkorange")] {
        s += &line(
            points.iter().map(|p| (p.nodes as f64, p.rate())).collect(),
            &format!(r#"stroke="{colour}" stroke-width="2""#),
        );
        for p in points {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{:.2}</text>\n",
                x(p.nodes as f64),
                y(p.rate()),
                x(p.nodes as f64) + 6.0,
                y(p.rate()) - 6.0,
                p.rate()
            );
        }
    }
    for n in 1..=nmax as usize {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{n}</text>\n",
            x(n as f64),
            h - m + 16.0
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\"><tspan fill=\"steelblue\">through the S3 gateway</tspan>, <tspan fill=\"darkorange\">with locality</tspan>, <tspan fill=\"gray\">{:.2} x N</tspan></text>\n</svg>\n",
        m + 8.0,
        m - 12.0,
        one
    );
    s
}

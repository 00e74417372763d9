//! `hapi-eval`: tables from `hapi-train` results.
//!
//! - `compare A.json B.json ...`: jobs side by side (the demo's summary);
//! - `split-summary OUT_DIR CASE.json ...`: the split-choice evaluation over sweep results
//!   (`hapi-train --sweep`): a table, `summary.json` and `split-choice.svg` in OUT_DIR.

use anyhow::{Context, bail};
use hapi_train::job::{Results, SweepResults, write_json};
use hapi_train::plan::Split;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("compare") => compare(&args[1..]),
        Some("split-summary") => split_summary(&args[1..]),
        _ => Err(anyhow::anyhow!(
            "usage: hapi-eval compare RESULTS.json...\n       hapi-eval split-summary OUT_DIR SWEEP.json..."
        )),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hapi-eval: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn read<T: serde::de::DeserializeOwned>(path: &str) -> anyhow::Result<T> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {path}"))
}

fn compare(paths: &[String]) -> anyhow::Result<()> {
    if paths.is_empty() {
        bail!("compare: no results given");
    }
    let runs: Vec<Results> = paths.iter().map(|p| read(p)).collect::<Result<_, _>>()?;
    let mut rows: Vec<(String, Vec<String>)> = vec![
        ("--split".into(), vec![]),
        (
            "split used (per epoch; cache: cached features)".into(),
            vec![],
        ),
        ("epoch 1 wall time".into(), vec![]),
        ("all epochs wall time".into(), vec![]),
        ("epoch 1 samples/s".into(), vec![]),
        ("MB received (epoch 1)".into(), vec![]),
        ("storage stage ms/it (epoch 1)".into(), vec![]),
        ("compute stage ms/it (epoch 1)".into(), vec![]),
        ("predicted epoch 1".into(), vec![]),
        ("train loss (last epoch)".into(), vec![]),
        ("test accuracy (per epoch)".into(), vec![]),
    ];
    for r in &runs {
        let e1 = r.epochs.first().context("a job with no epochs")?;
        let last = r.epochs.last().context("no epochs")?;
        let cols = [
            format!("{:?}", r.config.split).to_lowercase(),
            r.epochs
                .iter()
                .map(|e| {
                    if e.from_cache {
                        "cache".to_string()
                    } else {
                        e.split.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
            format!("{:.1} s", e1.wall_s),
            format!("{:.1} s", r.epochs.iter().map(|e| e.wall_s).sum::<f64>()),
            format!("{:.1}", e1.samples as f64 / e1.wall_s.max(1e-9)),
            format!("{:.2}", e1.bytes_received as f64 / 1e6),
            format!("{:.0}", e1.storage_stage_s * 1e3),
            format!("{:.0}", e1.compute_stage_s * 1e3),
            e1.predicted
                .map_or("-".into(), |p| format!("{:.1} s", p.epoch)),
            format!("{:.4}", last.train_loss),
            r.epochs
                .iter()
                .map(|e| {
                    e.test_accuracy
                        .map_or("-".into(), |a| format!("{:.1}%", a * 100.0))
                })
                .collect::<Vec<_>>()
                .join(", "),
        ];
        for (row, c) in rows.iter_mut().zip(cols) {
            row.1.push(c);
        }
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..runs.len())
        .map(|i| rows.iter().map(|r| r.1[i].len()).max().unwrap_or(0).max(12))
        .collect();
    for (name, cols) in &rows {
        let mut line = format!("{name:<w0$}");
        for (c, w) in cols.iter().zip(&widths) {
            let _ = write!(line, "  {c:>w$}");
        }
        println!("{line}");
    }
    Ok(())
}

#[derive(Serialize)]
struct CaseSummary {
    file: String,
    model: String,
    batch: usize,
    bandwidth: String,
    iterations: usize,
    best: Split,
    best_s: f64,
    auto: Split,
    auto_s: f64,
    /// auto's own run against the best split's run.
    auto_over_best: f64,
    /// The measured time of the split auto chose, in the sweep, against the best: whether the
    /// choice was right, free of run-to-run noise in auto's own run.
    chosen_over_best: f64,
    none_s: f64,
    speedup_over_none: f64,
    within_5pct: bool,
    probe_s: f64,
}

#[derive(Serialize)]
struct Summary {
    cases: Vec<CaseSummary>,
    share_within_5pct: f64,
    share_choice_within_5pct: f64,
    best_speedup_over_none: f64,
    median_auto_over_best: f64,
}

fn split_summary(args: &[String]) -> anyhow::Result<()> {
    let [out, files @ ..] = args else {
        bail!("split-summary OUT_DIR SWEEP.json...");
    };
    if files.is_empty() {
        bail!("split-summary: no sweep results");
    }
    let out = PathBuf::from(out);
    let mut cases = Vec::new();
    let mut sweeps = Vec::new();
    for f in files {
        let s: SweepResults = read(f)?;
        // The bandwidth label is the file's parent directory name (`bw-50mbit/`), if any.
        let bw = Path::new(f)
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().trim_start_matches("bw-").to_string())
            .unwrap_or_default();
        let chosen_s = s
            .cases
            .iter()
            .find(|c| c.split == s.auto)
            .map_or(f64::NAN, |c| c.seconds);
        cases.push(CaseSummary {
            file: f.clone(),
            model: s.model.clone(),
            batch: s.batch,
            bandwidth: bw,
            iterations: s.iterations,
            best: s.best,
            best_s: s.best_s,
            auto: s.auto,
            auto_s: s.auto_s,
            auto_over_best: s.auto_s / s.best_s,
            chosen_over_best: chosen_s / s.best_s,
            none_s: s.none_s,
            speedup_over_none: s.none_s / s.auto_s,
            within_5pct: s.auto_s <= 1.05 * s.best_s,
            probe_s: s.plan.probe_s,
        });
        sweeps.push(s);
    }
    let n = cases.len() as f64;
    let mut ratios: Vec<f64> = cases.iter().map(|c| c.auto_over_best).collect();
    ratios.sort_by(f64::total_cmp);
    let summary = Summary {
        share_within_5pct: cases.iter().filter(|c| c.within_5pct).count() as f64 / n,
        share_choice_within_5pct: cases.iter().filter(|c| c.chosen_over_best <= 1.05).count()
            as f64
            / n,
        best_speedup_over_none: cases
            .iter()
            .map(|c| c.speedup_over_none)
            .fold(0.0, f64::max),
        median_auto_over_best: ratios[ratios.len() / 2],
        cases,
    };
    println!(
        "{:<20} {:>5} {:>9} {:>6} {:>8} {:>6} {:>8} {:>9} {:>10} {:>8} {:>8}",
        "model",
        "batch",
        "bandwidth",
        "best",
        "best s",
        "auto",
        "auto s",
        "auto/best",
        "chosen/best",
        "none s",
        "vs none"
    );
    for c in &summary.cases {
        println!(
            "{:<20} {:>5} {:>9} {:>6} {:>8.2} {:>6} {:>8.2} {:>9.3} {:>10.3} {:>8.2} {:>7.2}x",
            c.model,
            c.batch,
            c.bandwidth,
            c.best.to_string(),
            c.best_s,
            c.auto.to_string(),
            c.auto_s,
            c.auto_over_best,
            c.chosen_over_best,
            c.none_s,
            c.speedup_over_none
        );
    }
    println!(
        "auto best or within 5% of the best: {:.1}% of {} cases (its own run); the chosen split's sweep time within 5%: {:.1}%",
        summary.share_within_5pct * 100.0,
        summary.cases.len(),
        summary.share_choice_within_5pct * 100.0
    );
    println!(
        "median auto/best {:.3}; best speed-up of auto over none: {:.2}x",
        summary.median_auto_over_best, summary.best_speedup_over_none
    );
    std::fs::create_dir_all(&out)?;
    write_json(&out.join("summary.json"), &summary)?;
    std::fs::write(out.join("split-choice.svg"), svg(&sweeps, &summary))?;
    println!(
        "wrote {} and {}",
        out.join("summary.json").display(),
        out.join("split-choice.svg").display()
    );
    Ok(())
}

/// One panel per case: measured time of every split (bars), the best (green) and auto's
/// choice (outlined), `none` first.
fn svg(sweeps: &[SweepResults], summary: &Summary) -> String {
    let cols = 3usize;
    let (pw, ph) = (380.0, 200.0);
    let rows = sweeps.len().div_ceil(cols);
    let (w, h) = (pw * cols as f64, ph * rows as f64 + 40.0);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">
<text x="10" y="20" font-size="14">Split choice: measured time per split (grey), best (green), auto's choice (blue outline). Auto within 5%: {:.1}%</text>
"#,
        summary.share_within_5pct * 100.0
    );
    for (i, (sw, c)) in sweeps.iter().zip(&summary.cases).enumerate() {
        let x0 = (i % cols) as f64 * pw + 30.0;
        let y0 = (i / cols) as f64 * ph + 50.0;
        let max = sw
            .cases
            .iter()
            .map(|c| c.seconds)
            .fold(0.0, f64::max)
            .max(1e-9);
        let bw = (pw - 50.0) / sw.cases.len() as f64;
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="{}">{} b={} {} (auto {} = {:.2}x best)</text>"#,
            y0 - 5.0,
            sw.model,
            sw.batch,
            c.bandwidth,
            sw.auto,
            c.auto_over_best
        );
        for (j, case) in sw.cases.iter().enumerate() {
            let bh = (ph - 50.0) * case.seconds / max;
            let x = x0 + j as f64 * bw;
            let y = y0 + (ph - 50.0) - bh;
            let fill = if case.split == sw.best {
                "#3a3"
            } else {
                "#bbb"
            };
            let stroke = if case.split == sw.auto {
                r##" stroke="#00f" stroke-width="2""##
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{fill}"{stroke}><title>split {}: {:.2} s</title></rect>"#,
                (bw - 1.0).max(0.5),
                case.split,
                case.seconds
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{x0}" y="{}">none ... split {} (max {max:.1} s)</text>"#,
            y0 + ph - 38.0,
            sw.freeze
        );
    }
    s.push_str("</svg>\n");
    s
}

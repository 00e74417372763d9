//! `hapi-eval`: tables from `hapi-train` results.
//!
//! - `compare A.json B.json ...`: jobs side by side (the demo's summary);
//! - `split-summary OUT_DIR CASE.json ...`: the split-choice evaluation over sweep results
//!   (`hapi-train --sweep`): a table, `summary.json` and `split-choice.svg` in OUT_DIR;
//! - `drift-summary OUT.json RESULTS.json TRACE.jsonl SWITCHES.json SWEEP_FAST.json
//!   SWEEP_SLOW.json [FIXED_RESULTS.json FIXED_TRACE.jsonl FIXED_SWITCHES.json]...`: an adaptive
//!   run whose link was shaped down and back (`cargo xtask eval-split`'s drift case) against,
//!   in each phase, the fastest of the fixed splits run through the same schedule (and the
//!   sweep's best at that phase's bandwidth);
//! - `best-split SWEEP.json`: the sweep's best fixed split, as `--split` takes it.

use anyhow::{Context, bail};
use hapi_train::job::{Results, SweepResults, write_json};
use hapi_train::pipeline::{Iteration, median};
use hapi_train::plan::Split;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("compare") => compare(&args[1..]),
        Some("split-summary") => split_summary(&args[1..]),
        Some("drift-summary") => drift_summary(&args[1..]),
        Some("best-split") => best_split(&args[1..]),
        _ => Err(anyhow::anyhow!(
            "usage: hapi-eval compare RESULTS.json...\n       hapi-eval split-summary OUT_DIR SWEEP.json...\n       hapi-eval drift-summary OUT.json RESULTS.json TRACE.jsonl SWITCHES.json SWEEP_FAST.json SWEEP_SLOW.json [FIXED_RESULTS.json FIXED_TRACE.jsonl FIXED_SWITCHES.json]...\n       hapi-eval best-split SWEEP.json"
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
    /// Iterations per fixed split, and of the adaptive run.
    iterations: usize,
    adaptive_iterations: usize,
    /// The fastest fixed split over the adaptive run's iterations, and its time (the best of
    /// the fixed long runs on all of its batches), and the fastest short run's extrapolation.
    best: Split,
    best_s: f64,
    screen_best_s: f64,
    /// Where the faster adaptive run settled, and its wall time; every adaptive run's time.
    auto: Split,
    auto_s: f64,
    auto_runs_s: Vec<f64>,
    /// Its first run alone against the best (the judgement before both sides had two runs).
    first_auto_over_best: f64,
    auto_over_best: f64,
    /// The fixed time of the split it settled on, against the best: whether the choice was
    /// right, free of what exploring cost.
    chosen_over_best: f64,
    /// The faster adaptive run's pace on its last stretch at the split it settled on (seconds
    /// per iteration, [`settled_pace`]) and over how many intervals, against that split's
    /// fixed pace (its long run's when it had one): above 1, the adaptive run's
    /// iterations at that split were slower than the fixed run's, whatever exploring cost.
    settled_pace_s: f64,
    settled_intervals: usize,
    settled_pace_over_fixed: f64,
    /// Where that pace went: the stretch's mean storage and compute stages (seconds per
    /// iteration), and that split's long run's, when it had one that kept them.
    settled_stages_s: Option<(f64, f64)>,
    fixed_stages_s: Option<(f64, f64)>,
    /// Where exploration started (the model's best), and whether that was the best split.
    first_candidate: Split,
    first_was_best: bool,
    explored: usize,
    none_s: f64,
    speedup_over_none: f64,
    within_5pct: bool,
    plan_s: f64,
}

#[derive(Serialize)]
struct Summary {
    cases: Vec<CaseSummary>,
    share_within_5pct: f64,
    share_choice_within_5pct: f64,
    share_first_run_within_5pct: f64,
    best_speedup_over_none: f64,
    median_speedup_over_none: f64,
    median_auto_over_best: f64,
    /// Cases where the first candidate was the best fixed split: the adaptive run against it
    /// (what exploring cost).
    #[serde(flatten)]
    overhead: Overhead,
}

/// What exploring cost where the first candidate was already the best fixed split: each such
/// case's adaptive run over the best, less one.
#[derive(Serialize, Debug)]
struct Overhead {
    overhead_cases: usize,
    /// Cases within the issue's 3%.
    overhead_within_3pct: usize,
    /// The largest and the mean; none where no case had its first candidate the best.
    overhead_max: Option<f64>,
    overhead_mean: Option<f64>,
}

impl Overhead {
    fn of(overhead: &[f64]) -> Self {
        Self {
            overhead_cases: overhead.len(),
            overhead_within_3pct: overhead.iter().filter(|&&o| o <= 0.03).count(),
            overhead_max: overhead.iter().copied().reduce(f64::max),
            overhead_mean: (!overhead.is_empty())
                .then(|| overhead.iter().sum::<f64>() / overhead.len() as f64),
        }
    }
}

impl std::fmt::Display for Overhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.overhead_max, self.overhead_mean) {
            (Some(max), Some(mean)) => write!(
                f,
                "exploration overhead where the first candidate was the best ({} cases): {} within 3%, max {:+.1}%, mean {:+.1}%",
                self.overhead_cases,
                self.overhead_within_3pct,
                max * 100.0,
                mean * 100.0
            ),
            _ => write!(
                f,
                "exploration overhead: no case whose first candidate was the best fixed split"
            ),
        }
    }
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
        let case = |split: Split| s.cases.iter().find(|c| c.split == split);
        let fixed = |split: Split| case(split).map_or(f64::NAN, |c| c.seconds_measured());
        let timed = &s.auto_trace[..s.adaptive_iterations.min(s.auto_trace.len())];
        let (settled_pace_s, settled_intervals) = settled_pace(timed, s.auto);
        // The fixed split `auto` settled on.
        let settled = case(s.auto);
        let fixed_pace = settled.map_or(f64::NAN, |c| c.pace_measured());
        let fixed_stages_s = settled.and_then(|c| c.full).and_then(|f| f.stages_s);
        cases.push(CaseSummary {
            file: f.clone(),
            model: s.model.clone(),
            batch: s.batch,
            bandwidth: bw,
            iterations: s.iterations,
            adaptive_iterations: s.adaptive_iterations,
            best: s.best,
            best_s: s.best_s,
            screen_best_s: s.screen_best.map_or(f64::NAN, |b| b.1),
            auto: s.auto,
            auto_s: s.auto_s,
            auto_runs_s: s.auto_runs.iter().map(|r| r.seconds).collect(),
            first_auto_over_best: s.auto_runs.first().map_or(s.auto_s, |r| r.seconds) / s.best_s,
            auto_over_best: s.auto_s / s.best_s,
            chosen_over_best: fixed(s.auto) / s.best_s,
            settled_pace_s,
            settled_intervals,
            settled_pace_over_fixed: settled_pace_s / fixed_pace,
            settled_stages_s: settled_stages(timed, s.auto),
            fixed_stages_s,
            first_candidate: s.first_candidate,
            first_was_best: s.first_candidate == s.best,
            explored: s.explored,
            none_s: s.none_s,
            speedup_over_none: s.none_s / s.auto_s,
            within_5pct: s.auto_s <= 1.05 * s.best_s,
            plan_s: s.plan.plan_s,
        });
        sweeps.push(s);
    }
    let n = cases.len() as f64;
    let overhead: Vec<f64> = cases
        .iter()
        .filter(|c| c.first_was_best)
        .map(|c| c.auto_over_best - 1.0)
        .collect();
    let summary = Summary {
        share_within_5pct: cases.iter().filter(|c| c.within_5pct).count() as f64 / n,
        share_choice_within_5pct: cases.iter().filter(|c| c.chosen_over_best <= 1.05).count()
            as f64
            / n,
        share_first_run_within_5pct: cases
            .iter()
            .filter(|c| c.first_auto_over_best <= 1.05)
            .count() as f64
            / n,
        best_speedup_over_none: cases
            .iter()
            .map(|c| c.speedup_over_none)
            .fold(0.0, f64::max),
        median_speedup_over_none: median(cases.iter().map(|c| c.speedup_over_none).collect()),
        median_auto_over_best: median(cases.iter().map(|c| c.auto_over_best).collect()),
        overhead: Overhead::of(&overhead),
        cases,
    };
    println!(
        "{:<20} {:>5} {:>9} {:>5} {:>6} {:>8} {:>6} {:>8} {:>15} {:>9} {:>11} {:>10} {:>6} {:>8} {:>8}",
        "model",
        "batch",
        "bandwidth",
        "it",
        "best",
        "best s",
        "auto",
        "auto s",
        "auto runs s",
        "auto/best",
        "chosen/best",
        "pace/fixed",
        "first",
        "explored",
        "vs none"
    );
    for c in &summary.cases {
        println!(
            "{:<20} {:>5} {:>9} {:>5} {:>6} {:>8.2} {:>6} {:>8.2} {:>15} {:>9.3} {:>11.3} {:>10.3} {:>6} {:>8} {:>7.2}x",
            c.model,
            c.batch,
            c.bandwidth,
            c.adaptive_iterations,
            c.best.to_string(),
            c.best_s,
            c.auto.to_string(),
            c.auto_s,
            c.auto_runs_s
                .iter()
                .map(|s| format!("{s:.2}"))
                .collect::<Vec<_>>()
                .join(" / "),
            c.auto_over_best,
            c.chosen_over_best,
            c.settled_pace_over_fixed,
            c.first_candidate.to_string(),
            c.explored,
            c.speedup_over_none
        );
    }
    println!(
        "auto best or within 5% of the best fixed split: {:.1}% of {} cases (the faster of its runs against the fastest fixed long run; its first run alone: {:.1}%); the split it settled on within 5%: {:.1}%",
        summary.share_within_5pct * 100.0,
        summary.cases.len(),
        summary.share_first_run_within_5pct * 100.0,
        summary.share_choice_within_5pct * 100.0
    );
    println!(
        "median auto/best {:.3}; speed-up of auto over none: best {:.2}x, median {:.2}x",
        summary.median_auto_over_best,
        summary.best_speedup_over_none,
        summary.median_speedup_over_none
    );
    println!("{}", summary.overhead);
    for c in &summary.cases {
        if let (Some((ss, sc)), Some((fs, fc))) = (c.settled_stages_s, c.fixed_stages_s) {
            println!(
                "stages at {} (storage / compute ms per iteration), {} batch {} {}: the adaptive run's settled stretch {:.0} / {:.0}, the fixed long run {:.0} / {:.0}",
                c.auto,
                c.model,
                c.batch,
                c.bandwidth,
                ss * 1e3,
                sc * 1e3,
                fs * 1e3,
                fc * 1e3
            );
        }
    }
    println!(
        "pace/fixed: the faster adaptive run's seconds per iteration on its last stretch at the split it settled on, against that split's fixed run"
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

/// The adaptive run's pace on its last stretch at `split` (from its last move on): the mean
/// time between the ends of consecutive iterations both at `split`, with the number of
/// intervals it averages. NaN with none.
fn settled_pace(trace: &[Iteration], split: Split) -> (f64, usize) {
    let stretch = settled_stretch(trace, split);
    match hapi_train::pipeline::mean_interval(stretch) {
        Some(pace) => (pace, stretch.len() - 1),
        None => (f64::NAN, 0),
    }
}

/// The mean storage and compute stages (seconds) of the iterations [`settled_pace`] times:
/// with at least two of them, as it needs.
fn settled_stages(trace: &[Iteration], split: Split) -> Option<(f64, f64)> {
    let stretch = settled_stretch(trace, split);
    if stretch.len() < 2 {
        return None;
    }
    hapi_train::pipeline::mean_stages(stretch)
}

/// The trace's last stretch at `split`: from the iteration after the last one elsewhere.
fn settled_stretch(trace: &[Iteration], split: Split) -> &[Iteration] {
    let start = trace
        .iter()
        .rposition(|it| it.split != split)
        .map_or(0, |last_other| last_other + 1);
    trace.get(start..).unwrap_or_default()
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
<text x="10" y="20" font-size="14">Split choice: each fixed split's time (grey), best (green), where auto settled (blue outline). Auto within 5%: {:.1}%</text>
"#,
        summary.share_within_5pct * 100.0
    );
    for (i, (sw, c)) in sweeps.iter().zip(&summary.cases).enumerate() {
        let x0 = (i % cols) as f64 * pw + 30.0;
        let y0 = (i / cols) as f64 * ph + 50.0;
        let max = sw
            .cases
            .iter()
            .map(|c| c.seconds_measured())
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
            let bh = (ph - 50.0) * case.seconds_measured() / max;
            let x = x0 + j as f64 * bw;
            let y = y0 + (ph - 50.0) - bh;
            let fill = if case.split == sw.best {
                "#3a3"
            } else {
                "#bbb"
            };
            // A split stopped early (clearly slow) is drawn faint.
            let faint = if case.stopped_after.is_some() {
                r#" fill-opacity="0.4""#
            } else {
                ""
            };
            let stroke = if case.split == sw.auto {
                r##" stroke="#00f" stroke-width="2""##
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{fill}"{stroke}{faint}><title>split {}: {:.2} s{}</title></rect>"#,
                (bw - 1.0).max(0.5),
                case.split,
                case.seconds_measured(),
                case.stopped_after.map_or(String::new(), |n| format!(
                    " (extrapolated: stopped after {n} of {} iterations)",
                    sw.iterations
                )),
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

#[derive(Deserialize)]
struct Switch {
    unix: f64,
    mbit: u32,
    after_iteration: usize,
}

#[derive(Deserialize)]
struct TraceLine {
    iteration: usize,
    split: Split,
    end_unix: f64,
}

#[derive(Serialize)]
struct Phase {
    mbit: u32,
    /// Iterations that ended in the phase, and the splits they ran at (split: count).
    iterations: usize,
    splits: Vec<(Split, usize)>,
    /// Seconds per iteration (mean interval between iteration ends within an epoch).
    pace_s: f64,
    /// The best split in hindsight: the fastest, in this phase, of the fixed splits run through
    /// the same link schedule right after the adaptive run (the sweep's best at each
    /// bandwidth); the sweep's best at this bandwidth when none were run.
    best: Split,
    best_pace_s: f64,
    ratio: f64,
    within_10pct: bool,
    /// Each fixed split's pace in this phase of its own run through the schedule.
    fixed: Vec<(Split, f64)>,
    /// The sweep's best fixed split at this bandwidth (measured before, at a constant link).
    sweep_best: Split,
    sweep_best_pace_s: f64,
}

/// One run through the link schedule: its iterations that ended in each phase, and their pace.
struct Run {
    phases: Vec<(Vec<Split>, f64)>,
}

impl Run {
    fn read(results: &Results, trace: &str, switches: &[Switch]) -> anyhow::Result<Run> {
        let text = std::fs::read_to_string(trace).with_context(|| trace.to_string())?;
        let trace: Vec<TraceLine> = text
            .lines()
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .with_context(|| format!("{trace}:{}: not a trace line", i + 1))
            })
            .collect::<anyhow::Result<_>>()?;
        let epoch_starts: Vec<usize> = results.epochs.iter().map(|e| e.first_iteration).collect();
        // Phase k: iterations ending after switch k - 1 and before switch k.
        let bounds: Vec<f64> = switches.iter().map(|s| s.unix).collect();
        let phase_of = |t: f64| bounds.iter().take_while(|&&b| t >= b).count();
        let phases = (0..=bounds.len())
            .map(|k| {
                let its: Vec<&TraceLine> =
                    trace.iter().filter(|t| phase_of(t.end_unix) == k).collect();
                let intervals: Vec<f64> = its
                    .windows(2)
                    .filter(|w| {
                        w[1].iteration == w[0].iteration + 1
                            && !epoch_starts.contains(&w[1].iteration)
                    })
                    .map(|w| w[1].end_unix - w[0].end_unix)
                    .collect();
                let pace = intervals.iter().sum::<f64>() / intervals.len().max(1) as f64;
                (its.iter().map(|t| t.split).collect(), pace)
            })
            .collect();
        Ok(Run { phases })
    }
}

#[derive(Serialize)]
struct DriftSummary {
    phases: Vec<Phase>,
    switches_after_iteration: Vec<usize>,
    moves: Vec<hapi_train::adapt::Move>,
}

/// `best-split SWEEP.json`: the sweep's best fixed split (from its long runs where there are
/// any; the short runs' best is biased low), printed as `--split` takes it.
fn best_split(args: &[String]) -> anyhow::Result<()> {
    let [sweep] = args else {
        bail!("best-split SWEEP.json");
    };
    let sweep: SweepResults = read(sweep)?;
    println!("{}", sweep_best(&sweep)?.split);
    Ok(())
}

fn sweep_best(sweep: &SweepResults) -> anyhow::Result<&hapi_train::job::SweepCase> {
    let long = sweep.cases.iter().any(|c| c.full.is_some());
    sweep
        .cases
        .iter()
        .filter(|c| !long || c.full.is_some())
        .min_by(|a, b| a.pace_measured().total_cmp(&b.pace_measured()))
        .context("a sweep without cases")
}

fn drift_summary(args: &[String]) -> anyhow::Result<()> {
    let usage = "drift-summary OUT.json RESULTS.json TRACE.jsonl SWITCHES.json SWEEP_FAST.json SWEEP_SLOW.json [FIXED_RESULTS.json FIXED_TRACE.jsonl FIXED_SWITCHES.json]...";
    if args.len() < 6 || !(args.len() - 6).is_multiple_of(3) {
        bail!(usage);
    }
    let (out, trace) = (&args[0], &args[2]);
    let results: Results = read(&args[1])?;
    let switches: Vec<Switch> = read(&args[3])?;
    let adaptive = Run::read(&results, trace, &switches)?;
    let (fast, slow): (SweepResults, SweepResults) = (read(&args[4])?, read(&args[5])?);
    let fixed = args[6..]
        .chunks(3)
        .map(|c| {
            let sw: Vec<Switch> = read(&c[2])?;
            if sw.len() != switches.len() {
                bail!(
                    "{}: {} link switches, the adaptive run had {}",
                    c[2],
                    sw.len(),
                    switches.len()
                );
            }
            let r: Results = read(&c[0])?;
            let run = Run::read(&r, &c[1], &sw)?;
            let split = r
                .epochs
                .first()
                .map(|e| e.split)
                .with_context(|| format!("{}: no epochs", c[0]))?;
            Ok((split, run))
        })
        .collect::<anyhow::Result<Vec<(Split, Run)>>>()?;
    let fast_mbit = switches.last().map_or(1000, |s| s.mbit);
    let mut phases = Vec::new();
    for (k, (its, pace)) in adaptive.phases.iter().enumerate() {
        let mbit = if k == 0 {
            fast_mbit
        } else {
            switches[k - 1].mbit
        };
        let sweep = if mbit == fast_mbit { &fast } else { &slow };
        let splits = hapi_train::pipeline::split_counts(its.iter().copied());
        let sb = sweep_best(sweep)?;
        let fixed_here: Vec<(Split, f64)> =
            fixed.iter().map(|(s, run)| (*s, run.phases[k].1)).collect();
        let (best, best_pace) = fixed_here
            .iter()
            .copied()
            .filter(|(_, p)| *p > 0.0)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((sb.split, sb.pace_measured()));
        phases.push(Phase {
            mbit,
            iterations: its.len(),
            splits,
            pace_s: *pace,
            best,
            best_pace_s: best_pace,
            ratio: pace / best_pace,
            within_10pct: *pace <= 1.1 * best_pace,
            fixed: fixed_here,
            sweep_best: sb.split,
            sweep_best_pace_s: sb.pace_measured(),
        });
    }
    let summary = DriftSummary {
        switches_after_iteration: switches.iter().map(|s| s.after_iteration).collect(),
        moves: results
            .epochs
            .iter()
            .flat_map(|e| e.moves.clone())
            .collect(),
        phases,
    };
    println!(
        "{:>6} {:>10} {:>9} {:>6} {:>10} {:>7} {:>7} {:>10}  splits (iterations)",
        "Mbit/s", "iterations", "pace ms", "best", "best ms", "ratio", "sweep", "sweep ms"
    );
    for p in &summary.phases {
        println!(
            "{:>6} {:>10} {:>9.1} {:>6} {:>10.1} {:>7.3} {:>7} {:>10.1}  {}",
            p.mbit,
            p.iterations,
            p.pace_s * 1e3,
            p.best.to_string(),
            p.best_pace_s * 1e3,
            p.ratio,
            p.sweep_best.to_string(),
            p.sweep_best_pace_s * 1e3,
            p.splits
                .iter()
                .map(|(s, n)| format!("{s}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "link shaped after iterations {:?}; moves:",
        summary.switches_after_iteration
    );
    for m in &summary.moves {
        println!("  iteration {:>4}: {}", m.iteration, m.reason);
    }
    write_json(Path::new(out), &summary)?;
    println!("wrote {out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(split: usize, end_unix: f64) -> Iteration {
        Iteration {
            split: Split::At(split),
            storage_s: 0.0,
            compute_s: 0.0,
            end_unix,
            link_bps: None,
        }
    }

    #[test]
    fn exploration_overhead_counts_the_cases_within_3pct_and_says_when_there_is_none() {
        let some = Overhead::of(&[0.01, -0.05, 0.03, 0.042]);
        assert_eq!((some.overhead_cases, some.overhead_within_3pct), (4, 3));
        assert_eq!(some.overhead_max, Some(0.042));
        assert!((some.overhead_mean.unwrap_or(f64::NAN) - 0.008).abs() < 1e-12);
        assert!(
            some.to_string()
                .contains("(4 cases): 3 within 3%, max +4.2%, mean +0.8%")
        );
        let none = Overhead::of(&[]);
        assert_eq!((none.overhead_max, none.overhead_mean), (None, None));
        let said = none.to_string();
        assert!(said.contains("no case") && !said.contains("NaN"), "{said}");
    }

    #[test]
    fn the_settled_pace_counts_the_intervals_at_the_split_after_the_last_move() {
        // Explores 3, 5, 3, 6, then settles on 3: the interval from the last iteration at 6 is
        // left out, and so is the earlier stretch at 3.
        let ends = [0.0, 1.0, 2.0, 3.0, 10.0, 12.0, 13.0, 14.0];
        let splits = [3, 3, 5, 3, 6, 3, 3, 3];
        let trace: Vec<Iteration> = splits.iter().zip(ends).map(|(&s, e)| it(s, e)).collect();
        assert_eq!(settled_pace(&trace, Split::At(3)), (1.0, 2));
        // Never left: every interval counts.
        let steady: Vec<Iteration> = (0..5).map(|i| it(4, 2.0 * i as f64)).collect();
        assert_eq!(settled_pace(&steady, Split::At(4)), (2.0, 4));
        // Too short a stretch, or never there: no pace.
        assert!(settled_pace(&trace[..6], Split::At(3)).0.is_nan());
        assert!(settled_pace(&trace, Split::At(9)).0.is_nan());
    }

    #[test]
    fn the_settled_stages_average_the_same_stretch_as_the_pace() {
        let splits = [3, 5, 3, 6, 3, 3, 3];
        let trace: Vec<Iteration> = splits
            .iter()
            .enumerate()
            .map(|(i, &s)| Iteration {
                storage_s: i as f64,
                compute_s: 10.0 * i as f64,
                ..it(s, i as f64)
            })
            .collect();
        // Iterations 4, 5 and 6: the last stretch at 3.
        assert_eq!(settled_stages(&trace, Split::At(3)), Some((5.0, 50.0)));
        // One iteration at the end is no stretch; never there, none.
        assert_eq!(settled_stages(&trace[..5], Split::At(3)), None);
        assert_eq!(settled_stages(&trace, Split::At(9)), None);
    }
}

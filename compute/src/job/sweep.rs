//! `--sweep`: every split measured for a fixed number of iterations (or until it is clearly
//! slow), the fastest few again for the whole run, each followed by a run of `--split auto`'s
//! online adaptation on the same batches, and the splits it settled on if they were not among
//! the few (the split-choice evaluation).

use crate::adapt::{Choice, Move};
use crate::pipeline::{Iteration, Until, mean_interval, median};
use crate::plan::{Costs, Estimate, Split};
use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::{EpochResult, PlanReport};
use super::report::{ms, print_plan};
use super::train::Job;

/// Fixed splits run again for all of the adaptive run's iterations: the fastest of the short
/// runs. The best of some 30 short, noisy runs is biased low (the luckiest one); the best fixed
/// split is judged on runs as long as the adaptive one. The adaptive run runs as many times,
/// each after one of them, and is judged on its faster run: the faster of two noisy runs is
/// biased low too, by about half their spread, and both sides get the same estimator (and the
/// same stretch of this machine's drifting speed).
pub const FINALISTS: usize = 2;

/// One of the adaptive runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AutoRun {
    /// Wall time to the end of its last iteration.
    pub seconds: f64,
    /// The split it used most.
    pub split: Split,
    /// Iterations it spent exploring.
    pub explored: usize,
    /// Where its storage stage went, at every split it used.
    #[serde(default)]
    pub storage: StorageSide,
}

/// Where a long run's storage stage went: the storage host's time per request by stage, and
/// the transfer rate. Two runs at the same split whose storage stages differ tell here whether
/// the host or the network differed.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct StorageSide {
    /// The host's mean seconds per request, by stage (`Server-Timing`).
    pub per_request: hapi_client::ServerTiming,
    pub requests: usize,
    /// The median of the iterations' transfer rates: bytes over the requests' summed network
    /// and HTTP time ([`crate::pipeline::Iteration::link_bps`]). A batch's requests that share
    /// the link at once each count their whole transfer, so where they overlap this reads under
    /// the link's rate: compare it between runs at one split, not between splits.
    pub link_bps: Option<f64>,
}

impl StorageSide {
    fn of(r: &EpochResult) -> Self {
        let mut per_request = hapi_client::ServerTiming::default();
        if r.requests > 0 {
            for stage in hapi_wire::Stage::ALL {
                let mean = r.server.get(stage) / r.requests as f64;
                per_request.set(stage, std::time::Duration::from_secs_f64(mean));
            }
        }
        let links: Vec<f64> = r
            .trace
            .iter()
            .filter_map(|i| i.link_bps)
            .filter(|l| l.is_finite() && *l > 0.0)
            .collect();
        Self {
            per_request,
            requests: r.requests,
            link_bps: Some(median(links)).filter(|l| !l.is_nan()),
        }
    }

    /// `host 812 ms/request (queue 40, compute 610, decode 90), link 6.12 MB/s`.
    fn line(&self) -> String {
        let t = &self.per_request;
        format!(
            "host {} ms/request (queue {}, compute {}, decode {}), link {}",
            ms(t.total),
            ms(t.queue),
            ms(t.compute),
            ms(t.decode),
            self.link_bps
                .map_or("not measured".into(), |l| format!("{:.2} MB/s", l / 1e6))
        )
    }
}

/// A short run stops once its wall time passes this many times the fastest complete short run
/// so far (the splits run in the model's order, fastest predicted first): such a split is
/// neither a finalist nor within 5% of the best, and its time, extrapolated from the iterations
/// it ran, says as much. `none` always runs all of its iterations (the speed-up over it is
/// reported).
pub const SCREEN_CUTOFF: f64 = 2.0;

/// A fixed split's run on all of the adaptive run's batches.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct FullRun {
    /// Wall time to the end of its last iteration.
    pub seconds: f64,
    /// Seconds per iteration after the first.
    pub pace_s: f64,
    /// Where its storage stage went.
    #[serde(default)]
    pub storage: StorageSide,
    /// Its two stages' mean seconds per iteration (storage, compute), from the pipeline's
    /// trace: what an adaptive run's iterations at the same split are compared with. None in
    /// results written before they were kept.
    #[serde(default)]
    pub stages_s: Option<(f64, f64)>,
}

/// One split's measured time in a sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepCase {
    pub split: Split,
    /// Wall time of its `iterations` iterations (batches spread evenly over the adaptive run's,
    /// then `--prefetch` more that are fetched but not timed), extrapolated from the
    /// iterations it ran when it was stopped early.
    pub seconds: f64,
    /// Iterations run when the short run was stopped before `iterations`, past
    /// [`SCREEN_CUTOFF`] times the fastest short run.
    #[serde(default)]
    pub stopped_after: Option<usize>,
    /// The same pipeline run for the adaptive run's `adaptive_iterations`: its first
    /// iteration's end, then its steady pace (the mean interval between iteration ends).
    pub seconds_at_adaptive: f64,
    /// Its steady pace: seconds per iteration after the first.
    pub pace_s: f64,
    pub storage_stage_s: f64,
    pub compute_stage_s: f64,
    pub bytes_received: u64,
    pub predicted: Estimate,
    /// Its run on all of the adaptive run's batches, if it was one of the [`FINALISTS`] or `auto`
    /// settled on it.
    #[serde(default)]
    pub full: Option<FullRun>,
}

impl SweepCase {
    /// Its time over the adaptive run's iterations: measured when it ran them, else
    /// extrapolated from the short run.
    pub fn seconds_measured(&self) -> f64 {
        self.full.map_or(self.seconds_at_adaptive, |f| f.seconds)
    }

    /// Its steady pace: from the long run when there was one.
    pub fn pace_measured(&self) -> f64 {
        self.full.map_or(self.pace_s, |f| f.pace_s)
    }
}

/// Every split measured, and the adaptive run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepResults {
    pub model: String,
    pub batch: usize,
    /// Iterations per fixed split.
    pub iterations: usize,
    /// Iterations of the adaptive run.
    pub adaptive_iterations: usize,
    pub freeze: usize,
    pub cases: Vec<SweepCase>,
    /// The fastest fixed split over `adaptive_iterations`, and its time: the fastest of the
    /// long runs (the [`FINALISTS`]', and those of splits `auto` settled on).
    pub best: Split,
    pub best_s: f64,
    /// The fastest short run, extrapolated to `adaptive_iterations`.
    #[serde(default)]
    pub screen_best: Option<(Split, f64)>,
    /// The split the faster adaptive run settled on (most of its iterations), and its wall time
    /// (measuring the tiers before it is in `plan.plan_s`).
    pub auto: Split,
    pub auto_s: f64,
    /// Every adaptive run, in the order they ran (one per finalist).
    #[serde(default)]
    pub auto_runs: Vec<AutoRun>,
    /// Where exploration started: the model's best split.
    pub first_candidate: Split,
    /// Iterations the faster adaptive run spent exploring.
    pub explored: usize,
    pub moves: Vec<Move>,
    pub auto_trace: Vec<Iteration>,
    pub none_s: f64,
    pub plan: PlanReport,
}

/// Seconds per iteration after the first (the first's own time when there is one).
fn pace(start: f64, trace: &[Iteration]) -> f64 {
    mean_interval(trace)
        .or_else(|| trace.first().map(|first| first.end_unix - start))
        .unwrap_or(f64::NAN)
}

/// The first iteration's end from the start, then `(n - 1)` steady intervals.
fn extrapolate(start: f64, trace: &[Iteration], n: usize) -> f64 {
    let Some(first) = trace.first() else {
        return f64::NAN;
    };
    (first.end_unix - start) + pace(start, trace) * (n.max(1) - 1) as f64
}

impl Job {
    /// `--sweep`: measures the tiers as `auto` would; runs the adaptive run's batches once at
    /// split `freeze` without training, so that every run reads objects the storage tier has
    /// read before; runs `none` and every split 0..=freeze on `--max-iters` of those batches
    /// spread evenly over them, in the model's order, stopping a split past [`SCREEN_CUTOFF`]
    /// times the fastest so far; the [`FINALISTS`] fastest of those again on all
    /// `adaptive_iters`, each followed by a run of `auto`'s online adaptation on all of them;
    /// then a split `auto` settled on that was not a finalist, on all of them too.
    pub fn sweep(mut self, adaptive_iters: usize) -> anyhow::Result<SweepResults> {
        let k = self.iterations();
        let all = self.epoch_batches(0, adaptive_iters);
        anyhow::ensure!(
            all.len() == adaptive_iters && all.iter().all(|b| b.len() == self.cfg.batch),
            "--sweep: {} training samples make {} full batches of {}; the adaptive run needs {adaptive_iters} (raise --train-limit)",
            self.data.train.len(),
            self.data.train.len() / self.cfg.batch,
            self.cfg.batch
        );
        eprintln!("sweep: measuring the tiers as --split auto would");
        // Ranked for the adaptive run's length, which `auto` below is seeded with (ranked for
        // the short runs' `k`, filling and draining the pipeline would count for two of five
        // iterations and favour splits with little compute-tier work).
        let plan = self.plan_over(adaptive_iters)?;
        let short = Costs {
            iterations: k,
            ..plan.costs.clone()
        };
        print_plan(&plan);
        eprintln!(
            "sweep: reading the {adaptive_iters} batches once at split {} (not timed)",
            self.freeze
        );
        let pb = self.progress(all.len(), "warm".into());
        self.feed(
            &Choice::Fixed(Split::At(self.freeze)),
            all.clone(),
            &pb,
            false,
            Until::END,
            |_, _, _| Ok(()),
        )?;
        pb.finish_and_clear();
        // `prefetch` more batches than are timed keep the producer busy through the last timed
        // iteration, as it is in a long run (a short run's last iterations would otherwise
        // train without the fetching beside them, on the same core, and look faster).
        let tail = self.cfg.prefetch;
        let picked: Vec<Vec<crate::dataset::Sample>> = (0..k + tail)
            .map(|j| all[j * adaptive_iters / (k + tail)].clone())
            .collect();
        let mut cases = Vec::new();
        // Every candidate (`none` and 0..=freeze) in the model's order, fastest predicted
        // first, so that the cutoff is tight early.
        let mut candidates = short.estimates();
        candidates.sort_by(|a, b| a.epoch.total_cmp(&b.epoch));
        let mut fastest = f64::INFINITY;
        for predicted in candidates {
            let split = predicted.split;
            let start = crate::pipeline::now_unix();
            let until = Until {
                iterations: k,
                past_unix: if split == Split::None {
                    f64::INFINITY
                } else {
                    start + SCREEN_CUTOFF * fastest
                },
            };
            let r = self.train_until(0, &Choice::Fixed(split), picked.clone(), until)?;
            let timed = &r.trace[..k.min(r.trace.len())];
            let stopped_after = (timed.len() < k).then_some(timed.len());
            // The measured wall time when all `k` ran (first end, then `k - 1` intervals).
            let wall = extrapolate(start, timed, k);
            if stopped_after.is_none() {
                fastest = fastest.min(wall);
            }
            let at_n = extrapolate(start, timed, adaptive_iters);
            let ran = match stopped_after {
                Some(n) => format!(
                    "stopped after {n} it, past {SCREEN_CUTOFF}x the fastest ({:.2} s for {k}); {wall:.2} s for {k} extrapolated",
                    fastest
                ),
                None => format!("{wall:.2} s for {k} it"),
            };
            eprintln!(
                "sweep: split {split:>4}: {ran} ({:.2} s for {adaptive_iters}; predicted {:.2} s for {k}), storage {} / compute {} ms/it, {:.1} MB",
                at_n,
                predicted.epoch,
                ms(r.storage_stage_s),
                ms(r.compute_stage_s),
                r.bytes_received as f64 / 1e6
            );
            cases.push(SweepCase {
                split,
                seconds: wall,
                stopped_after,
                seconds_at_adaptive: at_n,
                pace_s: pace(start, timed),
                storage_stage_s: r.storage_stage_s,
                compute_stage_s: r.compute_stage_s,
                bytes_received: r.bytes_received,
                predicted,
                full: None,
            });
        }
        cases.sort_by_key(|c| c.split);
        // The adaptive run's batches, and the same tail after them: timed to the end of its
        // last, where the run stops (the tail's fetches have overlapped its last iterations).
        let whole = Until {
            iterations: adaptive_iters,
            past_unix: f64::INFINITY,
        };
        let mut batches = all;
        let again: Vec<_> = batches.iter().take(tail).cloned().collect();
        batches.extend(again);
        let mut order: Vec<usize> = (0..cases.len()).collect();
        order.sort_by(|&a, &b| {
            cases[a]
                .seconds_at_adaptive
                .total_cmp(&cases[b].seconds_at_adaptive)
        });
        let screen_best = order
            .first()
            .map(|&i| (cases[i].split, cases[i].seconds_at_adaptive));
        // Each finalist's long run, then an adaptive run from a fresh chooser seeded with the
        // same plan: interleaved, so that both sides see the same stretches of this machine.
        let mut autos: Vec<(AutoRun, EpochResult)> = Vec::new();
        let long_run = |job: &mut Self, case: &mut SweepCase| -> anyhow::Result<()> {
            let split = case.split;
            let start = crate::pipeline::now_unix();
            let r = job.train_until(0, &Choice::Fixed(split), batches.clone(), whole)?;
            let timed = &r.trace[..adaptive_iters.min(r.trace.len())];
            let full = FullRun {
                seconds: timed.last().map_or(f64::NAN, |it| it.end_unix - start),
                pace_s: pace(start, timed),
                storage: StorageSide::of(&r),
                stages_s: crate::pipeline::mean_stages(timed),
            };
            eprintln!(
                "sweep: split {split:>4} on all {adaptive_iters} batches: {:.2} s ({:.2} s extrapolated from {k}), {} ms/it (storage {} / compute {} ms/it); {}",
                full.seconds,
                case.seconds_at_adaptive,
                ms(full.pace_s),
                full.stages_s.map_or("-".into(), |s| ms(s.0)),
                full.stages_s.map_or("-".into(), |s| ms(s.1)),
                full.storage.line()
            );
            case.full = Some(full);
            Ok(())
        };
        for &i in order.iter().take(FINALISTS) {
            long_run(&mut self, &mut cases[i])?;
            let choice = self.adaptive(&plan.costs);
            let start = crate::pipeline::now_unix();
            let r = self.train_until(1, &choice, batches.clone(), whole)?;
            let seconds = r
                .trace
                .get(adaptive_iters - 1)
                .map_or(f64::NAN, |i| i.end_unix - start);
            let (explored, _) = choice
                .adaptive()
                .context("Job::adaptive gave a fixed split")?
                .explored();
            let storage = StorageSide::of(&r);
            eprintln!(
                "sweep: auto on all {adaptive_iters} batches: {seconds:.2} s, mostly at split {} ({explored} it exploring); {}",
                r.split,
                storage.line()
            );
            let run = AutoRun {
                seconds,
                split: r.split,
                explored,
                storage,
            };
            autos.push((run, r));
        }
        // A split `auto` settled on that the screen left out of the finalists runs long too, so
        // that the best fixed split is judged among every split either side found (ResNet-18 at
        // 50 Mbit/s, batch 64, settled on 9, which beat both finalists' long runs).
        for (run, _) in &autos {
            if let Some(case) = cases
                .iter_mut()
                .find(|c| c.split == run.split && c.full.is_none())
            {
                long_run(&mut self, case)?;
            }
        }
        let auto_runs: Vec<AutoRun> = autos.iter().map(|(a, _)| a.clone()).collect();
        let (auto, r) = autos
            .into_iter()
            .min_by(|a, b| a.0.seconds.total_cmp(&b.0.seconds))
            .context("no adaptive run")?;
        let best = cases
            .iter()
            .filter(|c| c.full.is_some())
            .min_by(|a, b| a.seconds_measured().total_cmp(&b.seconds_measured()))
            .context("no cases")?;
        let none_s = cases.first().map_or(f64::NAN, |c| c.seconds_at_adaptive);
        Ok(SweepResults {
            model: self.cfg.model.clone(),
            batch: self.cfg.batch,
            iterations: k,
            adaptive_iterations: adaptive_iters,
            freeze: self.freeze,
            best: best.split,
            best_s: best.seconds_measured(),
            screen_best,
            auto: auto.split,
            auto_s: auto.seconds,
            auto_runs,
            first_candidate: plan.chosen,
            explored: auto.explored,
            moves: r.moves,
            auto_trace: r.trace,
            none_s,
            cases,
            plan,
        })
    }
}

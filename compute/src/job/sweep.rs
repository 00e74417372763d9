//! `--sweep`: every split measured for a fixed number of iterations (the split-choice
//! evaluation).

use crate::plan::{Estimate, Split};
use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::PlanReport;
use super::report::{ms, print_plan};
use super::train::Job;

/// One split's measured time in a sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepCase {
    pub split: Split,
    pub seconds: f64,
    pub storage_stage_s: f64,
    pub compute_stage_s: f64,
    pub bytes_received: u64,
    pub predicted: Estimate,
}

/// Every split measured for a fixed number of iterations, and the planner's choice.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepResults {
    pub model: String,
    pub batch: usize,
    pub iterations: usize,
    pub freeze: usize,
    pub cases: Vec<SweepCase>,
    pub best: Split,
    pub best_s: f64,
    /// The planner's choice and its own run's time (profiling not included; see `plan.probe_s`).
    pub auto: Split,
    pub auto_s: f64,
    pub none_s: f64,
    pub plan: PlanReport,
}

impl Job {
    /// `--sweep`: plans as `auto` would, then runs `none` and every split 0..=freeze for the
    /// job's iteration count (`--max-iters`), then the planner's choice again as `auto`'s run.
    pub fn sweep(mut self) -> anyhow::Result<SweepResults> {
        let iters = self.iterations();
        eprintln!("sweep: planning as --split auto would");
        let plan = self.plan()?;
        print_plan(&plan);
        let mut cases = Vec::new();
        let candidates: Vec<Split> = std::iter::once(Split::None)
            .chain((0..=self.freeze).map(Split::At))
            .collect();
        for split in candidates {
            let r = self.train_epoch(0, split, iters)?;
            let predicted = plan.costs.estimate(split);
            eprintln!(
                "sweep: split {split:>4}: {:.2} s for {iters} it (predicted {:.2} s), storage {} / compute {} ms/it, {:.1} MB",
                r.wall_s,
                predicted.epoch,
                ms(r.storage_stage_s),
                ms(r.compute_stage_s),
                r.bytes_received as f64 / 1e6
            );
            cases.push(SweepCase {
                split,
                seconds: r.wall_s,
                storage_stage_s: r.storage_stage_s,
                compute_stage_s: r.compute_stage_s,
                bytes_received: r.bytes_received,
                predicted,
            });
        }
        let auto = self.train_epoch(0, plan.chosen, iters)?;
        let best = cases
            .iter()
            .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .context("no cases")?;
        let none_s = cases.first().map_or(f64::NAN, |c| c.seconds);
        Ok(SweepResults {
            model: self.cfg.model.clone(),
            batch: self.cfg.batch,
            iterations: iters,
            freeze: self.freeze,
            best: best.split,
            best_s: best.seconds,
            auto: plan.chosen,
            auto_s: auto.wall_s,
            none_s,
            cases,
            plan,
        })
    }
}

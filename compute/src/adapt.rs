//! Online split adaptation: the split is chosen, and revised, on real training iterations.
//!
//! Frozen layers run in eval mode on both tiers, so every split gives the same features: the
//! trainer may change the split on any iteration without changing a loss. [`Adaptive`] uses
//! that. It starts from the planner's candidates (the model's best few splits), gives each
//! training iteration to one of them, and measures what each costs: an iteration at split `s`
//! costs `max(storage stage, compute stage)`, the pipeline's pace. Candidates are dropped by
//! successive elimination: once a candidate's lower confidence bound (mean minus `z` standard
//! errors) is above the best one's upper bound, it can no longer be the fastest. The noise is
//! pooled over every candidate as a relative standard deviation (the stages' noise scales with
//! their length), with a weak prior, so that a candidate 50% slower goes after one sample and
//! near-ties get more. Iterations are not dealt out in turn: after one each, the next goes to
//! the candidate that may be fastest (lowest lower bound), a bandit's optimism, so that the
//! leader gets most of them and exploring costs little over the best split's own pace. Before it
//! settles, the leader's neighbouring splits are measured too if they never were (the model may
//! have ranked the best one just out of the candidates), and if one leads, its neighbours. When
//! one is left (or the leader has `max_samples`), the trainer stays there and watches a window
//! of recent iterations; when their median moves from the median of the first
//! [`BASELINE_WINDOWS`] windows at that split by more than `drift` and more than [`WATCH_SDS`]
//! standard deviations of what noise alone moves it by (an upper bound on the noise measured
//! while exploring and since), because the network was shaped down or another tenant loads the
//! host, the model is recalibrated from what moved (the storage stage gives a new bandwidth, the
//! compute stage a new scale), the candidates are ranked again and exploration restarts. It
//! also watches the link itself (bytes received per second of transfer, per batch): at a split
//! whose iteration is bound by the compute stage, a slower link raises the storage stage without
//! moving the iteration's cost until it is too late, while splits that send less may already be
//! faster. When the link's median moves from that of its first batches at the split by more
//! than `drift` and more than its noise allows (or the median of the last half window by more
//! than [`LINK_JUMP`]), the model is given the new rate; if it then ranks another split faster
//! than the settled one by more than half of `drift` (a gain the cost's own watch would miss or
//! see late), exploration restarts, else the new rate becomes the baseline (after a jump, once
//! a whole window has confirmed it). A confirmed jump of more than [`LINK_JUMP`] also has the
//! settled split measured again against its neighbours (those the model puts within
//! [`PLAUSIBLE`]): the model's margin is within its error, and a split whose cost hardly moves
//! with the link (bound by its compute stage) would never let the cost's watch see that its
//! neighbour became faster.
//!
//! Nothing here trains or fetches: [`Choice`] is what the pipeline asks for the next batch's
//! split and tells how the batch went.

use crate::plan::{Costs, Estimate, Split};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Candidates explored at once.
pub const CANDIDATES: usize = 4;
/// Windows of iterations at the settled split whose median is the cost's baseline.
pub const BASELINE_WINDOWS: usize = 3;
/// Standard deviations of noise (in the difference of the window's median and the baseline's)
/// that the cost must move by, besides `drift`, to restart exploration.
pub const WATCH_SDS: f64 = 4.5;
/// A change of the link's rate by more than this factor is acted on from the median of half a
/// window.
pub const LINK_JUMP: f64 = 2.0;
/// The standard deviation of a median of `n` normal samples is this times the mean's.
const MEDIAN_SD: f64 = 1.2533;
/// Splits whose estimate is within this factor of the best are plausible winners: the model's
/// stage estimates are off by up to about 25% here.
pub const PLAUSIBLE: f64 = 1.3;

/// The splits to explore: the model's best, then others among the plausible ones spread
/// evenly over the layers (neighbouring splits often cost the same, and exploring three of
/// them would tell nothing new), `none` included when plausible.
pub fn candidates(estimates: &[Estimate]) -> Vec<Estimate> {
    let fits: Vec<Estimate> = estimates.iter().filter(|e| e.fits).copied().collect();
    let Some(best) = fits
        .iter()
        .min_by(|a, b| a.epoch.total_cmp(&b.epoch))
        .copied()
    else {
        return Vec::new();
    };
    let mut plausible: Vec<Estimate> = fits
        .into_iter()
        .filter(|e| e.epoch <= best.epoch * PLAUSIBLE && e.split != best.split)
        .collect();
    plausible.sort_by_key(|e| e.split);
    let mut out = vec![best];
    let k = (CANDIDATES - 1).min(plausible.len());
    for j in 0..k {
        // Evenly spaced positions over the plausible splits, in layer order.
        let i = if k == 1 {
            0
        } else {
            j * (plausible.len() - 1) / (k - 1)
        };
        let e = plausible[i];
        if !out.iter().any(|o| o.split == e.split) {
            out.push(e);
        }
    }
    out
}

/// How [`Adaptive`] decides.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct AdaptConfig {
    /// Standard errors in a confidence bound.
    pub z: f64,
    /// The leader's samples after which exploring stops even if the others are not separated
    /// from it.
    pub max_samples: usize,
    /// Recent iterations watched at the settled split.
    pub window: usize,
    /// Relative change of the window's median that restarts exploration (at least; more where
    /// the measured noise needs it).
    pub drift: f64,
    /// Prior relative standard deviation of an iteration's cost, and its weight in samples.
    pub prior_cv: f64,
    pub prior_weight: f64,
}

impl AdaptConfig {
    /// A relative standard deviation from squared relative deviations `ss` on `dof` degrees
    /// of freedom, pooled with the prior.
    fn with_prior(&self, ss: f64, dof: f64) -> f64 {
        let w = self.prior_weight;
        ((self.prior_cv.powi(2) * w + ss) / (w + dof)).sqrt()
    }

    pub fn new(drift: f64) -> Self {
        Self {
            z: 2.0,
            max_samples: 8,
            window: 6,
            drift,
            prior_cv: 0.1,
            prior_weight: 2.0,
        }
    }
}

/// One candidate split and what its iterations cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Arm {
    pub split: Split,
    /// The model's estimate per iteration (`max(storage, compute)`), for ranking.
    pub predicted: f64,
    /// Measured per iteration: `max(storage, compute)`, and the stages.
    pub samples: Vec<f64>,
    pub storage: Vec<f64>,
    pub compute: Vec<f64>,
    /// Still in the running.
    pub active: bool,
    /// Batches handed out and not yet measured.
    #[serde(skip)]
    pending: usize,
    /// Batches handed out in this exploration, measured or not.
    #[serde(skip)]
    handed: usize,
    /// Samples it started with, measured before this exploration (a second look's settled
    /// split): they do not count towards `max_samples`.
    #[serde(skip)]
    seeded: usize,
}

impl Arm {
    fn new(e: &Estimate) -> Self {
        Self {
            split: e.split,
            predicted: e.pace(),
            samples: Vec::new(),
            storage: Vec::new(),
            compute: Vec::new(),
            active: true,
            pending: 0,
            handed: 0,
            seeded: 0,
        }
    }

    pub fn mean(&self) -> f64 {
        mean(&self.samples)
    }

    /// A confidence bound on its cost as if it had `n` samples: the mean plus (`sign` 1) or
    /// minus (`sign` -1) `width` relative standard deviations (`z` times the noise) over √n.
    fn bound(&self, n: usize, width: f64, sign: f64) -> f64 {
        let m = self.mean();
        m + sign * width * m / (n as f64).sqrt()
    }
}

/// Where the trainer moved, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Move {
    /// The job's iteration (over all epochs) whose batch was the first at `to`.
    pub iteration: usize,
    pub to: Split,
    pub reason: String,
}

/// One iteration at the settled split: its cost, storage and compute stages (seconds), and the
/// link's rate during its fetch (bytes per second of transfer; NaN when not measured).
type Watched = (f64, f64, f64, f64);

#[derive(Clone, Debug)]
enum Phase {
    Explore,
    Settled {
        arm: usize,
        /// Medians of the storage and compute stages per iteration in the first full window at
        /// the settled split: what moved recalibrates the model (the cost's watch compares
        /// with `since`).
        baseline: Option<(f64, f64)>,
        /// The latest iterations at the settled split (its exploration samples first).
        recent: Vec<Watched>,
        /// The first [`BASELINE_WINDOWS`] windows of costs at the settled split (its
        /// exploration samples first): the cost's baseline is their median.
        since: Vec<f64>,
        /// The link's rate on the first [`BASELINE_WINDOWS`] windows of batches that measured
        /// it at the settled split (since it last moved): its baseline is their median.
        links_since: Vec<f64>,
    },
}

/// The online split chooser. See the module's documentation.
#[derive(Debug)]
pub struct Adaptive {
    cfg: AdaptConfig,
    costs: Costs,
    /// `--candidates`: exploration restricted to these splits.
    only: Option<Vec<Split>>,
    arms: Vec<Arm>,
    phase: Phase,
    /// Batches handed out so far (the job's iteration count).
    issued: usize,
    moves: Vec<Move>,
    /// Batches handed out while exploring.
    explored: usize,
}

impl Adaptive {
    /// Starts exploring the model's candidates (`only`: restricted to these splits).
    pub fn new(costs: Costs, cfg: AdaptConfig, only: Option<&[Split]>) -> Self {
        let only = only.map(<[Split]>::to_vec);
        let arms = Self::arms(&costs, only.as_deref());
        Self {
            cfg,
            costs,
            only,
            arms,
            phase: Phase::Explore,
            issued: 0,
            moves: Vec::new(),
            explored: 0,
        }
    }

    fn arms(costs: &Costs, only: Option<&[Split]>) -> Vec<Arm> {
        let all = costs.estimates();
        let arms: Vec<Arm> = match only {
            Some(only) => {
                let mut picked: Vec<Estimate> = all
                    .iter()
                    .filter(|e| only.contains(&e.split))
                    .copied()
                    .collect();
                picked.sort_by(|a, b| a.epoch.total_cmp(&b.epoch));
                picked.iter().map(Arm::new).collect()
            }
            None => candidates(&all).iter().map(Arm::new).collect(),
        };
        if arms.is_empty() {
            // Nothing fits the compute tier's memory: the model's fallback.
            vec![Arm::new(&costs.choose())]
        } else {
            arms
        }
    }

    /// The split the trainer would use now if it stopped exploring.
    pub fn current(&self) -> Split {
        match &self.phase {
            Phase::Settled { arm, .. } => self.arms[*arm].split,
            Phase::Explore => self
                .leader()
                .map_or(self.arms[0].split, |i| self.arms[i].split),
        }
    }

    /// Whether it has settled on a split.
    pub fn settled(&self) -> bool {
        matches!(self.phase, Phase::Settled { .. })
    }

    pub fn moves(&self) -> &[Move] {
        &self.moves
    }

    pub fn arms_now(&self) -> &[Arm] {
        &self.arms
    }

    /// Batches handed out while exploring, and in all.
    pub fn explored(&self) -> (usize, usize) {
        (self.explored, self.issued)
    }

    /// The model as calibrated so far.
    pub fn costs(&self) -> &Costs {
        &self.costs
    }

    /// The split for the next batch.
    pub fn next_split(&mut self) -> Split {
        let i = match &self.phase {
            Phase::Settled { arm, .. } => *arm,
            Phase::Explore => {
                self.explored += 1;
                self.optimistic()
            }
        };
        self.arms[i].pending += 1;
        self.arms[i].handed += 1;
        self.issued += 1;
        self.arms[i].split
    }

    /// A batch at `split` ran cold (a pipeline's first, see [`crate::pipeline::run`]): it is
    /// no longer on its way and is no sample, so a candidate measured on nothing else gets
    /// another batch once every candidate has had one.
    pub fn cold(&mut self, split: Split) {
        if let Some(arm) = self.arms.iter_mut().find(|a| a.split == split) {
            arm.pending = arm.pending.saturating_sub(1);
        }
    }

    /// A batch at `split` took `storage` (the producer's busy time) and `compute` (the
    /// trainer's) seconds; `link`: bytes it received per second of transfer, where measured.
    pub fn observe(&mut self, split: Split, storage: f64, compute: f64, link: Option<f64>) {
        let Some(i) = self.arms.iter().position(|a| a.split == split) else {
            return;
        };
        let cost = storage.max(compute);
        let explore_cv = self.cv();
        let arm = &mut self.arms[i];
        arm.pending = arm.pending.saturating_sub(1);
        match &mut self.phase {
            Phase::Explore => {
                arm.samples.push(cost);
                arm.storage.push(storage);
                arm.compute.push(compute);
                self.eliminate();
            }
            Phase::Settled {
                arm: settled,
                baseline,
                recent,
                since,
                links_since,
            } => {
                if *settled != i {
                    return; // a batch handed out before it settled
                }
                if since.len() < BASELINE_WINDOWS * self.cfg.window {
                    since.push(cost);
                }
                let link = link.filter(|l| l.is_finite() && *l > 0.0);
                if let Some(l) = link
                    && links_since.len() < BASELINE_WINDOWS * self.cfg.window
                {
                    links_since.push(l);
                }
                recent.push((cost, storage, compute, link.unwrap_or(f64::NAN)));
                if recent.len() > self.cfg.window {
                    recent.remove(0);
                }
                if recent.len() < self.cfg.window {
                    return;
                }
                let links: Vec<f64> = recent.iter().map(|r| r.3).filter(|l| !l.is_nan()).collect();
                let stages = (
                    median(recent.iter().map(|r| r.1)),
                    median(recent.iter().map(|r| r.2)),
                );
                let Some(base) = *baseline else {
                    *baseline = Some(stages);
                    return;
                };
                // The link first: its rate is the cause measured directly. Its baseline is the
                // median of the first measured batches at this split (half a window at least), and
                // it moved when the window's median (measured on at least half of it) moved by
                // more than `drift` and more than noise alone would move it; or when the median
                // of the last half window jumped by more than `LINK_JUMP` (noise does not halve
                // or double a median of three): at a split that sends much, each batch at the
                // old split costs dearly.
                let half: Vec<f64> = recent
                    .iter()
                    .rev()
                    .take(self.cfg.window.div_ceil(2))
                    .map(|r| r.3)
                    .collect();
                let fast = half
                    .iter()
                    .all(|l| !l.is_nan())
                    .then(|| median(half.into_iter()));
                let l0 = (2 * links_since.len() >= self.cfg.window)
                    .then(|| median(links_since.iter().copied()));
                let measured_links = links.len();
                // The new rate, from the window's batches that jumped when it jumped, and
                // whether the whole window did (a jump's rate from a few batches is noisy: it is
                // acted on at once only to move, and becomes the baseline once confirmed).
                let (l1, new, confirmed) = match (l0, fast) {
                    (Some(l0), Some(fast)) if (fast / l0).ln().abs() > LINK_JUMP.ln() => {
                        let down = fast < l0;
                        let jumped: Vec<f64> = links
                            .iter()
                            .copied()
                            .filter(|&l| (l < l0) == down && (l / l0).ln().abs() > LINK_JUMP.ln())
                            .collect();
                        let confirmed = jumped.len() == recent.len();
                        (Some(median(jumped.iter().copied())), jumped, confirmed)
                    }
                    _ => (
                        (2 * links.len() >= recent.len()).then(|| median(links.iter().copied())),
                        links,
                        true,
                    ),
                };
                // Its noise: the relative standard deviation of the baseline's batches, or that
                // pooled with the cost's prior if larger (a few batches may look quiet).
                let logs: Vec<f64> = links_since.iter().map(|l| l.ln()).collect();
                let measured = sd(&logs);
                let dof = links_since.len().saturating_sub(1) as f64;
                let link_sd = upper_sd(
                    self.cfg
                        .with_prior(measured.powi(2) * dof, dof)
                        .max(measured),
                    links_since.len(),
                );
                let link_noise = MEDIAN_SD
                    * link_sd
                    * (1.0 / measured_links.max(1) as f64 + 1.0 / links_since.len().max(1) as f64)
                        .sqrt();
                let link_moved = self.cfg.drift.ln_1p().max(WATCH_SDS * link_noise);
                if let (Some(l0), Some(l1)) = (l0, l1)
                    && (l1 / l0).ln().abs() > link_moved
                {
                    let split = self.arms[i].split;
                    let margin = self.cfg.drift / 2.0;
                    let only = self.only.as_deref();
                    if let Some((costs, why)) =
                        faster_at_link(&self.costs, only, split, l1 / l0, margin)
                    {
                        let reason = format!(
                            "link {:.1} -> {:.1} MB/s at split {split}: {why}: exploring again",
                            l0 / 1e6,
                            l1 / 1e6
                        );
                        self.costs = costs;
                        self.restart(reason);
                        return;
                    }
                    // No split would gain by the model: the new rate is the model's, and its
                    // measurements start the link's new baseline. After a jump, the model's
                    // ranking near the settled split is not to be trusted within its error (its
                    // margin is half of `drift`, its error tens of percent), and the cost's watch
                    // may never see a split fall behind its neighbour: the neighbours are
                    // measured again against the window just confirmed.
                    if confirmed {
                        self.costs.bandwidth *= l1 / l0;
                        let near = if (l1 / l0).ln().abs() > LINK_JUMP.ln() {
                            neighbours(&self.costs, self.only.as_deref(), split)
                        } else {
                            Vec::new()
                        };
                        if !near.is_empty() {
                            let reason = format!(
                                "link {:.1} -> {:.1} MB/s at split {split} over a whole window, no split ranked more than {:.0}% ahead: measuring its neighbours again",
                                l0 / 1e6,
                                l1 / 1e6,
                                margin * 100.0
                            );
                            let window = std::mem::take(recent);
                            self.explore_near(i, &window, &near, reason);
                            return;
                        }
                        *links_since = new;
                    }
                }
                // The cost against the median of the first windows, by more than `drift` and
                // more than noise alone would move it.
                let cost0 = median(since.iter().copied());
                let cv = upper_sd(explore_cv.max(sd(since) / mean(since)), since.len());
                let noise =
                    MEDIAN_SD * cv * (1.0 / recent.len() as f64 + 1.0 / since.len() as f64).sqrt();
                let cost = median(recent.iter().map(|r| r.0));
                if (cost / cost0 - 1.0).abs() <= self.cfg.drift.max(WATCH_SDS * noise) {
                    return;
                }
                let reason = format!(
                    "iteration cost {:.0} -> {:.0} ms at split {} (storage {:.0} -> {:.0} ms, compute {:.0} -> {:.0} ms): exploring again",
                    cost0 * 1e3,
                    cost * 1e3,
                    self.arms[i].split,
                    base.0 * 1e3,
                    stages.0 * 1e3,
                    base.1 * 1e3,
                    stages.1 * 1e3,
                );
                self.recalibrate(self.arms[i].split, base.0, stages.0, base.1, stages.1);
                self.restart(reason);
            }
        }
    }

    /// The model follows what moved: a storage stage that changed gives the bandwidth that
    /// explains it, a compute stage its scale.
    fn recalibrate(&mut self, split: Split, s0: f64, s1: f64, c0: f64, c1: f64) {
        let moved = |a: f64, b: f64| a > 0.0 && (b / a - 1.0).abs() > self.cfg.drift;
        if moved(c0, c1) {
            self.costs.compute_scale *= c1 / c0;
        }
        if moved(s0, s1) && matches!(split, Split::At(_)) {
            // The storage stage falls as bandwidth grows: bisect on log(bandwidth).
            let (mut lo, mut hi) = (1e4f64.ln(), 1e11f64.ln());
            for _ in 0..60 {
                let mid = 0.5 * (lo + hi);
                self.costs.bandwidth = mid.exp();
                if self.costs.estimate(split).storage > s1 {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            self.costs.bandwidth = (0.5 * (lo + hi)).exp();
        }
    }

    /// Explore again: the candidates the recalibrated model ranks best, and the split in use.
    fn restart(&mut self, reason: String) {
        let current = self.current();
        let mut arms = Self::arms(&self.costs, self.only.as_deref());
        if !arms.iter().any(|a| a.split == current) {
            let e = self.costs.estimate(current);
            arms.push(Arm::new(&e));
        }
        self.explore(arms, reason);
    }

    /// Explores `arms` from the split in use (recorded as a move, for `reason`).
    fn explore(&mut self, mut arms: Vec<Arm>, reason: String) {
        let current = self.current();
        // Batches already handed out at a split stay counted against it.
        for a in &mut arms {
            a.pending = self
                .arms
                .iter()
                .find(|o| o.split == a.split)
                .map_or(0, |o| o.pending);
        }
        self.arms = arms;
        self.phase = Phase::Explore;
        self.moves.push(Move {
            iteration: self.issued,
            to: current,
            reason,
        });
    }

    /// The candidate to measure next: one never handed a batch (the model's favourite first),
    /// then one whose batches were no samples ([`Adaptive::cold`]); else the one that may be
    /// fastest, by the lowest lower confidence bound on its cost (counting batches on their way
    /// as samples). A clearly slower candidate gets no more iterations, a near-tie gets them
    /// only while it may still be the faster, and the leader gets the rest: iterations spent
    /// exploring cost little more than the best's.
    fn optimistic(&self) -> usize {
        let active = || (0..self.arms.len()).filter(|&i| self.arms[i].active);
        let unmeasured = |i: &usize| self.arms[*i].samples.len() + self.arms[*i].pending == 0;
        if let Some(i) = active()
            .filter(unmeasured)
            .find(|&i| self.arms[i].handed == 0)
            .or_else(|| active().find(unmeasured))
        {
            return i;
        }
        let width = self.cfg.z * self.cv();
        let lower = |i: usize| {
            let a = &self.arms[i];
            a.bound(a.samples.len() + a.pending, width, -1.0)
        };
        active()
            .filter(|&i| !self.arms[i].samples.is_empty())
            .min_by(|&a, &b| lower(a).total_cmp(&lower(b)))
            .or_else(|| active().next())
            .unwrap_or(0)
    }

    /// The active candidate with the lowest mean, among those measured.
    fn leader(&self) -> Option<usize> {
        (0..self.arms.len())
            .filter(|&i| self.arms[i].active && !self.arms[i].samples.is_empty())
            .min_by(|&a, &b| self.arms[a].mean().total_cmp(&self.arms[b].mean()))
    }

    /// Pooled relative standard deviation of a sample, with the prior.
    fn cv(&self) -> f64 {
        let (mut ss, mut dof) = (0.0, 0.0);
        for a in &self.arms {
            if a.samples.len() >= 2 {
                let m = a.mean();
                ss += a.samples.iter().map(|x| (x / m - 1.0).powi(2)).sum::<f64>();
                dof += (a.samples.len() - 1) as f64;
            }
        }
        self.cfg.with_prior(ss, dof)
    }

    fn eliminate(&mut self) {
        let every_active_measured = self
            .arms
            .iter()
            .filter(|a| a.active)
            .all(|a| !a.samples.is_empty());
        if !every_active_measured {
            return;
        }
        let Some(best) = self.leader() else { return };
        let width = self.cfg.z * self.cv();
        let bound = |a: &Arm, sign: f64| a.bound(a.samples.len(), width, sign);
        let upper = bound(&self.arms[best], 1.0);
        for i in 0..self.arms.len() {
            if i != best && self.arms[i].active && bound(&self.arms[i], -1.0) > upper {
                self.arms[i].active = false;
            }
        }
        let active: Vec<usize> = (0..self.arms.len())
            .filter(|&i| self.arms[i].active)
            .collect();
        // The leader has had `max_samples` in this exploration: whatever is still in the
        // running is within the noise of it, and its share of the iterations ran close to the
        // leader's cost. A second look's settled split starts with a window of samples; were
        // they counted, it would settle two iterations later, its neighbours measured once or
        // twice each (at 10% noise, a neighbour 14% faster was left in 30 of 200 simulated
        // runs: `a_second_look_measures_the_neighbours_enough_to_tell_a_near_one_apart`).
        let leader = &self.arms[best];
        let done =
            active.len() == 1 || leader.samples.len() - leader.seeded >= self.cfg.max_samples;
        if done && !self.step_aside(best) {
            self.settle(best);
        }
    }

    /// Before settling on the leader: its neighbouring splits that were never candidates join
    /// the running (those that fit, that `--candidates` allows, and that the model puts within
    /// [`PLAUSIBLE`] of it). Neighbouring splits often cost about the same, so measuring them
    /// costs little, and the model, off by tens of percent in the middle of a network, may have
    /// ranked the best one just out of the candidates. If one of them leads, its own neighbours
    /// come next: a walk downhill. Whether any joined.
    fn step_aside(&mut self, leader: usize) -> bool {
        let fresh: Vec<Arm> =
            neighbours(&self.costs, self.only.as_deref(), self.arms[leader].split)
                .iter()
                .filter(|e| !self.arms.iter().any(|a| a.split == e.split))
                .map(Arm::new)
                .collect();
        if fresh.is_empty() {
            return false;
        }
        self.arms.extend(fresh);
        true
    }

    /// Explores the settled split `i` against its `near` neighbours, the split starting with
    /// the `window` of iterations just watched there (measured at the link's new rate).
    fn explore_near(&mut self, i: usize, window: &[Watched], near: &[Estimate], reason: String) {
        let mut here = Arm::new(&self.costs.estimate(self.arms[i].split));
        for &(cost, storage, compute, _) in window {
            here.samples.push(cost);
            here.storage.push(storage);
            here.compute.push(compute);
        }
        here.seeded = here.samples.len();
        let arms = std::iter::once(here)
            .chain(near.iter().map(Arm::new))
            .collect();
        self.explore(arms, reason);
    }

    fn settle(&mut self, i: usize) {
        let a = &self.arms[i];
        let (cost, storage, compute) = (a.mean(), mean(&a.storage), mean(&a.compute));
        // Calibrate the model where it settled, so that a later recalibration starts from
        // what was measured there (within bounds: a stage predicted at almost nothing gives no
        // scale).
        let e = self.costs.estimate(a.split);
        let scale = |measured: f64, predicted: f64| {
            if predicted > 1e-3 {
                (measured / predicted).clamp(0.2, 5.0)
            } else {
                1.0
            }
        };
        self.costs.storage_scale *= scale(storage, e.storage);
        self.costs.compute_scale *= scale(compute, e.compute);
        let others: Vec<String> = self
            .arms
            .iter()
            .filter(|o| o.split != a.split && !o.samples.is_empty())
            .map(|o| {
                format!(
                    "{} {:.0} ms ({} it)",
                    o.split,
                    o.mean() * 1e3,
                    o.samples.len()
                )
            })
            .collect();
        self.moves.push(Move {
            iteration: self.issued,
            to: a.split,
            reason: format!(
                "settled on split {} at {:.0} ms per iteration ({} it, {:.1}% noise){}",
                a.split,
                cost * 1e3,
                a.samples.len(),
                self.cv() * 100.0,
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; against {}", others.join(", "))
                }
            ),
        });
        // Exploration did not keep the link's rate: the watch measures it from here on.
        let recent: Vec<Watched> = (0..a.samples.len())
            .map(|k| (a.samples[k], a.storage[k], a.compute[k], f64::NAN))
            .rev()
            .take(self.cfg.window)
            .rev()
            .collect();
        let since = a
            .samples
            .iter()
            .copied()
            .take(BASELINE_WINDOWS * self.cfg.window)
            .collect();
        self.phase = Phase::Settled {
            arm: i,
            baseline: None,
            recent,
            since,
            links_since: Vec::new(),
        };
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// An upper bound (one-sided 95%) on a standard deviation estimated as `sd` from `n` samples:
/// a watch that took the estimate itself would fire on noise whenever a few quiet batches made
/// it low.
fn upper_sd(sd: f64, n: usize) -> f64 {
    sd * (1.0 + 1.645 / (2.0 * n.saturating_sub(1).max(1) as f64).sqrt())
}

/// Sample standard deviation (0 below 3 values). Of logarithms, or divided by the mean, it is
/// a relative one.
fn sd(v: &[f64]) -> f64 {
    if v.len() < 3 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// The splits next to `split` that fit, that `only` allows, and that the model puts within
/// [`PLAUSIBLE`] of it.
fn neighbours(costs: &Costs, only: Option<&[Split]>, split: Split) -> Vec<Estimate> {
    let Split::At(at) = split else {
        return Vec::new();
    };
    let estimates = costs.estimates();
    let Some(here) = estimates.iter().find(|e| e.split == split) else {
        return Vec::new();
    };
    let limit = here.pace() * PLAUSIBLE;
    estimates
        .iter()
        .filter(|e| {
            let Split::At(s) = e.split else { return false };
            e.fits
                && s.abs_diff(at) == 1
                && e.pace() <= limit
                && only.is_none_or(|o| o.contains(&e.split))
        })
        .copied()
        .collect()
}

/// The model with its bandwidth scaled by `ratio` (the link's measured change), and why, when
/// it then ranks a split (among `only`, if given) faster than `at` by more than `margin`.
fn faster_at_link(
    costs: &Costs,
    only: Option<&[Split]>,
    at: Split,
    ratio: f64,
    margin: f64,
) -> Option<(Costs, String)> {
    let mut moved = costs.clone();
    moved.bandwidth *= ratio;
    let here = moved.estimate(at).pace();
    let best = moved
        .estimates()
        .into_iter()
        .filter(|e| e.fits && e.split != at && only.is_none_or(|o| o.contains(&e.split)))
        .min_by(|a, b| a.pace().total_cmp(&b.pace()))?;
    (best.pace() * (1.0 + margin) < here).then(|| {
        let reason = format!(
            "the model now puts split {} at {:.0} ms per iteration against {:.0} ms here",
            best.split,
            best.pace() * 1e3,
            here * 1e3
        );
        (moved, reason)
    })
}

fn locked(a: &Mutex<Adaptive>) -> MutexGuard<'_, Adaptive> {
    a.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the pipeline gets each batch's split: fixed, or from an [`Adaptive`] chooser that it
/// tells how each batch went.
#[derive(Clone, Debug)]
pub enum Choice {
    Fixed(Split),
    Adaptive(Arc<Mutex<Adaptive>>),
}

impl Choice {
    /// The adaptive chooser, locked; `None` for a fixed split. A lock poisoned by a panic
    /// elsewhere while it was held is taken as it is (the chooser's own methods do not panic).
    pub fn adaptive(&self) -> Option<MutexGuard<'_, Adaptive>> {
        match self {
            Self::Fixed(_) => None,
            Self::Adaptive(a) => Some(locked(a)),
        }
    }

    pub fn next_split(&self) -> Split {
        match self {
            Self::Fixed(s) => *s,
            Self::Adaptive(a) => locked(a).next_split(),
        }
    }

    /// A batch at `split` took `storage` and `compute` seconds; `link`: bytes it received per
    /// second of transfer, where measured.
    pub fn observe(&self, split: Split, storage: f64, compute: f64, link: Option<f64>) {
        if let Some(mut a) = self.adaptive() {
            a.observe(split, storage, compute, link);
        }
    }

    /// A batch at `split` ran cold: no sample ([`Adaptive::cold`]).
    pub fn cold(&self, split: Split) {
        if let Some(mut a) = self.adaptive() {
            a.cold(split);
        }
    }

    /// The split in use (the leader while exploring).
    pub fn current(&self) -> Split {
        match self {
            Self::Fixed(s) => *s,
            Self::Adaptive(a) => locked(a).current(),
        }
    }

    /// The splits a batch may be given.
    pub fn splits(&self, freeze: usize) -> Vec<Split> {
        match self {
            Self::Fixed(s) => vec![*s],
            Self::Adaptive(_) => std::iter::once(Split::None)
                .chain((0..=freeze).map(Split::At))
                .collect(),
        }
    }

    pub fn moves(&self) -> Vec<Move> {
        self.adaptive()
            .map_or_else(Vec::new, |a| a.moves().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::costs;

    fn est(split: Split, epoch: f64) -> Estimate {
        Estimate {
            split,
            storage: epoch,
            compute: 0.0,
            epoch,
            memory: 0,
            fits: true,
        }
    }

    #[test]
    fn candidates_spread_over_the_plausible_splits_and_start_with_the_best() {
        // Splits 9..=25: the model likes 25 best; 9..=19 and 22..=24 are plausible.
        let mut all = vec![est(Split::None, 10.0)];
        for s in 0..=25 {
            let e = match s {
                25 => 3.88,
                22..=24 => 3.9,
                9..=19 => 4.4,
                _ => 9.0,
            };
            all.push(est(Split::At(s), e));
        }
        let c = candidates(&all);
        let splits: Vec<Split> = c.iter().map(|e| e.split).collect();
        assert_eq!(splits[0], Split::At(25));
        assert_eq!(splits.len(), 4, "{splits:?}");
        assert!(splits.contains(&Split::At(9)), "{splits:?}");
        assert!(c.iter().all(|e| e.epoch <= 3.88 * PLAUSIBLE));
        // Nothing else plausible: only the best.
        let c = candidates(&[est(Split::None, 10.0), est(Split::At(3), 2.0)]);
        assert_eq!(c.len(), 1);
    }

    /// Runs `n` iterations with the pipeline's lag (`lag` batches handed out ahead of the one
    /// measured) against `cost(iteration, split) -> (storage, compute)`; returns the splits.
    fn simulate(
        a: &mut Adaptive,
        n: usize,
        lag: usize,
        mut cost: impl FnMut(usize, Split) -> (f64, f64),
    ) -> Vec<Split> {
        simulate_linked(a, n, lag, |i, s| {
            let (st, co) = cost(i, s);
            (st, co, None)
        })
    }

    /// [`simulate`], with the link's rate each batch measured (`None`: not measured).
    fn simulate_linked(
        a: &mut Adaptive,
        n: usize,
        lag: usize,
        mut cost: impl FnMut(usize, Split) -> (f64, f64, Option<f64>),
    ) -> Vec<Split> {
        let mut handed = std::collections::VecDeque::new();
        let mut out = Vec::new();
        for i in 0..n {
            while handed.len() <= lag {
                handed.push_back(a.next_split());
            }
            let s = handed.pop_front().expect("handed out");
            let (st, co, link) = cost(i, s);
            a.observe(s, st, co, link);
            out.push(s);
        }
        out
    }

    /// A little deterministic noise: +-`amp` relative.
    fn jitter(i: usize, amp: f64) -> f64 {
        let x = ((i as u64).wrapping_mul(2654435761) % 1000) as f64 / 1000.0;
        1.0 + amp * (2.0 * x - 1.0)
    }

    #[test]
    fn it_settles_on_the_fastest_candidate_and_spends_little_on_clearly_slower_ones() {
        let mut a = Adaptive::new(
            costs(5e6),
            AdaptConfig::new(0.2),
            Some(&[Split::At(1), Split::At(2), Split::At(3), Split::None]),
        );
        // Split 2 is fastest; 3 is 10% slower, the others twice as slow.
        let truth = |s: Split| match s {
            Split::At(2) => 0.100,
            Split::At(3) => 0.110,
            _ => 0.200,
        };
        let splits = simulate(&mut a, 100, 2, |i, s| (truth(s) * jitter(i, 0.02), 0.05));
        assert!(a.settled());
        assert_eq!(a.current(), Split::At(2));
        let slow = splits
            .iter()
            .filter(|s| !matches!(s, Split::At(2) | Split::At(3)))
            .count();
        // One sample each (the pipeline's lag may hand out one or two more) before they go.
        assert!(
            slow <= 2 * 3,
            "{slow} iterations at twice the cost: {splits:?}"
        );
        // Iterations over the best's own pace: the price of exploring.
        let spent: f64 = splits.iter().map(|&s| truth(s) - 0.1).sum();
        assert!(spent < 0.1 * 8.0, "{spent} s lost exploring");
        assert_eq!(splits[99], Split::At(2));
        let m = a.moves();
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].reason.contains("settled on split 2"),
            "{}",
            m[0].reason
        );
    }

    /// The pipeline's first batch runs cold (AlexNet at batch 64: its step 1.6x the next
    /// ones'). Given to the chooser as a sample, it loses the model's favourite, here the
    /// fastest split; given as [`Adaptive::cold`], the others are measured first, then the
    /// favourite again, and it wins.
    #[test]
    fn a_cold_first_batch_is_no_sample() {
        let only = [Split::At(1), Split::At(2), Split::At(3)];
        let run = |as_sample: bool| {
            let mut a = Adaptive::new(costs(5e6), AdaptConfig::new(0.2), Some(&only));
            let mut handed = std::collections::VecDeque::new();
            let mut favourite = None;
            for i in 0..40 {
                while handed.len() <= 1 {
                    handed.push_back(a.next_split());
                }
                let s = handed.pop_front().expect("handed out");
                let fav = *favourite.get_or_insert(s);
                if i == 1 || i == 2 {
                    assert_ne!(s, fav, "batch {i}: every candidate has one first");
                }
                let cost = if s == fav { 0.100 } else { 0.125 } * jitter(i, 0.02);
                if i > 0 {
                    a.observe(s, cost, 0.05, None);
                } else if as_sample {
                    a.observe(s, cost * 1.6, 0.05, None);
                } else {
                    a.cold(s);
                }
            }
            (a.settled(), a.current(), favourite.expect("a batch"))
        };
        let (settled, at, favourite) = run(false);
        assert!(settled);
        assert_eq!(
            at, favourite,
            "the favourite, measured warm, is the fastest"
        );
        let (settled, at, favourite) = run(true);
        assert!(settled);
        assert_ne!(at, favourite, "the cold sample alone drops the favourite");
    }

    /// Noise from a seeded generator: relative, about normal, standard deviation `sd`.
    fn noise(seed: u64, i: usize, sd: f64) -> f64 {
        let mut x = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i as u64 + 1)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        // The sum of four uniforms on [-0.5, 0.5]: variance 1/3.
        let mut sum = 0.0;
        for _ in 0..4 {
            x ^= x >> 31;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 29;
            sum += (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
        }
        1.0 + sd * sum * 3f64.sqrt()
    }

    #[test]
    fn near_ties_cost_little_to_tell_apart() {
        // Four candidates at 1.00, 1.03, 1.10 and 1.30 s per iteration, 8% noise, 40
        // iterations, 200 seeds. Dealing the iterations out in turn until the leader is
        // separated or every one has 8 samples lost 1.71 s per run over the best's own pace
        // (4.3%); giving each to the one that may be fastest, 0.94 s (2.4%), settling within 3%
        // of the best in 199 runs of 200.
        let order = [Split::At(3), Split::At(2), Split::At(1), Split::None];
        let truth = |s: Split| match s {
            Split::At(2) => 1.00,
            Split::At(3) => 1.03,
            Split::At(1) => 1.10,
            _ => 1.30,
        };
        let (runs, mut spent, mut right) = (200u64, 0.0, 0u64);
        for seed in 0..runs {
            let mut a = Adaptive::new(costs(5e6), AdaptConfig::new(0.2), Some(&order));
            let splits = simulate(&mut a, 40, 2, |i, s| {
                (truth(s) * noise(seed, i, 0.08), 0.05)
            });
            // Where it first settled (noise alone may restart it later: the watch's window is
            // 6 iterations at 8% noise).
            let settled = a
                .moves()
                .iter()
                .find(|m| m.reason.starts_with("settled on"))
                .map(|m| m.to)
                .unwrap_or_else(|| panic!("seed {seed}: not settled: {:#?}", a.moves()));
            right += u64::from(truth(settled) <= 1.03);
            spent += splits.iter().map(|&s| truth(s) - 1.0).sum::<f64>();
            // Every candidate was measured.
            for s in order {
                assert!(splits.contains(&s), "{s} never tried: {splits:?}");
            }
        }
        let spent = spent / runs as f64;
        assert!(spent < 0.03 * 40.0, "{spent} s lost exploring per run");
        assert!(
            right >= runs * 9 / 10,
            "{right} of {runs} runs settled within 3%"
        );
    }

    #[test]
    fn it_walks_to_a_better_neighbour_that_was_not_a_candidate() {
        // Ten layers that cost almost nothing: every split is plausible and the model takes
        // four of them; the fastest split in truth is one it left out.
        let mut c = costs(1e9);
        let layers = 10;
        c.freeze = layers - 1;
        c.host_layer = vec![1e-5; layers];
        c.local_layer = vec![1e-5; layers];
        c.bytes_at = vec![50_000; layers];
        c.weight_bytes = vec![1_000_000; layers];
        c.layer_in_bytes = vec![50_000; layers];
        c.layer_out_bytes = vec![50_000; layers];
        let picked: Vec<Split> = candidates(&c.estimates()).iter().map(|e| e.split).collect();
        assert_eq!(picked.len(), CANDIDATES, "{picked:?}");
        // A left-out split two steps from the nearest candidate: reached through a neighbour.
        let at = |s: usize| picked.contains(&Split::At(s));
        let best = (1..layers - 1)
            .find(|&s| !at(s) && (at(s - 1) || at(s + 1)))
            .unwrap_or_else(|| panic!("no left-out split beside a candidate: {picked:?}"));
        let truth = |s: Split| match s {
            Split::At(s) if s == best => 0.90,
            Split::At(s) if s.abs_diff(best) == 1 => 1.0,
            _ => 1.1,
        };
        let mut a = Adaptive::new(c, AdaptConfig::new(0.2), None);
        let splits = simulate(&mut a, 60, 2, |i, s| (truth(s) * jitter(i, 0.04), 0.01));
        assert!(a.settled(), "{:#?}", a.arms_now());
        assert_eq!(a.current(), Split::At(best), "{picked:?}: {:#?}", a.moves());
        assert_eq!(splits[59], Split::At(best));
    }

    #[test]
    fn a_slower_network_moves_it_to_a_split_that_sends_less_and_back() {
        let mut a = Adaptive::new(
            costs(1e9),
            AdaptConfig::new(0.2),
            Some(&[Split::At(1), Split::At(2)]),
        );
        // Split 1 sends much more than split 2 and does less work on the host.
        let truth = |s: Split, slow: bool| -> (f64, f64) {
            match (s, slow) {
                (Split::At(1), false) => (0.080, 0.05),
                (Split::At(1), true) => (0.400, 0.05),
                (_, false) => (0.100, 0.04),
                (_, true) => (0.150, 0.04),
            }
        };
        let splits = simulate(&mut a, 200, 2, |i, s| {
            let (st, co) = truth(s, (60..140).contains(&i));
            (st * jitter(i, 0.02), co)
        });
        assert_eq!(splits[55], Split::At(1), "{splits:?}");
        assert_eq!(splits[135], Split::At(2), "{splits:?}");
        assert_eq!(splits[199], Split::At(1), "{splits:?}");
        let m = a.moves();
        let restarts: Vec<&Move> = m
            .iter()
            .filter(|m| m.reason.contains("exploring again"))
            .collect();
        assert_eq!(restarts.len(), 2, "{m:#?}");
        // Each change is noticed within a window, plus the batches in flight.
        for (r, at) in restarts.iter().zip([60, 140]) {
            assert!((at..at + 6 + 4).contains(&r.iteration), "{m:#?}");
        }
    }

    #[test]
    fn a_slower_link_at_a_compute_bound_split_is_seen_in_the_link_at_once() {
        // The world is the planner's model: split 1 is bound by the compute stage and sends
        // 200 times the bytes of split 2, which is 8% slower on the fast link. From iteration
        // 60 the link runs at 4% of its rate: split 1's iteration cost rises 22%, near the 20%
        // that moves the cost's watch, whose window sees it through 10% noise on the storage
        // stage; the link's rate (5% noise) falls 25x, and the model then puts split 2 13%
        // ahead.
        let truth = |s: Split, bandwidth: f64| {
            let e = costs(bandwidth).estimate(s);
            (e.storage, e.compute)
        };
        let (fast, slow) = (1e9, 3.95e7);
        let (c_fast, c_slow) = (truth(Split::At(1), fast), truth(Split::At(1), slow));
        assert!(c_fast.1 > c_fast.0, "split 1 is compute-bound: {c_fast:?}");
        let rise = c_slow.0.max(c_slow.1) / c_fast.1;
        assert!((1.2..1.25).contains(&rise), "{rise}");
        let mut a = Adaptive::new(
            costs(fast),
            AdaptConfig::new(0.2),
            Some(&[Split::At(1), Split::At(2)]),
        );
        let splits = simulate_linked(&mut a, 140, 2, |i, s| {
            let bw = if i >= 60 { slow } else { fast };
            let (st, co) = truth(s, bw);
            (st * jitter(i, 0.1), co, Some(bw * jitter(i + 7, 0.05)))
        });
        let moves = a.moves();
        assert_eq!(splits[55], Split::At(1), "{moves:#?}");
        let restart = moves
            .iter()
            .find(|m| m.reason.contains("exploring again"))
            .unwrap_or_else(|| panic!("no restart: {moves:#?}"));
        assert!(restart.reason.starts_with("link "), "{restart:?}");
        // A 16x jump: noticed within half a window of the change, plus the batches in flight.
        assert!((60..60 + 3 + 3).contains(&restart.iteration), "{moves:#?}");
        assert_eq!(splits[139], Split::At(2), "{moves:#?}");
    }

    #[test]
    fn a_link_that_comes_back_has_the_settled_splits_neighbours_measured_again() {
        // On a slow link the model ranks split 2 (tiny output) alone plausible, and it settles
        // there. From iteration 80 the link is 1000x faster: the model puts split 1 8.5% ahead
        // of split 2 (within its margin of 10%, so it sees no gain), and split 2's own cost falls
        // 2% (nothing for the cost's watch). In truth split 1 is 20% ahead: its compute stage is
        // 15% below the model's. The link's jump, once a whole window confirms it, has the
        // neighbours measured again, and it moves to 1.
        let truth = |s: Split, bandwidth: f64| {
            let e = costs(bandwidth).estimate(s);
            let compute = if s == Split::At(1) { 0.85 } else { 1.0 };
            (e.storage, e.compute * compute)
        };
        let (slow, fast) = (1e7, 1e10);
        let pace = |s: Split| {
            let (st, co) = truth(s, fast);
            st.max(co)
        };
        assert!(pace(Split::At(2)) / pace(Split::At(1)) > 1.2);
        let model = costs(fast);
        let ahead = model.estimate(Split::At(2)).pace() / model.estimate(Split::At(1)).pace();
        assert!((1.05..1.1).contains(&ahead), "{ahead}");
        let mut a = Adaptive::new(costs(slow), AdaptConfig::new(0.2), None);
        let splits = simulate_linked(&mut a, 200, 2, |i, s| {
            let bw = if i >= 80 { fast } else { slow };
            let (st, co) = truth(s, bw);
            (st * jitter(i, 0.05), co, Some(bw * jitter(i + 7, 0.05)))
        });
        let moves = a.moves();
        assert_eq!(splits[75], Split::At(2), "{moves:#?}");
        let again = moves
            .iter()
            .find(|m| m.reason.contains("neighbours again"))
            .unwrap_or_else(|| panic!("no second look: {moves:#?}"));
        // Confirmed by a whole window after the change, plus the batches in flight.
        assert!((80..80 + 6 + 3).contains(&again.iteration), "{moves:#?}");
        assert_eq!(splits[199], Split::At(1), "{moves:#?}");
        // Nothing else moved it: one settle before the change, the second look, one settle.
        assert_eq!(moves.len(), 3, "{moves:#?}");
    }

    /// 200 seeded runs of the test above's world with 10% noise on both stages, split 1's
    /// compute stage `factor` times the model's: how many had the second look, ended at split 1,
    /// and the iterations given to other splits than 2 after the link came back.
    fn second_looks(factor: f64) -> (u64, u64, usize) {
        let truth = |s: Split, bandwidth: f64| {
            let e = costs(bandwidth).estimate(s);
            let compute = if s == Split::At(1) { factor } else { 1.0 };
            (e.storage, e.compute * compute)
        };
        let (mut looked, mut at_1, mut elsewhere) = (0, 0, 0);
        for seed in 0..200 {
            let mut a = Adaptive::new(costs(1e7), AdaptConfig::new(0.2), None);
            let splits = simulate_linked(&mut a, 200, 2, |i, s| {
                let bw = if i >= 80 { 1e10 } else { 1e7 };
                let (st, co) = truth(s, bw);
                let n = noise(seed, i, 0.10);
                (st * n, co * n, Some(bw * noise(seed, i + 1000, 0.05)))
            });
            looked += u64::from(
                a.moves()
                    .iter()
                    .any(|m| m.reason.contains("neighbours again")),
            );
            at_1 += u64::from(splits[199] == Split::At(1));
            elsewhere += splits[80..].iter().filter(|&&s| s != Split::At(2)).count();
        }
        (looked, at_1, elsewhere)
    }

    #[test]
    fn a_second_look_measures_the_neighbours_enough_to_tell_a_near_one_apart() {
        // Split 1 14% ahead in truth once the link is back (the model puts it 8.5% ahead). The
        // settled split starts the look with its window of 6 samples; when they counted
        // towards `max_samples`, it settled after 2 more, its neighbours measured once or twice
        // each, and 30 of the 200 runs stayed at split 2.
        let pace = |s: Split, f: f64| {
            let e = costs(1e10).estimate(s);
            let c = if s == Split::At(1) { f } else { 1.0 };
            e.storage.max(e.compute * c)
        };
        let ahead = pace(Split::At(2), 0.95) / pace(Split::At(1), 0.95);
        assert!((1.12..1.16).contains(&ahead), "{ahead}");
        let (looked, at_1, _) = second_looks(0.95);
        assert!(looked >= 190, "a second look in {looked} runs of 200");
        assert!(at_1 >= 190, "at split 1 in {at_1} runs of 200");
        // Where the settled split stays the best (split 1 11% behind), the look costs little:
        // 4.8 iterations per run at other splits over the 120 after the change (2.1 when the
        // window counted), and it stays.
        let behind = pace(Split::At(1), 1.2) / pace(Split::At(2), 1.2);
        assert!((1.08..1.14).contains(&behind), "{behind}");
        let (_, at_1, elsewhere) = second_looks(1.2);
        assert!(
            at_1 <= 10,
            "moved to the slower split in {at_1} runs of 200"
        );
        assert!(
            elsewhere <= 8 * 200,
            "{elsewhere} iterations elsewhere in 200 runs"
        );
    }

    /// Runs of `iters` iterations at `sd` noise (seeded) on two candidates 30% apart, split 2
    /// the faster; from iteration `at`, split 2 costs `rise` times more. Each run's restarts
    /// and its last split.
    fn watched(sd: f64, runs: u64, iters: usize, at: usize, rise: f64) -> Vec<(Vec<Move>, Split)> {
        (0..runs)
            .map(|seed| {
                let mut a = Adaptive::new(
                    costs(5e6),
                    AdaptConfig::new(0.2),
                    Some(&[Split::At(2), Split::At(3)]),
                );
                let splits = simulate(&mut a, iters, 2, |i, s| {
                    let base = match s {
                        Split::At(2) if i >= at => rise,
                        Split::At(2) => 1.0,
                        _ => 1.3,
                    };
                    (base * noise(seed, i, sd), 0.05)
                });
                let restarts = a
                    .moves()
                    .iter()
                    .filter(|m| m.reason.contains("exploring again"))
                    .cloned()
                    .collect();
                (restarts, splits[iters - 1])
            })
            .collect()
    }

    #[test]
    fn the_watch_scales_with_the_measured_noise() {
        // 10% noise, 200 runs of 200 iterations where nothing changes. When the watch took
        // 20% on the median of 6 iterations against the first window's, noise alone restarted
        // exploration 27 times; at 4.5 standard deviations of the measured noise (its upper
        // bound), once.
        let runs = watched(0.10, 200, 200, usize::MAX, 1.0);
        let restarts: Vec<&Move> = runs.iter().flat_map(|r| &r.0).collect();
        assert!(
            restarts.len() <= 2,
            "{} false restarts: {restarts:#?}",
            restarts.len()
        );
        // A real change through the same noise: split 2 becomes 60% slower, 23% slower than
        // split 3, and every run sees it within a window and the batches in flight, and moves.
        for (seed, (restarts, last)) in watched(0.10, 50, 200, 100, 1.6).iter().enumerate() {
            let seen = restarts.iter().find(|m| m.iteration >= 100);
            assert!(
                seen.is_some_and(|m| m.iteration < 100 + 6 + 4),
                "seed {seed}: {restarts:#?}"
            );
            assert_eq!(*last, Split::At(3), "seed {seed}: {restarts:#?}");
        }
    }

    #[test]
    fn the_link_watch_scales_with_the_link_noise() {
        // The link test's world (split 1 compute-bound, split 2 8% slower), nothing changing,
        // the link measured with 15% noise per batch, 200 runs of 200 iterations. Noise alone
        // must neither restart exploration nor move the model's bandwidth (the watch gives it
        // the new rate when it thinks the link moved). When the link's watch took 20% on the
        // window's median against the first half-measured window's, noise moved the bandwidth
        // in 36 of the 200 runs; now in none.
        let truth = |s: Split| {
            let e = costs(1e9).estimate(s);
            (e.storage, e.compute)
        };
        let (mut restarts, mut moved) = (Vec::new(), 0);
        for seed in 0..200 {
            let mut a = Adaptive::new(
                costs(1e9),
                AdaptConfig::new(0.2),
                Some(&[Split::At(1), Split::At(2)]),
            );
            simulate_linked(&mut a, 200, 2, |i, s| {
                let (st, co) = truth(s);
                (
                    st * noise(seed, i, 0.05),
                    co,
                    Some(1e9 * noise(seed, i + 1000, 0.15)),
                )
            });
            restarts.extend(
                a.moves()
                    .iter()
                    .filter(|m| m.reason.contains("exploring again"))
                    .map(|m| (seed, m.reason.clone())),
            );
            if (a.costs.bandwidth / 1e9).ln().abs() > 0.2f64.ln_1p() {
                moved += 1;
            }
        }
        assert!(
            restarts.len() <= 2,
            "{} false restarts: {restarts:#?}",
            restarts.len()
        );
        assert!(
            moved <= 2,
            "noise moved the model's bandwidth in {moved} of 200 runs"
        );
    }

    #[test]
    fn noise_alone_does_not_make_it_move() {
        let mut a = Adaptive::new(
            costs(5e6),
            AdaptConfig::new(0.2),
            Some(&[Split::At(2), Split::At(3)]),
        );
        simulate(&mut a, 300, 2, |i, s| {
            let base = if s == Split::At(2) { 0.1 } else { 0.15 };
            (base * jitter(i, 0.15), 0.01)
        });
        assert_eq!(a.current(), Split::At(2));
        assert_eq!(a.moves().len(), 1, "{:#?}", a.moves());
    }
}

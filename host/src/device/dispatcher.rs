//! The dispatcher: one thread per device that forms pooled batches, and the workers that run
//! them.
//!
//! Calls for the same segment from any tenant are merged into one device batch. Up to
//! `workers` batches run at once ([`DeviceConfig::workers`]): on a CPU one per core, so that a
//! segment whose efficient batch is small keeps every core busy, as unpooled calls do (libtorch
//! then gives each batch's operators the cores divided among the workers, not all of them
//! each: [`crate::device::types::share_cores`]); a call
//! is in at most one running batch, and the rest of its samples wait for it. The tenant
//! with the least device time (per unit of weight) leads each batch ([`schedule`]); the batch
//! is as large as memory, `max_batch` and the fastest batch size allow, waiting at most the
//! batch window for batch mates, and bounded in time by whom it would make wait:
//!
//! - A batch of one tenant's work while other tenants are active runs at most the slice: the
//!   configured one, shrunk to the lower median of the active tenants' calls' device times, so
//!   that a tenant with small calls waits for at most about one of its own calls' worth of
//!   someone else's work. A tenant alone on the device may run longer batches, on all but one
//!   worker, so that a newcomer finds a worker within a slice.
//! - A pooled batch (several tenants' work) may run up to `batch_time`: every tenant in it is
//!   being served, and the larger batch is cheaper per sample. It holds each tenant whose work
//!   is all in it at most [`schedule::stretch`] times its own samples' time (`0.75 (n - 1)`
//!   with `n` tenants active, at least 1), so a light tenant next to one heavy tenant is not
//!   kept waiting for the heavy one's samples, while many similar tenants pool into batches
//!   near the segment's fastest size. Among three or more active tenants, a tenant may join
//!   while up to a slice of device time ahead of the leader, so that batches form from
//!   tenants whose shares differ by a little.
//!
//! Calls whose caller gave up (deadline passed, request dropped) are dropped before they run
//! and after any batch they were part of; their memory goes with them. A panic or a libtorch
//! error fails the calls of the batch it happened in and the dispatcher serves on.

use crate::account::{Charge, Deadline, Reaper};
use crate::device::batch::{self, Dest};
use crate::device::budget::{Budget, Pin, Reservation};
use crate::device::job::{Input, Ran, WireDtype};
use crate::device::schedule::{Fair, Pending, Slice, fill, stretch};
use crate::device::stats::Stats;
use crate::device::types::{DeviceConfig, DeviceError};
use crate::locks::lock;
use hapi_model::ModelPackage;
use hapi_wire::profile::SegmentCost;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A tenant with a call that arrived or finished this recently counts as active: a closed-loop
/// client's next call is usually on its way (decoding in the guest).
pub const ACTIVE_FOR: Duration = Duration::from_millis(100);
/// Shortest device slice while several tenants are active: below this, per-batch overhead
/// dominates.
pub const MIN_SLICE: Duration = Duration::from_millis(2);
/// How long the dispatcher sleeps when not even one sample fits the free memory.
const MEMORY_POLL: Duration = Duration::from_millis(2);

/// What the dispatcher thread and the device share.
#[derive(Debug)]
pub struct Shared {
    pub config: DeviceConfig,
    pub budget: Arc<Budget>,
    pub stats: Mutex<Stats>,
    incoming: Mutex<Incoming>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct Incoming {
    calls: Vec<Call>,
    /// Batches the workers finished.
    done: Vec<Done>,
    /// Device time used outside batches (a profile's measurement), by tenant: added to the
    /// fair schedule's virtual times at the next round (bounded by the tenants: one entry each).
    charges: HashMap<Arc<str>, (f64, u32)>,
    shutdown: bool,
}

/// A batch handed to a worker: its calls, moved out of the dispatcher while it runs.
struct Job {
    calls: Vec<(u64, Call, i64)>,
    model: Arc<ModelPackage>,
    range: Range<usize>,
    shape: Vec<i64>,
    out_shape: Vec<i64>,
    /// The batch's memory, released when it has run.
    held: Option<Reservation>,
    /// Device seconds charged to each slice's tenant when the batch was formed.
    estimate: Vec<f64>,
    /// A lone tenant's batch longer than the slice.
    long: bool,
}

/// A batch that ran: its calls with their outputs written, back to the dispatcher.
#[derive(Debug)]
struct Done {
    calls: Vec<(u64, Call, i64)>,
    model: Arc<ModelPackage>,
    result: Result<(), String>,
    took: Duration,
    /// Each call's own part of `took` ([`Dest::took`]).
    own: Vec<Duration>,
    estimate: Vec<f64>,
    long: bool,
}

impl Job {
    fn run(mut self) -> Done {
        let started = Instant::now();
        let (result, own): (_, Vec<Duration>) = {
            // Each call's next `take` samples in, its output buffer to append to.
            let (inputs, mut dests): (Vec<&[u8]>, Vec<Dest<'_>>) = self
                .calls
                .iter_mut()
                .map(|(_, c, take)| {
                    let sb = c.input.sample_bytes();
                    let (from, n) = (c.progress.taken as usize * sb, *take as usize * sb);
                    let input = c.input.bytes.get(from..from + n).unwrap_or_default();
                    let dest = Dest {
                        out: &mut c.output,
                        take: *take,
                        kind: c.out_kind,
                        took: Duration::ZERO,
                    };
                    (input, dest)
                })
                .unzip();
            let result = batch::run(
                &self.model,
                self.range.clone(),
                &self.shape,
                &self.out_shape,
                &inputs,
                &mut dests,
            );
            (result, dests.iter().map(|d| d.took).collect())
        };
        let took = started.elapsed();
        drop(self.held);
        Done {
            calls: self.calls,
            model: self.model,
            result,
            took,
            own,
            estimate: self.estimate,
            long: self.long,
        }
    }
}

/// A device worker: runs the batches it is handed until the dispatcher goes away.
fn work(shared: &Shared, jobs: &Mutex<Receiver<Job>>) {
    // This thread's libtorch threads, taken now from what `share_cores` set, not at its first
    // parallel operator (an operator that is not one would run with libtorch's default).
    let _ = tch::get_num_threads();
    loop {
        let job = match lock(jobs).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let done = job.run();
        lock(&shared.incoming).done.push(done);
        shared.arrived.notify_all();
    }
}

/// One call waiting for, or part way through, the device.
#[derive(Debug)]
pub struct Call {
    pub tenant: Arc<str>,
    pub weight: u32,
    pub pin: Pin,
    pub range: Range<usize>,
    pub cost: SegmentCost,
    pub input: Input,
    /// Per-sample output shape.
    pub out_shape: Vec<i64>,
    /// The output's element type.
    pub out_kind: WireDtype,
    /// Filled slice by slice; its capacity was charged when the call was made.
    pub output: Vec<u8>,
    pub out_charge: Charge,
    /// The whole call's memory, held from submission (adaptation off).
    pub held: Option<Reservation>,
    pub deadline: Arc<Deadline>,
    /// The invocation's admission slot (see [`crate::device::job::Job::slot`]): let go with
    /// the call, once no batch holds it.
    pub slot: Option<Arc<crate::admission::Permit>>,
    /// The invocation's usage, which each batch's share of device time is added to as it ends.
    pub usage: Arc<crate::account::Usage>,
    pub reply: oneshot::Sender<Result<Ran, DeviceError>>,
    pub enqueued: Instant,
    /// How far the device has got with it.
    pub progress: Progress,
}

/// What the device has done of a call.
#[derive(Debug, Default)]
pub struct Progress {
    taken: i64,
    device: Duration,
    batches: u32,
}

impl Call {
    /// Whether `self` and `other` run the same layers of the same loaded model, and so may be
    /// one batch: the loaded package itself, not its name (two tenants' private packages may
    /// share a name, and a tenant's private package may take a shared model's name).
    fn same_segment(&self, other: &Call) -> bool {
        Arc::ptr_eq(&self.pin.model, &other.pin.model) && self.range == other.range
    }

    fn left(&self) -> i64 {
        self.input.n - self.progress.taken
    }

    /// The caller gave up on it.
    fn gone(&self) -> bool {
        self.reply.is_closed() || self.deadline.expired()
    }

    /// Answers the call with `e`; what it holds of its tenant's bytes (input, output, their
    /// charges) and its slot go to `reaper`.
    fn refuse(self, e: DeviceError, reaper: &Reaper) {
        let Call {
            reply,
            input,
            output,
            out_charge,
            slot,
            ..
        } = self;
        let _ = reply.send(Err(e));
        let bytes = input.bytes.capacity() + output.capacity();
        reaper.free_sized(bytes, (input, output, out_charge, slot));
    }

    /// The finished call's result, and where to send it; its input, charge and slot with them,
    /// for `reaper`.
    fn into_ran(self, reaper: &Reaper) -> (Ran, oneshot::Sender<Result<Ran, DeviceError>>) {
        let dims = std::iter::once(self.input.n)
            .chain(self.out_shape.iter().copied())
            .collect();
        let ran = Ran {
            output: self.output,
            charge: self.out_charge,
            dims,
            queued: self.enqueued.elapsed().saturating_sub(self.progress.device),
            device: self.progress.device,
            batches: self.progress.batches,
        };
        reaper.free_sized(self.input.bytes.capacity(), (self.input, self.slot));
        (ran, self.reply)
    }
}

impl Shared {
    pub fn new(config: DeviceConfig, budget: Arc<Budget>) -> Arc<Self> {
        Arc::new(Self {
            config,
            budget,
            stats: Mutex::default(),
            incoming: Mutex::default(),
            arrived: Condvar::new(),
        })
    }

    /// Starts the dispatcher thread and its device workers.
    pub fn spawn(self: &Arc<Self>) -> std::io::Result<()> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..self.config.workers.max(1) {
            let (shared, rx) = (Arc::clone(self), Arc::clone(&rx));
            std::thread::Builder::new()
                .name(format!("device-worker-{i}"))
                .spawn(move || work(&shared, &rx))?;
        }
        let shared = Arc::clone(self);
        std::thread::Builder::new()
            .name("device-dispatcher".into())
            .spawn(move || Dispatcher::new(shared, tx).run())?;
        Ok(())
    }

    /// Hands a call to the dispatcher; gives it back if the host is shutting down.
    pub fn submit(&self, call: Call) -> Result<(), Box<Call>> {
        let mut incoming = lock(&self.incoming);
        if incoming.shutdown {
            return Err(Box::new(call));
        }
        incoming.calls.push(call);
        drop(incoming);
        self.arrived.notify_all();
        Ok(())
    }

    /// Adds `took` of device time used outside batches to `tenant`'s virtual time, at the
    /// dispatcher's next round.
    pub fn charge(&self, tenant: &str, weight: u32, took: Duration) {
        let mut incoming = lock(&self.incoming);
        let owed = incoming.charges.entry(Arc::from(tenant)).or_default();
        owed.0 += took.as_secs_f64();
        owed.1 = weight;
    }

    /// Stops the dispatcher; calls still queued are refused.
    pub fn shutdown(&self) {
        lock(&self.incoming).shutdown = true;
        self.arrived.notify_all();
    }
}

/// The dispatcher's own state.
struct Dispatcher {
    shared: Arc<Shared>,
    calls: HashMap<u64, Call>,
    /// Per tenant, its calls' ids in arrival order.
    queues: BTreeMap<Arc<str>, VecDeque<u64>>,
    fair: Fair<Arc<str>>,
    /// Per tenant: when it last had a call arrive or finish, and that call's estimated device
    /// seconds.
    recent: HashMap<Arc<str>, (Instant, f64)>,
    next_id: u64,
    /// Lone tenants' batches longer than the slice that are running.
    long_running: usize,
    /// Where batches go to the workers. Calls of a running batch are out of `calls` (their
    /// ids stay in `queues`); the stats count the running batches.
    jobs: Sender<Job>,
    reaper: Reaper,
}

impl Dispatcher {
    fn new(shared: Arc<Shared>, jobs: Sender<Job>) -> Self {
        Self {
            shared,
            calls: HashMap::new(),
            queues: BTreeMap::new(),
            fair: Fair::default(),
            recent: HashMap::new(),
            reaper: Reaper::start("device-reaper"),
            next_id: 0,
            long_running: 0,
            jobs,
        }
    }

    fn config(&self) -> &DeviceConfig {
        &self.shared.config
    }

    fn run(mut self) {
        loop {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step())) {
                Ok(true) => {}
                Ok(false) => return,
                Err(_) => {
                    // A bug outside a batch: the calls it concerned cannot be trusted to be in
                    // a consistent state. Fail them all; the dispatcher itself serves on.
                    tracing::error!(
                        "device dispatcher: panic outside a batch; failing queued calls"
                    );
                    lock(&self.shared.stats).faults += 1;
                    self.fail_all(&DeviceError::Failed(
                        "the device dispatcher hit an internal error".into(),
                    ));
                }
            }
        }
    }

    /// One round: take new calls, drop abandoned ones, run a batch or wait. False on shutdown.
    fn step(&mut self) -> bool {
        if !self.admit() {
            self.fail_all(&DeviceError::ShuttingDown);
            return false;
        }
        self.drop_gone();
        let running = lock(&self.shared.stats).running;
        let wait = if running >= self.config().workers.max(1) as u64 {
            // Every worker is busy: wait for one to finish (or for new calls).
            Some(Duration::from_secs(1))
        } else {
            self.dispatch()
        };
        if let Some(wait) = wait {
            let incoming = lock(&self.shared.incoming);
            if incoming.calls.is_empty() && incoming.done.is_empty() && !incoming.shutdown {
                let _ = self.shared.arrived.wait_timeout(incoming, wait);
            }
        }
        true
    }

    /// `tenant` has work (or owes device time) again: if it had none queued, it starts at the
    /// fair schedule's floor among the tenants that have ([`Fair::arrive`]).
    fn arrive_if_idle(&mut self, tenant: &Arc<str>) {
        if self.queues.get(tenant).is_none_or(VecDeque::is_empty) {
            let backlogged: Vec<Arc<str>> = self
                .queues
                .iter()
                .filter(|(_, q)| !q.is_empty())
                .map(|(t, _)| Arc::clone(t))
                .collect();
            self.fair.arrive(tenant, backlogged.iter());
        }
    }

    /// Takes newly arrived calls and finished batches, waiting when there is nothing to do.
    /// False on shutdown.
    fn admit(&mut self) -> bool {
        let mut incoming = lock(&self.shared.incoming);
        while incoming.calls.is_empty()
            && incoming.done.is_empty()
            && self.calls.is_empty()
            && !incoming.shutdown
        {
            let (guard, _) = self
                .shared
                .arrived
                .wait_timeout(incoming, Duration::from_secs(1))
                .unwrap_or_else(PoisonError::into_inner);
            incoming = guard;
        }
        if incoming.shutdown {
            for call in incoming.calls.drain(..) {
                call.refuse(DeviceError::ShuttingDown, &self.reaper);
            }
            return false;
        }
        let arrived: Vec<Call> = incoming.calls.drain(..).collect();
        let done: Vec<Done> = incoming.done.drain(..).collect();
        let charges = std::mem::take(&mut incoming.charges);
        drop(incoming);
        for d in done {
            self.complete(d);
        }
        for (tenant, (seconds, weight)) in charges {
            // From where it would start if it had work now, so that the time is not lost in
            // the floor an idle tenant comes back at; above that floor, `forget` keeps it
            // while the tenant is away.
            self.arrive_if_idle(&tenant);
            self.fair.charge(&tenant, seconds, weight);
        }
        let now = Instant::now();
        for call in arrived {
            let id = self.next_id;
            self.next_id += 1;
            let tenant = Arc::clone(&call.tenant);
            self.arrive_if_idle(&tenant);
            self.recent
                .insert(Arc::clone(&tenant), (now, call.cost.seconds(call.input.n)));
            self.queues.entry(tenant).or_default().push_back(id);
            self.calls.insert(id, call);
        }
        true
    }

    fn remove(&mut self, id: u64) -> Option<Call> {
        let c = self.calls.remove(&id)?;
        self.remove_queued(&c.tenant, id);
        Some(c)
    }

    /// Drops calls whose callers gave up; their memory (input, output, reservation, model pin)
    /// goes with them.
    fn drop_gone(&mut self) {
        let gone: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.gone())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let Some(c) = self.remove(id) {
                lock(&self.shared.stats).tenant(&c.tenant).expired += 1;
                let limit = c.deadline.limit();
                c.refuse(DeviceError::Expired(limit), &self.reaper);
            }
        }
        // Forget tenants that have been idle for a while; not one whose work is still queued
        // (a call cut into slices for longer than that): it was dropped from the active
        // tenants, and the one beside it ran long batches as if alone.
        let now = Instant::now();
        let queues = &self.queues;
        let backlogged = |t: &Arc<str>| queues.get(t).is_some_and(|q| !q.is_empty());
        self.recent
            .retain(|t, (at, _)| now.duration_since(*at) < 10 * ACTIVE_FOR || backlogged(t));
        let recent = &self.recent;
        self.fair.forget(
            |t| !recent.contains_key(t) && !backlogged(t),
            queues.keys().filter(|t| backlogged(t)),
        );
    }

    fn fail_all(&mut self, e: &DeviceError) {
        for (_, c) in self.calls.drain() {
            c.refuse(e.clone(), &self.reaper);
        }
        self.queues.clear();
    }

    /// Estimated device seconds of the calls of the active tenants (a call arrived or
    /// finished within [`ACTIVE_FOR`], or work queued or running), one per tenant.
    fn active(&self) -> Vec<f64> {
        let now = Instant::now();
        self.recent
            .iter()
            .filter(|(t, (at, _))| {
                now.duration_since(*at) < ACTIVE_FOR
                    || self.queues.get(*t).is_some_and(|q| !q.is_empty())
            })
            .map(|(_, (_, s))| *s)
            .collect()
    }

    /// How long a batch of one tenant's work may run: the configured slice, or while several
    /// tenants are active, the lower median of their calls' device times (at least
    /// [`MIN_SLICE`]).
    fn slice(&self, mut times: Vec<f64>) -> Duration {
        let configured = self.shared.config.slice;
        if times.len() < 2 {
            return configured;
        }
        times.sort_by(f64::total_cmp);
        let median = times[(times.len() - 1) / 2];
        Duration::from_secs_f64(median.max(0.0)).clamp(MIN_SLICE, configured.max(MIN_SLICE))
    }

    /// Runs one batch if one is due; otherwise how long to wait for batch mates or memory.
    fn dispatch(&mut self) -> Option<Duration> {
        // Tenants with work, oldest work first; the leader is the one with the least virtual
        // time.
        let mut backlogged: Vec<(Instant, Arc<str>, i64)> = self
            .queues
            .iter()
            .filter_map(|(t, q)| {
                // Calls in a running batch are not in `calls`: the head is the oldest waiting.
                let head = q.iter().find_map(|id| self.calls.get(id))?;
                let work = q
                    .iter()
                    .filter_map(|id| self.calls.get(id))
                    .map(Call::left)
                    .sum();
                Some((head.enqueued, Arc::clone(t), work))
            })
            .collect();
        if backlogged.is_empty() {
            return None;
        }
        backlogged.sort_by_key(|a| a.0);
        // The leader: the least virtual time. While its segment cannot get one sample's room,
        // it is waited for if the batches running now hold room that would give it one when
        // they end (that room goes to it, not to the next small batch); otherwise nothing will
        // free the room but the neighbours' models, pinned by their queued calls, and it is
        // passed over for the first in fair order whose segment fits, rather than holding up
        // every tenant's batches.
        //
        // A leader whose batch is not due yet (fewer samples than its target, its oldest call
        // within the window) waits for batch mates without holding the device: the next in
        // fair order whose batch is due runs meanwhile. The leader waited with every worker
        // idle, so a tenant sending one sample at a time, leading whenever it had a call
        // queued, left the device idle for a window before each of its calls, charged to no
        // one, while its neighbours' full batches waited.
        let shared = Arc::clone(&self.shared);
        let (config, budget) = (&shared.config, &shared.budget);
        let mut earliest: Option<Instant> = None;
        let mut memory_wait = false;
        // Segments whose batch was found not due: a later tenant's calls for one of them are
        // in that batch already, and must not lead it past the tenant ahead of it.
        let mut not_due: Vec<(*const ModelPackage, Range<usize>)> = Vec::new();
        for t in self
            .fair
            .order(backlogged.iter().map(|(_, t, work)| (t, *work)))
        {
            // Calls in a running batch are not in `calls`: the head is the oldest waiting.
            let Some((head, cost, segment)) = self.queues.get(t).and_then(|q| {
                q.iter().find_map(|id| {
                    let c = self.calls.get(id)?;
                    Some((*id, &c.cost, (Arc::as_ptr(&c.pin.model), c.range.clone())))
                })
            }) else {
                continue;
            };
            if not_due.contains(&segment) {
                continue;
            }
            let one = cost.run_bytes(1);
            let mut cap = config.max_batch;
            if config.adapt {
                let room = budget.room_for(one, t);
                let fits = room.saturating_sub(cost.workspace) / cost.per_sample.max(1);
                cap = cap.min(i64::try_from(fits).unwrap_or(i64::MAX));
                if let Some(e) = cost.efficient_batch {
                    cap = cap.min(e);
                }
            }
            if cap >= 1 {
                match self.lead(&backlogged, t, head, cap) {
                    Some(due) => {
                        earliest = Some(earliest.map_or(due, |e| e.min(due)));
                        not_due.push(segment);
                        continue;
                    }
                    None => return None,
                }
            }
            if budget.room_once_reservations_end(t) >= one {
                memory_wait = true;
                break; // wait for the running batches to give it their room
            }
        }
        match earliest {
            Some(due) => {
                let wait = due.saturating_duration_since(Instant::now());
                Some(if memory_wait {
                    wait.min(MEMORY_POLL)
                } else {
                    wait
                })
            }
            None => {
                // Not even one sample fits while other work holds the memory.
                budget.wait_changed(MEMORY_POLL);
                None
            }
        }
    }

    /// Runs a batch led by `leader`'s call `head` (at most `cap` samples) with every tenant's
    /// calls for the same segment, if it is due: None once it is handed over, or the instant
    /// it will be due (its target reached, or its oldest call's window over).
    fn lead(
        &mut self,
        backlogged: &[(Instant, Arc<str>, i64)],
        leader: &Arc<str>,
        head: u64,
        cap: i64,
    ) -> Option<Instant> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let lead = self.calls.get(&head)?;
        let cost = lead.cost.clone();
        // Every tenant's calls for this segment: the leader first, then by virtual time.
        let mut order: Vec<Arc<str>> = backlogged.iter().map(|(_, t, _)| Arc::clone(t)).collect();
        order.sort_by(|a, b| {
            (a != leader)
                .cmp(&(b != leader))
                .then(self.fair.vtime(a).total_cmp(&self.fair.vtime(b)))
        });
        let mut pending = Vec::new();
        let mut ids: Vec<Vec<u64>> = Vec::new();
        let mut oldest = Instant::now();
        for t in &order {
            let mine: Vec<u64> = self.queues[t]
                .iter()
                .copied()
                .filter(|id| self.calls.get(id).is_some_and(|c| c.same_segment(lead)))
                .collect();
            let Some(first) = mine.first().and_then(|id| self.calls.get(id)) else {
                continue;
            };
            let weight = first.weight;
            let vtime = self.fair.vtime(t);
            let calls: Vec<i64> = mine
                .iter()
                .filter_map(|id| self.calls.get(id))
                .map(|c| {
                    oldest = oldest.min(c.enqueued);
                    c.left()
                })
                .collect();
            pending.push(Pending {
                weight,
                vtime,
                calls,
            });
            ids.push(mine);
        }
        let active = self.active();
        let n_active = active.len().max(1);
        let slice = self.slice(active);
        let short = cost.batch_within(slice.as_secs_f64(), cap);
        let long = cost.batch_within(config.batch_time.max(config.slice).as_secs_f64(), cap);
        let workers = config.workers.max(1);
        // A tenant alone may run long batches on all but one worker; several tenants' work
        // may pool into long batches.
        let alone = n_active == 1 && (workers == 1 || self.long_running + 1 < workers);
        let pooled = pending.len() >= 2;
        let target = if alone || pooled { long } else { short };
        let waiting: i64 = pending.iter().flat_map(|p| p.calls.iter()).sum();
        let due = oldest + config.window;
        let now = Instant::now();
        if waiting < target && now < due {
            return Some(due);
        }
        let hold = stretch(n_active);
        let per_sample = cost.seconds(target) / target as f64;
        let joined_cap = |led: i64| cost.batch_within(cost.seconds(led) * hold, target);
        // Among three or more tenants, one may join a batch while up to a slice of device time
        // ahead of its leader: their shares still even out within a slice, and batches form
        // from tenants a little apart.
        let ahead = if n_active > 2 {
            slice.as_secs_f64()
        } else {
            0.0
        };
        let mut slices = fill(&pending, target, per_sample, ahead, joined_cap);
        // Whether anyone joined the leader (tenant 0 of `pending`).
        let joined = |slices: &[Slice]| slices.iter().any(|s| s.tenant != 0);
        if !alone && target > short && !joined(&slices) {
            // Only the leader's work made it in while others are active: a slice of it.
            let joined_cap = |led: i64| cost.batch_within(cost.seconds(led) * hold, short);
            let per_sample = cost.seconds(short) / short as f64;
            slices = fill(&pending, short, per_sample, ahead, joined_cap);
        }
        let size: i64 = slices.iter().map(|s| s.take).sum();
        let picked: Vec<(u64, i64)> = slices
            .iter()
            .filter_map(|s| Some((*ids.get(s.tenant)?.get(s.call)?, s.take)))
            .collect();
        self.execute(&picked, &cost, alone && !joined(&slices) && size > short);
        None
    }

    /// Hands one device batch made of `picked` slices to a worker. Each slice's tenant is
    /// charged its estimated device time now, so that the next batches, formed while this one
    /// runs, see it; [`Self::complete`] corrects the charge to the time the batch took.
    fn execute(&mut self, picked: &[(u64, i64)], cost: &SegmentCost, long: bool) {
        let size: i64 = picked.iter().map(|(_, n)| n).sum();
        let Some(c) = picked.first().and_then(|(id, _)| self.calls.get(id)) else {
            return;
        };
        let (model, range) = (Arc::clone(&c.pin.model), c.range.clone());
        let (shape, out_shape) = (c.input.shape.clone(), c.out_shape.clone());
        let held = if self.config().adapt {
            match self
                .shared
                .budget
                .reserve_batch(cost.run_bytes(size as u64), &c.tenant)
            {
                Some(r) => Some(r),
                None => {
                    self.shared.budget.wait_changed(MEMORY_POLL);
                    return;
                }
            }
        } else {
            None
        };
        let seconds = cost.seconds(size);
        let mut calls = Vec::with_capacity(picked.len());
        let mut estimate = Vec::with_capacity(picked.len());
        for &(id, take) in picked {
            let Some(c) = self.calls.remove(&id) else {
                continue;
            };
            let est = seconds * take as f64 / size.max(1) as f64;
            self.fair.charge(&c.tenant, est, c.weight);
            estimate.push(est);
            calls.push((id, c, take));
        }
        let job = Job {
            calls,
            model,
            range,
            shape,
            out_shape,
            held,
            estimate,
            long,
        };
        match self.jobs.send(job) {
            Ok(()) => {
                self.long_running += usize::from(long);
                lock(&self.shared.stats).started();
            }
            Err(lost) => {
                // The workers are gone (they only stop when the dispatcher does).
                for (id, c, _) in lost.0.calls {
                    self.remove_queued(&c.tenant, id);
                    c.refuse(
                        DeviceError::Failed("the device workers stopped".into()),
                        &self.reaper,
                    );
                }
            }
        }
    }

    /// Takes back a batch a worker ran: charges the time it took, and answers the calls it
    /// finished (or all of its calls, if it failed).
    fn complete(&mut self, done: Done) {
        self.long_running -= usize::from(done.long).min(self.long_running);
        let size: i64 = done.calls.iter().map(|(_, _, take)| take).sum();
        // Held through the loop below, which adds each call's device time.
        let mut stats = lock(&self.shared.stats);
        stats.finished();
        stats.batch(done.calls.iter().map(|(_, c, _)| &*c.tenant), size);
        if done.result.is_err() {
            stats.faults += 1;
        }
        let mut ids = Vec::with_capacity(done.calls.len());
        let takes: Vec<i64> = done.calls.iter().map(|(_, _, take)| *take).collect();
        let shares = batch::shares(done.took, &done.own, &takes);
        for (((id, mut c, take), est), share) in
            done.calls.into_iter().zip(done.estimate).zip(shares)
        {
            c.progress.taken += take;
            c.progress.device += share;
            c.progress.batches += 1;
            // Counted as it ran, whether or not the call gets to its end.
            c.usage.add_compute(share);
            stats.tenant(&c.tenant).device_seconds += share.as_secs_f64();
            self.fair
                .charge(&c.tenant, share.as_secs_f64() - est, c.weight);
            // Its id stayed in its tenant's queue, unless the queues were cleared meanwhile.
            let queue = self.queues.entry(Arc::clone(&c.tenant)).or_default();
            if !queue.contains(&id) {
                queue.push_front(id);
            }
            self.calls.insert(id, c);
            ids.push(id);
        }
        // `finish` takes the stats again.
        drop(stats);
        match done.result {
            Ok(()) => {
                for id in ids {
                    if self.calls.get(&id).is_some_and(|c| c.left() == 0) {
                        self.finish(id);
                    }
                }
            }
            Err(detail) => {
                let tenants: Vec<&str> = ids
                    .iter()
                    .filter_map(|id| Some(&*self.calls.get(id)?.tenant))
                    .collect();
                tracing::error!(
                    "device batch of {size} samples of `{}` for tenants {tenants:?} failed: {detail}",
                    done.model.name(),
                );
                for id in ids {
                    if let Some(c) = self.remove(id) {
                        c.refuse(DeviceError::Failed(detail.clone()), &self.reaper);
                    }
                }
            }
        }
    }

    fn remove_queued(&mut self, tenant: &str, id: u64) {
        if let Some(q) = self.queues.get_mut(tenant) {
            q.retain(|&x| x != id);
        }
    }

    /// Sends a finished call's output back.
    fn finish(&mut self, id: u64) {
        let Some(c) = self.remove(id) else { return };
        let now = Instant::now();
        self.recent
            .insert(Arc::clone(&c.tenant), (now, c.cost.seconds(c.input.n)));
        let (tenant, n) = (Arc::clone(&c.tenant), c.input.n);
        let (ran, reply) = c.into_ran(&self.reaper);
        {
            let mut stats = lock(&self.shared.stats);
            let t = stats.tenant(&tenant);
            t.samples += n as u64;
            t.queued_seconds += ran.queued.as_secs_f64();
        }
        // A caller that gave up meanwhile gets nothing; its output is freed off this thread.
        if let Err(unsent) = reply.send(Ok(ran)) {
            self.reaper.free(unsent);
        }
    }
}

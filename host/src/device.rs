//! The device: one memory budget shared by all in-flight work, storage-side batch adaptation,
//! and compute calls pooled across tenants.
//!
//! Every run of a model segment reserves `workspace + b * per_sample` bytes of the budget (the
//! [`memory`](crate::memory) model) before it starts and gives them back when it ends; a loaded
//! model's weights are charged once. So admitted work never takes more than the budget.
//!
//! - **Adaptation on**: a call of `n` samples runs in sub-batches of
//!   `b = min(n, floor((free - workspace) / per_sample))` (the paper's rule), further capped at
//!   the caller's fair share of the budget when several calls want the device, and its outputs
//!   are concatenated. Frozen layers run in eval mode, so a sample's features do not depend on
//!   its batch mates: the result is the one large batch's. A call waits (FIFO) until one
//!   sample fits; it never fails for lack of memory.
//! - **Adaptation off**: a call runs whole. If it does not fit in what is free now it is
//!   refused ([`DeviceError::Busy`], HTTP 503 with `Retry-After`); if it could never fit, it is
//!   refused for good ([`DeviceError::TooLarge`]).
//! - **Pooling on**: calls go to one dispatcher thread per device that merges calls for the
//!   same segment, from any tenant, into one device batch of at most `max_batch` samples (and,
//!   with adaptation, what the budget fits), waiting at most the batch window for batch mates.
//!   Each batch is filled by weighted round robin over the tenants with work for it (the
//!   policy's weights), starting with a different tenant each time, so a tenant that floods
//!   the host gets its share and no more while others wait. Results are scattered back.
//! - **Pooling off**: each call runs on its caller's thread, concurrently with others.
//!
//! Time a call spends waiting for the device is not charged to the tenant's time limit.

use crate::memory::{ModelMemory, SegmentCost};
use crate::models::Models;
use crate::policy::Tenant;
use hapi_model::ModelPackage;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write;
use std::ops::Range;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tch::Tensor;

/// How the device shares its memory and batches.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Bytes of device memory all work together may use (weights included).
    pub budget: u64,
    /// Split calls into sub-batches that fit (storage batch adaptation).
    pub adapt: bool,
    /// Merge calls for the same segment across tenants into one device batch.
    pub pool: bool,
    /// How long a pooled batch waits for batch mates.
    pub window: Duration,
    /// Largest pooled device batch, in samples.
    pub max_batch: i64,
}

/// Why the device did not run a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "the device has {free} bytes free and this call needs {need} (adaptation is off); retry later"
    )]
    Busy { need: u64, free: u64 },
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Failed(String),
}

/// A finished call: its output, and where its time went.
#[derive(Debug)]
pub struct Ran {
    pub output: Tensor,
    /// Waiting for memory or for a batch.
    pub queued: Duration,
    /// On the device (a pooled batch's time shared out by samples).
    pub device: Duration,
    /// Device batches the call was part of.
    pub batches: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The memory budget and who holds it.
#[derive(Debug)]
struct Budget {
    total: u64,
    state: Mutex<BudgetState>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct BudgetState {
    weights: u64,
    charged: HashSet<String>,
    reserved: u64,
    peak: u64,
    /// FIFO tickets of adaptive waiters: only `serving` may reserve next.
    next_ticket: u64,
    serving: u64,
    /// Adaptive callers wanting the device (waiting or running), for fair shares.
    active: u64,
}

impl BudgetState {
    fn free(&self, total: u64) -> u64 {
        total.saturating_sub(self.weights + self.reserved)
    }

    /// The most that can ever be free: the budget less the loaded weights.
    fn ceiling(&self, total: u64) -> u64 {
        total.saturating_sub(self.weights)
    }

    fn take(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak = self.peak.max(self.weights + self.reserved);
    }
}

/// Bytes held until dropped.
#[derive(Debug)]
struct Reservation<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.budget.state).reserved -= self.bytes;
        self.budget.freed.notify_all();
    }
}

impl Budget {
    fn reservation(&self, bytes: u64) -> Reservation<'_> {
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Charges a model's weights once; refuses a model that cannot fit at all.
    fn charge(&self, memory: &ModelMemory) -> Result<(), DeviceError> {
        let model = memory.model.as_str();
        let mut s = lock(&self.state);
        if s.charged.contains(model) {
            return Ok(());
        }
        let (weights, first_run) = (memory.weights(), memory.one_sample_peak());
        let need = weights + first_run;
        if s.weights + need > self.total {
            return Err(DeviceError::TooLarge(format!(
                "model `{model}` needs {weights} bytes of weights and {first_run} to run one \
                 sample; the device budget is {} with {} already taken by loaded models",
                self.total, s.weights
            )));
        }
        s.weights += weights;
        s.peak = s.peak.max(s.weights + s.reserved);
        s.charged.insert(model.to_string());
        Ok(())
    }

    fn try_reserve(&self, need: u64) -> Result<Reservation<'_>, DeviceError> {
        let mut s = lock(&self.state);
        let free = s.free(self.total);
        if need > s.ceiling(self.total) {
            return Err(DeviceError::TooLarge(format!(
                "this call needs {need} bytes of device memory at once and at most {} can ever \
                 be free (budget {}, weights {}); send fewer samples per call or turn storage \
                 batch adaptation on",
                s.ceiling(self.total),
                self.total,
                s.weights
            )));
        }
        if need > free {
            return Err(DeviceError::Busy { need, free });
        }
        s.take(need);
        Ok(self.reservation(need))
    }

    /// Waits (FIFO) until at least one sample fits, then reserves the adapted sub-batch.
    fn reserve_adapted(&self, cost: SegmentCost, remaining: i64) -> (Reservation<'_>, i64) {
        let mut s = lock(&self.state);
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        loop {
            let free = s.free(self.total);
            if s.serving == ticket && free >= cost.run_bytes(1) {
                let fits = (free - cost.workspace) / cost.per_sample.max(1);
                let usable = self.total.saturating_sub(s.weights + cost.workspace);
                let share = (usable / cost.per_sample.max(1) / s.active.max(1)).max(1);
                let b = (remaining as u64).min(fits).min(share).max(1) as i64;
                let bytes = cost.run_bytes(b as u64);
                s.take(bytes);
                s.serving += 1;
                drop(s);
                self.freed.notify_all();
                return (self.reservation(bytes), b);
            }
            s = self.freed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Per tenant, what the device did for it.
#[derive(Debug, Default, Clone)]
struct TenantStats {
    calls: u64,
    samples: u64,
    queued_seconds: f64,
    device_seconds: f64,
    /// Sum over this tenant's slices of the size of the batch they ran in.
    batch_samples: u64,
    slices: u64,
    refused: u64,
}

#[derive(Debug, Default)]
struct Stats {
    tenants: BTreeMap<String, TenantStats>,
    batches: u64,
    batch_samples: u64,
    largest_batch: i64,
    in_progress: u64,
    peak_in_progress: u64,
}

/// A snapshot for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DeviceSnapshot {
    pub budget: u64,
    pub reserved: u64,
    pub weights: u64,
    pub peak_bytes: u64,
    pub in_progress: u64,
    pub peak_in_progress: u64,
    pub batches: u64,
    pub batch_samples: u64,
    pub largest_batch: i64,
}

/// One call in the dispatcher.
struct Call {
    tenant: Arc<str>,
    weight: u32,
    model: Arc<ModelPackage>,
    range: Range<usize>,
    cost: SegmentCost,
    input: Tensor,
    n: i64,
    taken: i64,
    done: i64,
    parts: Vec<Tensor>,
    enqueued: Instant,
    device: Duration,
    batches: u32,
    reply: SyncSender<Result<Ran, DeviceError>>,
}

impl Call {
    fn key(&self) -> (&str, usize, usize) {
        (self.model.name(), self.range.start, self.range.end)
    }
}

#[derive(Default)]
struct Incoming {
    calls: Vec<Call>,
    shutdown: bool,
}

/// The device executor.
pub struct Device {
    config: DeviceConfig,
    models: Arc<Models>,
    budget: Budget,
    stats: Mutex<Stats>,
    incoming: Mutex<Incoming>,
    arrived: Condvar,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The slice of a call a batch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub tenant: usize,
    pub call: usize,
    pub take: i64,
}

/// Work one tenant has for the segment a batch runs: its weight and its calls' remaining
/// samples, oldest first.
#[derive(Debug, Clone)]
pub struct Pending {
    pub weight: u32,
    pub calls: Vec<i64>,
}

/// Fills one batch of at most `cap` samples by weighted round robin: each round gives every
/// tenant with work a quantum proportional to its weight (its share of `cap`), taken from its
/// oldest calls; rounds repeat until the batch is full or the work is gone. With `whole`, a call
/// is only taken entirely (a quantum too small for it carries over to the next round). With an
/// `allowance`, a tenant takes at most `weight * allowance` samples of this batch (in `whole`
/// mode, at least its oldest call; a tenant with a single call waiting, that call), which keeps
/// batches short while other tenants are active.
pub fn fill(pending: &[Pending], cap: i64, whole: bool, allowance: Option<i64>) -> Vec<Slice> {
    let weights: i64 = pending
        .iter()
        .filter(|p| !p.calls.is_empty())
        .map(|p| i64::from(p.weight.max(1)))
        .sum();
    if weights == 0 || cap <= 0 {
        return Vec::new();
    }
    let per_weight = (cap / weights).max(1);
    let mut left: Vec<Vec<i64>> = pending.iter().map(|p| p.calls.clone()).collect();
    let mut next = vec![0usize; pending.len()];
    let mut deficit = vec![0i64; pending.len()];
    let mut taken = vec![0i64; pending.len()];
    // A tenant with a single call waiting is not flooding: that call may go in whole.
    let limit = |t: usize| {
        allowance.map_or(i64::MAX, |a| {
            let own = a * i64::from(pending[t].weight.max(1));
            match pending[t].calls.as_slice() {
                [one] => own.max(*one),
                _ => own,
            }
        })
    };
    let mut room = cap;
    let mut out: Vec<Slice> = Vec::new();
    // Whether tenant t may still add its next call (or part of it) to this batch.
    let open = |t: usize, next: &[usize], left: &[Vec<i64>], taken: &[i64], room: i64| {
        if next[t] >= left[t].len() || room == 0 {
            return false;
        }
        let want = left[t][next[t]];
        let allowed =
            taken[t] < limit(t) && (!whole || taken[t] == 0 || taken[t] + want <= limit(t));
        allowed && (!whole || want <= room)
    };
    loop {
        let mut progressed = false;
        for (t, p) in pending.iter().enumerate() {
            if !open(t, &next, &left, &taken, room) {
                continue;
            }
            deficit[t] += i64::from(p.weight.max(1)) * per_weight;
            while open(t, &next, &left, &taken, room) && deficit[t] > 0 {
                let c = next[t];
                let want = left[t][c];
                let take = if whole {
                    if want > deficit[t] && taken[t] > 0 {
                        break;
                    }
                    if want > deficit[t] {
                        // Carry the quantum over, unless the allowance will never let it grow.
                        break;
                    }
                    want
                } else {
                    want.min(deficit[t]).min(room).min(limit(t) - taken[t])
                };
                deficit[t] -= take;
                room -= take;
                taken[t] += take;
                left[t][c] -= take;
                progressed = true;
                match out.last_mut() {
                    Some(s) if s.tenant == t && s.call == c => s.take += take,
                    _ => out.push(Slice {
                        tenant: t,
                        call: c,
                        take,
                    }),
                }
                if left[t][c] == 0 {
                    next[t] += 1;
                }
            }
        }
        let any_open = (0..pending.len()).any(|t| open(t, &next, &left, &taken, room));
        if !any_open || (!progressed && !whole) {
            return out;
        }
    }
}

impl Device {
    /// Starts the device; with pooling, its dispatcher thread.
    pub fn start(config: DeviceConfig, models: Arc<Models>) -> anyhow::Result<Arc<Self>> {
        let device = Arc::new(Self {
            budget: Budget {
                total: config.budget,
                state: Mutex::default(),
                freed: Condvar::new(),
            },
            config,
            models,
            stats: Mutex::default(),
            incoming: Mutex::default(),
            arrived: Condvar::new(),
        });
        if device.config.pool {
            let weak = Arc::downgrade(&device);
            std::thread::Builder::new()
                .name("device-dispatcher".into())
                .spawn(move || Dispatcher::default().run(&weak))?;
        }
        Ok(device)
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Stops the dispatcher; calls still queued are refused.
    pub fn shutdown(&self) {
        lock(&self.incoming).shutdown = true;
        self.arrived.notify_all();
    }

    pub fn snapshot(&self) -> DeviceSnapshot {
        let b = lock(&self.budget.state);
        let s = lock(&self.stats);
        DeviceSnapshot {
            budget: self.budget.total,
            reserved: b.reserved,
            weights: b.weights,
            peak_bytes: b.peak,
            in_progress: s.in_progress,
            peak_in_progress: s.peak_in_progress,
            batches: s.batches,
            batch_samples: s.batch_samples,
            largest_batch: s.largest_batch,
        }
    }

    /// The memory model of `model` (measured on first use) and its weights charged.
    fn cost(&self, model: &ModelPackage, range: Range<usize>) -> Result<SegmentCost, DeviceError> {
        let memory: Arc<ModelMemory> = self
            .models
            .memory(model.name())
            .map_err(DeviceError::Failed)?;
        self.budget.charge(&memory)?;
        Ok(memory.segment(range))
    }

    fn enter(&self, tenant: &str) {
        let mut s = lock(&self.stats);
        s.in_progress += 1;
        s.peak_in_progress = s.peak_in_progress.max(s.in_progress);
        s.tenants.entry(tenant.to_string()).or_default().calls += 1;
    }

    fn leave(&self, tenant: &str, result: &Result<Ran, DeviceError>, n: i64) {
        let mut s = lock(&self.stats);
        s.in_progress -= 1;
        let t = s.tenants.entry(tenant.to_string()).or_default();
        match result {
            Ok(r) => {
                t.samples += n as u64;
                t.queued_seconds += r.queued.as_secs_f64();
                t.device_seconds += r.device.as_secs_f64();
            }
            Err(DeviceError::Busy { .. } | DeviceError::TooLarge(_)) => t.refused += 1,
            Err(DeviceError::Failed(_)) => {}
        }
    }

    fn record_batch(&self, slices: &[(Arc<str>, i64)]) {
        let size: i64 = slices.iter().map(|(_, n)| n).sum();
        let mut s = lock(&self.stats);
        s.batches += 1;
        s.batch_samples += size as u64;
        s.largest_batch = s.largest_batch.max(size);
        for (tenant, _) in slices {
            let t = s.tenants.entry(tenant.to_string()).or_default();
            t.batch_samples += size as u64;
            t.slices += 1;
        }
    }

    /// Pooling off: runs on the calling thread, whole (in `held`) or in adapted sub-batches.
    #[allow(clippy::too_many_arguments)]
    fn run_here(
        &self,
        model: &Arc<ModelPackage>,
        range: Range<usize>,
        cost: SegmentCost,
        input: Tensor,
        n: i64,
        tenant: &str,
        held: Option<Reservation<'_>>,
    ) -> Result<Ran, DeviceError> {
        let run = |x: &Tensor| {
            let t = Instant::now();
            let y = model
                .run(range.clone(), x)
                .map_err(|e| DeviceError::Failed(e.to_string()));
            hapi_model::device::synchronize(model.device());
            (y, t.elapsed())
        };
        if let Some(_held) = held {
            let (y, device) = run(&input);
            self.record_batch(&[(Arc::from(tenant), n)]);
            return Ok(Ran {
                output: y?,
                queued: Duration::ZERO,
                device,
                batches: 1,
            });
        }
        lock(&self.budget.state).active += 1;
        let result = (|| {
            let mut parts = Vec::new();
            let (mut queued, mut device, mut offset, mut batches) =
                (Duration::ZERO, Duration::ZERO, 0i64, 0u32);
            while offset < n {
                let waited = Instant::now();
                let want = cost
                    .efficient_batch
                    .map_or(n - offset, |e| e.min(n - offset));
                let (_held, b) = self.budget.reserve_adapted(cost, want);
                queued += waited.elapsed();
                let (y, took) = run(&input.narrow(0, offset, b));
                device += took;
                batches += 1;
                self.record_batch(&[(Arc::from(tenant), b)]);
                parts.push(y?);
                offset += b;
            }
            let output = if parts.len() == 1 {
                parts.pop().expect("one part")
            } else {
                Tensor::cat(&parts, 0)
            };
            Ok(Ran {
                output,
                queued,
                device,
                batches,
            })
        })();
        lock(&self.budget.state).active -= 1;
        result
    }

    /// Pooling on: hands the call to the dispatcher and waits for its output.
    fn submit(
        &self,
        tenant: &Tenant,
        model: &Arc<ModelPackage>,
        range: Range<usize>,
        cost: SegmentCost,
        input: Tensor,
        n: i64,
    ) -> Result<Ran, DeviceError> {
        let (reply, answer) = sync_channel(1);
        {
            let mut incoming = lock(&self.incoming);
            if incoming.shutdown {
                return Err(DeviceError::Failed("the host is shutting down".into()));
            }
            incoming.calls.push(Call {
                tenant: Arc::from(tenant.name.as_str()),
                weight: tenant.limits.weight,
                model: Arc::clone(model),
                range,
                cost,
                input,
                n,
                taken: 0,
                done: 0,
                parts: Vec::new(),
                enqueued: Instant::now(),
                device: Duration::ZERO,
                batches: 0,
                reply,
            });
        }
        self.arrived.notify_all();
        answer
            .recv()
            .unwrap_or_else(|_| Err(DeviceError::Failed("the device dispatcher stopped".into())))
    }

    /// Per-tenant device metrics in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        let snap = self.snapshot();
        let s = lock(&self.stats);
        let gauges: [(&str, &str, f64); 7] = [
            (
                "hapi_device_budget_bytes",
                "Device memory budget.",
                snap.budget as f64,
            ),
            (
                "hapi_device_weights_bytes",
                "Weights of loaded models charged to the budget.",
                snap.weights as f64,
            ),
            (
                "hapi_device_reserved_bytes",
                "Device memory reserved by running batches.",
                snap.reserved as f64,
            ),
            (
                "hapi_device_peak_bytes",
                "Most device memory held at once (weights and batches).",
                snap.peak_bytes as f64,
            ),
            (
                "hapi_device_calls_in_progress",
                "Compute calls admitted to the device and not finished.",
                snap.in_progress as f64,
            ),
            (
                "hapi_device_calls_peak",
                "Most compute calls admitted to the device at once.",
                snap.peak_in_progress as f64,
            ),
            (
                "hapi_device_largest_batch",
                "Largest device batch, in samples.",
                snap.largest_batch as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let _ = writeln!(
            out,
            "# HELP hapi_device_batches_total Device batches run.\n# TYPE hapi_device_batches_total counter\nhapi_device_batches_total {}\n# HELP hapi_device_batch_samples_total Samples in device batches.\n# TYPE hapi_device_batch_samples_total counter\nhapi_device_batch_samples_total {}",
            s.batches, s.batch_samples
        );
        type F = fn(&TenantStats) -> String;
        let families: [(&str, &str, &str, F); 7] = [
            (
                "hapi_device_calls_total",
                "counter",
                "Compute calls by tenant.",
                |t| t.calls.to_string(),
            ),
            (
                "hapi_device_samples_total",
                "counter",
                "Samples computed by tenant.",
                |t| t.samples.to_string(),
            ),
            (
                "hapi_device_queue_seconds_total",
                "counter",
                "Time compute calls waited for the device (memory or batch).",
                |t| t.queued_seconds.to_string(),
            ),
            (
                "hapi_device_seconds_total",
                "counter",
                "Device time by tenant (a pooled batch's time shared by samples).",
                |t| t.device_seconds.to_string(),
            ),
            (
                "hapi_device_tenant_batch_samples_total",
                "counter",
                "Sum of the sizes of the batches a tenant's slices ran in (divide by slices for the mean).",
                |t| t.batch_samples.to_string(),
            ),
            (
                "hapi_device_slices_total",
                "counter",
                "Slices of a tenant's calls run in device batches.",
                |t| t.slices.to_string(),
            ),
            (
                "hapi_device_refused_total",
                "counter",
                "Compute calls refused (did not fit, adaptation off).",
                |t| t.refused.to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (tenant, t) in &s.tenants {
                let _ = writeln!(
                    out,
                    "{name}{{tenant=\"{}\"}} {}",
                    crate::metrics::escape(tenant),
                    value(t)
                );
            }
        }
    }
}

impl crate::nn::Executor for Device {
    /// Runs layers `range` of `model` on `input` for `tenant`, within the budget.
    fn run(
        &self,
        tenant: &Tenant,
        model: &Arc<ModelPackage>,
        range: Range<usize>,
        input: Tensor,
    ) -> Result<Ran, DeviceError> {
        // The first call for a model waits for its memory model to be measured: host time,
        // counted as queued like waiting for memory.
        let arrived = Instant::now();
        let cost = self.cost(model, range.clone())?;
        let setup = arrived.elapsed();
        let n = input.size().first().copied().unwrap_or(0);
        if n < 1 {
            return Err(DeviceError::Failed("an empty batch".into()));
        }
        let refuse = |e: DeviceError| {
            let mut s = lock(&self.stats);
            s.tenants.entry(tenant.name.clone()).or_default().refused += 1;
            Err(e)
        };
        // Without adaptation a call runs whole: one that can never fit is refused before it
        // queues, and without pooling one that does not fit now is refused at once.
        let mut held = None;
        if !self.config.adapt {
            let need = cost.run_bytes(n as u64);
            let ceiling = lock(&self.budget.state).ceiling(self.budget.total);
            if need > ceiling {
                return refuse(DeviceError::TooLarge(format!(
                    "{n} samples of `{}[{}..{}]` need {need} bytes of device memory at once and \
                     at most {ceiling} can ever be free; send fewer samples per call or turn \
                     storage batch adaptation on",
                    model.name(),
                    range.start,
                    range.end
                )));
            }
            if !self.config.pool {
                match self.budget.try_reserve(need) {
                    Ok(r) => held = Some(r),
                    Err(e) => return refuse(e),
                }
            }
        }
        self.enter(&tenant.name);
        let result = if self.config.pool {
            self.submit(tenant, model, range, cost, input, n)
        } else {
            self.run_here(model, range, cost, input, n, &tenant.name, held)
        };
        let result = result.map(|mut r| {
            r.queued += setup;
            r
        });
        self.leave(&tenant.name, &result, n);
        result
    }
}

/// The dispatcher's own state: calls by id, and per tenant the ids in arrival order.
#[derive(Default)]
struct Dispatcher {
    calls: HashMap<u64, Call>,
    queues: BTreeMap<Arc<str>, VecDeque<u64>>,
    /// Tenants in the order they get to lead the next batch.
    turn: VecDeque<Arc<str>>,
    /// Per tenant: when it last had a call arrive or finish, and that call's size.
    seen: HashMap<Arc<str>, (Instant, i64)>,
    next_id: u64,
}

/// A tenant with a call that arrived or finished this recently counts as active: a closed-loop
/// client's next call is usually on its way (decoding in the guest).
pub const ACTIVE_FOR: Duration = Duration::from_millis(100);

impl Dispatcher {
    fn run(mut self, device: &std::sync::Weak<Device>) {
        loop {
            let Some(dev) = device.upgrade() else { return };
            if !self.admit(&dev) {
                self.refuse_all("the host is shutting down");
                return;
            }
            if let Some(wait) = self.dispatch(&dev) {
                let incoming = lock(&dev.incoming);
                if incoming.calls.is_empty() && !incoming.shutdown {
                    let _ = dev.arrived.wait_timeout(incoming, wait);
                }
            }
        }
    }

    /// Takes newly arrived calls; waits when there is nothing to do. False on shutdown.
    fn admit(&mut self, dev: &Device) -> bool {
        let mut incoming = lock(&dev.incoming);
        while incoming.calls.is_empty() && self.calls.is_empty() && !incoming.shutdown {
            let (guard, _) = dev
                .arrived
                .wait_timeout(incoming, Duration::from_secs(1))
                .unwrap_or_else(PoisonError::into_inner);
            incoming = guard;
        }
        if incoming.shutdown {
            for call in incoming.calls.drain(..) {
                let _ = call
                    .reply
                    .send(Err(DeviceError::Failed("the host is shutting down".into())));
            }
            return false;
        }
        for call in incoming.calls.drain(..) {
            let id = self.next_id;
            self.next_id += 1;
            let queue = self.queues.entry(Arc::clone(&call.tenant)).or_default();
            if queue.is_empty() && !self.turn.contains(&call.tenant) {
                self.turn.push_back(Arc::clone(&call.tenant));
            }
            queue.push_back(id);
            self.seen
                .insert(Arc::clone(&call.tenant), (Instant::now(), call.n));
            self.calls.insert(id, call);
        }
        true
    }

    /// While several tenants are active, each may put at most this many samples (per unit of
    /// weight) into a batch: half the lower median of the active tenants' recent call sizes
    /// (a tenant with one call waiting may put that call in whole). A tenant flooding the host
    /// then cannot make the batches, which nobody can interrupt, long for a tenant with small
    /// calls; alone, a tenant fills the batch.
    fn allowance(&mut self) -> Option<i64> {
        let now = Instant::now();
        self.seen
            .retain(|_, (at, _)| now.duration_since(*at) < 10 * ACTIVE_FOR);
        let mut sizes: Vec<i64> = self
            .seen
            .iter()
            .filter(|(t, (at, _))| {
                now.duration_since(*at) < ACTIVE_FOR
                    || self.queues.get(*t).is_some_and(|q| !q.is_empty())
            })
            .map(|(_, (_, n))| (*n).max(1))
            .collect();
        if sizes.len() < 2 {
            return None;
        }
        sizes.sort_unstable();
        Some((sizes[(sizes.len() - 1) / 2] / 2).max(1))
    }

    fn refuse_all(&mut self, why: &str) {
        for (_, call) in self.calls.drain() {
            let _ = call.reply.send(Err(DeviceError::Failed(why.into())));
        }
    }

    /// Runs one batch if one is due; otherwise how long to wait for batch mates.
    fn dispatch(&mut self, dev: &Device) -> Option<Duration> {
        // The tenant whose turn it is chooses the segment: its oldest call's.
        let leader = loop {
            let t = self.turn.front()?;
            if self.queues.get(t).is_some_and(|q| !q.is_empty()) {
                break Arc::clone(t);
            }
            self.turn.pop_front();
        };
        let head = self.queues[&leader][0];
        let (model, a, b) = self.calls[&head].key();
        let (model, cost) = (model.to_string(), self.calls[&head].cost);
        let same = |c: &Call| c.key() == (model.as_str(), a, b);
        // Tenants with work for this segment, leader first, in turn order.
        let order: Vec<Arc<str>> = self.turn.iter().cloned().collect();
        let mut pending = Vec::new();
        let mut ids: Vec<Vec<u64>> = Vec::new();
        let mut oldest = Instant::now();
        for t in &order {
            let q = &self.queues[t];
            let mine: Vec<u64> = q
                .iter()
                .copied()
                .filter(|id| same(&self.calls[id]))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let weight = self.calls[&mine[0]].weight;
            let calls: Vec<i64> = mine
                .iter()
                .map(|id| {
                    let c = &self.calls[id];
                    oldest = oldest.min(c.enqueued);
                    c.n - c.taken
                })
                .collect();
            pending.push(Pending { weight, calls });
            ids.push(mine);
        }
        let waiting: i64 = pending.iter().flat_map(|p| p.calls.iter()).sum();
        let config = &dev.config;
        let budget = &dev.budget;
        let cap = {
            let s = lock(&budget.state);
            let fits = s.free(budget.total).saturating_sub(cost.workspace) / cost.per_sample.max(1);
            let cap = config
                .max_batch
                .min(i64::try_from(fits).unwrap_or(i64::MAX));
            // With adaptation, no bigger than the batch that runs fastest per sample.
            match cost.efficient_batch {
                Some(e) if config.adapt => cap.min(e),
                _ => cap,
            }
        };
        let due = oldest + config.window;
        let now = Instant::now();
        if waiting < cap && now < due {
            return Some(due - now);
        }
        if cap < 1 {
            // Not even one sample fits (other work holds the memory): wait for it.
            return Some(Duration::from_millis(1));
        }
        let slices = fill(&pending, cap, !config.adapt, self.allowance());
        self.turn.rotate_left(1);
        if !slices.iter().any(|s| s.tenant == 0) {
            // Adaptation off and the leader's oldest call is larger than this batch's room:
            // it runs alone (it fits the budget, or it was refused before it queued), so that
            // smaller calls cannot starve it.
            let id = ids[0][0];
            let n = self.calls[&id].n - self.calls[&id].taken;
            return self.execute(dev, &[(id, n)], cost);
        }
        let picked: Vec<(u64, i64)> = slices
            .iter()
            .map(|s| (ids[s.tenant][s.call], s.take))
            .collect();
        self.execute(dev, &picked, cost)
    }

    /// Runs one device batch made of `picked` slices and scatters the outputs.
    fn execute(
        &mut self,
        dev: &Device,
        picked: &[(u64, i64)],
        cost: SegmentCost,
    ) -> Option<Duration> {
        let size: i64 = picked.iter().map(|(_, n)| n).sum();
        let held = match dev.budget.try_reserve(cost.run_bytes(size as u64)) {
            Ok(r) => r,
            Err(DeviceError::Busy { .. }) => return Some(Duration::from_millis(1)),
            Err(e) => {
                for (id, _) in picked {
                    self.finish(*id, Err(e.clone()));
                }
                return None;
            }
        };
        let mut inputs = Vec::with_capacity(picked.len());
        let (model, range) = {
            let c = &self.calls[&picked[0].0];
            (Arc::clone(&c.model), c.range.clone())
        };
        for (id, take) in picked {
            let c = self.calls.get_mut(id).expect("picked call");
            inputs.push(c.input.narrow(0, c.taken, *take));
            c.taken += take;
        }
        let x = if inputs.len() == 1 {
            inputs.pop().expect("one input")
        } else {
            Tensor::cat(&inputs, 0)
        };
        drop(inputs);
        let started = Instant::now();
        let y = model.run(range, &x);
        hapi_model::device::synchronize(model.device());
        let took = started.elapsed();
        drop(x);
        dev.record_batch(
            &picked
                .iter()
                .map(|(id, n)| (Arc::clone(&self.calls[id].tenant), *n))
                .collect::<Vec<_>>(),
        );
        match y {
            Ok(y) => {
                let sizes: Vec<i64> = picked.iter().map(|(_, n)| *n).collect();
                let outs = y.split_with_sizes(&sizes, 0);
                drop(held);
                for ((id, n), out) in picked.iter().zip(outs) {
                    let c = self.calls.get_mut(id).expect("picked call");
                    c.parts.push(out);
                    c.done += n;
                    c.batches += 1;
                    c.device += took.mul_f64(*n as f64 / size as f64);
                    if c.done == c.n {
                        let c = self.remove(*id);
                        self.seen
                            .insert(Arc::clone(&c.tenant), (Instant::now(), c.n));
                        let output = if c.parts.len() == 1 {
                            c.parts.into_iter().next().expect("one part")
                        } else {
                            Tensor::cat(&c.parts, 0)
                        };
                        let _ = c.reply.send(Ok(Ran {
                            output,
                            queued: c.enqueued.elapsed().saturating_sub(c.device),
                            device: c.device,
                            batches: c.batches,
                        }));
                    }
                }
            }
            Err(e) => {
                drop(held);
                let e = DeviceError::Failed(e.to_string());
                for (id, _) in picked {
                    self.finish(*id, Err(e.clone()));
                }
            }
        }
        None
    }

    fn remove(&mut self, id: u64) -> Call {
        let c = self.calls.remove(&id).expect("call");
        if let Some(q) = self.queues.get_mut(&c.tenant) {
            q.retain(|&x| x != id);
        }
        c
    }

    fn finish(&mut self, id: u64, result: Result<Ran, DeviceError>) {
        if self.calls.contains_key(&id) {
            let c = self.remove(id);
            let _ = c.reply.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pending, Slice, fill};

    fn p(weight: u32, calls: &[i64]) -> Pending {
        Pending {
            weight,
            calls: calls.to_vec(),
        }
    }

    #[test]
    fn a_light_tenant_gets_its_share_of_a_batch_next_to_a_flood() {
        // A heavy tenant with four calls of 8 and a light one with one call of 4; batch of 16.
        let s = fill(&[p(1, &[8, 8, 8, 8]), p(1, &[4])], 16, false, None);
        let light: i64 = s.iter().filter(|s| s.tenant == 1).map(|s| s.take).sum();
        let heavy: i64 = s.iter().filter(|s| s.tenant == 0).map(|s| s.take).sum();
        assert_eq!((light, heavy), (4, 12), "{s:?}");
        // Alone, the heavy tenant fills the batch (work-conserving).
        let s = fill(&[p(1, &[8, 8, 8, 8])], 16, false, None);
        assert_eq!(s.iter().map(|s| s.take).sum::<i64>(), 16);
    }

    #[test]
    fn while_others_are_active_each_tenant_gets_its_allowance() {
        // Allowance 4 per weight: the flood adds 4 samples next to the light tenant's 4.
        let s = fill(&[p(1, &[8, 8, 8, 8]), p(1, &[4])], 32, false, Some(4));
        let took = |t: usize| {
            s.iter()
                .filter(|s| s.tenant == t)
                .map(|s| s.take)
                .sum::<i64>()
        };
        assert_eq!((took(0), took(1)), (4, 4), "{s:?}");
        // Weight 2: twice the allowance.
        let s = fill(&[p(2, &[8, 8, 8, 8]), p(1, &[4])], 32, false, Some(4));
        let took = |t: usize| {
            s.iter()
                .filter(|s| s.tenant == t)
                .map(|s| s.take)
                .sum::<i64>()
        };
        assert_eq!((took(0), took(1)), (8, 4), "{s:?}");
        // Allowance 2: the flood is held to 2, the light tenant's single call goes in whole.
        let s = fill(&[p(1, &[8, 8, 8, 8]), p(1, &[4])], 32, false, Some(2));
        let took = |t: usize| {
            s.iter()
                .filter(|s| s.tenant == t)
                .map(|s| s.take)
                .sum::<i64>()
        };
        assert_eq!((took(0), took(1)), (2, 4), "{s:?}");
        // Whole calls: a call larger than the allowance still goes in, alone for its tenant.
        let s = fill(&[p(1, &[8, 8]), p(1, &[2])], 32, true, Some(4));
        let took = |t: usize| {
            s.iter()
                .filter(|s| s.tenant == t)
                .map(|s| s.take)
                .sum::<i64>()
        };
        assert_eq!((took(0), took(1)), (8, 2), "{s:?}");
    }

    #[test]
    fn weights_divide_a_full_batch() {
        let s = fill(&[p(3, &[100]), p(1, &[100])], 32, false, None);
        assert_eq!(
            s,
            vec![
                Slice {
                    tenant: 0,
                    call: 0,
                    take: 24
                },
                Slice {
                    tenant: 1,
                    call: 0,
                    take: 8
                }
            ]
        );
    }

    #[test]
    fn calls_are_split_only_with_adaptation() {
        // Adaptation off: whole calls only; a 20-sample call waits for a batch with room.
        let s = fill(&[p(1, &[20]), p(1, &[6, 6])], 16, true, None);
        assert_eq!(
            s.iter().map(|s| (s.tenant, s.take)).collect::<Vec<_>>(),
            vec![(1, 6), (1, 6)]
        );
        // Adaptation on: the same work fills the batch exactly.
        let s = fill(&[p(1, &[20]), p(1, &[6, 6])], 16, false, None);
        assert_eq!(s.iter().map(|s| s.take).sum::<i64>(), 16);
        assert!(s.iter().all(|s| s.take > 0));
    }

    #[test]
    fn empty_work_or_no_room_gives_an_empty_batch() {
        assert!(fill(&[p(1, &[])], 8, false, None).is_empty());
        assert!(fill(&[p(1, &[3])], 0, false, None).is_empty());
    }
}

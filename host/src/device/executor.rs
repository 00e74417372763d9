//! [`Device`]: what the wasi-nn capability calls to pin a model and run a segment on it.
//!
//! A call's output buffer is charged to the caller's memory account before the call is
//! admitted. With pooling the call goes to the dispatcher; without, it runs on a blocking
//! thread in time-bounded sub-batches. Either way the caller waits at most until its deadline:
//! then the call is abandoned (the dispatcher or the thread drops it and its memory).

use crate::account::{Cancel, Deadline, Pace};
use crate::device::batch::{self, Dest};
use crate::device::budget::{Budget, Pin, Reservation};
use crate::device::dispatcher::{Call, Progress, Shared};
use crate::device::job::{Job, Ran};
use crate::device::types::{DeviceConfig, DeviceError};
use crate::locks::lock;
use crate::models::Models;
use hapi_wire::profile::DeviceMemory;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device executor.
#[derive(Debug)]
pub struct Device {
    shared: Arc<Shared>,
    models: Arc<Models>,
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}

/// Counts a call in progress while it lives (also when its caller's future is dropped).
struct InProgress<'a>(&'a Shared);

impl<'a> InProgress<'a> {
    fn enter(shared: &'a Shared, tenant: &str) -> Self {
        let mut s = lock(&shared.stats);
        s.in_progress += 1;
        s.peak_in_progress = s.peak_in_progress.max(s.in_progress);
        s.tenant(tenant).calls += 1;
        Self(shared)
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        lock(&self.0.stats).in_progress -= 1;
    }
}

impl Device {
    /// Starts the device; with pooling, its dispatcher thread.
    pub fn start(config: DeviceConfig, models: Arc<Models>) -> anyhow::Result<Arc<Self>> {
        let pool = config.pool;
        let shared = Shared::new(
            config.clone(),
            Budget::new(config.budget, config.resident_for),
        );
        if pool {
            shared.spawn()?;
        }
        Ok(Arc::new(Self { shared, models }))
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.shared.config
    }

    pub fn models(&self) -> &Arc<Models> {
        &self.models
    }

    /// Stops the dispatcher; calls still queued are refused.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    /// The budget and what the device did, for the profile endpoint and tests.
    pub fn memory(&self) -> DeviceMemory {
        let b = self.shared.budget.snapshot();
        lock(&self.shared.stats).memory(&b)
    }

    /// Device time spent on `tenant`'s behalf outside its batches (a profile's measurement),
    /// added to its `hapi_device_seconds_total` and, with pooling, to its virtual time in the
    /// fair schedule (at its `weight`): its batches then wait as if it had run a batch that long.
    pub fn charge(&self, tenant: &str, weight: u32, took: Duration) {
        lock(&self.shared.stats).tenant(tenant).device_seconds += took.as_secs_f64();
        if self.shared.config.pool {
            self.shared.charge(tenant, weight, took);
        }
    }

    /// The device's metric families, appended to `out`.
    pub fn render_metrics(&self, out: &mut String) {
        let b = self.shared.budget.snapshot();
        let stats = lock(&self.shared.stats);
        stats.render(&stats.memory(&b), out);
    }

    /// Pins model `name` for a call of `tenant`, loading it (weights charged) if need be, the
    /// load paced by `pace` (see [`Budget::acquire`]).
    pub async fn acquire(
        &self,
        name: &str,
        tenant: &Arc<str>,
        deadline: &Deadline,
        pace: Option<Arc<dyn Pace>>,
    ) -> Result<Pin, DeviceError> {
        self.shared
            .budget
            .acquire(&self.models, name, tenant, deadline, pace)
            .await
    }

    /// Holds `need` bytes of the device's budget for work of `tenant` outside the dispatcher
    /// (a model's profile), waiting for room until `deadline`.
    pub async fn reserve(
        &self,
        need: u64,
        tenant: &str,
        deadline: &Deadline,
        what: &str,
    ) -> Result<Reservation, DeviceError> {
        self.shared
            .budget
            .reserve(need, tenant, deadline, what)
            .await
    }

    /// Waits until `tenant` could hold `need` bytes, or `done` says it needs none (see
    /// [`Budget::wait_room`]), holding none.
    pub async fn wait_room(
        &self,
        need: u64,
        tenant: &str,
        deadline: &Deadline,
        what: &str,
        done: impl Fn() -> bool,
    ) -> Result<(), DeviceError> {
        self.shared
            .budget
            .wait_room(need, tenant, deadline, what, done)
            .await
    }

    /// Holds `need` bytes for work of `tenant` outside the dispatcher if there is room now
    /// (see [`Budget::reserve_now`]).
    pub fn reserve_now(&self, need: u64, tenant: &str) -> Option<Reservation> {
        self.shared.budget.reserve_now(need, tenant)
    }

    /// The most the budget could ever hold for a run of a model with `weights` loaded.
    pub fn ceiling(&self, weights: u64) -> u64 {
        self.shared.budget.ceiling(weights)
    }

    /// Bytes `tenant` could claim now (see [`Budget::room_of`]).
    pub fn room_of(&self, tenant: &str) -> u64 {
        self.shared.budget.room_of(tenant)
    }

    fn refused(&self, tenant: &str, e: DeviceError) -> DeviceError {
        lock(&self.shared.stats).tenant(tenant).refused += 1;
        e
    }

    /// Runs `job`, within the budget, until its deadline.
    pub async fn run(&self, job: Job) -> Result<Ran, DeviceError> {
        let Job {
            tenant,
            weight,
            pin,
            range,
            input,
            out,
            account,
            deadline,
            slot,
            usage,
        } = job;
        let n = input.n;
        let cost = pin.memory.segment(range.clone());
        let out_shape: Vec<i64> = pin
            .model
            .shape_before(range.end)
            .ok_or_else(|| DeviceError::TooLarge("layer range outside the model".into()))?
            .to_vec();
        let out_bytes = out_shape
            .iter()
            .try_fold(out.size() * n as u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| DeviceError::TooLarge("output dimensions overflow".into()))?;
        let out_charge = account
            .charge(out_bytes, "compute output")
            .map_err(DeviceError::Memory)?;
        let model_name = format!("{}[{}..{}]", pin.model.name(), range.start, range.end);
        let ceiling = self.shared.budget.ceiling(pin.memory.weights());
        let config = &self.shared.config;
        // A call that can never fit is refused, under every setting.
        let held = if config.adapt {
            let one = cost.run_bytes(1);
            if one > ceiling {
                return Err(self.refused(
                    &tenant,
                    DeviceError::TooLarge(format!(
                        "one sample of `{model_name}` needs {one} bytes of device memory and at \
                         most {ceiling} can ever be free (budget {}, the model's weights {})",
                        self.shared.budget.total(),
                        pin.memory.weights()
                    )),
                ));
            }
            None
        } else {
            let need = cost.run_bytes(n as u64);
            if need > ceiling {
                return Err(self.refused(
                    &tenant,
                    DeviceError::TooLarge(format!(
                        "{n} samples of `{model_name}` need {need} bytes of device memory at once \
                         and at most {ceiling} can ever be free; send fewer samples per call or \
                         turn storage batch adaptation on"
                    )),
                ));
            }
            match self.shared.budget.reserve_now(need, &tenant) {
                Some(r) => Some(r),
                None => {
                    return Err(self.refused(
                        &tenant,
                        DeviceError::Busy(format!(
                            "the device has no room now for {need} bytes ({n} samples of \
                             `{model_name}`, adaptation off); retry later"
                        )),
                    ));
                }
            }
        };
        let output = Vec::with_capacity(usize::try_from(out_bytes).unwrap_or(usize::MAX));
        let _counted = InProgress::enter(&self.shared, &tenant);
        if config.pool {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let call = Call {
                tenant: Arc::clone(&tenant),
                weight,
                pin,
                range,
                cost,
                input,
                out_shape,
                out_kind: out,
                output,
                out_charge,
                held,
                deadline: Arc::clone(&deadline),
                slot,
                usage,
                reply,
                enqueued: Instant::now(),
                progress: Progress::default(),
            };
            if self.shared.submit(call).is_err() {
                return Err(DeviceError::ShuttingDown);
            }
            match deadline.run(answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(DeviceError::Failed("the device dispatcher stopped".into())),
                Err(e) => Err(DeviceError::Expired(e.limit)),
            }
        } else {
            let cancel = Cancel::default();
            let _cancel = cancel.on_drop();
            let shared = Arc::clone(&self.shared);
            let d = Arc::clone(&deadline);
            let worker = tokio::task::spawn_blocking(move || {
                // Held until the sub-batch running when the caller goes is done: its slot and,
                // with adaptation off, the call's memory (reserved whole above), which it uses
                // until then. Left with the caller, the budget showed it free while it ran.
                let (_slot, _held) = (slot, held);
                let mut output = output;
                let timing = run_here(
                    &shared,
                    &tenant,
                    &pin,
                    range,
                    &cost,
                    &input,
                    &out_shape,
                    out,
                    &mut output,
                    &d,
                    &cancel,
                    &usage,
                )?;
                let dims = std::iter::once(n).chain(out_shape).collect();
                Ok(Ran {
                    output,
                    charge: out_charge,
                    dims,
                    queued: timing.0,
                    device: timing.1,
                    batches: timing.2,
                })
            });
            match deadline.run(worker).await {
                Ok(Ok(result)) => result,
                Ok(Err(e)) => Err(DeviceError::Failed(format!("device worker: {e}"))),
                Err(e) => Err(DeviceError::Expired(e.limit)),
            }
        }
    }
}

/// Pooling off: runs a call on this (blocking) thread in sub-batches bounded by memory (with
/// adaptation), the fastest batch size and the time slice; stops when the caller is gone.
/// Returns (queued, device, batches).
#[allow(clippy::too_many_arguments)]
fn run_here(
    shared: &Arc<Shared>,
    tenant: &str,
    pin: &Pin,
    range: std::ops::Range<usize>,
    cost: &hapi_wire::profile::SegmentCost,
    input: &crate::device::job::Input,
    out_shape: &[i64],
    out: crate::device::job::WireDtype,
    output: &mut Vec<u8>,
    deadline: &Deadline,
    cancel: &Cancel,
    usage: &crate::account::Usage,
) -> Result<(Duration, Duration, u32), DeviceError> {
    let config = &shared.config;
    let (mut queued, mut device, mut batches) = (Duration::ZERO, Duration::ZERO, 0u32);
    let sb = input.sample_bytes();
    let mut offset = 0i64;
    while offset < input.n {
        let waited = Instant::now();
        let left = input.n - offset;
        let mut cap = left.min(config.max_batch);
        if let Some(e) = cost.efficient_batch.filter(|_| config.adapt) {
            cap = cap.min(e);
        }
        let cap = cost.batch_within(config.slice.as_secs_f64(), cap);
        let (held, b) = loop {
            if cancel.is_cancelled() || deadline.expired() {
                return Err(DeviceError::Expired(deadline.limit()));
            }
            if !config.adapt {
                break (None, cap);
            }
            let room = shared.budget.room_for(cost.run_bytes(1), tenant);
            let fits = i64::try_from(room.saturating_sub(cost.workspace) / cost.per_sample.max(1))
                .unwrap_or(i64::MAX);
            let b = cap.min(fits);
            if b >= 1
                && let Some(r) = shared
                    .budget
                    .reserve_batch(cost.run_bytes(b as u64), tenant)
            {
                break (Some(r), b);
            }
            shared.budget.wait_changed(Duration::from_millis(5));
        };
        queued += waited.elapsed();
        let (from, len) = (offset as usize * sb, b as usize * sb);
        let slice = input.bytes.get(from..from + len).unwrap_or_default();
        let started = Instant::now();
        let result = batch::run(
            &pin.model,
            range.clone(),
            &input.shape,
            out_shape,
            &[slice],
            &mut [Dest {
                out: output,
                take: b,
                kind: out,
                took: Duration::ZERO,
            }],
        );
        let took = started.elapsed();
        drop(held);
        device += took;
        batches += 1;
        usage.add_compute(took);
        {
            let mut stats = lock(&shared.stats);
            stats.tenant(tenant).device_seconds += took.as_secs_f64();
            stats.batch(std::iter::once(tenant), b);
            if result.is_err() {
                stats.faults += 1;
            }
        }
        if let Err(detail) = result {
            tracing::error!(
                "device batch of {b} samples of `{}` failed: {detail}",
                pin.model.name()
            );
            return Err(DeviceError::Failed(detail));
        }
        offset += b;
    }
    Ok((queued, device, batches))
}

//! `hapi-host`: the storage tier of HAPI.
//!
//! A multi-tenant wasmtime host. Each tenant deploys pushdown functions (Wasm components of the
//! `hapi:pushdown/pushdown` world); each invocation runs in a fresh store with the tenant's
//! memory, time and output limits, reads only the tenant's granted objects, and calls model
//! segments through wasi-nn on libtorch (CUDA when present), on a device shared by time.
//!
//! The crate is laid out along its capabilities; data flows one way, HTTP → admission →
//! instance → capability → device:
//!
//! | module | what |
//! |---|---|
//! | [`http`] | router, connection limits and timeouts, one error table |
//! | [`admission`] | per-tenant concurrency and queue |
//! | [`functions`] | deployed functions: checks, quotas, compile queue, per-tenant code cache |
//! | [`wasm`] | engine, store limits, error classification, invocations |
//! | [`caps`] | what guests may call: objects, models, wasi-nn |
//! | [`device`] | memory budget, fair schedule by device time, dispatcher |
//! | [`store`] | object store backends and a tenant's scoped view |
//! | [`account`] | what an invocation is charged: memory, time, text |
//! | [`models`], [`memory`] | model packages and their measured memory model |
//! | [`policy`] | the operator's policy file |

pub mod account;
pub mod admission;
pub mod bindings;
pub mod caps;
pub mod device;
pub mod functions;
pub mod http;
pub(crate) mod locks;
pub mod memory;
pub mod metrics;
pub mod models;
pub mod policy;
pub mod store;
pub mod units;
pub mod wasm;

use crate::account::{Deadline, Pace};
use crate::admission::{Admission, Admissions};
use crate::device::{Device, DeviceConfig, DeviceError};
use crate::functions::{Function, FunctionError, Functions};
use crate::locks::lock;
use crate::metrics::Metrics;
use crate::models::Models;
use crate::policy::{Policy, Tenant};
use crate::wasm::invoke::{Finished, Runtime};
use anyhow::Context;
use hapi_wire::InvokeRequest;
use hapi_wire::profile::ModelProfile;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a profile request waits for its model to be loaded and for room to measure it
/// (and no longer than its tenant's time limit).
pub const PROFILE_TIMEOUT: Duration = Duration::from_secs(600);
/// Bytes of invocations' outputs the outputs' reaper holds at most while it frees them: a
/// tenant's outputs are bounded by its `concurrency` until they are let go, and those let go
/// faster than one thread frees them are freed where they are let go past this.
const OUTPUTS_FREEING: usize = 256 << 20;

/// Function removals that may wait on a blocking thread at once, host-wide.
pub const UNDEPLOYS_AT_ONCE: usize = 2;

/// Readies this process for `policy`'s device work on `device`, before any libtorch operator,
/// in every command that measures or runs models, so that measurements are taken as batches
/// run: libtorch's threads ([`device::types::share_cores`]; what runs side by side is the
/// device workers' batches when pooled, the invocation workers' calls when not) and the
/// allocator ([`memory::rss::serving`]). Returns the device workers.
pub fn prepare_for_models(policy: &Policy, device: tch::Device) -> usize {
    let h = &policy.host;
    let workers = h
        .device_workers
        .unwrap_or_else(|| device::types::default_workers(device));
    device::types::share_cores(device, if h.pool { workers } else { h.workers });
    memory::rss::serving();
    workers
}

/// The running host: policy, functions, runtime and device.
#[derive(Debug)]
pub struct Host {
    policy: Arc<policy::Current>,
    runtime: Arc<Runtime>,
    device: Arc<Device>,
    functions: Arc<Functions>,
    admissions: Admissions,
    /// Each model's measuring turn: two first profiles of a model wait for one measurement
    /// rather than reserve memory for two (one entry per model on the host).
    profiling: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Removals running on blocking threads: one waits there for a reload or a commit in
    /// progress, so the rest wait here, holding no thread, however many a tenant sends. A turn
    /// goes with its job, so a client that hangs up does not free it while the job still waits.
    pub undeploys: Arc<tokio::sync::Semaphore>,
    pub metrics: Arc<Metrics>,
    /// The engine's instance pool (see [`wasm::engine::instances_for`]).
    instances: u32,
    /// Frees invocations' large outputs once their responses are written, off the HTTP
    /// runtime's threads, which serve every tenant.
    pub outputs: account::Reaper,
}

impl Host {
    /// Opens the store and the models, starts the engine and the device, and deploys the
    /// functions the policy names and those tenants uploaded earlier.
    pub fn start(policy: Policy) -> anyhow::Result<Arc<Self>> {
        let policy = Arc::new(policy);
        let current = Arc::new(policy::Current::new(Arc::clone(&policy)));
        let h = &policy.host;
        let device = hapi_model::device::parse(&h.device)?;
        // Before any libtorch operator: the model measurements below run with the threads
        // and the allocator the batches will have.
        let workers = prepare_for_models(&policy, device);
        let models = Arc::new(
            Models::open(&policy, device, Some(h.state.join("memory")))
                .context("reading the model packages")?,
        );
        if h.measure_at_start {
            models.measure_ahead(&models.usable(&policy));
        }
        let store = store::Store::open(&h.store)
            .with_context(|| format!("opening the object store {:?}", h.store))?;
        let device = Device::start(
            DeviceConfig {
                budget: h.memory_budget,
                adapt: h.adapt_batch,
                pool: h.pool,
                window: h.batch_window,
                max_batch: h.max_batch,
                slice: h.slice,
                batch_time: h.batch_time,
                resident_for: h.resident_for,
                workers,
            },
            Arc::clone(&models),
        )?;
        let instances = wasm::engine::instances_for(policy.invocations());
        let engine = wasm::engine::engine(policy::MAX_GUEST_MEMORY, h.keep_resident, instances)?;
        let runtime = Arc::new(Runtime::new(
            engine,
            Arc::clone(&current),
            models,
            Arc::new(store),
            Arc::clone(&device),
            h.workers,
            instances,
        )?);
        let functions = Arc::new(
            Functions::open(&h.state)
                .with_context(|| format!("opening the state directory {}", h.state.display()))?,
        );
        // At start a failure stops the host: nobody to fall back to.
        functions.load_all(&runtime, &policy, &Default::default())?;
        functions.sweep(&runtime);
        Ok(Arc::new(Self {
            policy: current,
            runtime,
            device,
            functions,
            admissions: Admissions::default(),
            profiling: std::sync::Mutex::default(),
            undeploys: Arc::new(tokio::sync::Semaphore::new(UNDEPLOYS_AT_ONCE)),
            metrics: Arc::default(),
            instances,
            outputs: account::Reaper::bounded("output-reaper", OUTPUTS_FREEING),
        }))
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.get()
    }

    /// Replaces the policy (SIGHUP). In-flight invocations finish under the limits they started
    /// with, and under the new policy's grants from their next host call on (objects, models:
    /// see [`caps::caller::Caller::tenant_now`]); admission counts carry over; a call still
    /// waiting for its slot runs under the new policy, or not at all (see
    /// [`Host::current_tenant`]). The model directories are read again. Returns what changed
    /// but takes effect only at the next restart: host settings, and model packages changed
    /// on disk.
    ///
    /// Tenants come first: once the new policy has parsed and its packages are read, its
    /// tenants (who they are, tokens, grants, models, limits, deploy rights) and operator token
    /// are in force, before the slow step of loading every tenant's functions (which may
    /// compile; capabilities, linked into functions, change with them). If that step fails,
    /// the old policy stays less what the new one revokes: removed tenants stay removed,
    /// changed tokens stay changed, and each tenant keeps only what both give it (grants,
    /// shared models, deploy right, the lower limits: [`Policy::revoked_by`]). New packages are
    /// measured (`measure_at_start`) after the new policy serves.
    pub fn reload(&self, policy: Policy) -> anyhow::Result<Vec<String>> {
        let old = self.policy();
        policy.apart_from_store_of(&old.host).map_err(|e| {
            anyhow::Error::msg(e).context("the old policy stays: the running store")
        })?;
        let mut restart: Vec<String> = old
            .host
            .restart_only_changes(&policy.host)
            .into_iter()
            .map(str::to_string)
            .collect();
        let found = policy::packages::PolicyModels::read(&policy)
            .map_err(|e| anyhow::Error::msg(e).context("the old policy stays"))?;
        self.set_policy(Arc::new(old.with_tenants_of(&policy)));
        let (narrowed, changed) = old.revoked_by(&policy);
        if let Err(e) = self
            .functions
            .load_all(&self.runtime, &policy, &narrowed.tenants)
        {
            let narrowed = Arc::new(narrowed);
            self.set_policy(Arc::clone(&narrowed));
            self.admissions.reload(&narrowed);
            let kept = match changed.is_empty() {
                true => "the old policy stays".to_string(),
                false => format!(
                    "the old policy stays, less what the new one revokes ({})",
                    changed.join(", ")
                ),
            };
            return Err(e.context(kept));
        }
        let models = self.runtime.models();
        restart.extend(models.reload(&found));
        let wanted = wasm::engine::instances_for(policy.invocations());
        if wanted > self.instances {
            restart.push(format!(
                "the instance pool: the tenants' concurrency adds up to {}, past the {} \
                 instances this host started with (invocations past them are answered 429 \
                 `busy` until a restart)",
                policy.invocations(),
                self.instances
            ));
        }
        let measure = policy.host.measure_at_start.then(|| models.usable(&policy));
        let policy = Arc::new(policy);
        self.set_policy(Arc::clone(&policy));
        self.admissions.reload(&policy);
        if let Some(ids) = measure {
            models.measure_ahead(&ids);
        }
        Ok(restart)
    }

    fn set_policy(&self, policy: Arc<Policy>) {
        self.policy.set(policy);
    }

    /// The tenant as the policy has it now, if it is still there with the same token: a
    /// request authenticated before a reload that removed its tenant or changed the token is
    /// refused where it next looks (an invocation, once admitted and its body read), and one
    /// whose grants, models or limits changed runs under the new ones.
    pub fn current_tenant(&self, tenant: &Tenant) -> Option<Arc<Tenant>> {
        tenant.as_in(&self.policy().tenants).cloned()
    }

    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The device that runs model segments.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Tenant `tenant`'s function `name`: one of the policy's, or an upload while the tenant
    /// has the deploy right (a reload that took the right away and failed to load the new
    /// policy's functions leaves its uploads in the table, not served).
    pub fn function(&self, tenant: &str, name: &str) -> Option<Arc<Function>> {
        let f = self.functions.get(tenant, name)?;
        (f.managed || self.may_deploy(tenant)).then_some(f)
    }

    /// Tenant `tenant`'s functions, as [`Host::function`] serves them.
    pub fn functions(&self, tenant: &str) -> Vec<Arc<Function>> {
        let uploads = self.may_deploy(tenant);
        let mut fns = self.functions.list(tenant);
        fns.retain(|f| f.managed || uploads);
        fns
    }

    fn may_deploy(&self, tenant: &str) -> bool {
        self.policy().tenants.get(tenant).is_some_and(|t| t.deploy)
    }

    /// Uploads waiting for the compiler or being compiled, all tenants together.
    pub fn uploads_compiling(&self) -> usize {
        self.functions.compiling()
    }

    /// The tenant's admission (its concurrency slots and queue).
    pub fn admission(&self, tenant: &Tenant) -> Arc<Admission> {
        // The limits of the policy now: a request authenticated before a reload would put
        // the old ones back. One whose token a reload revoked meanwhile gets an admission of
        // no slots (429), and touches nobody's.
        match self.current_tenant(tenant) {
            Some(t) => self.admissions.of(&t),
            None => Arc::default(),
        }
    }

    /// Runs `function` on `req` for `tenant`; dropping the future stops the invocation.
    pub async fn invoke(
        &self,
        tenant: &Arc<Tenant>,
        function: &Function,
        req: InvokeRequest,
    ) -> Finished {
        self.invoke_using(tenant, function, req, Arc::default(), None)
            .await
    }

    /// [`Host::invoke`], recording what the invocation reads and computes in `usage` as it
    /// goes, so that it can be charged when the future is dropped before the end; `slot` is
    /// the tenant's admission slot it runs in, which its device calls hold too.
    pub async fn invoke_using(
        &self,
        tenant: &Arc<Tenant>,
        function: &Function,
        req: InvokeRequest,
        usage: Arc<account::Usage>,
        slot: Option<Arc<admission::Permit>>,
    ) -> Finished {
        let mut meta = BTreeMap::from([
            ("function".to_string(), function.name.clone()),
            ("tenant".to_string(), tenant.name.clone()),
        ]);
        if let Some(model) = &req.model {
            meta.insert("model".to_string(), model.clone());
        }
        if let Some(split) = req.split {
            meta.insert("split".to_string(), split.to_string());
        }
        let invocation = bindings::Invocation {
            bucket: req.bucket,
            keys: req.keys,
            model: req.model,
            split: req.split,
            options: req.options.into_iter().collect(),
        };
        let reply = wasm::invoke::Reply {
            meta,
            quantize: req.quantize,
        };
        self.runtime
            .invoke(tenant, &function.prepared, invocation, reply, usage, slot)
            .await
    }

    /// Reserves the tenant's one upload in progress for function `name` of `declared` bytes (0
    /// when unknown), before the bytes are read ([`Functions::reserve`]).
    pub fn reserve_deploy(
        &self,
        tenant: &Tenant,
        name: &str,
        declared: u64,
    ) -> Result<functions::Reservation, FunctionError> {
        self.functions.reserve(tenant, name, declared)
    }

    /// Deploys a tenant's reserved upload.
    pub async fn deploy(
        &self,
        tenant: &Arc<Tenant>,
        reservation: functions::Reservation,
        bytes: bytes::Bytes,
    ) -> Result<Arc<Function>, FunctionError> {
        self.functions
            .deploy(&self.runtime, tenant, reservation, bytes, &self.metrics)
            .await
    }

    /// Removes a tenant's upload; its metrics fold into the tenant's `(removed)` series.
    pub fn undeploy(&self, tenant: &Tenant, name: &str) -> Result<(), FunctionError> {
        self.functions.undeploy(&self.runtime, tenant, name)?;
        self.metrics.fold(&tenant.name, name);
        Ok(())
    }

    /// Per-layer time, output size and memory of model `id` on this host's device (loaded and
    /// measured on first use), reported under `tenant`'s name for it, `model`. It waits for the
    /// model and for room no longer than the tenant's time limit. The load and the measurement
    /// are CPU work for the tenant: each runs on a slot of its share of the workers.
    pub async fn profile(
        &self,
        tenant: &Tenant,
        id: &str,
        model: &str,
        slot: Option<admission::Permit>,
    ) -> Result<ModelProfile, DeviceError> {
        let limit = PROFILE_TIMEOUT.min(tenant.limits.timeout);
        let deadline = Deadline::new(limit);
        // The load's place: at the front of the tenant's queue (`Turn::sibling`).
        let share = || -> Arc<dyn Pace> { self.runtime.share_for(tenant, deadline.at()).sibling() };
        let work = self.runtime.share_for(tenant, deadline.at());
        let weight = tenant.limits.weight;
        let tenant = tenant.name.as_str();
        // Stopped at this tenant's limit lately, and measured by no one since: answered that
        // before the model is pinned or loaded for it.
        let models = Arc::clone(self.runtime.models());
        if models.profiled(id).is_none()
            && models.profiled_for(id, tenant).is_none()
            && let Some(ago) = models.stopped_for(id, tenant, limit)
        {
            return Err(Self::stopped(model, ago));
        }
        let pin = self
            .device
            .acquire(id, &Arc::from(tenant), &deadline, Some(share()))
            .await?;
        // Measured before (or failed less than `models::FAILURE_KEPT` ago), or measured for
        // this tenant at a smaller batch less than `models::UNKEPT_FOR` ago: nothing runs.
        if let Some(kept) = self.kept_profile(id, model, tenant, &pin) {
            return kept;
        }
        let turn = Arc::clone(lock(&self.profiling).entry(id.to_string()).or_default());
        // Measuring runs every layer on the device outside the dispatcher: the memory it takes
        // is held in the budget while it runs, at the largest batch (up to PROFILE_BATCH) that
        // the budget can hold beside the weights now without unloading models other tenants
        // keep within their shares (one sample at least: it waits for that, and never takes
        // it from such a model, as a batch that every tenant waits behind may). A measurement
        // at the largest batch the budget can hold is kept for every caller; one at a smaller
        // batch (under contention) is answered to this caller only (`Models::profile`).
        let cost = pin.memory.segment(0..pin.memory.layers.len());
        let ceiling = self.device.ceiling(pin.memory.weights());
        let one = cost.run_bytes(1);
        let largest = |limit: u64| {
            (1..=models::PROFILE_BATCH)
                .rev()
                .find(|&b| cost.run_bytes(b as u64) <= limit)
        };
        // Kept for every caller only if measured at the largest batch the budget can ever hold
        // beside the weights, not at a smaller one because other work held the room.
        let keep = largest(ceiling);
        if keep.is_none() {
            return Err(DeviceError::TooLarge(format!(
                "profiling model `{model}` needs {one} bytes of device memory for one sample, \
                 and at most {ceiling} can ever be free beside its weights"
            )));
        }
        // The room is waited for without the model's turn, which is taken only once there is
        // room for one sample: a call that waited for room holding the turn kept every other
        // tenant's profile of the model waiting behind it (the turn is first come, first
        // served), however much room they had, and one tenant without room, asking again as
        // each of its calls ran out of time, kept them out for good.
        // Or until another call's measurement is kept for this one (it gives its room back
        // after it keeps it, which wakes the wait): answered with no room at all.
        let kept = || models.profiled(id).is_some() || models.profiled_for(id, tenant).is_some();
        let what = format!("profiling model `{model}`");
        let (measuring, held, batch) = loop {
            self.device
                .wait_room(one, tenant, &deadline, &what, &kept)
                .await?;
            if let Some(kept) = self.kept_profile(id, model, tenant, &pin) {
                return kept;
            }
            let measuring = deadline
                .run(Arc::clone(&turn).lock_owned())
                .await
                .map_err(|_| {
                    DeviceError::Busy(format!(
                        "model `{model}` is being profiled by another call; retry shortly"
                    ))
                })?;
            // Measured while this one waited its turn (by this tenant's other calls too: a
            // tenant's calls queued on the turn measure once between them).
            if let Some(kept) = self.kept_profile(id, model, tenant, &pin) {
                return kept;
            }
            let room = self.device.room_of(tenant).max(one);
            let batch = largest(ceiling.min(room)).unwrap_or(1);
            // One sample's room, as just found, if the batch's is not there after all.
            let held = [batch, 1].into_iter().find_map(|b| {
                self.device
                    .reserve_now(cost.run_bytes(b as u64), tenant)
                    .map(|held| (held, b))
            });
            if let Some((held, batch)) = held {
                break (measuring, held, batch);
            }
            // The room went while this call waited for the turn: waited for again, the turn
            // given back.
            drop(measuring);
        };
        // The model stays pinned, and the memory, the turn and the tenant's admission slot
        // held, until the measurement ends, even when the caller goes away: a tenant that
        // hangs up cannot run more measurements at once than its concurrency.
        let (id, owner) = (id.to_string(), tenant.to_string());
        let device = Arc::clone(&self.device);
        let (layers, pin) = tokio::task::spawn_blocking(move || {
            // Each run of a layer on a slot of the tenant's share, and none once its time is up
            // (the measurement stops there, kept for no one); the time it runs is the tenant's
            // device time, its waits for its share are not.
            let keep = keep == Some(batch);
            let waited = std::cell::Cell::new(Duration::ZERO);
            // Waits while none of the tenant's own invocations ran or waited: other tenants'.
            let excused = std::cell::Cell::new(Duration::ZERO);
            let go_on = || {
                let asked = Instant::now();
                let own = work.beside_own();
                let go = work.pace();
                let wait = asked.elapsed();
                waited.set(waited.get() + wait);
                if !own {
                    excused.set(excused.get() + wait);
                }
                go
            };
            let started = Instant::now();
            let layers = models.profile(&id, &pin.model, batch, keep, &owner, &go_on);
            let (took, waited) = (started.elapsed(), waited.get());
            device.charge(&owner, weight, took.saturating_sub(waited));
            // Stopped with most of its time measuring or waiting behind the tenant's own
            // invocations, not waiting for a share that other tenants' work took: the
            // measurement takes longer than the tenant's limit (with what the tenant runs
            // beside it), and is not begun again for it for a while. A tenant's own busy
            // invocations made every wait look like others' load, and its stops were never
            // kept.
            if matches!(layers, Ok(None)) && excused.get() < took / 2 {
                models.note_stopped(&id, &owner, limit);
            }
            drop(work);
            drop(held);
            drop(measuring);
            drop(slot);
            (layers, pin)
        })
        .await
        .map_err(|e| DeviceError::Failed(format!("profile worker: {e}")))?;
        let layers = layers
            .map_err(DeviceError::Failed)?
            .ok_or(DeviceError::Expired(deadline.limit()))?;
        Ok(self.profile_reply(model, &layers, &pin))
    }

    /// The reply from a kept measurement (or failure) of model `id`, if there is one.
    fn kept_profile(
        &self,
        id: &str,
        model: &str,
        tenant: &str,
        pin: &device::budget::Pin,
    ) -> Option<Result<ModelProfile, DeviceError>> {
        let models = self.runtime.models();
        let Some(done) = models.profiled(id) else {
            let layers = models.profiled_for(id, tenant)?;
            return Some(Ok(self.profile_reply(model, &layers, pin)));
        };
        Some(
            done.map(|layers| self.profile_reply(model, &layers, pin))
                .map_err(DeviceError::Failed),
        )
    }

    /// A measurement of `model` stopped at the tenant's time limit `ago`.
    fn stopped(model: &str, ago: Duration) -> DeviceError {
        DeviceError::Stopped(format!(
            "measuring model `{model}` takes longer than this tenant's time limit: its \
             measurement was stopped there {} s ago, and is not started again for this tenant \
             within {} s of that, unless its limit grows (a profile another tenant measures in \
             full is answered meanwhile)",
            ago.as_secs(),
            models::UNKEPT_FOR.as_secs()
        ))
    }

    fn profile_reply(
        &self,
        model: &str,
        layers: &[hapi_wire::profile::LayerProfile],
        pin: &device::budget::Pin,
    ) -> ModelProfile {
        ModelProfile {
            model: model.to_string(),
            device: format!("{:?}", self.runtime.models().device()),
            batch: layers.first().map_or(models::PROFILE_BATCH, |l| l.batch),
            layers: layers.to_vec(),
            memory: pin.memory.as_ref().clone(),
            // The budget only: what holds it (loaded weights, batches, evictions) is every
            // tenant's activity, the operator's to see (`/metrics`), not a neighbour's.
            device_memory: hapi_wire::profile::DeviceMemory {
                budget: self.device.config().budget,
                ..Default::default()
            },
        }
    }
}
